"""A run's timeline is valid Chrome trace-event JSON whose step spans tile each round."""

from __future__ import annotations

import json
from numbers import Real

import pytest

from engine.analysis.timeline import STEPS, step_name, timeline
from engine.contract.trace import RunTrace
from engine.core.paths import ASSETS

DEMO = ASSETS / "demo_trace.json"


@pytest.fixture(scope="module")
def trace() -> RunTrace:
    return RunTrace.from_json(DEMO.read_text())


def check_trace_event_format(doc: dict) -> list[dict]:
    """The Trace Event Format's JSON object form: every event a phase we write (X complete,
    C counter, M metadata) with its required fields; the events."""
    assert set(doc) >= {"traceEvents"} and doc["displayTimeUnit"] in ("ms", "ns")
    json.dumps(doc)  # JSON values only
    for e in doc["traceEvents"]:
        assert isinstance(e["name"], str) and isinstance(e["pid"], int), e
        if e["ph"] == "X":
            assert isinstance(e["tid"], int) and isinstance(e["ts"], Real), e
            assert isinstance(e["dur"], Real) and e["dur"] >= 0 and e["ts"] >= 0, e
        elif e["ph"] == "C":
            assert isinstance(e["ts"], Real) and e["args"], e
            assert all(isinstance(v, Real) for v in e["args"].values()), e
        elif e["ph"] == "M":
            assert e["name"] in ("process_name", "thread_name") and e["args"]["name"], e
        else:
            raise AssertionError(f"unexpected phase {e['ph']!r}")
    return doc["traceEvents"]


def test_the_timeline_is_trace_event_json(trace):
    events = check_trace_event_format(timeline(trace))
    rounds = [e for e in events if e["ph"] == "X" and e["cat"] == "round"]
    assert [e["name"] for e in rounds] == [f"round {r.index}" for r in trace.rounds]


def test_timestamps_are_microseconds_of_the_rounds_own_timings(trace):
    events = timeline(trace)["traceEvents"]
    rounds = [e for e in events if e["ph"] == "X" and e["cat"] == "round"]
    for e, r in zip(rounds, trace.rounds):
        assert e["dur"] == pytest.approx(sum(r.timings.values()) * 1e6, abs=1e-2)
    total_us = sum(sum(r.timings.values()) for r in trace.rounds) * 1e6
    last = rounds[-1]
    assert last["ts"] + last["dur"] == pytest.approx(total_us, abs=1e-2)
    assert total_us > 1000  # a negative control: seconds or milliseconds would fail above


def test_step_spans_tile_each_round_and_rounds_tile_the_run(trace):
    events = timeline(trace)["traceEvents"]
    rounds = [e for e in events if e["ph"] == "X" and e["cat"] == "round"]
    clock = 0.0
    for e, r in zip(rounds, trace.rounds):
        assert e["ts"] == pytest.approx(clock, abs=1e-6)
        steps = [s for s in events if s["ph"] == "X" and s["cat"] == "step"
                 and s["args"]["round"] == r.index]
        assert [s["name"] for s in steps] == [step_name(k) for k, _ in STEPS if k in r.timings]
        at = e["ts"]
        for s in steps:
            assert s["ts"] == pytest.approx(at, abs=1e-6)
            at = s["ts"] + s["dur"]
        assert at == pytest.approx(e["ts"] + e["dur"], abs=1e-6)
        clock = e["ts"] + e["dur"]


def test_counters_give_tokens_a_round_and_drafted_nodes(trace):
    events = timeline(trace)["traceEvents"]
    tokens = [e["args"]["committed"] for e in events
              if e["ph"] == "C" and e["name"] == "tokens a round"]
    nodes = [e["args"]["nodes"] for e in events
             if e["ph"] == "C" and e["name"] == "drafted nodes"]
    assert tokens == [len(r.committed) for r in trace.rounds]
    assert sum(tokens) == trace.stats.new_tokens
    assert max(nodes) > 0 and len(nodes) == len(trace.rounds)


def test_steps_carry_the_serving_engines_names():
    assert step_name("propose") == "draft (propose)"
    assert step_name("score") == "verify (score)"
    assert step_name("verify") == "accept (verify)"
    assert step_name("commit") == "commit"
