"""Beam-level rules (engine/verify/beam.py): DSBD exactness and width DP, AtSpeed relaxed.

Exactness checks run the production rules under engine.verify.enumerate's chooser, which explores
every accept / categorical branch with its exact float64 probability (no sampling noise).
"""

from __future__ import annotations

import itertools
from collections import defaultdict

import pytest
import torch
from torch.testing import assert_close

from engine.contract.trace import ACCEPTED, BONUS, RESAMPLED, TARGET
from engine.core.sampling import make_generator
from engine.verify.beam import (
    acceptance_alphas,
    bonus_layer,
    choose_width,
    relaxed_bonus_step,
    relaxed_verify_step,
    verify_layer,
    width_distribution,
)
from engine.verify.enumerate import enumerate_outcomes

# ---------------------------------------------------------------- exact enumeration


def enumerate_law(run) -> dict:
    """Exact law of run(chooser)'s (hashable) result over every branch of its choices."""
    law = defaultdict(float)
    for weight, result in enumerate_outcomes(run):
        law[result] += weight
    return dict(law)


def max_gap(law: dict, ref: dict) -> float:
    return max(abs(law.get(x, 0.0) - ref.get(x, 0.0)) for x in set(law) | set(ref))


def tv(law: dict, ref: dict) -> float:
    return 0.5 * sum(abs(law.get(x, 0.0) - ref.get(x, 0.0)) for x in set(law) | set(ref))


def iid_law(p_beam: torch.Tensor, n: int) -> dict:
    """Law of n i.i.d. (parent, token) draws from p_beam (B, V), as ordered tuples."""
    cells = [(b, v) for b in range(p_beam.shape[0]) for v in range(p_beam.shape[1])]
    law = {}
    for combo in itertools.product(cells, repeat=n):
        w = 1.0
        for b, v in combo:
            w *= float(p_beam[b, v])
        if w > 0:
            law[combo] = w
    return law


def draft(chooser, q_beam: torch.Tensor, n: int) -> list[tuple[int, int]]:
    """n i.i.d. (parent, token) drafts from q_beam (B, V)."""
    vocab = q_beam.shape[1]
    return [divmod(chooser.categorical(q_beam.reshape(-1)), vocab) for _ in range(n)]


def dist(*rows: list[float]) -> torch.Tensor:
    t = torch.tensor(rows, dtype=torch.float64)
    return t / t.sum()


P2 = dist([0.30, 0.05], [0.15, 0.50])  # (B=2, V=2) target beam distribution
Q2 = dist([0.10, 0.40], [0.35, 0.15])  # (B=2, V=2) draft beam distribution
P_HALF = dist([0.55, 0.45], [0.0, 0.0])  # parent 1 rejected at the previous layer
Q3 = dist([0.20, 0.10, 0.15], [0.25, 0.05, 0.25])  # (B=2, V=3)
P3 = dist([0.05, 0.40, 0.10], [0.0, 0.0, 0.0])


# ---------------------------------------------------------------- DSBD: Theorem 3.1


@pytest.mark.parametrize(
    "p_beam, q_beam, valid, n_drafts, width, fill_to",
    [
        (P2, Q2, None, 3, 2, None),
        (P2, Q2, None, 2, 1, 3),  # code's fill to W_S
        (P_HALF, Q2, [True, False], 3, 2, None),  # children of a rejected parent
        (P3, Q3, [True, False], 2, 1, 2),
    ],
)
def test_dsbd_layer_outputs_are_iid_p_beam_given_parents(
    p_beam, q_beam, valid, n_drafts, width, fill_to
):
    out_width = fill_to or width

    def run(chooser):
        cands = draft(chooser, q_beam, n_drafts)
        v = verify_layer(p_beam, q_beam, cands, width, chooser, parent_valid=valid,
                         fill_to=fill_to)
        if v.outcome == "accepted":  # an accepted layer keeps `width` beams; pad with fresh
            return v.beams + bonus_layer(p_beam, out_width - width, chooser).beams
        return v.beams

    law = enumerate_law(run)
    ref = iid_law(p_beam, out_width)
    assert abs(sum(law.values()) - 1.0) < 1e-12
    assert max_gap(law, ref) < 1e-9


