"""Controllers whose round is bounded by a length or by the draft's confidence: fixed,
heuristic (transformers' assisted decoding schedule) and confidence (its
``assistant_confidence_threshold``).
"""

from __future__ import annotations

from typing import Any

import torch

from engine.control.config import ControlConfig, check
from engine.control.recorder import Features, RoundRecorder
from engine.core.sampling import Chooser


class _LengthController(RoundRecorder):
    """A controller whose round length is decided before the round (no sampling)."""

    def should_continue(
        self, drafted: int, rng: torch.Generator | Chooser, features: Features = None
    ) -> bool:
        if self._at_limit(drafted, "length"):
            return False
        return self._record({"step": drafted, "theta": None, "uniform": None, "continue": True})


class FixedController(_LengthController):
    """Always drafts exactly gamma tokens (vanilla SD)."""

    name = "fixed"

    def __init__(self, *, gamma: int) -> None:
        check(gamma >= 1, f"gamma must be >= 1, got {gamma}")
        self.gamma = gamma
        super().__init__()

    def settings(self) -> dict[str, Any]:
        return {"gamma": self.gamma}

    def _params(self) -> dict[str, Any]:
        return {"length": self.gamma}

    def _update(self, drafted: int, accepted: int) -> dict[str, Any]:
        return {}

    def max_len(self) -> int:
        return self.gamma


class HeuristicController(_LengthController):
    """transformers' assisted-decoding heuristic: +2 after an all-accepted round, else -1."""

    name = "heuristic"
    reads = ("cap",)

    def __init__(self, config: ControlConfig, *, start: int) -> None:
        """start: the first round's length (+2 after a fully accepted round, else -1)."""
        check(1 <= start <= config.cap, f"need 1 <= start <= cap, got {start}, {config.cap}")
        self.config, self.start, self.length = config, start, start
        super().__init__()

    def settings(self) -> dict[str, Any]:
        return {"start": self.start, **super().settings()}

    def _params(self) -> dict[str, Any]:
        return {"length": self.length}

    def _update(self, drafted: int, accepted: int) -> dict[str, Any]:
        if drafted > 0:  # nothing verified: keep the length
            grow = accepted == drafted
            self.length = min(self.length + 2, self.config.cap) if grow else max(1, self.length - 1)
        return {}

    def max_len(self) -> int:
        return self.length


class ConfidenceController(RoundRecorder):
    """Draft on while the drafter is sure: after each drafted token, continue iff the draft
    gave that token probability >= ``confidence`` (at temperature 1), up to ``cap`` (the rule
    of transformers' ``assistant_confidence_threshold``). The length depends on the draft
    side only, so every verification rule stays exact."""

    name = "confidence"
    reads = ("confidence", "cap")
    reads_confidence = True  # should_continue's features: the newest token's q (a float)

    def __init__(self, config: ControlConfig) -> None:
        self.config = config
        super().__init__()

    def should_continue(
        self, drafted: int, rng: torch.Generator | Chooser, features: Features = None
    ) -> bool:
        if self._at_limit(drafted, "cap"):
            return False
        if features is None:
            raise ValueError("the confidence controller needs the newest token's probability")
        return self._confidence_step(drafted, float(features))

    def _params(self) -> dict[str, Any]:
        return {"threshold": self.config.confidence}

    def _update(self, drafted: int, accepted: int) -> dict[str, Any]:
        return {}
