"""The cost model (engine.run.costs) on literal numbers."""

from __future__ import annotations

import pytest

import engine
from engine.cli.cost_text import cost_sentence
from engine.contract.trace import (
    ACCEPTED,
    BONUS,
    REJECTED,
    RESAMPLED,
    BeamTrace,
    CommittedToken,
    NodeTrace,
    RoundTrace,
)
from engine.control.cost import CostProfile
from engine.run import costs
from engine.run.api import plain_step_s
from tests.conftest import tiny_pair


def test_expected_tokens_is_leviathans_geometric_sum():
    assert costs.expected_tokens(0.0, 4) == 1.0
    assert costs.expected_tokens(1.0, 4) == 5.0
    assert costs.expected_tokens(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)


def test_break_even_acceptance_solves_expected_tokens_equals_cost():
    # gamma 1, draft 0.2, verify 1.0: 1 + a = 1.2 -> a = 0.2
    assert costs.break_even_acceptance(1, 0.2, 1.0) == pytest.approx(0.2, abs=1e-9)
    assert costs.break_even_acceptance(2, 0.0, 1.0) == 0.0  # free drafts pay at once
    assert costs.break_even_acceptance(1, 1.5, 1.0) is None  # 2 tokens < 2.5 steps


def _node(i, depth, status):
    return NodeTrace(i, i - 1, 0, depth, 7, "x", 0.5, 0.5, status)


def _chain_round(index, accepted, timings):
    nodes = [_node(0, 1, ACCEPTED if accepted else REJECTED), _node(1, 2, REJECTED),
             NodeTrace(2, -1, 0, 1, 8, "y", None, None, RESAMPLED)]
    committed = tuple(CommittedToken(7, "x", "accepted") for _ in range(accepted + 1))
    return RoundTrace(index, nodes=tuple(nodes), committed=committed, drafted=2,
                      accepted=accepted, target_calls=1, draft_calls=2, timings=timings)


def test_chain_cost_model_from_measured_phases():
    t = {"propose": 0.04, "score": 0.12, "verify": 0.01, "commit": 0.01, "observe": 0.0}
    rounds = [_chain_round(0, 0, {"propose": 9.0}), _chain_round(1, 1, t),
              _chain_round(2, 1, t)]  # round 0 (prefill) is left out
    out = costs.cost_model(rounds, 1, False, lambda w: 0.1)
    assert out.kind == "chain"
    assert out.c_draft == pytest.approx(0.2) and out.c_verify == pytest.approx(1.2)
    # each round tested 2 drafts (accepted the 1st, rejected the 2nd): alpha = 2 / 4
    assert out.acceptance == pytest.approx(0.5) and out.gamma == pytest.approx(2)
    assert out.predicted_speedup == pytest.approx(1.75 / 1.6)
    assert out.measured_speedup == pytest.approx(4 * 0.1 / 0.36)
    assert out.efficiency == pytest.approx((0.4 / 0.36) / (1.75 / 1.6))
    assert out.break_even_acceptance == pytest.approx(
        costs.break_even_acceptance(2, 0.2, 1.2))
    assert "draft steps cost 0.20 of a target step" in cost_sentence(out)


def test_a_chain_of_varying_length_is_predicted_round_by_round():
    t = {"propose": 0.0, "score": 0.1}
    long = RoundTrace(1, nodes=tuple(_node(i, i + 1, ACCEPTED) for i in range(4)),
                      committed=tuple(CommittedToken(7, "x", "accepted") for _ in range(5)),
                      drafted=4, accepted=4, target_calls=1, draft_calls=4, timings=t)
    none = RoundTrace(2, committed=(CommittedToken(8, "y", "target"),), target_calls=1,
                      timings=t)  # the lookup found nothing: a plain step
    half = _chain_round(3, 1, t)  # 2 drafted, 1 accepted
    rounds = [_chain_round(0, 0, {"propose": 9.0}), long, none, half]
    out = costs.cost_model(rounds, 1, False, lambda w: 0.1)
    alpha = 5 / 6  # tested: 4 accepted, then 1 accepted + 1 rejected
    assert out.kind == "chain" and out.acceptance == pytest.approx(alpha)
    want = (costs.expected_tokens(alpha, 4) + 1 + costs.expected_tokens(alpha, 2)) / 3
    assert out.expected_tokens == pytest.approx(want)
    assert want < costs.expected_tokens(alpha, 2)  # E at the mean length (2) would overstate
    assert out.predicted_speedup == pytest.approx(want / 1.0)  # drafts free, verify 1 step


def test_chain_acceptance_counts_only_tested_drafts():
    t = {"score": 0.1}
    rounds = [_chain_round(1, 0, t), _chain_round(2, 0, t), _chain_round(3, 1, t)]
    # tested: round 1 one rejection, round 2 one rejection, round 3 accept + reject = 1 / 4
    assert costs.chain_acceptance(rounds) == pytest.approx(1 / 4)
    full = RoundTrace(4, drafted=2, accepted=2, target_calls=1)  # no rejection: 2 tested
    assert costs.chain_acceptance([full]) == 1.0