def test_dropping_children_of_rejected_parents_without_residual_update_is_caught():
    def naive(chooser):  # drop auto-rejected drafts; q stays unnormalised (docs/derivations.md)
        cands = [c for c in draft(chooser, Q2, 3) if c[0] == 0]
        if not cands:
            return bonus_layer(P_HALF, 2, chooser).beams
        return verify_layer(P_HALF, Q2, cands, 2, chooser, parent_valid=[True, False]).beams

    gap = max_gap(enumerate_law(naive), iid_law(P_HALF, 2))
    print(f"naive drop-without-residual variant: max |P(o1,o2) - p p| = {gap:.4f}")
    assert gap > 1e-3


def test_dsbd_outputs_conditional_on_layer_outcome_are_reported_consistently():
    def run(chooser):
        v = verify_layer(P2, Q2, draft(chooser, Q2, 3), 2, chooser)
        return v.outcome, v.accepted, v.origins, len(v.beams)

    for (outcome, accepted, origins, n), w in enumerate_law(run).items():
        assert n == 2 and w > 0
        if outcome == "accepted":
            assert accepted == 2 and origins == (ACCEPTED, ACCEPTED)
        else:
            assert accepted < 2 and origins[accepted] == RESAMPLED
            assert origins[:accepted] == (ACCEPTED,) * accepted
            assert origins[accepted + 1:] == (TARGET,) * (1 - accepted)


# ---------------------------------------------------------------- DSBD: width DP


def test_width_distribution_matches_hand_computed_cases():
    # P(2,0) = (1-a1)(1-a2), P(2,1) = a1(1-a1) + (1-a1)a2, P(2,2) = a1^2
    assert_close(width_distribution([0.5, 0.2]),
                 torch.tensor([0.40, 0.35, 0.25], dtype=torch.float64))
    assert_close(width_distribution([0.5, 0.2, 0.1]),
                 torch.tensor([0.36, 0.29, 0.225, 0.125], dtype=torch.float64))
    assert_close(width_distribution(torch.tensor([1.0, 1.0])),
                 torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64))
    assert_close(width_distribution([0.0, 0.0]),
                 torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64))
    assert_close(width_distribution([]), torch.tensor([1.0], dtype=torch.float64))


def test_choose_width_takes_largest_width_with_tail_above_threshold():
    alphas = [0.5, 0.2, 0.1]  # tails P(>=K), K=0..3: 1, 0.64, 0.35, 0.125
    d = choose_width(alphas, t=0.5, w_min=1)
    assert d.tails == pytest.approx((1.0, 0.64, 0.35, 0.125))
    assert (d.w_tilde, d.width) == (1, 1)
    assert choose_width(alphas, t=0.3).width == 2
    assert choose_width(alphas, t=0.35).width == 2  # boundary: P(>=2) = 0.35 exactly
    assert choose_width(alphas, t=0.9, w_min=1).w_tilde == 0
    assert choose_width(alphas, t=0.9, w_min=1).width == 1  # floored at W_min
    assert choose_width(alphas, t=0.9, w_min=2).width == 2
    assert choose_width(alphas, t=0.1, w_max=2).width == 2  # w_tilde 3, capped
    assert d.expected == pytest.approx(0.29 + 2 * 0.225 + 3 * 0.125)
    assert d.beta_min == pytest.approx(0.64)
    with pytest.raises(ValueError):
        choose_width(alphas, t=0.5, w_min=4)


def test_acceptance_alphas_follow_the_residual_chain():
    a = acceptance_alphas(P2, Q2, 3)
    assert a[0] == pytest.approx(float(torch.minimum(P2, Q2).sum()))  # 1 - TV(p, q)
    assert all(0.0 <= x <= 1.0 for x in a) and len(a) == 3


