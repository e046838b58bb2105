"""Per-session UI state kept in ``gr.State``: a JSON-able dataclass, never tensors.

The trace is stored in its ``RunTrace.to_dict()`` form so a session can be exported,
imported and replayed without a model.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from engine.trace import RunTrace

ASSETS = Path(__file__).resolve().parent.parent / "assets"
DEMO_TRACE = ASSETS / "demo_trace.json"


@dataclass
class SessionState:
    """What one browser session is looking at.

    trace: a RunTrace dict (possibly partial while a run streams), or None.
    round: index of the selected round.
    source: "demo" | "run" | "import" | "" (where the trace came from).
    """

    trace: dict[str, Any] | None = None
    round: int = 0
    source: str = ""
    live: bool = False  # a run is streaming into this state

    @property
    def n_rounds(self) -> int:
        return len(self.trace["rounds"]) if self.trace else 0

    def run_trace(self) -> RunTrace | None:
        return RunTrace.from_dict(self.trace) if self.trace else None

    def at(self, index: int) -> SessionState:
        """A copy with the selected round clamped into range."""
        last = max(self.n_rounds - 1, 0)
        return replace(self, round=min(max(int(index), 0), last))

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> SessionState:
        return cls(**json.loads(text))


def coerce(state: Any) -> SessionState:
    """A SessionState from whatever gr.State hands back (dataclass, dict or None)."""
    if isinstance(state, SessionState):
        return state
    if isinstance(state, dict):
        return SessionState(**state)
    return SessionState()


def demo_state() -> SessionState:
    """The recorded demo trace, opened at its first round with the most accepted drafts
    (a more telling first view than an all-rejected round); empty state if it is missing."""
    if not DEMO_TRACE.exists():
        return SessionState()
    data = json.loads(DEMO_TRACE.read_text())
    RunTrace.from_dict(data)  # fail early if the shipped file no longer matches the contract
    accepted = [r.get("accepted", 0) for r in data["rounds"]]
    first = accepted.index(max(accepted)) if accepted else 0
    return SessionState(trace=data, round=first, source="demo")
