"""Exactness and contract tests for the one-position verification rules (engine/verify/token.py).

The exactness proofs enumerate every draft draw and every rule decision with their
exact float64 probabilities (engine/verify/enumerate.py), running the production code.
"""

from __future__ import annotations

import math
from functools import lru_cache
from itertools import product

import pytest
import torch
from scipy.optimize import brentq

from engine.core.sampling import Warp, as_chooser, make_generator, probs_from_logits, residual
from engine.verify.enumerate import (
    EnumeratingChooser,
    enumerate_outcomes,
    exact_acceptance,
    exact_output_distribution,
    exact_step,
)
from engine.verify.token import (
    RULES,
    SCHEME,
    TokenVerdict,
    draw_candidates,
    kseq_beta,
    kseq_rho,
    on_support,
    without,
)
from tests.choosers import ScriptedChooser

F64 = torch.float64


def _t(*xs: float) -> torch.Tensor:
    return torch.tensor(xs, dtype=F64)


def _random_dist(seed: int, v: int, zeros: int = 0) -> torch.Tensor:
    """Seeded peaked distribution over v tokens with `zeros` entries set to 0."""
    g = make_generator(seed)
    x = torch.rand(v, generator=g, dtype=F64) ** 3 + 1e-3  # (v,)
    x[torch.randperm(v, generator=g)[:zeros]] = 0.0
    return x / x.sum()


CASES: dict[str, tuple[torch.Tensor, torch.Tensor]] = {
    "dense_v4": (_random_dist(0, 4), _random_dist(1, 4)),
    "dense_v6": (_random_dist(2, 6), _random_dist(3, 6)),
    "sparse_v5": (_random_dist(4, 5, zeros=2), _random_dist(5, 5, zeros=2)),
    "sparse_q_v6": (_random_dist(6, 6), _random_dist(7, 6, zeros=3)),
    "disjoint": (_t(0.5, 0.5, 0.0, 0.0), _t(0.0, 0.0, 0.3, 0.7)),
    "equal": (_random_dist(8, 4), _random_dist(8, 4)),
    "one_hot_p": (_t(0.0, 0.0, 1.0, 0.0, 0.0), _random_dist(9, 5)),
    "one_hot_q": (_random_dist(10, 4), _t(0.0, 1.0, 0.0, 0.0)),
}

# (rule, draft scheme) pairs the rule is exact for; MCNS is exact under every scheme.
EXACT_PAIRS = [(r, SCHEME[r]) for r in RULES] + [
    ("naive", "without_replacement"),
    ("naive", "greedy"),
]


@lru_cache(maxsize=None)
def _step(rule: str, case: str, n: int, scheme: str) -> tuple[torch.Tensor, float]:
    p, q = CASES[case]
    return exact_step(rule, p, q, n, scheme)


def _ns(rule: str, case: str) -> list[int]:
    """Draft counts to enumerate (V**3 draws for the 6-token cases are kept out for speed)."""
    if rule == "sd":
        return [1]
    return [1, 2] if CASES[case][0].numel() >= 6 else [1, 2, 3]


STEP_GRID = [(r, s, c, n) for r, s in EXACT_PAIRS for c in CASES for n in _ns(r, c)]


# ------------------------------------------------------------------ exactness


@pytest.mark.parametrize("rule,scheme,case,n", STEP_GRID)
def test_rule_output_distribution_equals_target(rule, scheme, case, n):
    p, _ = CASES[case]
    dist, _ = _step(rule, case, n, scheme)
    torch.testing.assert_close(dist, p, atol=1e-9, rtol=0)


def _rrs_wr_alpha(p: torch.Tensor, q: torch.Tensor, n: int) -> float:
    """Hu et al. App. A.1: sum_k a_k prod_{j<k} (1 - a_j), a_k = sum min(p_k, q)."""
    alpha, stay, p_k = 0.0, 1.0, p
    for _ in range(n):
        a_k = float(torch.minimum(p_k, q).sum())
        alpha, stay = alpha + stay * a_k, stay * (1.0 - a_k)
        p_k, _ = residual(p_k, q)
    return alpha


