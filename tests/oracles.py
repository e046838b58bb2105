"""Test oracles: slow, obviously correct references the engine's fast code is checked against.

- ``naive_beam_search``: beam search where every step runs a full forward (no KV cache).
- ``run_beam_search`` / ``run_beam_sampling``: drive ``beam_step`` / ``beam_sample_step`` to
  the end on any next-log-prob function.
- ``lp_value`` / ``lp_alpha_star``: the multi-draft transport LP (Hu et al. Eq. 7/9) solved by
  brute force over every draft tuple, for tiny vocabularies.
- ``draft_prob_of_set``: Q(H) for one token set H, to check the alpha* prefix scan against the
  minimum over every subset.
- ``qmm_error_bound``: how far a 4-bit packed linear's product (engine.kernels.qmm: 16-bit
  activations) may be from the dequantised fp32 product, per output.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

import torch
from scipy.optimize import linprog
from scipy.sparse import coo_matrix

from engine.beams.sample import beam_sample_step
from engine.beams.search import BeamConfig, Hypothesis, StepInfo, beam_step, finalize, init_beams
from engine.core.sampling import Chooser, Warp
from engine.verify.optimal import _dist, _inputs, _q_without
from engine.verify.token import greedy_top, without

LogprobFn = Callable[[torch.Tensor], torch.Tensor]  # (K, L) running sequences -> (K, V)
LP_LIMIT = 20_000  # draft tuples the brute-force LP accepts


# ------------------------------------------------------------------ beam search / sampling


def run_beam_search(
    next_logprobs: LogprobFn, prompt_ids: torch.Tensor, cfg: BeamConfig
) -> tuple[list[Hypothesis], list[StepInfo]]:
    """Drive beam_step to the end. ``next_logprobs`` maps the running (K, L) sequences to
    (K, V) processed log-probs."""
    state = init_beams(prompt_ids, cfg)
    steps: list[StepInfo] = []
    while not state.done:
        state, info = beam_step(state, next_logprobs(state.sequences), cfg)
        steps.append(info)
    return finalize(state, cfg), steps


@torch.no_grad()
def naive_beam_search(
    model: Any,
    prompt_ids: torch.Tensor,
    cfg: BeamConfig,
    logits_processor: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
) -> tuple[list[Hypothesis], list[StepInfo]]:
    """Beam search where every step runs a full forward (no KV cache).

    logits_processor(sequences (K, L), logprobs (K, V)) -> (K, V) is applied after
    log_softmax, as transformers applies its processors.
    """

    def next_logprobs(seqs: torch.Tensor) -> torch.Tensor:
        logits = model(input_ids=seqs, use_cache=False).logits[:, -1, :].float()  # (K, V)
        lp = torch.log_softmax(logits, dim=-1)
        return lp if logits_processor is None else logits_processor(seqs, lp)

    return run_beam_search(next_logprobs, prompt_ids, cfg)


def run_beam_sampling(
    next_logprobs: LogprobFn,
    prompt_ids: torch.Tensor,
    cfg: BeamConfig,
    warp: Warp,
    rng: torch.Generator | Chooser,
    *,
    replacement: bool = True,
) -> tuple[list[Hypothesis], list[StepInfo]]:
    """Drive beam_sample_step to the end. Returns the finished hypotheses, best first."""
    state = init_beams(prompt_ids, cfg)
    steps: list[StepInfo] = []
    while not state.done:
        lp = next_logprobs(state.sequences)
        state, info = beam_sample_step(state, lp, cfg, warp, rng, replacement=replacement)
        steps.append(info)
    return finalize(state, cfg), steps


# ------------------------------------------------------------------------ brute-force LP


def draft_tuple_probs(q: torch.Tensor, n: int, scheme: str) -> dict[tuple[int, ...], float]:
    """p_draft over ordered draft tuples (Hu et al. §2.3), for tiny vocabularies only.

    Without replacement and greedy draft at most |supp q| tokens, so tuples can be shorter.
    """
    _, q = _inputs(q, q, n, scheme)
    qv = q.tolist()
    supp = [i for i, x in enumerate(qv) if x > 0]
    if len(supp) ** n > LP_LIMIT and scheme != "greedy":
        raise ValueError(f"|supp q|^n = {len(supp) ** n} tuples: for tiny vocabularies only")
    if scheme == "with_replacement":
        return {t: math.prod(qv[i] for i in t) for t in itertools.product(supp, repeat=n)}
    if scheme == "greedy":
        top = tuple(greedy_top(q, n).tolist())
        rest = without(q, list(top)).tolist()
        tuples = {top + (x,): r for x, r in enumerate(rest) if r > 0}
        return tuples or {top: 1.0}
    out: dict[tuple[int, ...], float] = {}
    for t in itertools.permutations(supp, min(n, len(supp))):
        prob = 1.0
        for k, x in enumerate(t):
            prob *= qv[x] / math.fsum(qv[j] for j in supp if j not in t[:k])
        out[t] = prob
    return out


def lp_alpha_star(p: torch.Tensor, q: torch.Tensor, n: int, scheme: str) -> float:
    """alpha* by brute force: lp_value over every draft tuple of the scheme (tiny V, n only)."""
    p, q = _inputs(p, q, n, scheme)
    return lp_value(p, draft_tuple_probs(q, n, scheme))


def lp_value(p: torch.Tensor, tuples: dict[tuple[int, ...], float]) -> float:
    """Optimum of the relaxed transport LP (Hu et al. Eq. 9 = Eq. 7 by Lemma 1), by HiGHS.

    max sum S[i, t] s.t. sum_t S[i, t] <= p(i), sum_i S[i, t] <= p_draft(t), S >= 0, and
    S[i, t] = 0 unless token i is in tuple t.

    Args:
        p: (V,) target distribution.
        tuples: p_draft as {draft tuple: probability}.
    """
    p = _dist(p, "p")
    if len(tuples) > LP_LIMIT:
        raise ValueError(f"{len(tuples)} draft tuples: the LP is for tiny V and n only")
    items = list(tuples.items())
    edges = [(i, k) for k, (t, _) in enumerate(items) for i in sorted(set(t))]
    rows = [r for i, k in edges for r in (i, p.numel() + k)]
    cols = [e for e in range(len(edges)) for _ in range(2)]
    shape = (p.numel() + len(items), len(edges))
    a_ub = coo_matrix(([1.0] * len(rows), (rows, cols)), shape=shape).tocsr()
    b_ub = p.tolist() + [prob for _, prob in items]
    tol = {"primal_feasibility_tolerance": 1e-10, "dual_feasibility_tolerance": 1e-10}
    res = linprog([-1.0] * len(edges), A_ub=a_ub, b_ub=b_ub, bounds=(0, None),
                  method="highs", options=tol)
    if res.status != 0:
        raise RuntimeError(f"LP failed: {res.message}")
    return float(-res.fun)


def draft_prob_of_set(q: torch.Tensor, n: int, scheme: str, H) -> float:
    """Q(H) = Prob[every draft lies in H] for one token set H (Hu et al. §2.3).

    Args:
        q: (V,) draft distribution.
        H: iterable of token ids.
    """
    _, q = _inputs(q, q, n, scheme)
    ids = torch.as_tensor(sorted({int(x) for x in H}), dtype=torch.long)  # (|H|,)
    if scheme == "greedy":
        top = greedy_top(q, n)
        q_rest = without(q, top.tolist())  # (V,); all zero when supp q lies inside T
        if not bool(torch.isin(top, ids).all()):
            return 0.0
        return float(q_rest[ids].sum()) if float(q_rest.sum()) > 0.0 else 1.0
    if scheme == "with_replacement":
        return min(1.0, float(q[ids].sum())) ** n
    order = torch.cat([ids, torch.nonzero(~torch.isin(torch.arange(q.numel()), ids)).flatten()])
    return float(_q_without(q[order], n)[ids.numel()])


def qmm_error_bound(w_abs: torch.Tensor, x: torch.Tensor, group: int = 32,
                    levels: int = 32767) -> torch.Tensor:
    """|error| allowed per output of engine.kernels.qmm's product against the fp32 product
    x W^T, given |W| (out, in) and x (R, in):

    - the quantised activations: each x is rounded to a step dx = max|x| / levels of its
      block, so off by at most dx / 2 (widened by 2^-10 for the rounding of x / dx itself);
    - fp32 rounding: the kernel's 2 fused multiply-adds a block (a Q8_0 weight's: one, and
      its integer's conversion to fp32) and the reference's K-term sum, each at most
      u = 2^-24 of the magnitudes summed, (|x| + dx) |W|^T.

    -> (R, out)."""
    r, k = x.shape
    xb = x.double().view(r, k // group, group)  # (R, nb, G)
    dx = (xb.abs().amax(-1, keepdim=True) / levels).expand_as(xb).reshape(r, k)  # (R, in)
    w = w_abs.double()  # (out, in)
    steps = 2 * (k // group) + 2 + k
    return (0.5 * (1 + 2**-10) * (dx @ w.T)
            + steps * 2**-24 * ((x.double().abs() + dx) @ w.T))  # (R, out)
