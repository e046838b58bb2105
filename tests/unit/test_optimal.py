"""alpha* of multi-draft speculative decoding (engine/verify/optimal.py; Hu et al. 2025).

The ground truth is the brute-force transport LP (Hu et al. Eq. 9, tests/oracles.py) over every
draft tuple, and
exact enumeration of each verifier's acceptance over every draft tuple.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from engine.bench.optimal import bench_optimal
from engine.verify.optimal import (
    ENUM_LIMIT,
    SCHEMES,
    OptimalResult,
    PrefixCurve,
    _q_without_clock,
    _q_without_enum,
    _q_without_two,
    alpha_star,
    greedy_drafts_acceptance,
    kseq_acceptance,
    prefix_curve,
    ratio_order,
    rrs_wr_acceptance,
    scan_certificate,
    tv_distance,
)
from engine.verify.token import kseq_rho
from tests.oracles import draft_prob_of_set, draft_tuple_probs, lp_alpha_star, lp_value

F64 = torch.float64


def _instance(seed: int, v_max: int = 7, n_max: int = 3) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Random (p, q, n) with V <= v_max; every third instance has zeros in p and q."""
    gen = torch.Generator().manual_seed(seed)
    v = int(torch.randint(2, v_max + 1, (1,), generator=gen))
    n = int(torch.randint(1, n_max + 1, (1,), generator=gen))
    temp = (0.3, 1.0, 3.0)[seed % 3]
    p = torch.softmax(2.0 * torch.randn(v, generator=gen, dtype=F64) / temp, 0)
    q = torch.softmax(2.0 * torch.randn(v, generator=gen, dtype=F64) / temp, 0)
    if seed % 3 == 1:  # sparse: zero out ~1/3 of each, keeping some mass
        p = p * (torch.rand(v, generator=gen) > 0.35)
        q = q * (torch.rand(v, generator=gen) > 0.35)
        p[0] += float(p.sum() == 0)
        q[-1] += float(q.sum() == 0)
    return p / p.sum(), q / q.sum(), n


SEEDS = range(30)


def _rrs_conditional(p: torch.Tensor, q: torch.Tensor, drafts, update_q: bool) -> float:
    """RRS acceptance given the drafts (Hu et al. App. A.1): sum_k a_k prod_{j<k} (1 - a_j)."""
    p_k, q_k, alpha, stay = p.clone(), q.clone(), 0.0, 1.0
    for x in drafts:
        a = 1.0 if q_k[x] <= 0 else min(1.0, float(p_k[x] / q_k[x]))
        alpha, stay = alpha + stay * a, stay * (1.0 - a)
        res = (p_k - q_k).clamp_min(0.0)
        if float(res.sum()) <= 0.0 or stay <= 0.0:
            break
        p_k = res / res.sum()
        if update_q:
            q_k = q_k.clone()
            q_k[x] = 0.0
            q_k = q_k / q_k.sum()
    return alpha


def _expected(tuples: dict, conditional) -> float:
    """Expected acceptance over the draft tuples' law."""
    return math.fsum(prob * conditional(t) for t, prob in tuples.items())


# ------------------------------------------------------------------------- LP cross-check


@pytest.mark.parametrize("scheme", SCHEMES)
def test_alpha_star_matches_the_transport_lp_on_tiny_instances(scheme):
    for seed in SEEDS:
        p, q, n = _instance(seed)
        got = alpha_star(p, q, n, scheme).alpha
        assert abs(got - lp_alpha_star(p, q, n, scheme)) < 1e-7, (seed, n, p, q)