def _rrs_wor_alpha(p: torch.Tensor, q: torch.Tensor, m: int) -> float:
    """Hu et al. App. A.1, RRS without replacement: exact recursion (exponential in m)."""
    if m == 0 or float(q.sum()) <= 0:
        return 0.0
    res, _ = residual(p, q)
    out = float(torch.minimum(p, q).sum())
    for x in range(q.numel()):
        lost = float((q[x] - p[x]).clamp_min(0))
        if lost > 0:
            out += lost * _rrs_wor_alpha(res, without(q, [x]), m - 1)
    return out


def _kseq_alpha(p: torch.Tensor, q: torch.Tensor, n: int) -> float:
    """Hu et al. App. A.2: 1 - (1 - beta(rho))^n with rho from an independent root finder."""
    def g(rho: float) -> float:
        beta = float(torch.minimum(p / rho, q).sum())
        return rho * beta - 1.0 + (1.0 - beta) ** n

    rho = 1.0 if g(1.0) >= 0 else brentq(g, 1.0, float(n), xtol=1e-15)
    return 1.0 - (1.0 - float(torch.minimum(p / rho, q).sum())) ** n


def _greedy_alpha(p: torch.Tensor, q: torch.Tensor, n: int) -> float:
    """Hu et al. §5.2, Theorem 7: P(T) + sum min(p, q'), T = Top_{n-1}(q) over q's support."""
    k = min(n - 1, int((q > 0).sum()))
    top = sorted(range(q.numel()), key=lambda i: -float(q[i]))[:k]
    q_rest = without(q, top)
    return float(p[top].sum()) + float(torch.minimum(p, q_rest).sum())


def _naive_alpha(p: torch.Tensor, q: torch.Tensor, n: int) -> float:
    """MCSD MCNS (§4.5), i.i.d. drafts: sum_y p(y) (1 - (1 - q(y))^n)."""
    return float((p * (1.0 - (1.0 - q) ** n)).sum())


CLOSED_FORMS = {
    "sd": _rrs_wr_alpha,
    "rrs_wr": _rrs_wr_alpha,
    "rrs_wor": _rrs_wor_alpha,
    "kseq": _kseq_alpha,
    "greedy_drafts": _greedy_alpha,
    "naive": _naive_alpha,
}
ALPHA_GRID = [(r, c, n) for r in RULES for c in CASES for n in _ns(r, c)]


@pytest.mark.parametrize("rule,case,n", ALPHA_GRID)
def test_expected_acceptance_matches_closed_form(rule, case, n):
    p, q = CASES[case]
    _, alpha = _step(rule, case, n, SCHEME[rule])
    assert alpha == pytest.approx(CLOSED_FORMS[rule](p, q, n), abs=1e-9)


@pytest.mark.parametrize("case", list(CASES))
def test_mcss_accepts_at_least_as_often_as_mcns(case):
    # MCSD App. C: Alg. 1 never rejects more often than MCNS on i.i.d. drafts.
    for n in _ns("rrs_wr", case):
        naive_alpha = _step("naive", case, n, "with_replacement")[1]
        assert naive_alpha <= _step("rrs_wr", case, n, "with_replacement")[1] + 1e-12


def test_kseq_rho_solves_its_equation():
    p, q = CASES["dense_v6"]
    for n in (2, 3, 5):
        rho = kseq_rho(p, q, n)
        beta = kseq_beta(p, q, rho)
        assert 1.0 <= rho <= n
        assert 1.0 - (1.0 - beta) ** n == pytest.approx(rho * beta, abs=1e-12)


def test_exact_acceptance_given_candidates_matches_hand_values():
    p, q = _t(0.1, 0.4, 0.5), _t(0.5, 0.3, 0.2)
    # rrs_wor: a1 = 0.1/0.5, p2 = (0, .25, .75), q2 = (0, .6, .4), a2 = .25/.6 -> 0.2 + 0.8 * 5/12
    assert exact_acceptance("rrs_wor", p, q, [0, 1]) == pytest.approx(8 / 15, abs=1e-12)
    # rrs_wr keeps q: a2 = .25/.3 -> 0.2 + 0.8 * 5/6
    assert exact_acceptance("rrs_wr", p, q, [0, 1]) == pytest.approx(13 / 15, abs=1e-12)
    # greedy, T = [0], q' = (0, .6, .4): a = 2/3, Z' = 0.2, P(T) = 0.1 -> a + (1 - a) P(T)/Z'
    assert exact_acceptance("greedy_drafts", p, q, [0, 1]) == pytest.approx(5 / 6, abs=1e-12)
    assert exact_acceptance("greedy_drafts", p, q, [0, 2]) == pytest.approx(1.0, abs=1e-12)
    # naive: P(y in {0, 2}) = 0.6
    assert exact_acceptance("naive", p, q, [0, 2]) == pytest.approx(0.6, abs=1e-12)


