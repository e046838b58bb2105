"""Per-session UI state kept in ``gr.State``: the parsed RunTrace and the selected round.

The trace is held as a RunTrace object, parsed once (from a run, an import or the demo file),
never re-parsed by navigation; views that depend on the whole trace but not on the selected
round (the text, the per-round series) are computed once per trace and kept in ``memo``,
which every navigation copy of the state shares. Gradio keeps a State value by reference
(it copies only the initial value, once per session).
"""

from __future__ import annotations

import json
import threading
import weakref
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from engine.contract.trace import RunTrace
from engine.core.errors import ConfigError
from engine.core.paths import ASSETS

DEMO_TRACE = ASSETS / "demo_trace.json"
# A parsed trace holds about 6.5 kB of Python objects per round (its beams, committed tokens,
# target top-k, timings, controller and extras) and about 340 B per forest node, verification
# test or beam match (tracemalloc around RunTrace.from_json on imports at the caps: the n-gram
# demo's rounds of ~3 nodes and mcsd rounds of ~21 nodes; docs/hosting.md). So a round
# counts as 19 records, and the budget is 3,500,000 x 340 B = 1.19 GB of parsed traces.
ROUND_RECORDS = 19  # record-equivalents of a round's own fields (6.5 kB / 340 B)
MAX_HELD_RECORDS = 3_500_000  # weight() of every session's trace together: about 1.2 GB


def weight(trace: RunTrace) -> int:
    """A trace's size in records: ROUND_RECORDS per round, plus its forest nodes,
    verification tests and beam matches (about 340 bytes each when parsed)."""
    return sum(ROUND_RECORDS + len(r.nodes) + len(r.tests)
               + sum(len(s.target_beams) + len(s.drafted) for s in r.beam_steps)
               for r in trace.rounds)


class TraceBudget:
    """The traces sessions hold, each counted once (sessions share a trace by reference)
    and released when it is garbage, and a cap on their total weight."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._held: dict[int, int] = {}  # id(trace) -> weight
        self._lock = threading.RLock()  # a release may run inside a hold (garbage collection)

    @property
    def total(self) -> int:
        with self._lock:
            return sum(self._held.values())

    def hold(self, trace: RunTrace) -> None:
        key = id(trace)
        with self._lock:
            if key in self._held:
                return
        records = weight(trace)
        with self._lock:
            if key in self._held:
                return
            self._held[key] = records
        weakref.finalize(trace, self._release, key)

    def _release(self, key: int) -> None:
        with self._lock:
            self._held.pop(key, None)

    def admit(self, records: int = 0) -> None:
        """Refuse (one line) a new trace of this weight when the total would pass the cap."""
        total = self.total
        if total + records > self.cap:
            raise ConfigError(f"the server holds {total:,} trace records for its sessions "
                              f"(limit {self.cap:,}): try again in a while")


HELD = TraceBudget(MAX_HELD_RECORDS)


@dataclass
class SessionState:
    """What one browser session is looking at.

    trace: the RunTrace (possibly partial while a run streams), or None.
    round: index of the selected round.
    source: "demo" | "run" | "import" | "" (where the trace came from).
    live: a run is streaming into this state.
    """

    trace: RunTrace | None = None
    round: int = 0
    source: str = ""
    live: bool = False
    memo: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.trace is not None and not self.live:
            HELD.hold(self.trace)

    @property
    def n_rounds(self) -> int:
        return len(self.trace.rounds) if self.trace else 0

    def run_trace(self) -> RunTrace | None:
        return self.trace

    def at(self, index: int) -> SessionState:
        """A copy with the selected round clamped into range (same trace, same memo)."""
        last = max(self.n_rounds - 1, 0)
        return replace(self, round=min(max(int(index), 0), last))

    def __deepcopy__(self, memo: dict) -> SessionState:
        """Gradio deep-copies the opening state into every new session: the trace is frozen
        and ``memo`` holds only values derived from it, so sessions share both instead of
        each holding a copy."""
        return replace(self)

    def cached(self, key: str, build: Callable[[], Any]) -> Any:
        """A value derived from the whole trace, built once per trace (not while live)."""
        if self.live:
            return build()
        if key not in self.memo:
            self.memo[key] = build()
        return self.memo[key]

    def to_json(self) -> str:
        trace = self.trace.to_dict() if self.trace else None
        return json.dumps({"trace": trace, "round": self.round, "source": self.source,
                           "live": self.live})

    @classmethod
    def from_json(cls, text: str) -> SessionState:
        d = json.loads(text)
        trace = RunTrace.from_dict(d["trace"]) if d.get("trace") else None
        return cls(trace, d.get("round", 0), d.get("source", ""), d.get("live", False))


def coerce(state: Any) -> SessionState:
    """A SessionState from whatever gr.State hands back (dataclass or None)."""
    if isinstance(state, SessionState):
        return state
    return SessionState()


def demo_state() -> SessionState:
    """The recorded demo trace, opened at its first round with the most accepted drafts and,
    among those, the most forest nodes (an accepted branch beside a rejected one tells more
    than an all-rejected round or a lone chain); empty state if it is missing."""
    if not DEMO_TRACE.exists():
        return SessionState()
    trace = RunTrace.from_json(DEMO_TRACE.read_text())
    score = [(r.accepted, len(r.nodes)) for r in trace.rounds]
    first = score.index(max(score)) if score else 0
    return SessionState(trace=trace, round=first, source="demo")