@pytest.mark.parametrize("v, n", [(12, 3), (13, 3), (8, 4)])
def test_alpha_star_through_the_clock_integral_matches_the_lp(v, n):
    """Supports too large to enumerate (> ENUM_LIMIT ordered draws) use the integral."""
    gen = torch.Generator().manual_seed(v + n)
    p = torch.softmax(2.0 * torch.randn(v, generator=gen, dtype=F64), 0)
    q = torch.softmax(2.0 * torch.randn(v, generator=gen, dtype=F64), 0)
    assert math.perm(v, n) > ENUM_LIMIT
    got = alpha_star(p, q, n, "without_replacement").alpha
    assert got == pytest.approx(lp_alpha_star(p, q, n, "without_replacement"), abs=1e-7)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_certificate_set_attains_alpha_star(scheme):
    for seed in SEEDS:
        p, q, n = _instance(seed)
        res = alpha_star(p, q, n, scheme)
        q_h = draft_prob_of_set(q, n, scheme, res.H)  # computed independently of the scan
        assert res.alpha == pytest.approx(1.0 + float(p[list(res.H)].sum()) - q_h, abs=1e-12)
        assert res.Q_H == pytest.approx(q_h, abs=1e-12)


def test_without_replacement_q_matches_the_note_hand_example():
    q = torch.tensor([0.5, 0.3, 0.2], dtype=F64)
    # 0.5 * 0.3 / 0.5 + 0.3 * 0.5 / 0.7; the paper's W-ratio gives 0.15 / 0.31 = 0.4839
    assert draft_prob_of_set(q, 2, "without_replacement", [0, 1]) == pytest.approx(
        0.5142857142857142, abs=1e-15)


def test_generating_function_q_disagrees_with_the_lp_for_sequential_drafts():
    """The paper's Q = W_{n,H} / W_{n,Sigma} (Hu et al. §4.2.2) fits conditional-Poisson sets
    only (docs/derivations.md, Optimal multi-draft).

    Plugged into the same scan it matches the LP for conditional-Poisson drafts and misses
    the LP for sequential drafts: the LP check can fail.
    """
    worst = 0.0
    for seed in range(12):
        p, q, _ = _instance(seed, v_max=6)
        n = 2 + seed % 2
        if int((q > 0).sum()) <= n:
            continue
        curve = prefix_curve(p, q, n, "without_replacement")
        wrong = PrefixCurve(curve.order, curve.P, _q_generating_function(q[curve.order], n))
        alpha_gf = scan_certificate(wrong, "conditional_poisson", n).alpha
        assert alpha_gf == pytest.approx(lp_value(p, _conditional_poisson(q, n)), abs=1e-7)
        worst = max(worst, abs(alpha_gf - lp_alpha_star(p, q, n, "without_replacement")))
    assert worst > 1e-2


def _q_generating_function(qs: torch.Tensor, n: int) -> torch.Tensor:
    """Hu et al. §4.2.2 Q(H_i) = e_n(q on H_i) / e_n(q), by the W recurrence."""
    w = [1.0] + [0.0] * n
    out = [0.0]
    for x in qs.tolist():
        w = [1.0] + [w[k] + x * w[k - 1] for k in range(1, n + 1)]
        out.append(w[n])
    return torch.tensor(out, dtype=F64) / out[-1]


def _conditional_poisson(q: torch.Tensor, n: int) -> dict:
    """Unordered n-sets S with Prob(S) proportional to prod_{i in S} q(i)."""
    sets = {s: math.prod(q[list(s)].tolist()) for s in itertools.combinations(range(len(q)), n)}
    total = math.fsum(sets.values())
    return {s: w / total for s, w in sets.items() if w > 0}


# ---------------------------------------------------------------- Q for sequential drafts


def test_exponential_clock_q_matches_enumeration_to_1e8():
    gen = torch.Generator().manual_seed(3)
    for trial in range(24):
        n = 3 + trial % 2
        v = int(torch.randint(n + 1, 10, (1,), generator=gen))
        q = torch.softmax(3.0 * torch.randn(v, generator=gen, dtype=F64), 0)
        if trial % 4 == 0:  # peaked: 1 - q_max computed naively would cancel
            q[0], q[1:] = 1.0 - 1e-9, 1e-9 * torch.rand(v - 1, generator=gen, dtype=F64)
        if trial % 4 == 1:  # two near-equal heavy tokens
            q[:2], q[2:] = 0.49, 0.02 * torch.rand(v - 2, generator=gen, dtype=F64)
        q = q / q.sum()
        err = (_q_without_clock(q, n) - _q_without_enum(q, n)).abs().max()
        assert float(err) < 1e-8, (trial, q)


