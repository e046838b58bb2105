"""A run's rounds as a Chrome trace-event timeline (the JSON Perfetto's UI, chrome://tracing
and speedscope open): one span per round, tiled by its step spans, and counters per round.

Each round's steps carry the names the serving engines give them beside the engine's own:
draft (propose), verify (score: the target forward), accept (verify: the rule), commit,
observe. A trace holds each step's duration, not its clock time, so the rounds are laid end
to end from 0 in the engine's own time (the caller's time between rounds is left out, as in
``RunSummary.wall_s``). Pure: a RunTrace in, a JSON-serialisable dict out.

Format (the Trace Event Format): ``{"traceEvents": [...], "displayTimeUnit": "ms"}``;
complete events ``ph = "X"`` with ``ts`` and ``dur`` in microseconds, ``pid``, ``tid``;
counters ``ph = "C"`` whose ``args`` are the series; metadata ``ph = "M"`` names the process
and the thread.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from engine.contract.trace import BONUS, RESAMPLED, TARGET, RunTrace

PID, TID = 1, 1
# (the engine's step, the name serving engines give it): SGLang's draft / verify / accept
STEPS = (("propose", "draft"), ("score", "verify"), ("verify", "accept"),
         ("commit", "commit"), ("observe", "observe"))
NOT_DRAFTED = (RESAMPLED, BONUS, TARGET)


def step_name(step: str) -> str:
    """A step span's name: the serving engines' word and the engine's own."""
    common = dict(STEPS).get(step, step)
    return common if common == step else f"{common} ({step})"


def _us(ns: int) -> float:
    return ns / 1000.0


def timeline(trace: RunTrace) -> dict[str, Any]:
    """The trace-event JSON of a run (see module docstring)."""
    label = f"{trace.method} on {trace.target}" + (f" + {trace.draft}" if trace.draft else "")
    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": PID, "tid": TID, "args": {"name": label}},
        {"name": "thread_name", "ph": "M", "pid": PID, "tid": TID, "args": {"name": "rounds"}},
    ]
    clock = 0  # nanoseconds since the first round began
    for r in trace.rounds:
        known = [s for s, _ in STEPS if s in r.timings]
        steps = known + sorted(k for k in r.timings if k not in known)
        spans = [(s, round(max(r.timings[s], 0.0) * 1e9)) for s in steps]
        start = clock
        drafted = sum(1 for n in r.nodes if n.status not in NOT_DRAFTED)
        events.append({"name": f"round {r.index}", "cat": "round", "ph": "X", "pid": PID,
                       "tid": TID, "ts": _us(start), "dur": _us(sum(d for _, d in spans)),
                       "args": {"drafted": r.drafted, "accepted": r.accepted,
                                "committed": len(r.committed), "drafted_nodes": drafted,
                                "target_calls": r.target_calls, "draft_calls": r.draft_calls}})
        for step, dur in spans:
            events.append({"name": step_name(step), "cat": "step", "ph": "X", "pid": PID,
                           "tid": TID, "ts": _us(clock), "dur": _us(dur),
                           "args": {"round": r.index}})
            clock += dur
        events.append({"name": "tokens a round", "ph": "C", "pid": PID, "ts": _us(start),
                       "args": {"committed": len(r.committed), "accepted": r.accepted}})
        events.append({"name": "drafted nodes", "ph": "C", "pid": PID, "ts": _us(start),
                       "args": {"nodes": drafted}})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"method": trace.method, "target": trace.target,
                          "draft": trace.draft, "device": trace.device,
                          "rounds": len(trace.rounds), "new_tokens": trace.stats.new_tokens,
                          "clock": "engine time, rounds end to end from 0"}}


def write_timeline(trace: RunTrace, path: str | Path) -> Path:
    """Write the run's trace-event JSON to `path` (what Perfetto's UI opens)."""
    path = Path(path)
    path.write_text(json.dumps(timeline(trace), separators=(",", ":")))
    return path