def test_exact_acceptance_runs_on_a_full_vocabulary():
    v = 49_152
    p, q = _random_dist(11, v), _random_dist(12, v)
    cands = draw_candidates(q, 3, "with_replacement", make_generator(0))
    p_k, want, stay = p, 0.0, 1.0
    for x in cands:  # Hu et al. App. A.1: c(x) = sum_k a_k prod_{j<k} (1 - a_j), a_k = p_k(x)/q(x)
        a = min(1.0, float(p_k[x] / q[x]))
        want, stay = want + stay * a, stay * (1 - a)
        p_k, _ = residual(p_k, q)
    for rule in ("rrs_wr", "kseq", "naive", "greedy_drafts"):
        assert 0.0 <= exact_acceptance(rule, p, q, cands) <= 1.0
    assert exact_acceptance("rrs_wr", p, q, cands) == pytest.approx(want, abs=1e-12)


# ---------------------------------------------------------- the check can fail


def test_rrs_that_forgets_to_update_q_is_not_exact_on_distinct_drafts():
    p, q = _t(0.1, 0.4, 0.5), _t(0.5, 0.3, 0.2)
    dist = exact_output_distribution("rrs_wr", p, q, 2, scheme="without_replacement")
    torch.testing.assert_close(dist, _t(0.1, 0.5, 0.4), atol=1e-12, rtol=0)
    assert float((dist - p).abs().sum()) > 0.1


def _rrs_unnormalised(p, q, candidates, rng) -> TokenVerdict:
    """Deliberately wrong MCSD Alg. 1: tests against max(p_i - q, 0) without renormalising."""
    chooser = as_chooser(rng)
    p_cur = p.clone()
    for i, x in enumerate(candidates):
        ok, _ = chooser.accept(min(1.0, float(p_cur[x] / q[x])))
        if ok:
            return TokenVerdict(i, x, (), None)
        p_cur = (p_cur - q).clamp_min(0)
    return TokenVerdict(None, chooser.categorical(p_cur), (), None)


def test_rrs_with_unnormalised_residual_is_not_exact():
    p, q = CASES["dense_v4"]
    dist = exact_output_distribution(_rrs_unnormalised, p, q, 3, scheme="with_replacement")
    assert float((dist - p).abs().sum()) > 1e-2


# ---------------------------------------------------------------- temperature 0

ONE_HOT_CANDIDATES = [[2], [0], [0, 2], [2, 2], [0, 1], [1, 1], [0, 1, 2], [4, 3, 1]]


@pytest.mark.parametrize("rule", list(RULES))
def test_one_hot_target_always_emits_its_argmax(rule):
    p = probs_from_logits(_t(0.1, -1.0, 3.0, 0.2, 0.0), Warp(temperature=0.0)).double()
    qs = [_random_dist(13, 5), _t(0, 0, 1, 0, 0), _t(0.5, 0.5, 0, 0, 0), _t(0.7, 0, 0.1, 0, 0.2)]
    lists = [c for c in ONE_HOT_CANDIDATES if rule != "sd" or len(c) == 1]
    for q, cands in product(qs, lists):
        outcomes = enumerate_outcomes(lambda ch, q=q, c=cands: RULES[rule](p, q, c, ch))
        for w, verdict in outcomes:
            assert verdict.token == 2, (q, cands)
            assert (verdict.accepted is not None) == (2 in cands), (q, cands)


@pytest.mark.parametrize("rule", list(RULES))
def test_one_hot_target_with_drafted_candidates_emits_argmax(rule):
    p = _t(0.0, 0.0, 0.0, 1.0)
    q = _random_dist(14, 4)
    for scheme in ("with_replacement", "without_replacement", "greedy"):
        for n in [1] if rule == "sd" else [1, 2, 3]:
            dist = exact_output_distribution(rule, p, q, n, scheme=scheme)
            torch.testing.assert_close(dist, p, atol=1e-12, rtol=0)


# ------------------------------------------------------------- on the support