@pytest.mark.parametrize("p_beam, valid", [(P2, None), (P_HALF, [True, False])])
def test_width_distribution_matches_exact_accept_count_of_verify_layer(p_beam, valid):
    n = 3
    probs = width_distribution(acceptance_alphas(p_beam, Q2, n, valid))

    def run(chooser):  # width n: testing stops only when every draft is accepted
        return verify_layer(p_beam, Q2, draft(chooser, Q2, n), n, chooser,
                            parent_valid=valid).accepted

    law = enumerate_law(run)
    assert_close(torch.tensor([law.get(k, 0.0) for k in range(n + 1)], dtype=torch.float64),
                 probs, atol=1e-9, rtol=0)


def test_width_distribution_matches_monte_carlo():
    n, trials, g = 4, 4000, make_generator(1234)
    probs = width_distribution(acceptance_alphas(P_HALF, Q2, n, [True, False]))
    counts = torch.zeros(n + 1, dtype=torch.float64)
    flat = Q2.reshape(-1)
    for _ in range(trials):
        idx = torch.multinomial(flat, n, replacement=True, generator=g).tolist()
        cands = [divmod(i, 2) for i in idx]
        counts[verify_layer(P_HALF, Q2, cands, n, g, parent_valid=[True, False]).accepted] += 1
    # std of each frequency <= 0.5 / sqrt(4000) = 0.0079; 0.04 is 5 sigma
    assert_close(counts / trials, probs, atol=0.04, rtol=0)


# ---------------------------------------------------------------- DSBD: records


def test_verify_layer_records_every_candidate_and_skips_after_width():
    p = dist([0.5, 0.0], [0.5, 0.0])
    cands = [(0, 0), (1, 0), (0, 0), (1, 0)]
    v = verify_layer(p, p.clone(), cands, 2, make_generator(0))  # p == q: every test accepts
    assert [t.decision for t in v.tests] == ["accept", "accept", "skip", "skip"]
    assert v.outcome == "accepted" and v.beams == ((0, 0), (1, 0)) and v.sources == (0, 1)
    assert v.tests[2].uniform is None and v.tests[0].ratio == 1.0


class RejectAll:
    """Chooser that rejects every test and draws the argmax (a deterministic path)."""

    def uniform(self) -> float:
        return 0.999

    def accept(self, prob: float) -> tuple[bool, float]:
        return False, 0.999

    def categorical(self, probs: torch.Tensor) -> int:
        return int(probs.argmax())


def test_verify_layer_uses_p_over_q_and_compounds_the_residual():
    p, q = dist([0.2, 0.8]), dist([0.4, 0.6])  # (B=1, V=2)
    v = verify_layer(p, q, [(0, 0), (0, 0)], 1, RejectAll())
    first, second = v.tests
    assert first.ratio == pytest.approx(0.5) and first.p == pytest.approx(0.2)  # p/q, not q/p
    assert first.residual_mass == pytest.approx(0.2) and first.level == 1
    # p' = norm(max(p - q, 0)) = [0, 1]: the same token now has p' = 0
    assert second.p == 0.0 and second.p_beam == pytest.approx(0.2) and second.level == 2
    assert v.outcome == "corrected" and v.beams == ((0, 1),) and v.origins == (RESAMPLED,)


def test_verify_layer_auto_rejects_children_of_rejected_parents():
    v = verify_layer(P_HALF, Q2, [(1, 0), (1, 1), (0, 1)], 1, make_generator(3),
                     parent_valid=[True, False])
    assert [t.decision for t in v.tests[:2]] == ["auto_reject", "auto_reject"]
    assert v.tests[0].uniform is None and v.tests[0].residual_mass is not None
    assert all(b[0] == 0 for b in v.beams)
    rec = v.tests[0].record(node=7, tree=1, depth=2)
    assert (rec.node, rec.decision, rec.uniform) == (7, "auto_reject", None)


def test_verify_layer_is_deterministic_and_leaves_inputs_untouched():
    p, q = P2.clone(), Q2.clone()
    cands = [(0, 1), (1, 0), (1, 1), (0, 0)]
    a = verify_layer(p, q, cands, 2, make_generator(7), fill_to=4)
    b = verify_layer(p, q, cands, 2, make_generator(7), fill_to=4)
    assert a == b
    assert torch.equal(p, P2) and torch.equal(q, Q2)
    with pytest.raises(ValueError):
        verify_layer(P2, Q2, cands, 2, make_generator(0), parent_valid=[True, False])


