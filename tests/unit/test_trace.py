from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from engine.cli.cost_text import cost_sentence
from engine.contract.records import (
    ControllerState,
    CostRecord,
    DepthPosteriorState,
    GateRecord,
    OptimalRecord,
    ProjectionRecord,
    RoundExtras,
    RunSummary,
    SwitchOption,
    SwitchPlan,
    WidthDecision,
)
from engine.contract.trace import (
    ACCEPTED,
    BONUS,
    BeamStep,
    BeamTrace,
    CommittedToken,
    DraftMatch,
    NodeTrace,
    RoundTrace,
    RunTrace,
    TargetBeam,
    TestRecord,
    TopK,
    summarize,
)
from engine.core.errors import TraceError

COST = CostRecord(kind="chain", width=1, t_step_s=0.1, rounds_used=3, measured_speedup=1.2,
                  predicted_speedup=1.5, efficiency=0.8, c_draft=0.2, c_verify=1.1,
                  draft_calls_per_round=2.0, tokens_per_round=2.5, gamma=2.0, acceptance=0.7,
                  break_even_acceptance=0.3, expected_tokens=2.19,
                  projected=ProjectionRecord("h100", "stored", 2.1, 0.1, 1.05, 2.0))
PLAN = SwitchPlan(depth=1, predicted_gain=1.5, drawn=(0.8, 0.4), profile="measured",
                  options=(SwitchOption(0, 1.0, 1.0, 1.0), SwitchOption(1, 1.8, 1.2, 1.5)),
                  posterior=DepthPosteriorState((2.0, 1.0), (1.0, 1.0), (0.6667, 0.5)))
OLD_TRACE = Path(__file__).parent.parent / "data" / "trace_v1_old_stats.json"


def _trace() -> RunTrace:
    rnd = RoundTrace(
        index=0,
        nodes=(NodeTrace(0, -1, 0, 1, 5, "a", 0.5, 0.25, ACCEPTED),
               NodeTrace(1, 0, 0, 2, 6, "b", None, 0.1, BONUS)),
        tests=(TestRecord(0, 0, 1, 5, 0.25, 0.5, 0.5, 0.3, "accept", None),),
        beams_before=(BeamTrace((), 0.0),), beams_after=(BeamTrace((5, 6), -1.5, True),),
        committed=(CommittedToken(5, "a", "accepted", 0, 0), CommittedToken(6, "b", "bonus")),
        drafted=1, accepted=1, target_calls=1, draft_calls=1,
        timings={"propose": 0.1, "score": 0.2},
        controller=ControllerState(kind="beta_ts", after={"alpha": 2}, steps=(
            {"step": 1, "theta": 0.4, "uniform": 0.1, "continue": True},)),
        extras=RoundExtras(width=(WidthDecision(chosen=2),)), p_top=(TopK((5, 7), (0.25, 0.2)),),
    )
    return RunTrace("sd", {"gamma": 1}, "t", "d", "cpu", "hi", (1, 2), (rnd,), (5, 6), "ab",
                    (BeamTrace((5, 6), -1.5, True),),
                    replace(summarize((rnd,), 2), wall_s=0.5, tokens_per_s=4.0, cost=COST), "eos",
                    ("accepted", "bonus"), (0, 0), ("h", "i"))


def test_run_trace_round_trips_through_json():
    tr = _trace()
    back = RunTrace.from_json(json.dumps(tr.to_dict()))
    assert back == tr
    assert isinstance(back.rounds[0].nodes[0], NodeTrace)
    assert back.rounds[0].p_top[0].token_ids == (5, 7)


def test_the_typed_records_round_trip_through_json():
    tr = _trace()
    tr = replace(tr, rounds=(replace(tr.rounds[0], controller=replace(
        tr.rounds[0].controller, kind="cost"), switch=PLAN), RoundTrace(1, switch=PLAN)))
    back = RunTrace.from_json(tr.to_json())
    assert back == tr and back.to_json() == tr.to_json()
    assert back.stats.cost == COST and back.stats.cost.projected.speedup == 2.1
    assert back.rounds[0].switch == PLAN and back.rounds[1].switch == PLAN
    assert back.rounds[1].controller is None


