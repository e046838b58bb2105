"""The cost-aware switch (:mod:`engine.control.cost`) as a draft-length controller."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from engine.contract.records import SwitchPlan
from engine.contract.trace import SOURCE_LOOKUP as LOOKUP
from engine.control.config import ControlConfig
from engine.control.cost import CostProfile, CostSwitch, Shape
from engine.control.guard import TimedGuard
from engine.control.recorder import Features, RoundRecorder
from engine.core.sampling import Chooser


class CostController(RoundRecorder):
    """The cost-aware switch (:mod:`engine.control.cost`) as a draft-length controller: at the
    start of a round :meth:`plan` picks the depth D* (0: a plain target step) with the best
    expected tokens per cost from the acceptance posterior and the cost profile; drafting then
    stops at D*, at ``cap``, or earlier when the newest token's q falls under ``confidence``
    (0: never). With ``guard="timed"`` a drafted plan also passes the run's own clock
    (engine.control.guard). Decisions read the past (its rounds' outcomes and, under the
    guard, their seconds), the profile, the chooser and the draft only."""

    name = "cost"
    reads = ("cap", "confidence", "costs", "discount", "guard", "plan")
    reads_confidence = True  # should_continue's features: the newest token's q (a float)
    plans = True

    def costs_wanted(self) -> str | None:
        return self.config.costs

    def __init__(self, config: ControlConfig) -> None:
        self.config = config
        self.profile: CostProfile | None = None
        self.switches: dict[str | None, CostSwitch] = {}  # one per context (plan's)
        self.switch: CostSwitch | None = None  # the round's
        self.shape: Shape | None = None
        self.planned = config.cap
        self.decided = False  # plan() ran this round
        self._rest_states: dict[str | None, Any] = {}  # per context: the record of every
        # round while its switch rests
        self.guard: TimedGuard | None = None  # guard="timed": the run's rounds by kind
        self._last: tuple[str | None, bool, int] | None = None  # the planned round, once
        # observed: (context, drafted, tokens committed), until its seconds come
        self._catching_up = False  # the round's drafter had uncached tokens to read first
        super().__init__()

    def attach(self, profile: CostProfile) -> None:
        """Use `profile` from now on (a run attaches the profile it resolved once)."""
        self.profile, self.switches, self._rest_states = profile, {}, {}
        self.guard = TimedGuard() if self.config.guard == "timed" else None
        self._last = None
        self.switch = self._switch(None)

    def _switch(self, context: str | None) -> CostSwitch:
        """The switch of `context`, made at its first round: each context learns its own
        acceptance, probes and rests on its own (engine.control.cost, contexts); the lookup's
        prices its draft calls at the profile's c_lookup where measured, and its unreached
        depths take the mean of the depth above (DepthPosterior.carry)."""
        if context not in self.switches:
            profile = self.profile
            if context == LOOKUP and profile.c_lookup is not None:  # its calls run no forward
                profile = replace(profile, c_draft=profile.c_lookup)
            self.switches[context] = CostSwitch(
                profile, self.config.cap, discount=self.config.discount,
                plan=self.config.plan, context=context, carry=context == LOOKUP)
        return self.switches[context]

    def begin_round(self) -> None:
        super().begin_round()
        self.decided = False
        if self.switch is not None:
            self.switch.decision = None

    def plan(self, shape: Shape, rng: torch.Generator | Chooser, *, behind: int = 1,
             remaining: int | None = None, context: str | None = None,
             seconds: float | None = None) -> int:
        """This round's depth in 0..shape.depth (call after begin_round, before drafting);
        `behind` and `remaining` as :meth:`CostSwitch.decide` takes them; `context`: the
        round's context where the drafter tells two apart (its switch plans the round);
        `seconds`: the run's previous round's time (the timed guard's; None: not known)."""
        if self.profile is None:
            raise ValueError("the cost controller needs a cost profile (attach one)")
        if self.guard is not None and self._last is not None and seconds is not None:
            self.guard.add(*self._last, seconds)
        self._last = None
        self.switch = self._switch(context)
        self._before = self._params()  # the posterior this round plans with: its context's
        self.planned = self.switch.decide(shape, rng, behind=behind, remaining=remaining)
        self._catching_up = behind > 1  # a drafted round that first reads uncached tokens
        # (the drafter's start, a plain stretch's tokens) is an investment: not timed
        if self.planned and self.guard is not None:
            verdict = self.guard.verdict(context)
            if verdict:
                self.switch.decision = replace(self.switch.decision, depth=0,
                                               predicted_gain=1.0, probe=False, guard=verdict)
                self.planned = 0
        self.decided = True
        return self.planned

    def should_continue(
        self, drafted: int, rng: torch.Generator | Chooser, features: Features = None
    ) -> bool:
        if self._at_limit(drafted, "cap"):
            return False
        if drafted >= self.planned:
            self._steps.append({"step": drafted, "theta": None, "uniform": None,
                                "continue": False})
            self._stop_reason = "plan"
            return False
        return self._confidence_step(drafted, None if features is None else float(features))

    def _params(self) -> dict[str, Any]:
        return {} if self.switch is None else self.switch.posterior.state()

    def _update(self, drafted: int, accepted: int) -> dict[str, Any]:
        if self.switch is not None:
            self.switch.observe(drafted, accepted)
            drafted_round = self.switch.decision is not None and self.switch.decision.depth > 0
            if self.decided and not (drafted_round and self._catching_up):
                self._last = (self.switch.context, drafted_round, accepted + 1)
        return {}

    def state(self):
        """The round's record; while the switch rests (engine.control.cost) every round's is
        the first resting round's (nothing in it changes)."""
        rest = self.switch is not None and self.switch.decision is not None \
            and self.switch.decision.rest
        if not rest:
            return super().state()
        context = self.switch.context
        if context not in self._rest_states:
            self._rest_states[context] = super().state()
        return self._rest_states[context]

    def can_draft(self, shape: Shape) -> bool:
        """Whether some context's switch could draft `shape` in this run (engine.control.cost):
        a run whose drafter prices a lookup (the profile's c_lookup) may draft its lookup's
        rounds where the model's draft calls cost too much to ever pay; a run where every
        context rests from its first plan (CostSwitch.rests_at_start: nothing pays at the
        prior and no probe could) drafts nothing, so a method starts no drafter and reads no
        context (a plain round then pays no lookup and no drafter commit). The contexts asked
        are None's (the rounds of a run whose drafter has not started plan there) and the
        lookup's; the hybrid's feature context is priced as None's and probes under a bar
        no laxer (FEATURE_BREAK_EVEN), so it rests wherever None's does. Only with c_lookup
        above c_draft (never measured) may a run start a drafter that rests in both of its
        contexts: a wasted start, nothing inexact."""
        if self.switch is None:
            return True
        contexts = [None] + ([LOOKUP] if self.profile.c_lookup is not None else [])
        return not all(self._switch(c).rests_at_start(shape) for c in contexts)

    def plan_record(self) -> SwitchPlan | None:
        return None if self.switch is None else self.switch.record()
