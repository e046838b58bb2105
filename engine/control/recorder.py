"""The draft-length controller interface and the round bookkeeping every controller shares
(posterior before / after, per-step records, cap and outcome; :meth:`Controller.state` is the
JSON snapshot the trace stores).
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

import torch

from engine.contract.records import ControllerState, SwitchPlan
from engine.control.config import ControlConfig
from engine.control.cost import CostProfile, Shape
from engine.core.sampling import Chooser

Features = Any  # what a Cali-TS predictor reads (see module docstring); None: nothing
Predictor = Callable[[Features], float]  # features -> theta_M in [0, 1] (EESD Eq. 5)


class Controller(Protocol):
    name: str

    def begin_round(self) -> None: ...

    def should_continue(
        self, drafted: int, rng: torch.Generator | Chooser, features: Features = None
    ) -> bool:
        """Called after the `drafted`-th token of the round (>= 1); False stops drafting.
        Always False once drafted >= the round's cap. Records theta and the decision."""

    def observe(self, drafted: int, accepted: int) -> None:
        """After verification: drafted tokens in the round, accepted of them (0..drafted)."""

    def state(self) -> ControllerState:
        """The round's record: kind, posterior before, per-step theta/decisions, cap, after."""

    def max_len(self) -> int:
        """Upper bound on this round's draft length (for buffers)."""

    # What a method may ask of any controller (the cost switch answers differently):
    reads_confidence: bool  # should_continue wants the newest draft token's q as features
    plans: bool  # plan() picks the round's depth before any draft call
    decided: bool  # plan() ran this round (a plain round it planned is still observed)

    def costs_wanted(self) -> str | None:
        """The cost profile this controller plans with (None: none)."""

    def attach(self, profile: CostProfile) -> None:
        """Plan with `profile` from now on."""

    def plan(self, shape: Shape, rng: torch.Generator | Chooser, *, behind: int = 1,
             remaining: int | None = None, context: str | None = None,
             seconds: float | None = None) -> int:
        """This round's depth in 0..shape.depth (0: a plain target step): the drafter's
        uncached tokens, the tokens left, the round's context (None: one context) and the
        previous round's seconds (None: not known)."""

    def plan_record(self) -> SwitchPlan | None:
        """The round's plan (None: plan() did not run this round)."""

    def can_draft(self, shape: Shape) -> bool:
        """Whether a round of `shape` could ever draft (False: the switch plans plain for
        good, engine.control.cost.CostSwitch.can_draft)."""


class RoundRecorder:
    """Shared round bookkeeping: posterior before/after, per-step records, cap and outcome."""

    name = "base"
    reads: tuple[str, ...] = ()  # the ControlConfig fields this kind uses (its state's config)
    config: ControlConfig
    reads_confidence = False
    plans = False
    decided = False

    def costs_wanted(self) -> str | None:
        return None

    def attach(self, profile: CostProfile) -> None:
        raise ValueError(f"the {self.name} controller plans without a cost profile")

    def plan(self, shape: Shape, rng: torch.Generator | Chooser) -> int:
        raise ValueError(f"the {self.name} controller does not plan rounds")

    def plan_record(self) -> SwitchPlan | None:
        return None

    def can_draft(self, shape: Shape) -> bool:
        return True  # no switch: the controller's own rule decides each round

    def __init__(self) -> None:
        self.begin_round()

    def max_len(self) -> int:
        """The round's cap: config.cap (the length controllers bound rounds otherwise)."""
        return self.config.cap

    def settings(self) -> dict[str, Any]:
        """The parameters this controller was built with (JSON values)."""
        return {name: getattr(self.config, name) for name in self.reads}

    def _params(self) -> dict[str, Any]:
        """Current posterior / length parameters (JSON values)."""
        raise NotImplementedError

    def _update(self, drafted: int, accepted: int) -> dict[str, Any]:
        """Apply one verification outcome; return what the update used."""
        raise NotImplementedError

    def begin_round(self) -> None:
        self._before = self._params()
        self._cap = self.max_len()  # fixed for the round (the heuristic's length moves on observe)
        self._steps: list[dict[str, Any]] = []
        self._stop_reason: str | None = None
        self._outcome: dict[str, Any] | None = None
        self._after: dict[str, Any] | None = None

    def _at_limit(self, drafted: int, reason: str) -> bool:
        """True (and a recorded stop) once drafted reaches the round's cap."""
        if drafted < 1:
            raise ValueError(f"should_continue needs drafted >= 1, got {drafted}")
        if drafted < self._cap:
            return False
        self._steps.append({"step": drafted, "theta": None, "uniform": None, "continue": False})
        self._stop_reason = reason
        return True

    def _confidence_step(self, drafted: int, q: float | None) -> bool:
        """Go on iff the newest token's q >= config.confidence (None: no q, go on); recorded,
        a stop as "confidence"."""
        go = q is None or q >= self.config.confidence
        self._steps.append({"step": drafted, "theta": None, "uniform": None, "q": q,
                            "continue": go})
        if not go:
            self._stop_reason = "confidence"
        return go

    def _record(self, step: dict[str, Any]) -> bool:
        """Append a sampled step; note a chi = 0 stop. Returns the decision."""
        self._steps.append(step)
        if not step["continue"]:
            self._stop_reason = "chi0"
        return step["continue"]

    def observe(self, drafted: int, accepted: int) -> None:
        if not 0 <= accepted <= drafted:
            raise ValueError(f"need 0 <= accepted <= drafted, got {accepted}, {drafted}")
        update = self._update(drafted, accepted)
        self._outcome = {"drafted": drafted, "accepted": accepted, **update}
        self._after = self._params()

    def state(self) -> ControllerState:
        return ControllerState(
            kind=self.name,
            config=self.settings(),
            cap=self._cap,
            before=dict(self._before),
            steps=tuple(dict(s) for s in self._steps),
            cap_hit=self._stop_reason == "cap",
            stop_reason=self._stop_reason,
            update=None if self._outcome is None else dict(self._outcome),
            after=None if self._after is None else dict(self._after),
        )