def test_a_switch_plan_stored_in_the_old_places_becomes_the_round_s_own():
    """Before the plan was a round's field, a token method kept it in its controller's state
    and a beam method in its extras: both import as the round's switch."""
    tr = _trace()
    tr = replace(tr, rounds=(replace(tr.rounds[0], controller=replace(
        tr.rounds[0].controller, kind="cost")), RoundTrace(1), RoundTrace(2)))
    plan = json.loads(json.dumps(asdict(PLAN)))
    d = json.loads(tr.to_json())
    for r in d["rounds"]:
        del r["switch"]
    d["rounds"][0]["controller"]["switch"] = plan
    d["rounds"][1]["extras"] = {"switch": plan}
    back = RunTrace.from_dict(d)
    assert [r.switch for r in back.rounds] == [PLAN, PLAN, None]
    bad = json.loads(json.dumps(d))
    bad["rounds"][1]["extras"]["switch"]["depth"] = "two"
    with pytest.raises(TraceError, match=r"rounds\[1\]\.switch\.depth: expected int"):
        RunTrace.from_dict(bad)


def test_a_trace_in_the_old_shape_still_imports():
    """Written before the records (stats a dict with the cost model's English summary,
    controller states without a switch): it imports, its extra keys ignored, and the views
    build today's sentence from its numbers (the stored one named the round-time speedup
    "measured")."""
    data = json.loads(OLD_TRACE.read_text())
    old_cost = data["stats"]["cost"]
    assert "summary" in old_cost and "switch" not in data["rounds"][1]["controller"]
    tr = RunTrace.from_dict(data)
    assert isinstance(tr.stats, RunSummary) and tr.stats.tau == data["stats"]["tau"]
    assert tr.stats.cost.kind == "tree" and tr.stats.cost.projected is None
    assert old_cost["summary"].startswith("a round costs 1.28 target steps (drafting 0.11, "
                                          "verifying 1.16) and commits 2.55 tokens")
    assert cost_sentence(tr.stats.cost) == (
        "over rounds 1..11 (round 0, which also prefills the prompt, left out): a round costs "
        "1.28 target steps (drafting 0.11, verifying 1.16) and commits 2.55 tokens per round: "
        "break-even needs 1.28 tokens per round · predicted 1.99x, round-time 1.88x (tokens × "
        "a plain step's time / the rounds' time; efficiency 94% = round-time / predicted)")
    state = tr.rounds[1].controller
    assert isinstance(state, ControllerState) and state.kind == "confidence"
    assert tr.rounds[1].switch is None
    assert RunTrace.from_json(tr.to_json()) == tr
    assert RunTrace.from_dict({**data, "stats": {}}).stats == RunSummary()


OPTIMAL = {"depth": 1, "parent": -1, "n": 2, "scheme": "without_replacement", "rule": "rrs_wor",
           "alpha_star": 0.9, "certificate_size": 3, "achieved": 0.7, "expected": None,
           "tv": 0.2}
DECISION = {"alphas": [0.98, 0.41], "P": [0.01, 0.6, 0.39], "tails": [1.0, 0.99, 0.39],
            "t": 0.7, "chosen": 1, "w_tilde": 1, "w_min": 1, "expected": 1.38, "beta_min": 0.99,
            "depth": 1}
OLD_EXTRAS = [  # one round per method family, as the methods wrote them before RoundExtras
    {"k_config": [2, 2], "rule": "rrs_wor", "tree_nodes": 6, "optimal": [OPTIMAL]},
    {"steps": [{"depth": 1, "kind": "drafted", "accepted": False, "target_topk": [[5, -0.1]]}],
     "first_failing_step": 1, "draft_beams": 2, "fill": True,
     "gate": {"threshold": 0.2, "confidence": 0.35, "drafted": True}, "beams": 2, "depth": 1},
    {"draws": [[0, 5, 0.25, False], [1, 7, 0.5, True]], "beams": 2},
    {"mode": "one_cache", "draft_beams": 4, "threshold": 0.7, "min_width": 1,
     "layers": [{"depth": 1, "width": 1, "outcome": "accepted", "decision": DECISION}],
     "last_layer": 2, "depth": 1, "gate": {"threshold": 0.2, "confidence": None,
                                           "drafted": False}, "width": [DECISION]},
    {"kv_cache": {"shared": 7, "deep": 7, "ee": 6, "kept": 6}, "drafter": "early-exit",
     "predictor": "trained", "switch": {"depth": 1}, "an_unknown_key": [1, 2]},
]


