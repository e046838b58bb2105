"""The exact laws the check compares against: the target's warped law of the first token(s)
after a prompt, and the drafter's (the wrong law a rule that ignores p would give)."""

from __future__ import annotations

import torch

from engine.check.stats import PAIR_LIMIT
from engine.core.sampling import Warp, probs_from_logits
from engine.drafters.ngram import support

# ------------------------------------------------------------------ laws


@torch.no_grad()
def _next_probs(model, contexts: list[list[int]], warp: Warp, device) -> torch.Tensor:
    """(B, V) float64 warped next-token law after each context (same lengths)."""
    x = torch.tensor(contexts, device=device)  # (B, T)
    logits = model(input_ids=x).logits[:, -1].float().cpu()  # (B, V)
    p = probs_from_logits(logits, warp).double()  # (B, V)
    return p / p.sum(-1, keepdim=True)


def _q_probs(pair, contexts: list[list[int]], warp: Warp) -> list[torch.Tensor | None]:
    """The drafter's warped law after each context (its declared context law); None where
    it proposes nothing there (a lookup with no recurring suffix) or declares no context
    law."""
    x = torch.tensor(contexts, device=pair.device)  # (B, T)
    logits = pair.drafter.context_logits(x)  # (B, T, V) or None
    if logits is None:
        return [None] * len(contexts)
    out: list[torch.Tensor | None] = []
    for last in logits[:, -1].float().cpu():  # (V,) after each context
        if support(last) == 0:
            out.append(None)
            continue
        p = probs_from_logits(last, warp).double()
        out.append(p / p.sum())
    return out


def exact_laws(pair, ids: list[int], warp: Warp, depth: int, eos: set[int]
               ) -> tuple[dict, dict | None, int]:
    """(p's law, q's law on p's cells or None, depth used): laws of the first token, or of
    the first two (a first EOS is a one-token cell) when depth 2 is asked and the warped
    support has at most PAIR_LIMIT cells. q is the drafter's warped law, p's where the
    drafter proposes nothing."""
    p1 = _next_probs(pair.target, [ids], warp, pair.device)[0]  # (V,)
    q1 = _q_probs(pair, [ids], warp)[0]
    first = [int(t) for t in torch.nonzero(p1).flatten()]
    law = {(t,): float(p1[t]) for t in first}
    q_law = None if q1 is None else {(t,): float(q1[t]) for t in first}
    go_on = [t for t in first if t not in eos]
    if depth < 2 or len(first) > PAIR_LIMIT or not go_on:
        return law, q_law, 1
    ctxs = [ids + [t] for t in go_on]
    p2 = _next_probs(pair.target, ctxs, warp, pair.device)  # (B, V)
    if len(first) - len(go_on) + int(torch.count_nonzero(p2)) > PAIR_LIMIT:
        return law, q_law, 1
    q2 = _q_probs(pair, ctxs, warp)
    pairs, q_pairs = {c: v for c, v in law.items() if c[0] in eos}, {}
    for i, t in enumerate(go_on):
        q_row = q2[i] if q2[i] is not None else p2[i]  # proposes nothing: a target step
        for u in torch.nonzero(p2[i]).flatten().tolist():
            pairs[(t, u)] = float(p1[t] * p2[i, u])
            q_pairs[(t, u)] = float(q1[t] * q_row[u]) if q1 is not None else 0.0
    if q_law is not None:
        q_pairs.update({c: v for c, v in q_law.items() if c[0] in eos})
    return pairs, (q_pairs if q1 is not None else None), 2