def test_two_draft_closed_form_matches_enumeration_and_the_clock_at_large_v():
    gen = torch.Generator().manual_seed(4)
    small = torch.softmax(2.0 * torch.randn(7, generator=gen, dtype=F64), 0)
    torch.testing.assert_close(_q_without_two(small), _q_without_enum(small, 2),
                               atol=1e-14, rtol=0)
    big = torch.softmax(3.0 * torch.randn(5000, generator=gen, dtype=F64), 0)
    torch.testing.assert_close(_q_without_clock(big, 2), _q_without_two(big), atol=1e-9, rtol=0)


def test_prefix_scan_is_the_subset_minimum_for_sequential_drafts():
    """Hu et al. Thm. 6 needs q-convexity, which sequential Q can lack (docs/derivations.md)."""
    for seed in range(40):
        p, q, _ = _instance(seed, v_max=6)
        n = 2 + seed % 3
        best = min(float(p[list(h)].sum()) - draft_prob_of_set(q, n, "without_replacement", h)
                   for k in range(len(p) + 1) for h in itertools.combinations(range(len(p)), k))
        assert alpha_star(p, q, n, "without_replacement").alpha == pytest.approx(1.0 + best,
                                                                                abs=1e-12)


# ------------------------------------------------------------ verifiers versus alpha*


def test_rrs_and_kseq_closed_forms_match_enumeration_and_stay_below_alpha_star():
    for seed in SEEDS:
        p, q, n = _instance(seed)
        tuples = draft_tuple_probs(q, n, "with_replacement")
        rrs = _expected(tuples, lambda t: _rrs_conditional(p, q, t, update_q=False))
        rho = kseq_rho(p, q, n)
        accept = [min(1.0, float(p[x] / (rho * q[x]))) for x in range(len(q))]
        kseq = _expected(tuples, lambda t: 1.0 - math.prod(1.0 - accept[x] for x in t))
        assert rrs_wr_acceptance(p, q, n) == pytest.approx(rrs, abs=1e-12)
        assert kseq_acceptance(p, q, n) == pytest.approx(kseq, abs=1e-12)
        bound = alpha_star(p, q, n, "with_replacement").alpha
        assert rrs <= bound + 1e-12 and kseq <= bound + 1e-12
        assert kseq >= (1.0 - math.exp(-1.0)) * bound - 1e-12  # SpecTr's guarantee (§6.4)


def test_rrs_without_replacement_stays_below_its_alpha_star():
    gaps = []
    for seed in SEEDS:
        p, q, n = _instance(seed)
        tuples = draft_tuple_probs(q, n, "without_replacement")
        rrs = _expected(tuples, lambda t: _rrs_conditional(p, q, t, update_q=True))
        gaps.append(alpha_star(p, q, n, "without_replacement").alpha - rrs)
    assert min(gaps) > -1e-12
    assert max(gaps) > 1e-3  # and is strictly suboptimal somewhere


def test_greedy_verifier_attains_alpha_star_of_greedy_drafts():
    for seed in SEEDS:
        p, q, n = _instance(seed)
        tuples = draft_tuple_probs(q, n, "greedy")

        def conditional(t):  # Hu et al. §5.2: a + (1 - a) P(T) / Z' on the random draft
            top = list(t[:-1]) if len(t) == n else list(t)
            if len(t) < n:  # supp q inside T: output ~ p
                return float(p[top].sum())
            rest = q.clone()
            rest[top] = 0.0
            rest = rest / rest.sum()
            a = min(1.0, float(p[t[-1]] / rest[t[-1]]))
            z = float((p - rest).clamp_min(0.0).sum())
            return a + (1.0 - a) * float(p[top].sum()) / z if z > 0 else a

        verifier = _expected(tuples, conditional)
        assert verifier == pytest.approx(alpha_star(p, q, n, "greedy").alpha, abs=1e-12)
        assert verifier == pytest.approx(greedy_drafts_acceptance(p, q, n), abs=1e-12)