def test_old_shape_extras_of_every_method_family_import_as_round_extras():
    """Extras written as a dict of JSON values per method family read into RoundExtras:
    lists become tuples, the nested records their records, unknown keys are ignored."""
    d = json.loads(_trace().to_json())
    d["rounds"] = [{**d["rounds"][0], "index": i, "extras": ex}
                   for i, ex in enumerate(OLD_EXTRAS)]
    tr = RunTrace.from_dict(d)
    token, strict, sampling, dsbd, eesd = (r.extras for r in tr.rounds)
    assert token == RoundExtras(k_config=(2, 2), rule="rrs_wor", tree_nodes=6,
                                optimal=(OptimalRecord(**OPTIMAL),))
    assert strict.gate == GateRecord(0.2, 0.35, True) and strict.fill is True
    assert strict.steps[0]["target_topk"] == [[5, -0.1]] and strict.first_failing_step == 1
    assert sampling.draws == ((0, 5, 0.25, False), (1, 7, 0.5, True)) and sampling.beams == 2
    width = WidthDecision(alphas=(0.98, 0.41), P=(0.01, 0.6, 0.39), tails=(1.0, 0.99, 0.39),
                          t=0.7, chosen=1, w_tilde=1, w_min=1, expected=1.38, beta_min=0.99,
                          depth=1)
    assert dsbd.width == (width,) and dsbd.gate == GateRecord(0.2, None, False)
    assert (dsbd.mode, dsbd.draft_beams, dsbd.threshold, dsbd.min_width, dsbd.last_layer,
            dsbd.depth) == ("one_cache", 4, 0.7, 1, 2, 1)
    assert dsbd.layers[0]["decision"] == DECISION  # free-form: kept as written
    assert eesd == RoundExtras(kv_cache={"shared": 7, "deep": 7, "ee": 6, "kept": 6},
                               drafter="early-exit", predictor="trained")
    assert RunTrace.from_json(tr.to_json()) == tr
    summary = summarize(tr.rounds, 2)
    assert summary.verifier_efficiency == pytest.approx(0.7 / 0.9)
    bad = json.loads(json.dumps(d))
    bad["rounds"][1]["extras"]["gate"]["drafted"] = "yes"
    with pytest.raises(TraceError, match=r"rounds\[1\]\.extras\.gate\.drafted: expected bool"):
        RunTrace.from_dict(bad)


def test_round_extras_round_trip_through_json():
    ex = RoundExtras(
        k_config=(4, 2), rule="sd", tree_nodes=3, optimal=(OptimalRecord(**OPTIMAL),),
        steps=({"depth": 1, "accepted": True},), first_failing_step=None, draft_beams=2,
        fill=False, gate=GateRecord(0.3, 0.5, True), beams=2, depth=1,
        draws=((0, 5, 0.25, False),), mode="full", threshold=0.7, min_width=2,
        layers=({"depth": 1, "width": 2, "outcome": "bonus"},), last_layer=1,
        width=(WidthDecision(depth=1, alphas=(0.5,), P=(0.5, 0.5), chosen=1),),
        kv_cache={"shared": 3, "kept": 2}, drafter="early-exit", predictor="constant")
    tr = replace(_trace(), rounds=(replace(_trace().rounds[0], extras=ex), RoundTrace(1)))
    back = RunTrace.from_json(tr.to_json())
    assert back == tr and back.to_json() == tr.to_json()
    assert back.rounds[0].extras == ex and back.rounds[1].extras == RoundExtras()
    assert isinstance(back.rounds[0].extras.optimal[0], OptimalRecord)


def test_summary_counts_acceptance_tau_and_per_depth():
    s = _trace().stats
    assert s.acceptance_rate == 1.0
    assert s.tau == 2.0
    assert s.per_depth_acceptance == {"1": 1.0}
    assert s.time_split_s == {"propose": 0.1, "score": 0.2}


def _with_beam_steps() -> RunTrace:
    tr = _trace()
    step = BeamStep(1, "drafted", (TargetBeam(1, 0, -1, 5, "a", -0.7, 0),
                                   TargetBeam(2, 0, -1, 7, "c", -1.6, -1, 0.2)),
                    (DraftMatch(0, 0, 1, -0.7), DraftMatch(0, 1, 0, None)), False,
                    "target beam #2 'c' (score -1.60) was not drafted")
    return replace(tr, rounds=(replace(tr.rounds[0], beam_steps=(step,)),))


def test_beam_steps_round_trip_through_json():
    tr = _with_beam_steps()
    back = RunTrace.from_json(tr.to_json())
    assert back == tr
    assert back.rounds[0].beam_steps[0].target_beams[1] == TargetBeam(2, 0, -1, 7, "c", -1.6,
                                                                       -1, 0.2)


def test_a_round_without_beam_steps_reads_as_none_recorded():
    d = _with_beam_steps().to_dict()
    del d["rounds"][0]["beam_steps"]
    assert RunTrace.from_dict(d).rounds[0].beam_steps == ()
