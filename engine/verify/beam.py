"""Beam-level verification rules: DSBD layer verification and width DP, AtSpeed relaxed.

Pure functions, no model. A candidate is a ``(parent, token)`` pair: ``parent`` indexes the rows
of the step's ``(B, V)`` distributions (the draft's parent beams), ``token`` the vocabulary.
p = target, q = draft; both are beam laws (DSBD Eq. 1, ``engine.beams.sample.beam_law``). Every
random draw goes through ``as_chooser(rng)``; inputs are never mutated (all arithmetic runs on
float64 copies).

- DSBD: "Dynamic-Width Speculative Beam Decoding for LLM Inference" (Qin et al., AAAI'25):
  ``acceptance_alphas`` (Eq. 4), ``width_distribution`` (Eq. 2-3), ``choose_width``
  (Eq. 5-7), ``verify_layer`` (§3.1, Alg. 1), ``bonus_layer``.
- AtSpeed: "Efficient Inference for LLM-based Generative Recommendation" (Lin et al., ICLR'25):
  ``relaxed_verify_step`` and ``relaxed_bonus_step`` (§3.2, Alg. 2 as its released code
  resolves it). AtSpeed's strict top-K verification (Alg. 1) needs no rule here: the
  ``atspeed_strict`` method replays the target's beam search (``engine.beams.search``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.contract import trace
from engine.core.sampling import EPS, Chooser, as_chooser, draw_without_replacement, residual

Pair = tuple[int, int]  # (parent row, token id)
Rng = torch.Generator | Chooser

ACCEPT, REJECT, AUTO_REJECT, SKIP = "accept", "reject", "auto_reject", "skip"
OUTCOME_ACCEPTED, OUTCOME_CORRECTED, OUTCOME_BONUS = "accepted", "corrected", "bonus"
_STATUS = {ACCEPT: trace.ACCEPTED, REJECT: trace.REJECTED, AUTO_REJECT: trace.AUTO_REJECTED,
           SKIP: trace.SKIPPED}
_TAIL_TOL = 1e-12  # P(>= K) >= t is tested with this slack so float sums do not flip a width


@dataclass(frozen=True)
class BeamTest:
    """One drafted (parent, token) candidate as a beam rule saw it, in draft order."""

    index: int  # draft order j within the step (0-based)
    parent: int
    token: int
    p: float  # p'(x): current (residual) target mass used by the test
    p_beam: float  # unmodified target mass of x
    q: float  # draft mass of x
    ratio: float  # min(1, p'/q); 0 for auto-rejects; would-have-been value for skips
    uniform: float | None  # None where no draw was made (auto_reject, skip)
    decision: str  # accept | reject | auto_reject | skip
    level: int = 1  # k of the active residual p_k (1 = p reset to p_beam)
    residual_mass: float | None = None  # mass of max(p' - q_v, 0) after a (auto-)reject

    @property
    def status(self) -> str:
        """Forest-node status (engine.contract.trace constant) for this decision."""
        return _STATUS[self.decision]

    def record(self, node: int, tree: int, depth: int) -> trace.TestRecord:
        """The trace record of this test, once the loop knows the forest node."""
        return trace.TestRecord(node, tree, depth, self.token, self.p, self.q, self.ratio,
                                self.uniform, self.decision, self.residual_mass,
                                note=f"parent={self.parent} j={self.index} k={self.level}")


@dataclass(frozen=True)
class LayerVerdict:
    """Outcome of verifying one draft layer (DSBD) or step (AtSpeed relaxed): the tests and
    the output beams, with where each came from."""

    tests: tuple[BeamTest, ...]
    width: int  # DSBD W_L^(l) / AtSpeed K: accepts needed for the step to pass
    accepted: int  # number of accepted candidates (DSBD: stops counting at width)
    outcome: str  # accepted | corrected | bonus
    beams: tuple[Pair, ...]  # output (parent, token) pairs, in output order
    origins: tuple[str, ...]  # trace.ACCEPTED / RESAMPLED / TARGET (fresh p sample) / BONUS
    sources: tuple[int, ...]  # draft index j of each output beam, -1 if not a draft
    residual_mass: float | None = None  # AtSpeed: mass of max(0, p - q) at a rejected step
    fallback: bool = False  # AtSpeed: residual empty, drew from p instead

    @property
    def step_accepted(self) -> bool:
        return self.outcome == OUTCOME_ACCEPTED


# ---------------------------------------------------------------- DSBD width (Eq. 2-7)


def acceptance_alphas(
    p_beam: torch.Tensor, q_beam: torch.Tensor, n: int, parent_valid: Sequence[bool] | None = None
) -> tuple[float, ...]:
    """DSBD Eq. 4: alpha_j = sum_x min(p_j, q_v); p_1 = p_beam, p_{j+1} = norm(max(p_j - q_v, 0)).

    alpha_j = P(draft j accepted | the j-1 drafts since the last reset were rejected). Depends
    only on (p_beam, q_beam, parents), never on the layer's drafts: compute it before them.

    Args:
        p_beam, q_beam: (B, V) target / draft beam distributions of the layer.
        n: number of drafts W_S in the layer.
        parent_valid: (B,) False for parents the target rejected; their q mass stays in q_v as 0
            (not renormalised), as in ``verify_layer``.
    """
    p, _, q_v, _ = _flatten(p_beam, q_beam, parent_valid)
    alphas, p_j = [], p
    for _ in range(n):
        alphas.append(min(1.0, float(torch.minimum(p_j, q_v).sum())))
        p_j, _ = residual(p_j, q_v)
    return tuple(alphas)


def width_distribution(alphas: Sequence[float] | torch.Tensor) -> torch.Tensor:
    """DSBD Eq. 2-3: P(W_S, k), the law of the number k of accepts among W_S drafts.

    P(m, k) = sum_{i=1}^{m} Ptilde(i) P(m - i, k - 1), Ptilde(i) = alpha_i prod_{j<i}(1 - alpha_j)
    (Eq. 3; the alpha sequence restarts after each accept because p' resets), P(0, 0) = 1,
    P(m, k) = 0 for k > m, and the base case the paper omits: P(m, 0) = prod_{j<=m}(1 - alpha_j).

    Args:
        alphas: (W_S,) alpha_1..alpha_{W_S} from ``acceptance_alphas``.
    Returns:
        (W_S + 1,) float64, entry k = P(W_S, k).
    """
    a = [float(x) for x in torch.as_tensor(alphas, dtype=torch.float64).reshape(-1)]
    m = len(a)
    first, survive = [], 1.0  # first[i-1] = Ptilde(i), Eq. 3
    for alpha in a:
        first.append(alpha * survive)
        survive *= 1.0 - alpha
    table = [[0.0] * (m + 1) for _ in range(m + 1)]  # table[n][k] = P(n, k)
    table[0][0] = 1.0
    for n in range(1, m + 1):
        table[n][0] = table[n - 1][0] * (1.0 - a[n - 1])
        for k in range(1, n + 1):
            table[n][k] = sum(first[i - 1] * table[n - i][k - 1] for i in range(1, n + 1))
    return torch.tensor(table[m], dtype=torch.float64)


@dataclass(frozen=True)
class WidthDecision:
    """DSBD Eq. 5-7 for one layer, computed before the layer's draws."""

    alphas: tuple[float, ...]  # alpha_1..alpha_{W_S} (Eq. 4)
    probs: tuple[float, ...]  # P(W_S, k), k = 0..W_S (Eq. 2-3)
    tails: tuple[float, ...]  # P(>= K accepted) = 1 - sum_{k<K} P(W_S, k), K = 0..W_S (Eq. 5)
    threshold: float  # t
    w_min: int
    w_max: int
    w_tilde: int  # Eq. 7: largest K with P(>= K) >= t
    width: int  # Eq. 6: max(W_min, w_tilde), capped at w_max
    expected: float  # E[#accepted] = sum_k k P(W_S, k)
    beta_min: float  # beta_{W_min} = P(>= W_min accepted)


def choose_width(
    alphas: Sequence[float] | torch.Tensor, t: float, w_min: int = 1, w_max: int | None = None
) -> WidthDecision:
    """DSBD Eq. 5-7: W_L^(l) = max(W_min, max{K : P(>= K of W_S accepted) >= t}), <= w_max.

    Eq. 5 is read with k = 0..K-1 and W_S (the paper prints k = 1 and M_S: typos).

    Args:
        alphas: (W_S,) from ``acceptance_alphas``. t: threshold in [0, 1].
        w_min: floor W_min (>= 1). w_max: cap (default W_S); needs w_min <= w_max <= W_S.
    """
    probs = width_distribution(alphas)  # (W_S + 1,)
    m = probs.numel() - 1
    w_max = m if w_max is None else w_max
    if not 1 <= w_min <= w_max <= m:
        raise ValueError(f"need 1 <= w_min={w_min} <= w_max={w_max} <= W_S={m}")
    if not 0.0 <= t <= 1.0:
        raise ValueError(f"threshold t={t} is outside [0, 1]")
    tails = probs.flip(0).cumsum(0).flip(0)  # (W_S + 1,) P(>= K)
    w_tilde = max(k for k in range(m + 1) if k == 0 or float(tails[k]) >= t - _TAIL_TOL)
    ks = torch.arange(m + 1, dtype=torch.float64)
    return WidthDecision(
        alphas=tuple(float(x) for x in torch.as_tensor(alphas, dtype=torch.float64)),
        probs=tuple(probs.tolist()), tails=tuple(tails.tolist()), threshold=float(t),
        w_min=w_min, w_max=w_max, w_tilde=w_tilde, width=min(w_max, max(w_min, w_tilde)),
        expected=float((ks * probs).sum()), beta_min=float(tails[w_min]),
    )


# ---------------------------------------------------------------- DSBD layer verification


def verify_layer(
    p_beam: torch.Tensor, q_beam: torch.Tensor, candidates: Sequence[Pair], width: int, rng: Rng,
    *, parent_valid: Sequence[bool] | None = None, fill_to: int | None = None,
) -> LayerVerdict:
    """DSBD §3.1 / Alg. 1 lines 12-31: verify one draft layer, correct it if it fails.

    Drafts are tested in draft order with r < p'(x)/q_beam(x) (the paper's Alg. 1 line 17 prints
    the ratio inverted: a typo). p' resets to p_beam after an accept and becomes
    norm(max(p' - q_v, 0)) after a reject. A draft whose parent the target rejected is
    auto-rejected with the same residual update, as the released code does (q_v = q_beam
    zeroed on those parents, NOT renormalised; exact, see docs/derivations.md, DSBD). Once
    ``width`` drafts are accepted the rest are skipped and the layer passes. Otherwise the
    correction layer is: the accepted drafts, ONE sample from the final p', then fresh samples
    from p_beam up to ``fill_to``. Theorem 3.1: the output beams are i.i.d. p_beam given the
    parents, whichever way the layer ends.

    One-cache (memory-saving) mode does not change this math: it is a cache-layout option for
    the loop, which keeps one output beam (the code keeps the residual sample,
    ``beams[accepted]`` of a corrected layer; the paper keeps the lowest-perplexity beam) and
    uses ``bonus_layer(p_beam, 1, rng)``.

    Args:
        p_beam: (B, V) target beam distribution (Eq. 1) over the layer's parents x V, zero on
            rows of parents the target rejected at the previous layer.
        q_beam: (B, V) the draft's beam distribution the candidates were drawn from (i.i.d.,
            with replacement, for exactness).
        candidates: the W_S drafted (parent, token) pairs in draft order.
        width: W_L^(l) from ``choose_width`` (computed before the draws).
        rng: torch.Generator or Chooser.
        parent_valid: (B,) False for parents rejected at the previous layer (default: all valid).
        fill_to: output width of a corrected layer (default ``width``; the code uses W_S).
    """
    fill_to = width if fill_to is None else fill_to
    if not 1 <= width <= fill_to:
        raise ValueError(f"need 1 <= width={width} <= fill_to={fill_to}")
    chooser = as_chooser(rng)
    p, q, q_v, valid = _flatten(p_beam, q_beam, parent_valid)
    vocab = p_beam.shape[-1]
    tests, accepted, p_res = _test_layer(p, q, q_v, valid, candidates, vocab, width, chooser)
    if len(accepted) == width:
        beams = tuple(candidates[j] for j in accepted)
        return LayerVerdict(tuple(tests), width, width, OUTCOME_ACCEPTED, beams,
                            (trace.ACCEPTED,) * width, tuple(accepted))
    return _correct_layer(p, p_res, candidates, tests, accepted, width, fill_to, vocab, chooser)


def bonus_layer(p_beam: torch.Tensor, width: int, rng: Rng) -> LayerVerdict:
    """DSBD Alg. 1 lines 32-34: every draft layer passed; draw ``width`` beams i.i.d. from p_beam.

    Args:
        p_beam: (B, V) target beam distribution over the accepted depth-gamma beams x V.
    """
    chooser = as_chooser(rng)
    p = p_beam.detach().double().cpu().reshape(-1)  # (B*V,)
    beams = tuple(_pair(chooser.categorical(p), p_beam.shape[-1]) for _ in range(width))
    return LayerVerdict((), width, 0, OUTCOME_BONUS, beams, (trace.BONUS,) * width,
                        (-1,) * width)


def _test_layer(p, q, q_v, valid, candidates, vocab, width, chooser):
    """Sequential DSBD tests; returns (tests, accepted draft indices, final p')."""
    tests, accepted, p_res, level = [], [], p, 1
    for j, (parent, token) in enumerate(candidates):
        x = parent * vocab + token
        qx, px = _draft_mass(q, x, (parent, token)), float(p_res[x])
        ratio = min(1.0, px / qx)
        common = dict(index=j, parent=parent, token=token, p=px, p_beam=float(p[x]), q=qx)
        if len(accepted) == width:
            tests.append(BeamTest(**common, ratio=ratio, uniform=None, decision=SKIP, level=level))
            continue
        if not valid[parent]:
            ok, u, decision, ratio = False, None, AUTO_REJECT, 0.0
        else:
            ok, u = chooser.accept(ratio)
            decision = ACCEPT if ok else REJECT
        mass = None
        if ok:
            accepted.append(j)
        else:
            p_next, mass = residual(p_res, q_v)
        tests.append(BeamTest(**common, ratio=ratio, uniform=u, decision=decision,
                              level=level, residual_mass=mass))
        p_res, level = (p, 1) if ok else (p_next, level + 1)
    return tests, accepted, p_res


def _correct_layer(p, p_res, candidates, tests, accepted, width, fill_to, vocab, chooser):
    """DSBD correction layer: accepted drafts + one residual sample + fresh p_beam samples."""
    beams = [candidates[j] for j in accepted]
    origins, sources = [trace.ACCEPTED] * len(accepted), list(accepted)
    beams.append(_pair(chooser.categorical(p_res), vocab))
    origins.append(trace.RESAMPLED)
    sources.append(-1)
    while len(beams) < fill_to:
        beams.append(_pair(chooser.categorical(p), vocab))
        origins.append(trace.TARGET)  # fresh sample from p_beam
        sources.append(-1)
    return LayerVerdict(tuple(tests), width, len(accepted), OUTCOME_CORRECTED, tuple(beams),
                        tuple(origins), tuple(sources))


# ---------------------------------------------------------------- AtSpeed


def relaxed_verify_step(
    p: torch.Tensor, q: torch.Tensor, drafted: Sequence[Pair], k: int, rng: Rng
) -> LayerVerdict:
    """AtSpeed §3.2 / Alg. 2 as the released code resolves it: relaxed sampling verification.

    Each of the N drafts is tested independently with r < min(1, p/q). With >= K accepts the
    step passes and K of the accepted are kept, chosen uniformly at random, in draft order.
    Otherwise the K - #accepted missing beams are drawn without replacement from
    norm(max(0, p - q)) with the accepted pairs zeroed (falling back to p when that is empty).
    APPROXIMATE BY DESIGN: the output law is only close to the target's sampling beam search
    (distinct outputs, all-or-nothing steps, random K-subset); no exactness is claimed.

    Args:
        p: (B, V) target distribution over children of the target's current beams, embedded in
            the drafts' (parent, token) index space (zero elsewhere).
        q: (B, V) the draft distribution the N candidates were drawn from.
        drafted: the N drafted (parent, token) pairs in draft order.
        k: target beam count K.
    """
    chooser = as_chooser(rng)
    pf, qf = (t.detach().double().cpu().reshape(-1) for t in (p, q))  # (B*V,)
    vocab = p.shape[-1]
    tests, accepted = [], []
    for j, (parent, token) in enumerate(drafted):
        x = parent * vocab + token
        qx, px = _draft_mass(qf, x, (parent, token)), float(pf[x])
        ok, u = chooser.accept(min(1.0, px / qx))
        tests.append(BeamTest(j, parent, token, px, px, qx, min(1.0, px / qx), u,
                              ACCEPT if ok else REJECT))
        accepted += [j] if ok else []
    if len(accepted) >= k:
        keep = sorted(_uniform_subset(accepted, k, chooser))
        return LayerVerdict(tuple(tests), k, len(accepted), OUTCOME_ACCEPTED,
                            tuple(drafted[j] for j in keep), (trace.ACCEPTED,) * k, tuple(keep))
    res = (pf - qf).clamp_min(0)  # (B*V,) unnormalised residual
    taken = [drafted[j][0] * vocab + drafted[j][1] for j in accepted]
    extra, fallback = _draw_distinct(res, pf, taken, k - len(accepted), chooser)
    beams = tuple(drafted[j] for j in accepted) + tuple(_pair(x, vocab) for x in extra)
    return LayerVerdict(tuple(tests), k, len(accepted), OUTCOME_CORRECTED, beams,
                        (trace.ACCEPTED,) * len(accepted) + (trace.RESAMPLED,) * len(extra),
                        tuple(accepted) + (-1,) * len(extra), float(res.sum()), fallback)


def relaxed_bonus_step(p: torch.Tensor, k: int, rng: Rng) -> LayerVerdict:
    """AtSpeed Alg. 2, step gamma+1: K distinct beams drawn without replacement from p (B, V)."""
    pf = p.detach().double().cpu().reshape(-1)  # (B*V,)
    extra, fallback = _draw_distinct(pf, pf, [], k, as_chooser(rng))
    beams = tuple(_pair(x, p.shape[-1]) for x in extra)
    return LayerVerdict((), k, 0, OUTCOME_BONUS, beams, (trace.BONUS,) * k, (-1,) * k, None,
                        fallback)


# ---------------------------------------------------------------- helpers


def _flatten(p_beam, q_beam, parent_valid):
    """(B*V,) float64 p, q, q_v (q zeroed on invalid parents, not renormalised) + (B,) validity."""
    if p_beam.dim() != 2 or p_beam.shape != q_beam.shape:
        raise ValueError(f"p_beam {tuple(p_beam.shape)} and q_beam {tuple(q_beam.shape)} "
                         "must both be (B, V)")
    rows = p_beam.shape[0]
    valid = [True] * rows if parent_valid is None else [bool(v) for v in parent_valid]
    if len(valid) != rows:
        raise ValueError(f"parent_valid has {len(valid)} entries for {rows} parents")
    p = p_beam.detach().double().cpu()  # (B, V)
    q = q_beam.detach().double().cpu()  # (B, V)
    mask = torch.tensor(valid, dtype=torch.float64)[:, None]  # (B, 1)
    if float((p * (1 - mask)).sum()) > EPS:
        raise ValueError("p_beam has mass on a parent marked invalid")
    return p.reshape(-1), q.reshape(-1), (q * mask).reshape(-1), valid


def _draft_mass(q: torch.Tensor, x: int, pair: Pair) -> float:
    """q(x) of a drafted candidate; a zero means it cannot have been drafted from q."""
    qx = float(q[x])
    if qx <= 0.0:
        raise ValueError(f"candidate {pair} has zero draft probability")
    return qx


def _pair(flat_index: int, vocab: int) -> Pair:
    """Flat (B*V) index -> (parent, token)."""
    return (int(flat_index) // vocab, int(flat_index) % vocab)


def _uniform_subset(items: list[int], k: int, chooser: Chooser) -> list[int]:
    """k of items chosen uniformly without replacement (one categorical per pick)."""
    pool, picked = list(items), []
    for _ in range(k):
        i = chooser.categorical(torch.full((len(pool),), 1.0 / len(pool), dtype=torch.float64))
        picked.append(pool.pop(i))
    return picked


def _draw_distinct(dist, fallback, taken, n, chooser):
    """n draws without replacement from dist (then fallback), `taken` excluded; + fallback flag.

    Once fallback has fewer than n positive-mass pairs left, the rest repeat draws from it.
    """
    out = draw_without_replacement(dist, n, chooser, taken=taken, min_mass=EPS)
    fell_back = len(out) < n
    if fell_back:
        out += draw_without_replacement(fallback, n - len(out), chooser,
                                        taken=[*taken, *out], min_mass=EPS)
    out += [chooser.categorical(fallback / fallback.sum()) for _ in range(n - len(out))]
    return out, fell_back
