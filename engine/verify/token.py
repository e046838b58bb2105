"""Verification rules for one tree position: one parent node and its drafted children.

Every rule has the signature ``rule(p, q, candidates, rng) -> TokenVerdict`` where p is the
target distribution at the parent and q the draft distribution at the parent (both already
warped, (V,)), and ``candidates`` are the drafted child tokens in draw order. Rules work on
float64 copies (the inputs are never mutated) and make every random decision through a
:class:`~engine.core.sampling.Chooser`, so the enumerating chooser (``engine/verify/enumerate.py``)
proves them exact by running this very code.

Rules and the papers they implement:
- ``sd``: speculative sampling (Leviathan et al. 2023; Chen et al. 2023), one candidate.
- ``rrs_wr``: MCSD Alg. 1, recursive rejection sampling with i.i.d. drafts (Yang et al. 2024).
- ``rrs_wor``: MCSD Alg. 2, drafts drawn without replacement, q updated after each rejection.
- ``naive``: MCSD's MCNS ablation (MCSD §4.5, footnote 5).
- ``kseq``: SpecTr K-SEQ (Sun et al. 2023; Hu et al. App. A.2) with a corrected fallback
  (docs/derivations.md, Optimal multi-draft).
- ``greedy_drafts``: Hu et al. 2025 §5 greedy drafts with their optimal verifier.

Acceptance event (Hu et al. §2.3): ``TokenVerdict.accepted`` is set whenever the emitted token is
one of the candidates, including a final residual draw that lands on a candidate. Only
``greedy_drafts`` (a draw landing on a top-(n-1) draft) and ``naive`` do that with positive
probability. Either way the tree walk can descend into that child.

One-hot inputs (temperature 0; MCSD §4.5). When p is one-hot on a, every rule emits a, and it
accepts exactly when a is among the candidates. This is exact argmax matching. It holds for any
candidate list, because a candidate with q(x) = 0 and p(x) > 0 gets ratio 1 (the limit of
min(1, p/q)). When q is one-hot on b and p is not (greedy draft, sampled target), i.i.d.
drafting gives n copies of b. RRS accepts the first copy with probability p(b); every repeat
then has ratio 0. K-SEQ tests each copy with min(1, p(b)/rho), and its total acceptance is
also p(b). The emitted token follows p in every case. Choosing candidates
deterministically at temperature 0 is the caller's job; see :func:`draw_candidates`.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch

from engine.contract.trace import TestRecord
from engine.core.sampling import EPS, Chooser, as_chooser, draw_without_replacement, residual

ACCEPT = "accept"
REJECT = "reject"
KSEQ_ITERS = 64  # bisection halvings of [1, n]: ~1e-19 relative width, below float64 resolution
Y_NOTE = "y={}"  # naive's note: the token drawn from p (the one note that names a token)


@dataclass(frozen=True)
class TokenVerdict:
    """Outcome of verifying one sibling group."""

    accepted: int | None  # index into candidates of the accepted one; None = all rejected
    token: int  # accepted candidate's token, or the token drawn from the final residual
    tests: tuple[TestRecord, ...]  # one per tested candidate, in test order
    residual_mass: float | None  # mass of the final residual when the token came from it


Rule = Callable[
    [torch.Tensor, torch.Tensor, Sequence[int], "torch.Generator | Chooser"], TokenVerdict
]


# ---------------------------------------------------------------------------- helpers


def _f64(x: torch.Tensor) -> torch.Tensor:
    """Detached float64 copy (rules never touch their inputs)."""
    return x.detach().to(torch.float64, copy=True)


def _ratio(px: float, qx: float) -> float:
    """min(1, p/q); a token with q = 0 gets the limit (1 if p > 0, else 0)."""
    if qx <= 0.0:
        return 1.0 if px > 0.0 else 0.0
    return min(1.0, px / qx)


def without(q: torch.Tensor, tokens: Sequence[int]) -> torch.Tensor:
    """q^{¬S}: q with `tokens` zeroed and renormalised; all zeros if no mass is left.

    The normaliser is summed over the remaining tokens, never computed as 1 - q(S)
    (that subtraction cancels for peaked q).
    """
    r = q.clone()  # (V,)
    if len(tokens):
        r[list(tokens)] = 0.0
    mass = float(r.sum())
    return r / mass if mass > 0.0 else r


def _index(candidates: Sequence[int], token: int) -> int | None:
    """First index of token among candidates, or None."""
    for i, x in enumerate(candidates):
        if x == token:
            return i
    return None


def _record(
    i: int, x: int, px: float, qx: float, ratio: float, u: float | None, ok: bool,
    mass: float | None, note: str = "",
) -> TestRecord:
    """TestRecord for candidate i (node = candidate index; the caller remaps tree/depth)."""
    return TestRecord(
        node=i, tree=0, depth=0, token_id=int(x), p=px, q=qx, ratio=ratio, uniform=u,
        decision=ACCEPT if ok else REJECT, residual_mass=None if ok else mass, note=note,
    )


def _final_draw(
    dist: torch.Tensor, candidates: Sequence[int], chooser: Chooser,
    tests: list[TestRecord], mass: float,
) -> TokenVerdict:
    """Draw the endpoint token from the final residual `dist` (V,)."""
    token = chooser.categorical(dist)
    return TokenVerdict(_index(candidates, token), token, tuple(tests), mass)


# ------------------------------------------------------------------ recursive rejection


def _recursive_rejection(
    p: torch.Tensor, q: torch.Tensor, candidates: Sequence[int], chooser: Chooser,
    *, update_q: bool, start: int = 0,
) -> TokenVerdict:
    """MCSD Alg. 1 (update_q=False) / Alg. 2 (update_q=True) on candidates[start:].

    p_1 = p, q_1 = q; accept x_i w.p. min(1, p_i(x_i)/q_i(x_i)); on rejection
    p_{i+1} = norm(max(0, p_i - q_i)) and, for Alg. 2, q_{i+1} = q_i^{¬x_i}.
    """
    p_cur, q_cur = p, q  # read only until the first rejection, then float64 copies
    copied = False
    tests: list[TestRecord] = []
    mass = 1.0
    for i in range(start, len(candidates)):
        x = int(candidates[i])
        px, qx = float(p_cur[x]), float(q_cur[x])  # exact in float64 either way
        ratio = _ratio(px, qx)
        ok, u = chooser.accept(ratio)
        if ok:
            tests.append(_record(i, x, px, qx, ratio, u, True, None))
            return TokenVerdict(i, x, tuple(tests), None)
        if not copied:
            p_cur, q_cur, copied = _f64(p), _f64(q), True  # (V,), (V,)
        p_cur, mass = residual(p_cur, q_cur)  # (V,) Res^{p_i - q_i}; zero mass falls back
        tests.append(_record(i, x, px, qx, ratio, u, False, mass))
        if update_q:
            q_cur = without(q_cur, [x])  # (V,) q_{i+1} = q_i^{¬x_i}
    if not copied:  # no candidate tested: the draw is from p itself
        p_cur = _f64(p)
    return _final_draw(p_cur, candidates, chooser, tests, mass)


def sd(p: torch.Tensor, q: torch.Tensor, candidates: Sequence[int],
       rng: torch.Generator | Chooser) -> TokenVerdict:
    """Speculative sampling (Leviathan et al. 2023, Chen et al. 2023) for one candidate.

    Accept x w.p. min(1, p(x)/q(x)); otherwise emit y ~ norm(max(p - q, 0)).

    Args:
        p, q: (V,) target / draft distributions at the parent.
        candidates: exactly one token, drawn from q.
    """
    if len(candidates) != 1:
        raise ValueError(f"sd verifies exactly one candidate, got {len(candidates)}")
    return _recursive_rejection(p, q, candidates, as_chooser(rng), update_q=False)


def rrs_wr(p: torch.Tensor, q: torch.Tensor, candidates: Sequence[int],
           rng: torch.Generator | Chooser) -> TokenVerdict:
    """MCSD Alg. 1 (RRS with replacement; Hu et al. App. A.1). q stays fixed.

    Exact for i.i.d. drafts from q. A repeat of a rejected token has ratio 0 but still
    updates the residual, as correctness requires (MCSD §3.2, App. A).

    Args:
        p, q: (V,) target / draft distributions at the parent.
        candidates: i.i.d. draws from q, in draw order.
    """
    return _recursive_rejection(p, q, candidates, as_chooser(rng), update_q=False)


def rrs_wor(p: torch.Tensor, q: torch.Tensor, candidates: Sequence[int],
            rng: torch.Generator | Chooser) -> TokenVerdict:
    """MCSD Alg. 2 (RRS without replacement; MCSD §3.2, Hu et al. App. A.1).

    The candidates are tested in draw order. The residual is taken against the current
    draft law q_i. Each rejected token is then removed from q_i, which is renormalised.

    Args:
        p, q: (V,) target / draft distributions at the parent.
        candidates: drawn sequentially without replacement from q, in draw order.
    """
    return _recursive_rejection(p, q, candidates, as_chooser(rng), update_q=True)


# ------------------------------------------------------------------------------- MCNS


def naive(p: torch.Tensor, q: torch.Tensor, candidates: Sequence[int],
          rng: torch.Generator | Chooser) -> TokenVerdict:
    """MCSD MCNS, multi-candidate naive sampling (MCSD §4.5, footnote 5).

    Draw y ~ p. Accept the first candidate equal to y; otherwise emit y. This preserves p
    exactly under every draft scheme, because the emitted token is always y ~ p. Its
    acceptance rate is only sum_y p(y) P(y in candidates), which is never above MCSD Alg. 1
    (MCSD App. C). The tests are deterministic given y, so ``uniform`` is None.
    A record's residual_mass is the p-mass outside the candidates seen so far.
    """
    chooser = as_chooser(rng)
    p64 = _f64(p)  # (V,)
    y = chooser.categorical(p64)
    off = p64.clone()  # (V,) p restricted to tokens not yet compared
    tests: list[TestRecord] = []
    for i, x in enumerate(candidates):
        x = int(x)
        ok = x == y
        off[x] = 0.0
        mass = float(off.sum())
        tests.append(_record(i, x, float(p64[x]), float(q[x]), float(ok), None, ok, mass,
                             note=Y_NOTE.format(y)))
        if ok:
            return TokenVerdict(i, y, tuple(tests), None)
    return TokenVerdict(None, y, tuple(tests), float(off.sum()))


# ------------------------------------------------------------------------------ K-SEQ


def kseq_beta(p: torch.Tensor, q: torch.Tensor, rho: float) -> float:
    """SpecTr K-SEQ: beta(rho) = sum_i min(p(i)/rho, q(i)) (Hu et al. App. A.2)."""
    return float(torch.minimum(p / rho, q).sum())


def _kseq_gap(p: torch.Tensor, q: torch.Tensor, n: int) -> Callable[[float], float]:
    """g(rho) = sum min(p, rho q) - 1 + (1 - beta(rho))^n, nondecreasing in rho.

    sum_i min(p_i, rho q_i) is piecewise linear in rho with breaks at p_i/q_i. After one
    sort, each evaluation is a binary search over the breaks.
    """
    pos = q > 0  # (V,) tokens with q = 0 add min(p, 0) = 0
    ratio = p[pos] / q[pos]  # (m,)
    order = torch.argsort(ratio)  # (m,)
    breaks = ratio[order].tolist()
    p_below = [0.0] + torch.cumsum(p[pos][order], 0).tolist()  # (m+1,) sum p with p/q < rho
    q_above = torch.cumsum(q[pos][order].flip(0), 0).flip(0).tolist() + [0.0]  # (m+1,)

    def gap(rho: float) -> float:
        k = bisect.bisect_left(breaks, rho)
        hit = p_below[k] + rho * q_above[k]  # rho * beta(rho) = sum min(p, rho q)
        return hit - 1.0 + (1.0 - hit / rho) ** n

    return gap


def kseq_rho(p: torch.Tensor, q: torch.Tensor, n: int) -> float:
    """SpecTr K-SEQ: the smallest rho in [1, n] with 1 - (1 - beta)^n <= rho beta (bisection).

    g(1) <= 0 <= g(n) (docs/derivations.md, Optimal multi-draft). The result is the upper end
    of the final bracket, so g(rho) >= 0 holds and the fallback below is non-negative.

    Args:
        p, q: (V,) target / draft distributions; n: number of drafts.
    """
    gap = _kseq_gap(_f64(p), _f64(q), n)
    lo, hi = 1.0, float(max(n, 1))
    if gap(lo) >= 0.0:
        return lo
    for _ in range(KSEQ_ITERS):
        mid = 0.5 * (lo + hi)
        if gap(mid) >= 0.0:
            hi = mid
        else:
            lo = mid
    return hi


def _kseq_fallback(p: torch.Tensor, q: torch.Tensor, rho: float, n: int) -> torch.Tensor:
    """Unnormalised K-SEQ fallback p - min(q, p/rho) (1 - (1-beta)^n)/beta
    (Hu et al. App. A.2, corrected: docs/derivations.md, Optimal multi-draft).

    At the root this equals the corrected p - min(rho q, p). The first form keeps the output
    exactly p for the rho actually used. Its mass is (1 - beta)^n.
    """
    beta = kseq_beta(p, q, rho)
    if beta <= 0.0:
        return p.clone()  # (V,) p and q/rho share no mass: every draft is rejected
    hit = -math.expm1(n * math.log1p(-beta)) if beta < 1.0 else 1.0  # 1 - (1 - beta)^n
    return (p - torch.minimum(q, p / rho) * (hit / beta)).clamp_min(0.0)  # (V,)


def kseq(p: torch.Tensor, q: torch.Tensor, candidates: Sequence[int],
         rng: torch.Generator | Chooser) -> TokenVerdict:
    """SpecTr K-SEQ (Sun et al. 2023; Hu et al. App. A.2), for i.i.d. drafts.

    Each draft is tested independently against the same p, with ratio min(1, p/(rho q)).
    If all n are rejected, the token comes from the corrected fallback. Acceptance is
    1 - (1 - beta(rho))^n. K-SEQ has a single fixed fallback, so each rejection record
    reports that fallback's mass, (1 - beta)^n.

    Args:
        p, q: (V,) target / draft distributions at the parent.
        candidates: i.i.d. draws from q; n = len(candidates).
    """
    chooser = as_chooser(rng)
    p64, q64 = _f64(p), _f64(q)  # (V,), (V,)
    n = len(candidates)
    rho = kseq_rho(p64, q64, n) if n else 1.0
    fallback = _kseq_fallback(p64, q64, rho, n)  # (V,)
    mass = float(fallback.sum())
    tests: list[TestRecord] = []
    for i, x in enumerate(candidates):
        x = int(x)
        px, qx = float(p64[x]), float(q64[x])
        ratio = _ratio(px, rho * qx)
        ok, u = chooser.accept(ratio)
        tests.append(_record(i, x, px, qx, ratio, u, ok, mass, note=f"rho={rho:.6g}"))
        if ok:
            return TokenVerdict(i, x, tuple(tests), None)
    dist = fallback / mass if mass > EPS else p64  # (V,)
    return _final_draw(dist, candidates, chooser, tests, mass)


# ----------------------------------------------------------------------- greedy drafts


def greedy_drafts(p: torch.Tensor, q: torch.Tensor, candidates: Sequence[int],
                  rng: torch.Generator | Chooser) -> TokenVerdict:
    """Verifier for Hu et al. 2025 greedy drafts, pi^Greedy (Hu et al. §5.2, App. D).

    T = candidates[:-1] are the deterministic top-(n-1) drafts and x_n = candidates[-1] is
    the random one, drawn from q' = q^{¬T}. The verifier runs single-draft speculative
    sampling between p and q' on x_n only. After a rejection, the emitted token follows
    Res^{p - q'}, which puts mass proportional to p(i) on T; a draw landing on T counts as
    accepted. The output is exactly p whatever T is. Expected acceptance is the optimum
    P(T) + sum_i min(p(i), q'(i)) (Theorem 7). If q' is empty (q's support lies inside T),
    no random draft exists: the emitted token is y ~ p, accepted when y is in T.

    Args:
        p, q: (V,) target / draft distributions at the parent.
        candidates: Top_{n-1}(q) followed by one draw from q^{¬T} (see draw_candidates).
    """
    chooser = as_chooser(rng)
    p64 = _f64(p)  # (V,)
    if not candidates:
        return _final_draw(p64, candidates, chooser, [], 1.0)
    q_rest = without(_f64(q), list(candidates[:-1]))  # (V,) q' = q^{¬T}
    if float(q_rest.sum()) <= 0.0:
        return _final_draw(p64, candidates, chooser, [], 1.0)
    return _recursive_rejection(p64, q_rest, candidates, chooser, update_q=False,
                                start=len(candidates) - 1)


# --------------------------------------------------------------------- on the support


def on_support(rule: Rule, p: tuple[Sequence[int], torch.Tensor],
               q: tuple[Sequence[int], torch.Tensor], candidates: Sequence[int],
               rng: torch.Generator | Chooser) -> TokenVerdict:
    """``rule``'s verdict from laws given on their supports: p = (ids, probs) and q likewise,
    each zero outside its ids (distinct).

    The rule runs on S = supp p ∪ supp q ∪ candidates, listed by token id, and its tokens are
    mapped back. Every rule reads p and q through indexing, element-wise operations, sums,
    cumulative sums and (kseq) a sort of p/q over q > 0, where a token outside S is 0 in both
    laws and changes nothing; and S keeps the vocabulary's order, so the inverse-CDF draw picks
    the same token. The records and the chooser's draws are the dense rule's, except that a
    float64 sum over S may group its terms differently and round differently in its last bit
    (a residual's or a renormalised q's mass). At temperature 0 that cannot change a verdict:
    p is one-hot, every residual stays one-hot, and each ratio is exactly 0 or 1. With other
    laws a decision or a draw would flip only when a uniform falls within that last bit of a
    threshold. At temperature 0, with q on the drafted tokens, this costs a few entries
    instead of vocabulary-sized float64 copies, residuals and cumulative sums.

    Args:
        p, q: ((n,) token ids, (n,) their probabilities) of the target and draft laws.
        candidates: the drafted child tokens in draw order (in S even where q is 0).
    """
    ids = sorted({*map(int, p[0]), *map(int, q[0]), *map(int, candidates)})  # S
    at = {tok: i for i, tok in enumerate(ids)}
    p_s, q_s = (torch.zeros(len(ids), dtype=torch.float64) for _ in range(2))  # (|S|,) each
    for law, (law_ids, probs) in ((p_s, p), (q_s, q)):
        if len(law_ids):
            law[[at[int(t)] for t in law_ids]] = probs.detach().double().cpu()  # (n,) placed
    v = rule(p_s, q_s, [at[int(c)] for c in candidates], rng)
    relabel = rule is naive  # the one rule whose note names a token (Y_NOTE)
    return TokenVerdict(v.accepted, ids[v.token],
                        tuple(_on_vocabulary(t, ids, relabel) for t in v.tests),
                        v.residual_mass)


def _on_vocabulary(t: TestRecord, ids: list[int], relabel_note: bool) -> TestRecord:
    """A record of a rule run on S with its token (and, for naive, its note's y) as
    vocabulary ids."""
    note = t.note
    if relabel_note:
        head = Y_NOTE.format("")
        note = Y_NOTE.format(ids[int(note[len(head):])])
    return replace(t, token_id=ids[t.token_id], note=note)


# ------------------------------------------------------------------------ draft side


def greedy_top(q: torch.Tensor, n: int) -> torch.Tensor:
    """T = Top_{n-1}(q) within supp q, in descending q, ties to the lower id (Hu et al. §5.1)."""
    k = min(n - 1, int((q > 0).sum()))
    return torch.sort(q, descending=True, stable=True).indices[:k]  # (k,)


def _draw_greedy(q: torch.Tensor, n: int, chooser: Chooser) -> list[int]:
    """Hu et al. 2025 §5.1: T = Top_{n-1}(q), then one draw from q^{¬T} if any mass is left."""
    top = greedy_top(q, n).tolist()
    if int((q > 0).sum()) > len(top):
        top.append(chooser.categorical(without(q, top)))
    return top


def draw_candidates(q: torch.Tensor, n: int, scheme: str,
                    rng: torch.Generator | Chooser) -> list[int]:
    """Draw n child tokens from the draft distribution q under a draft scheme (Hu et al. §2.3).

    Schemes:
    - "with_replacement": n i.i.d. draws from q.
    - "without_replacement": sequential draws, each from q with the earlier draws removed
      and renormalised (MCSD Eq. 1). At most |supp q| tokens are returned.
    - "greedy": Top_{n-1}(q) in descending q, then one draw from q^{¬T}. At most |supp q|
      tokens are returned.

    Tokens with q = 0 are never drafted. At temperature 0 the caller chooses candidates
    deterministically instead, as the MCSD code does (docs/derivations.md, MCSD): top-1
    repeated with q = one_hot, or the top-k with q = softmax over the top-k logits.

    Args:
        q: (V,) draft distribution at the parent.
        rng: a torch.Generator or Chooser. An enumerating chooser must branch over categoricals.
    Returns:
        candidate token ids in draw order.
    """
    chooser = as_chooser(rng)
    q64 = _f64(q)  # (V,)
    if n <= 0:
        return []
    if scheme == "with_replacement":
        return [chooser.categorical(q64) for _ in range(n)]
    if scheme == "without_replacement":
        return draw_without_replacement(q64, n, chooser)
    if scheme == "greedy":
        return _draw_greedy(q64, n, chooser)
    schemes = sorted(set(SCHEME.values()))
    raise ValueError(f"unknown draft scheme {scheme!r}; expected one of {schemes}")


RULES: dict[str, Rule] = {
    "sd": sd,
    "rrs_wr": rrs_wr,
    "rrs_wor": rrs_wor,
    "naive": naive,
    "kseq": kseq,
    "greedy_drafts": greedy_drafts,
}

# Draft scheme each rule is exact for. MCNS is exact under any scheme. The MCSD ablation
# compares it with Alg. 1, so i.i.d. drafts are its default here.
SCHEME: dict[str, str] = {
    "sd": "with_replacement",
    "rrs_wr": "with_replacement",
    "rrs_wor": "without_replacement",
    "naive": "with_replacement",
    "kseq": "with_replacement",
    "greedy_drafts": "greedy",
}