def test_bonus_layer_draws_width_beams_from_p_beam():
    v = bonus_layer(P2, 3, make_generator(0))
    assert len(v.beams) == 3 and v.origins == (BONUS,) * 3 and v.tests == ()


# ---------------------------------------------------------------- AtSpeed relaxed

PR = dist([0.5, 0.3, 0.2])  # (B=1, V=3)
QR = dist([0.2, 0.3, 0.5])


def test_relaxed_step_with_enough_accepts_yields_k_accepted_outputs():
    drafted = [(0, 0), (0, 1), (0, 2), (0, 1)]
    v = relaxed_verify_step(PR, PR.clone(), drafted, 2, make_generator(5))  # p == q
    assert v.accepted == 4 and v.outcome == "accepted" and len(v.beams) == 2
    assert v.origins == (ACCEPTED, ACCEPTED) and list(v.sources) == sorted(v.sources)
    assert all(drafted[j] == b for j, b in zip(v.sources, v.beams))


def test_relaxed_step_always_returns_k_beams_with_complete_records():
    drafted = [(0, 2), (0, 2), (0, 0)]
    for seed in range(50):
        v = relaxed_verify_step(PR, QR, drafted, 2, make_generator(seed))
        assert len(v.beams) == 2 and len(v.tests) == 3
        assert all(t.uniform is not None and t.decision in ("accept", "reject") for t in v.tests)
        assert v.step_accepted == (v.accepted >= 2)
        if not v.step_accepted:
            assert v.origins.count(RESAMPLED) == 2 - v.accepted and v.residual_mass is not None


def test_relaxed_step_is_deterministic_under_a_seeded_generator():
    drafted = [(0, 2), (0, 1), (0, 0)]
    runs = [relaxed_verify_step(PR, QR, drafted, 2, make_generator(11)) for _ in range(2)]
    assert runs[0] == runs[1]
    assert relaxed_bonus_step(PR, 2, make_generator(3)) == relaxed_bonus_step(
        PR, 2, make_generator(3))


def draft_distinct(chooser, q: torch.Tensor, n: int) -> list[tuple[int, int]]:
    """n (parent, token) drafts from q (B, V) without replacement (AtSpeed's released code)."""
    flat, out = q.reshape(-1).clone(), []
    for _ in range(n):
        i = chooser.categorical(flat / flat.sum())
        flat[i] = 0.0
        out.append(divmod(i, q.shape[1]))
    return out


def test_relaxed_step_output_law_is_close_to_target_beam_sampling():
    n, k = 3, 2  # P3 is zero on parent 1: the target kept only parent 0

    def run(chooser):
        v = relaxed_verify_step(P3, Q3, draft_distinct(chooser, Q3, n), k, chooser)
        assert len(v.beams) == k and len(v.tests) == n
        return tuple(sorted(v.beams))

    law = enumerate_law(run)
    distinct = enumerate_law(lambda c: tuple(sorted(relaxed_bonus_step(P3, k, c).beams)))
    iid = defaultdict(float)
    for combo, w in iid_law(P3, k).items():
        iid[tuple(sorted(combo))] += w
    d_distinct, d_iid = tv(law, distinct), tv(law, iid)
    print(f"AtSpeed relaxed (N={n}, K={k}, 3 target children): TV vs target beam sampling "
          f"without replacement = {d_distinct:.4f}, vs i.i.d. = {d_iid:.4f}")
    assert abs(sum(law.values()) - 1.0) < 1e-12
    assert all(a != b for a, b in law)  # distinct outputs: accepted pairs leave the residual
    assert 0.0 <= d_distinct <= 1.0 and 0.0 <= d_iid <= 1.0  # approximate by design


def test_relaxed_step_falls_back_to_p_when_the_residual_is_empty():
    v = relaxed_verify_step(PR, PR.clone(), [(0, 0)], 2, make_generator(0))  # p == q, N < K
    assert v.accepted == 1 and v.fallback and v.residual_mass == 0.0
    assert v.beams[0] == (0, 0) and v.beams[1] != (0, 0)  # accepted pair is zeroed