def test_a_plain_run_s_cost_model_is_its_median_round():
    rounds = [RoundTrace(i, committed=(CommittedToken(1, "a", "target"),), target_calls=1,
                         timings={"score": 0.05 + 0.01 * i}) for i in range(4)]
    out = costs.cost_model(rounds, 1, True, lambda w: 1 / 0)
    assert out.kind == "plain" and out.t_step_s == pytest.approx(0.07)


def test_a_plain_run_records_its_step_in_the_pair_s_calibration_for_later_runs():
    pair = tiny_pair(seed=6)
    assert pair.calibration.step_s == {}
    trace = engine.generate(pair, [3, 4, 5], "greedy", max_new_tokens=6)
    step = trace.stats.cost.t_step_s
    assert pair.calibration.step_s == {1: step}
    assert plain_step_s(pair, 1) == step  # read, not measured again


def test_calibration_measures_a_plain_step_when_none_is_known():
    pair = tiny_pair(seed=5)
    step = plain_step_s(pair, 2)
    assert step > 0 and plain_step_s(pair, 2) == step  # measured once


# ---------------------------------------------------------------------------- projection

GPU = CostProfile("h100", 0.1, ((0, 1.0), (4, 1.2)), "a stored GPU")


def _tree_round(index):
    """Width 2: 6 drafted nodes over two rows (3 a row) and a bonus token, 3 draft calls,
    4 committed."""
    nodes = [NodeTrace(i, -1, i % 2, 1 + i // 2, 7, "x", 0.5, 0.5, ACCEPTED) for i in range(6)]
    nodes.append(NodeTrace(6, 5, 1, 4, 8, "y", None, None, BONUS))
    return RoundTrace(index, nodes=tuple(nodes), beams_before=(BeamTrace((1,), 0.0),) * 2,
                      committed=tuple(CommittedToken(7, "x", "accepted") for _ in range(4)),
                      drafted=3, accepted=3, target_calls=1, draft_calls=3,
                      timings={"propose": 0.03, "score": 0.1})


def test_a_speculative_run_is_projected_at_the_stored_costs_and_its_tokens_per_round():
    t = {"propose": 0.04, "score": 0.12}
    rounds = [_tree_round(0), _chain_round(1, 1, t), _tree_round(2)]  # round 0 left out
    out = costs.cost_model(rounds, 1, False, lambda w: 0.1, projected=GPU)
    # drafted nodes a row: round 1 two (the resampled one is the target's), round 2 6 / 2;
    # draft calls (2 + 3) / 2, tokens (2 + 4) / 2
    proj = out.projected
    assert proj.nodes_per_row == pytest.approx(2.5)
    assert proj.c_draft == 0.1 and proj.c_verify == pytest.approx(1.125)
    assert proj.speedup == pytest.approx(3 / (2.5 * 0.1 + 1.125))
    assert proj.profile == "h100" and proj.source == "a stored GPU"
    assert "projected on an H100: 2.18x" in cost_sentence(out)
    assert "not a measurement" in cost_sentence(out)


def test_a_chain_is_projected_at_its_measured_tokens_per_round_not_its_expected_ones():
    t = {"propose": 0.04, "score": 0.12}
    rounds = [_chain_round(0, 0, t), _chain_round(1, 1, t), _chain_round(2, 0, t)]
    out = costs.cost_model(rounds, 1, False, lambda w: 0.1, projected=GPU)
    assert out.kind == "chain"
    assert out.projected.speedup == pytest.approx(1.5 / (2 * 0.1 + 1.1))


def test_a_plain_run_is_projected_at_one_and_no_profile_means_no_projection():
    rounds = [RoundTrace(i, committed=(CommittedToken(1, "a", "target"),), target_calls=1,
                         timings={"score": 0.05}) for i in range(3)]
    plain = costs.cost_model(rounds, 1, True, lambda w: 1 / 0,
                             projected=GPU)
    assert plain.projected.speedup == 1.0 and plain.projected.profile == "h100"
    t = {"propose": 0.04, "score": 0.12}
    chain = [_chain_round(0, 0, t), _chain_round(1, 1, t)]
    out = costs.cost_model(chain, 1, False, lambda w: 0.1)
    assert out.projected is None and "H100" not in cost_sentence(out)


def test_a_finished_run_carries_the_stored_h100_projection():
    import engine
    from engine.run import profile

    trace = engine.generate(tiny_pair(), [3, 4, 5], "sd", max_new_tokens=6, gamma=2)
    proj = trace.stats.cost.projected
    stored = profile.stored("h100", "sd", 1)
    assert proj.profile == "h100" and proj.c_draft == stored.c_draft
    assert proj.source == stored.source and proj.speedup > 0