def _embed(x: torch.Tensor, v: int, seed: int) -> torch.Tensor:
    """x's entries at seeded random positions of a length-v zero vector."""
    out = torch.zeros(v, dtype=x.dtype)
    out[torch.randperm(v, generator=make_generator(seed))[:x.numel()]] = x
    return out


def _support(law: torch.Tensor) -> tuple[list[int], torch.Tensor]:
    """A law (V,) as on_support takes it: its nonzero entries' ids and probabilities."""
    ids = torch.nonzero(law).flatten()  # (n,)
    return ids.tolist(), law[ids]


def _on_support(rule: str, restrict_q=_support):
    """RULES[rule] through on_support, p and q handed over as their nonzero entries (or q as
    ``restrict_q`` gives it)."""
    def run(p, q, candidates, rng):
        return on_support(RULES[rule], _support(p), restrict_q(q), candidates, rng)
    return run


ON_SUPPORT_CASES = ["sparse_v5", "sparse_q_v6", "disjoint", "one_hot_p", "one_hot_q"]


@pytest.mark.parametrize("rule,scheme", EXACT_PAIRS)
@pytest.mark.parametrize("case", ON_SUPPORT_CASES)
def test_rule_on_the_support_has_the_dense_rules_exact_law(rule, scheme, case):
    p, q = (_embed(x, 40, seed=3) for x in CASES[case])  # same positions for both laws
    n = 1 if rule == "sd" else 2
    law, alpha = exact_step(rule, p, q, n, scheme)
    law_s, alpha_s = exact_step(_on_support(rule), p, q, n, scheme)
    torch.testing.assert_close(law_s, law, atol=1e-12, rtol=0)
    torch.testing.assert_close(law_s, p, atol=1e-12, rtol=0)
    assert alpha_s == pytest.approx(alpha, abs=1e-12)


def test_rule_on_the_support_with_q_cut_to_the_candidates_is_not_exact():
    """Negative control: q handed over on its two largest entries alone (its other mass
    lost) changes the residual, and the law test above catches it."""
    p, q = (_embed(x, 40, seed=3) for x in CASES["sparse_q_v6"])

    def cut(law):  # the two largest entries only
        ids = torch.topk(law, 2).indices
        return ids.tolist(), law[ids]

    law = exact_step(_on_support("rrs_wor", restrict_q=cut), p, q, 2, "without_replacement")[0]
    assert (law - p).abs().max() > 1e-3


@pytest.mark.parametrize("rule", list(RULES))
def test_rule_on_the_support_gives_the_dense_verdict_and_draws(rule):
    """Same seed, same verdict: token, accepted index, every record (token, decision, uniform,
    note; the floats to rounding) and the generator's state after; p sampled or one-hot."""
    n = 1 if rule == "sd" else 3
    for seed in range(40):
        p = _embed(_random_dist(100 + seed, 6, zeros=seed % 3), 60, seed)
        if seed % 4 == 0:  # temperature 0: one-hot on p's argmax
            p = torch.nn.functional.one_hot(p.argmax(), 60).double()
        q = _embed(_random_dist(200 + seed, 5), 60, seed + 1)
        cands = draw_candidates(q, n, SCHEME[rule], make_generator(seed))
        g_dense, g_sparse = make_generator(seed), make_generator(seed)
        dense = RULES[rule](p, q, cands, g_dense)
        sparse = on_support(RULES[rule], _support(p), _support(q), cands, g_sparse)
        assert (sparse.token, sparse.accepted) == (dense.token, dense.accepted)
        assert len(sparse.tests) == len(dense.tests)
        for a, b in zip(sparse.tests, dense.tests):
            assert (a.token_id, a.decision, a.uniform, a.note) == (
                b.token_id, b.decision, b.uniform, b.note)
            assert (a.p, a.q, a.ratio) == pytest.approx((b.p, b.q, b.ratio), rel=1e-12)
            assert (a.residual_mass is None) == (b.residual_mass is None)
            if a.residual_mass is not None:
                assert a.residual_mass == pytest.approx(b.residual_mass, rel=1e-12, abs=1e-15)
        assert torch.equal(g_sparse.get_state(), g_dense.get_state())


