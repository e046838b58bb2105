from __future__ import annotations

import json
from dataclasses import replace

from engine.core.trace import (
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
        controller={"kind": "beta_ts", "after": {"alpha": 2}},
        extras={"width": [{"chosen": 2}]}, p_top=(TopK((5, 7), (0.25, 0.2)),),
    )
    return RunTrace("sd", {"gamma": 1}, "t", "d", "cpu", "hi", (1, 2), (rnd,), (5, 6), "ab",
                    (BeamTrace((5, 6), -1.5, True),), summarize((rnd,), 2), "eos",
                    ("accepted", "bonus"), (0, 0), ("h", "i"))


def test_run_trace_round_trips_through_json():
    tr = _trace()
    back = RunTrace.from_json(json.dumps(tr.to_dict()))
    assert back == tr
    assert isinstance(back.rounds[0].nodes[0], NodeTrace)
    assert back.rounds[0].p_top[0].token_ids == (5, 7)


def test_summary_counts_acceptance_tau_and_per_depth():
    s = _trace().stats
    assert s["acceptance_rate"] == 1.0
    assert s["tau"] == 2.0
    assert s["per_depth_acceptance"] == {"1": 1.0}
    assert s["time_split_s"] == {"propose": 0.1, "score": 0.2}


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
