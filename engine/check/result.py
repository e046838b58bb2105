"""What a check is asked (CheckConfig) and what it answers (CheckResult)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from engine.check.stats import ALPHA, MAX_RUNS, MIN_RUNS, POWER
from engine.run.pacing import own_clock

# ------------------------------------------------------------------ results


@dataclass(frozen=True)
class CheckConfig:
    """How a law check is sized: false-alarm rate, power goal, bounds on the runs, a fixed
    number of runs (None: from the power calculation) and a time budget (None: no cap; else
    N is cut to what fits, and the power at that N is reported)."""

    alpha: float = ALPHA
    power: float = POWER
    min_runs: int = MIN_RUNS
    max_runs: int = MAX_RUNS
    runs: int | None = None
    max_seconds: float | None = None


@dataclass(frozen=True)
class CheckResult:
    """A check's outcome. verdict: "pass" | "fail" | "distance" (approximate methods).

    plot: (cell text, observed frequency, expected frequency) per drawn cell (law checks).
    """

    method: str
    mode: str  # "identical" | "law"
    verdict: str
    lines: tuple[str, ...]
    runs: int = 0
    plot: tuple[tuple[str, float, float], ...] = ()
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        return 1 if self.verdict == "fail" else 0

    def text(self) -> str:
        return "\n".join(self.lines)


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    """fn() and the seconds it took itself (less any time a caller's pacing hook let other
    work run: engine.run.pacing)."""
    t0 = own_clock()
    out = fn()
    return out, own_clock() - t0