@pytest.mark.parametrize("rule", list(RULES))
def test_a_candidate_outside_both_supports_is_verified_as_the_dense_rule_does(rule):
    """A drafted token where q (and p) is 0, handed to on_support only as a candidate."""
    p = torch.zeros(40, dtype=F64)
    p[[5, 30]] = torch.tensor([0.25, 0.75], dtype=F64)
    q = torch.zeros(40, dtype=F64)
    q[[5, 12]] = torch.tensor([0.6, 0.4], dtype=F64)
    cands = [21] if rule == "sd" else [21, 12, 5]  # 21: in neither support
    for seed in range(20):
        g_dense, g_sparse = make_generator(seed), make_generator(seed)
        dense = RULES[rule](p, q, cands, g_dense)
        sparse = on_support(RULES[rule], _support(p), _support(q), cands, g_sparse)
        assert (sparse.token, sparse.accepted) == (dense.token, dense.accepted)
        assert [(t.token_id, t.decision, t.uniform) for t in sparse.tests] == [
            (t.token_id, t.decision, t.uniform) for t in dense.tests]
        assert torch.equal(g_sparse.get_state(), g_dense.get_state())


def test_naive_note_on_the_support_names_the_vocabulary_token():
    p = torch.zeros(30, dtype=F64)
    p[17] = 1.0
    q = torch.zeros(30, dtype=F64)
    q[[4, 9]] = 0.5
    v = on_support(RULES["naive"], ([17], p[[17]]), ([4, 9], q[[4, 9]]), [9, 4],
                   make_generator(0))
    assert v.token == 17 and v.accepted is None
    assert [t.note for t in v.tests] == ["y=17", "y=17"]
    assert [t.token_id for t in v.tests] == [9, 4]


# ------------------------------------------------------------- draft samplers


def _draw_law(q: torch.Tensor, n: int, scheme: str) -> dict[tuple[int, ...], float]:
    out = enumerate_outcomes(lambda ch: tuple(draw_candidates(q, n, scheme, ch)))
    return {c: w for w, c in out}


def test_without_replacement_draws_follow_the_sequential_law():
    law = _draw_law(_t(0.5, 0.3, 0.2), 2, "without_replacement")
    want = {(0, 1): 0.3, (0, 2): 0.2, (1, 0): 0.15 / 0.7, (1, 2): 0.06 / 0.7,
            (2, 0): 0.125, (2, 1): 0.075}
    assert law.keys() == want.keys()
    for k, w in want.items():
        assert law[k] == pytest.approx(w, abs=1e-15)


def test_greedy_draws_are_top_n_minus_one_then_one_random():
    law = _draw_law(_t(0.2, 0.5, 0.3), 2, "greedy")
    assert law == pytest.approx({(1, 0): 0.4, (1, 2): 0.6}, abs=1e-15)


def test_with_replacement_draws_are_iid():
    law = _draw_law(_t(0.25, 0.75), 2, "with_replacement")
    assert law == pytest.approx({(0, 0): 1 / 16, (0, 1): 3 / 16, (1, 0): 3 / 16,
                                 (1, 1): 9 / 16}, abs=1e-15)


def test_distinct_draws_stop_at_the_support_size():
    q = _t(0.0, 0.6, 0.0, 0.4)
    assert sorted(draw_candidates(q, 3, "without_replacement", make_generator(0))) == [1, 3]
    assert draw_candidates(q, 3, "greedy", make_generator(0)) == [1, 3]
    assert draw_candidates(q, 0, "with_replacement", make_generator(0)) == []
    with pytest.raises(ValueError):
        draw_candidates(q, 2, "beam", make_generator(0))


# ----------------------------------------------------------------- contracts


def _verdicts(seed: int, p: torch.Tensor, q: torch.Tensor) -> list[TokenVerdict]:
    g = make_generator(seed)
    out = []
    for rule, scheme in SCHEME.items():
        cands = draw_candidates(q, 1 if rule == "sd" else 3, scheme, g)
        out.append(RULES[rule](p, q, cands, g))
    return out


def test_rules_do_not_mutate_their_inputs():
    p = torch.softmax(torch.randn(50, generator=make_generator(1)), -1)  # float32, as in prod
    q = torch.softmax(torch.randn(50, generator=make_generator(2)), -1)
    p0, q0 = p.clone(), q.clone()
    for seed in range(5):
        _verdicts(seed, p, q)
    assert torch.equal(p, p0) and torch.equal(q, q0)