def test_without_replacement_never_below_with_replacement():
    """Always true: sequential draws are the first n distinct values of an i.i.d. stream, so
    their set contains the i.i.d. drafts' set, and a with-replacement verifier fed a
    simulated stream loses nothing (observed numerically; this coupling proves it)."""
    for seed in range(60):
        p, q, n = _instance(seed, v_max=60, n_max=4)
        wo = alpha_star(p, q, n, "without_replacement").alpha
        assert wo >= alpha_star(p, q, n, "with_replacement").alpha - 1e-9


# ----------------------------------------------------------------------- special cases


@pytest.mark.parametrize("scheme", SCHEMES)
def test_single_draft_is_one_minus_total_variation(scheme):
    for seed in SEEDS:
        p, q, _ = _instance(seed, v_max=50)
        assert alpha_star(p, q, 1, scheme).alpha == pytest.approx(1.0 - tv_distance(p, q),
                                                                  abs=1e-12)
    assert rrs_wr_acceptance(p, q, 1) == pytest.approx(1.0 - tv_distance(p, q), abs=1e-12)
    assert kseq_acceptance(p, q, 1) == pytest.approx(1.0 - tv_distance(p, q), abs=1e-12)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_identical_distributions_accept_surely(scheme):
    gen = torch.Generator().manual_seed(5)
    p = torch.softmax(torch.randn(300, generator=gen, dtype=F64), 0)
    for n in (1, 2, 3, 4):
        assert alpha_star(p, p, n, scheme).alpha == pytest.approx(1.0, abs=1e-9)
        assert alpha_star(p, p, n, scheme).H == ()


def test_alpha_star_on_a_hand_instance():
    p = torch.tensor([0.0, 0.5, 0.5], dtype=F64)
    q = torch.tensor([0.5, 0.5, 0.0], dtype=F64)
    # with replacement, n = 2: H = {0, 1} gives 1 + 0.5 - 1 = 0.5; H = {0} gives 1 - 0.25
    assert alpha_star(p, q, 2, "with_replacement") == OptimalResult(
        0.5, (0, 1), 0.5, 1.0, "with_replacement", 2)
    # without replacement both tokens are always drafted: alpha* = P({0, 1}) = 0.5
    assert alpha_star(p, q, 2, "without_replacement").alpha == pytest.approx(0.5, abs=1e-15)
    # greedy: T = {0} (tie to the lower id), q' = one-hot on 1 -> P(T) + min(p, q') = 0.5
    assert greedy_drafts_acceptance(p, q, 2) == pytest.approx(0.5, abs=1e-15)
    assert ratio_order(p, q).tolist() == [0, 1, 2]


def test_float32_inputs_give_the_float64_answer():
    gen = torch.Generator().manual_seed(6)
    p = torch.softmax(torch.randn(2000, generator=gen), 0)  # float32
    q = torch.softmax(torch.randn(2000, generator=gen), 0)
    for scheme in SCHEMES:
        got = alpha_star(p, q, 3, scheme).alpha
        assert got == pytest.approx(alpha_star(p.double(), q.double(), 3, scheme).alpha,
                                    abs=1e-9)


@pytest.mark.parametrize("bad", [
    dict(p=torch.tensor([0.5, -0.1, 0.6]), n=2, scheme="greedy"),
    dict(p=torch.tensor([0.5, 0.5]), n=2, scheme="greedy"),
    dict(p=torch.tensor([0.2, 0.3, 0.5]), n=0, scheme="greedy"),
    dict(p=torch.tensor([0.2, 0.3, 0.5]), n=2, scheme="beam"),
    dict(p=torch.zeros(3), n=2, scheme="greedy"),
])
def test_bad_inputs_raise_value_error(bad):
    with pytest.raises(ValueError):
        alpha_star(bad["p"], torch.tensor([0.2, 0.3, 0.5]), bad["n"], bad["scheme"])


def test_benchmark_reports_every_scheme_and_n():
    out = bench_optimal(V=500, ns=(2, 3), repeats=1)
    assert sorted(out) == sorted(f"{s}/n={n}" for s in SCHEMES for n in (2, 3))
    assert all(ms > 0 for ms in out.values())
