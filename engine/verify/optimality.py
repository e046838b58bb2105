"""Per-position optimality record (Hu et al.): how close a verifier came to alpha*.

For one verified sibling group: alpha* of the draft scheme in use (the best acceptance any
verifier could reach with drafts drawn that way), the rule's exact acceptance probability
given the drafts it actually saw (enumerated over its own random decisions), and the
expected acceptance over draft draws where a closed form exists.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from engine.verify.enumerate import exact_acceptance
from engine.verify.optimal import (
    alpha_star,
    greedy_drafts_acceptance,
    kseq_acceptance,
    rrs_wr_acceptance,
    tv_distance,
)
from engine.verify.token import SCHEME

CLOSED_FORMS = {
    "sd": lambda p, q, n: 1.0 - tv_distance(p, q),
    "rrs_wr": rrs_wr_acceptance,
    "kseq": kseq_acceptance,
    "greedy_drafts": greedy_drafts_acceptance,
}


def position_record(rule: str, p: torch.Tensor, q: torch.Tensor, candidates: Sequence[int],
                    depth: int, node: int) -> dict[str, Any]:
    """JSON-able record for the trace (its fields: engine.contract.records.OptimalRecord, one of
    RoundTrace.extras.optimal).

    Args:
        p, q: (V,) warped target / draft distributions at the parent.
        candidates: the drafted children, in draw order.
    """
    n = len(candidates)
    scheme = SCHEME[rule]
    best = alpha_star(p, q, n, scheme)
    expected = CLOSED_FORMS[rule](p, q, n) if rule in CLOSED_FORMS else None
    return {
        "depth": depth, "parent": node, "n": n, "scheme": scheme, "rule": rule,
        "alpha_star": best.alpha, "certificate_size": len(best.H),
        "achieved": exact_acceptance(rule, p, q, list(candidates)),
        "expected": expected, "tv": tv_distance(p, q),
    }