def test_same_seed_gives_the_same_verdicts():
    p, q = _random_dist(15, 50), _random_dist(16, 50)
    assert _verdicts(7, p, q) == _verdicts(7, p, q)
    runs = [_verdicts(s, p, q) for s in range(8)]
    assert any(r != runs[0] for r in runs[1:])


def test_equal_distributions_never_reject_and_give_no_nan():
    p = _random_dist(17, 8)
    rejection_rules = {"sd", "rrs_wr", "rrs_wor", "kseq"}  # ratio p/q (kseq: rho = 1)
    for seed in range(20):
        for rule, v in zip(SCHEME, _verdicts(seed, p, p.clone())):
            if rule in rejection_rules:
                assert v.accepted == 0 and v.tests[0].ratio == 1.0
            assert all(math.isfinite(t.ratio) and math.isfinite(t.p) for t in v.tests)
            assert v.residual_mass is None or math.isfinite(v.residual_mass)


def test_zero_residual_falls_back_to_the_target():
    # The off-law candidate 1 (q(1) = 0) is rejected, max(p - q, 0) has no mass, and the
    # residual falls back to p.
    p = _t(0.0, 0.0, 1.0)
    for rule in ("sd", "rrs_wr", "rrs_wor", "kseq"):
        for w, v in enumerate_outcomes(lambda ch, r=rule: RULES[r](p, p.clone(), [1], ch)):
            assert v.token == 2 and v.accepted is None
            assert v.residual_mass is not None and math.isfinite(v.residual_mass)


def test_test_records_carry_the_residual_and_draft_law_used():
    p, q = _t(0.1, 0.4, 0.5), _t(0.5, 0.3, 0.2)
    v = RULES["rrs_wor"](p, q, [0, 1], ScriptedChooser([0.9, 0.9]))
    assert (v.accepted, v.token) == (None, 2)
    assert v.residual_mass == pytest.approx(0.35)
    first, second = v.tests
    assert (first.node, first.tree, first.depth, first.token_id) == (0, 0, 0, 0)
    assert (first.p, first.q, first.uniform, first.decision) == (0.1, 0.5, 0.9, "reject")
    assert first.ratio == pytest.approx(0.2) and first.residual_mass == pytest.approx(0.4)
    assert (second.node, second.token_id, second.decision) == (1, 1, "reject")
    assert (second.p, second.q) == pytest.approx((0.25, 0.6))  # p_2 and q_2 = q^{¬0}
    assert second.ratio == pytest.approx(5 / 12) and second.residual_mass == pytest.approx(0.35)
    accepted = RULES["rrs_wor"](p, q, [0, 1], ScriptedChooser([0.1]))
    assert (accepted.accepted, accepted.token, accepted.residual_mass) == (0, 0, None)
    assert accepted.tests[0].decision == "accept" and accepted.tests[0].residual_mass is None


def test_greedy_residual_landing_on_a_top_draft_counts_as_accepted():
    p, q = _t(0.1, 0.4, 0.5), _t(0.5, 0.3, 0.2)
    outcomes = enumerate_outcomes(lambda ch: RULES["greedy_drafts"](p, q, [0, 1], ch))
    via_top = [(w, v) for w, v in outcomes if v.accepted == 0]
    assert sum(w for w, _ in via_top) == pytest.approx(1 / 3 * 0.5)
    assert all(v.tests[0].decision == "reject" and v.tests[0].node == 1 for _, v in via_top)


def test_enumerator_probabilities_sum_to_one_and_lump_unkept_tokens():
    q = _random_dist(18, 6)
    out = enumerate_outcomes(lambda ch: draw_candidates(q, 3, "without_replacement", ch))
    assert math.fsum(w for w, _ in out) == pytest.approx(1.0, abs=1e-12)
    assert len(out) == 6 * 5 * 4
    lumped = enumerate_outcomes(lambda ch: ch.categorical(q), branch_categorical=False)
    assert lumped == [(pytest.approx(1.0), -1)]
    kept = enumerate_outcomes(lambda ch: ch.categorical(q), branch_categorical=False, keep=[2])
    assert sorted(t for _, t in kept) == [-1, 2]
    assert dict((t, w) for w, t in kept)[2] == pytest.approx(float(q[2]))
    with pytest.raises(NotImplementedError):
        EnumeratingChooser().uniform()
