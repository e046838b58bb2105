"""The diagnosis of a run: tested drafts grouped by position, target entropy, q and token,
and the one line each view suggests."""

from __future__ import annotations

import math

import pytest

from engine.analysis.diagnosis import Bin, Diagnosis, diagnose, entropy
from engine.contract.records import ControllerState
from engine.contract.trace import (
    ACCEPTED,
    BONUS,
    REJECTED,
    BeamTrace,
    CommittedToken,
    NodeTrace,
    RoundTrace,
    RunSummary,
    RunTrace,
    TestRecord,
    TopK,
)
from engine.core.paths import ASSETS
from specviz import diagnosis_view as dv


def _round(i, tokens, accepted, q=0.9, steps=()):
    """A chain round drafting `tokens`, the first `accepted` of them accepted."""
    nodes, tests = [], []
    for d, tok in enumerate(tokens, start=1):
        ok = d <= accepted
        nodes.append(NodeTrace(d - 1, d - 2, 0, d, tok, f"t{tok}", q, None,
                               ACCEPTED if ok else REJECTED))
        if d <= accepted + 1:
            tests.append(TestRecord(d - 1, 0, d, tok, 1.0 if ok else 0.0, q, 1.0 if ok else 0.0,
                                    None, "accept" if ok else "reject"))
    nodes.append(NodeTrace(len(tokens), accepted - 1, 0, accepted + 1, 0, "x", None, 1.0,
                           BONUS))
    committed = tuple(CommittedToken(t, "t", "accepted") for t in tokens[:accepted]) + (
        CommittedToken(0, "x", "bonus"),)
    p_top = tuple(TopK((tokens[d], 99), (0.5, 0.5)) if d < len(tokens) else TopK((1,), (1.0,))
                  for d in range(accepted + 1))
    ctl = ControllerState(kind="confidence", steps=steps) if steps else None
    return RoundTrace(index=i, nodes=tuple(nodes), tests=tuple(tests), committed=committed,
                      drafted=len(tokens), accepted=accepted, target_calls=1,
                      p_top=p_top, controller=ctl)


def _trace(rounds) -> RunTrace:
    return RunTrace("sd", {}, "t", "d", "cpu", "", (1, 2, 3), tuple(rounds), (), "", (
        BeamTrace((), 0.0),), RunSummary())


def test_entropy_of_a_top_k_slice_counts_the_rest_as_one_outcome():
    assert entropy(TopK((1, 2), (0.5, 0.5))) == pytest.approx(math.log(2))
    assert entropy(TopK((1,), (0.5,))) == pytest.approx(math.log(2))  # 0.5 + the rest 0.5
    assert entropy(TopK((1,), (1.0,))) == 0.0


def test_tested_drafts_are_binned_by_their_position_in_the_text():
    # round 0 from position 0: two accepted, one rejected (3 tested); then from position 3
    rounds = [_round(0, [5, 6, 7], 2), _round(1, [8, 9], 0)]
    d = diagnose(_trace(rounds), position_bin=2)
    assert (d.tested, d.accepted) == (4, 2)
    assert [(b.lo, b.hi, b.tested, b.accepted) for b in d.by_position] == [
        (0.0, 2.0, 2, 2), (2.0, 4.0, 2, 0)]  # positions 0, 1 | 2 (round 0), 3 (round 1)


def test_entropy_bins_read_the_targets_law_at_the_drafts_parent():
    d = diagnose(_trace([_round(0, [5, 6, 7], 2)]))
    # every parent holds a two-way top slice: log 2 = 0.69 nats
    assert [(b.lo, b.hi, b.tested, b.accepted) for b in d.by_entropy] == [(0.5, 1.0, 3, 2)]


def test_calibration_reads_the_confidence_controllers_q_of_chains():
    steps = ({"step": 1, "q": 0.95, "continue": True}, {"step": 2, "q": 0.15,
                                                          "continue": False})
    rounds = [_round(i, [5, 6], 1, steps=steps) for i in range(4)]
    d = diagnose(_trace(rounds))
    assert d.calibration_source == "controller"
    assert [(b.lo, b.tested, b.accepted) for b in d.calibration] == [(0.1, 4, 0), (0.9, 4, 4)]


def test_a_one_hot_q_gives_no_calibration():
    d = diagnose(_trace([_round(0, [5, 6], 1, q=1.0)]))
    assert d.calibration == () and d.calibration_source == ""
    assert "one-hot" in dv.calibration_figure(d).layout.annotations[0].text
    assert dv.calibration_note(d).startswith("No varying q")


def test_the_most_rejected_tokens_come_first_with_the_targets_p():
    rounds = [_round(0, [5, 6], 0), _round(1, [5], 0), _round(2, [7, 8], 0)]
    d = diagnose(_trace(rounds))
    assert [(t.token_id, t.count) for t in d.rejected] == [(5, 2), (7, 1)]
    assert d.rejected[0].mean_p == 0.5 and d.rejected[0].mean_q == pytest.approx(0.9)
    assert dv.rejected_note(d).startswith("Most rejected: 't5' (2x")


def _diag(**kw) -> Diagnosis:
    return Diagnosis(tested=100, accepted=50, prompt_tokens=10, **kw)


def test_the_notes_name_a_context_length_cliff_and_only_then():
    cliff = _diag(by_position=(Bin(0, 32, 20, 16, 10), Bin(32, 64, 20, 4, 40)))
    assert "falls from 0.80 in the first 32 tokens to 0.20 past 32" in dv.position_note(cliff)
    steady = _diag(by_position=(Bin(0, 32, 20, 10, 10), Bin(32, 64, 20, 11, 40)))
    assert dv.position_note(steady).startswith("Acceptance holds")


def test_the_notes_say_where_the_target_is_unsure_or_the_drafter_disagrees():
    unsure = _diag(by_entropy=(Bin(0, 0.5, 20, 18, 0.1), Bin(2, math.inf, 20, 4, 3)))
    assert "fail where the target is unsure" in dv.entropy_note(unsure)
    wrong = _diag(by_entropy=(Bin(0, 0.5, 20, 4, 0.1),))
    assert "even where the target is sure" in dv.entropy_note(wrong)


def test_the_notes_read_over_and_under_confidence():
    over = _diag(calibration=(Bin(0.9, 1.0, 20, 8, 0.95),))
    assert dv.calibration_note(over).startswith("The drafter is overconfident")
    under = _diag(calibration=(Bin(0.2, 0.3, 20, 16, 0.25),))
    assert dv.calibration_note(under).startswith("The drafter is underconfident")
    fine = _diag(calibration=(Bin(0.5, 0.6, 20, 11, 0.55),))
    assert "calibrated" in dv.calibration_note(fine)


def test_every_view_renders_for_the_demo_trace():
    trace = RunTrace.from_json((ASSETS / "demo_trace.json").read_text())
    d = diagnose(trace)
    assert d.tested == sum(1 for r in trace.rounds for t in r.tests
                           if t.decision in ("accept", "reject") and t.tree == 0)
    for fig in (dv.position_figure(d), dv.entropy_figure(d), dv.calibration_figure(d)):
        assert fig.layout.height == dv.HEIGHT
    assert dv.diagnosis_markdown(d).count("\n- ") == 4
