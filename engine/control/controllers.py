"""Draft-length controllers: fixed, heuristic, Beta-TS and Cali-TS (EESD, Liu et al. 2024),
and the draft-confidence rule of transformers' assisted decoding.

The round loop drafts one token at a time and, after each drafted token, asks
:meth:`Controller.should_continue` (EESD Alg. 1 steps 6-11: draft first, then sample theta, then
chi ~ Bernoulli(theta), stop on chi = 0). After verification it calls
:meth:`Controller.observe` (Alg. 1 step 18). The paper bounds a round only by the token budget
(Alg. 1 step 5); here a hard cap K_max bounds every round too (docs/derivations.md, EESD).

The posterior is per request (Alg. 1 step 1): build one controller per generation.
``features`` are opaque here: they go unchanged to a Cali-TS predictor (an
:class:`engine.control.predictor.CaliFeatures` for the trained one, None for a constant theta_M).
Every random draw goes through a :class:`~engine.core.sampling.Chooser` (or a ``torch.Generator``
wrapped into one), never the global RNG. ``state()`` is the JSON snapshot the trace stores.
The math (variates, densities, posterior updates) is in :mod:`engine.control.posterior`.

Parameters are declared once, as the CONTROL_PARAMS rows (one spelling, lower case: sigma_m
is the paper's sigma_M); :class:`ControlConfig` holds their values and
:func:`make_controller` builds the kind it names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

import torch

from engine.control.cost import PLANS, CostProfile, CostSwitch, Shape
from engine.control.posterior import (
    BETA_RULES,
    THETA_HAT_RULES,
    beta_update,
    cali_posterior,
    sample_beta,
    sample_normal,
    theta_hat_update,
)
from engine.core.config import ParamSpec, check_config_fields, config_from_params, validate_params
from engine.core.errors import ConfigError
from engine.core.sampling import Chooser, as_chooser

Features = Any  # what a Cali-TS predictor reads (see module docstring); None: nothing
Predictor = Callable[[Features], float]  # features -> theta_M in [0, 1] (EESD Eq. 5)
CONTROLLER_KINDS = ("fixed", "heuristic", "beta_ts", "cali_ts", "confidence", "cost")


# ------------------------------------------------------------------------------------ configs

CONTROL_PARAMS: tuple[ParamSpec, ...] = (  # everyday: the kind; advanced: cap, priors, rules
    ParamSpec("controller", str, "fixed", "draft-length controller", choices=CONTROLLER_KINDS),
    ParamSpec("cap", int, 16, "hard cap K_max on the draft length (adaptive controllers)",
              min=1, max=64, advanced=True),
    ParamSpec("alpha0", float, 1.0, "Beta-TS prior alpha_0 (EESD Eq. 2)", min=0.0,
              min_exclusive=True, advanced=True),
    ParamSpec("beta0", float, 1.0, "Beta-TS prior beta_0 (EESD Eq. 2)", min=0.0,
              min_exclusive=True, advanced=True),
    ParamSpec("update", str, "paper", "Beta-TS update rule (EESD Eq. 3-4 or textbook counts)",
              choices=BETA_RULES, advanced=True),
    ParamSpec("sigma_m", float, 0.4, "Cali-TS sigma_M: prior std around the predictor's "
              "theta_M (EESD Eq. 6-7)", min=0.0, min_exclusive=True, advanced=True),
    ParamSpec("sigma_s", float, 0.25, "Cali-TS sigma_S: std of the sample mean (Eq. 6-7)",
              min=0.0, min_exclusive=True, advanced=True),
    ParamSpec("theta_hat0", float, 0.5, "Cali-TS initial sample mean theta_hat_0 (Eq. 8)",
              min=0.0, max=1.0, advanced=True),
    ParamSpec("theta_hat_rule", str, "accepted", "Cali-TS theta_hat numerator: accepted "
              "drafts (the fix in docs/derivations.md, EESD) or |Q_v| (Eq. 8 as printed)",
              choices=THETA_HAT_RULES, advanced=True),
    ParamSpec("theta_m", float, 0.5, "Cali-TS constant theta_M when no trained predictor "
              "is used", min=0.0, max=1.0, advanced=True),
    ParamSpec("confidence", float, 0.4, "confidence controller: draft on while the drafter "
              "gave its newest token at least this probability (temperature 1)", min=0.0,
              max=1.0, advanced=True),
    ParamSpec("costs", str, "measured", "cost controller: the cost profile it plans with, "
              "'measured' on this machine or a stored one (e.g. h100)", advanced=True),
    ParamSpec("discount", float, 0.9, "cost controller: how much of the acceptance "
              "posterior each drafted round keeps (1: never forget)", min=0.0, max=1.0,
              advanced=True),
    ParamSpec("plan", str, "mean", "cost controller: plan at the acceptance posterior's "
              "means or at a Thompson draw from it", choices=PLANS, advanced=True),
)


@dataclass(frozen=True, kw_only=True)
class ControlConfig:
    """A token method's draft-length controller: one field per CONTROL_PARAMS row (defaults,
    help and ranges are the rows'; build it with :func:`control_config`). The configs of sd,
    mcsd and eesd extend it, so a method's config is its controller's config too."""

    controller: str  # one of CONTROLLER_KINDS
    cap: int  # hard cap K_max on a round's draft length (heuristic, beta_ts, cali_ts)
    alpha0: float  # Beta-TS prior alpha_0, beta_0 (EESD Eq. 2)
    beta0: float
    update: str  # Beta-TS update rule, one of BETA_RULES
    sigma_m: float  # Cali-TS sigma_M, sigma_S (EESD Eq. 6-7)
    sigma_s: float
    theta_hat0: float  # Cali-TS theta_hat_0 (EESD Eq. 8) and its rule, one of THETA_HAT_RULES
    theta_hat_rule: str
    theta_m: float  # Cali-TS constant theta_M when no trained predictor is given (Eq. 5)
    confidence: float  # confidence controller: least q of the newest draft token to go on
    costs: str  # cost controller: cost profile name (engine.core.profile)
    discount: float  # cost controller: posterior kept per drafted round
    plan: str  # cost controller: one of PLANS (Thompson draw or posterior means)


check_config_fields(ControlConfig, CONTROL_PARAMS)


def control_config(**values: Any) -> ControlConfig:
    """A ControlConfig from keyword values; the rest take the CONTROL_PARAMS defaults.
    Unknown names and out-of-range values raise ConfigError."""
    return config_from_params(ControlConfig, CONTROL_PARAMS,
                              validate_params(CONTROL_PARAMS, values, "controller"))


def _check(ok: bool, message: str) -> None:
    """Raise ConfigError(message) unless ok."""
    if not ok:
        raise ConfigError(message)


@dataclass(frozen=True)
class ConstantPredictor:
    """Trivial Cali-TS predictor: theta_M is a constant, whatever the features."""

    theta_m: float

    def __call__(self, features: Features = None) -> float:
        return self.theta_m


# --------------------------------------------------------------------------------- controllers


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

    def state(self) -> dict[str, Any]:
        """JSON-able snapshot: kind, posterior before, per-step theta/decisions, cap, after."""

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

    def plan(self, shape: Shape, rng: torch.Generator | Chooser) -> int:
        """This round's depth in 0..shape.depth (0: a plain target step)."""


class _RoundRecorder:
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

    def __init__(self) -> None:
        self.begin_round()

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

    def state(self) -> dict[str, Any]:
        return {
            "kind": self.name,
            "config": self.settings(),
            "cap": self._cap,
            "before": dict(self._before),
            "steps": [dict(s) for s in self._steps],
            "cap_hit": self._stop_reason == "cap",
            "stop_reason": self._stop_reason,
            "update": None if self._outcome is None else dict(self._outcome),
            "after": None if self._after is None else dict(self._after),
        }


class _LengthController(_RoundRecorder):
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
        _check(gamma >= 1, f"gamma must be >= 1, got {gamma}")
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
        _check(1 <= start <= config.cap, f"need 1 <= start <= cap, got {start}, {config.cap}")
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


class ConfidenceController(_RoundRecorder):
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

    def max_len(self) -> int:
        return self.config.cap


class CostController(_RoundRecorder):
    """The cost-aware switch (:mod:`engine.control.cost`) as a draft-length controller: at the
    start of a round :meth:`plan` picks the depth D* (0: a plain target step) with the best
    expected tokens per cost from the acceptance posterior and the cost profile; drafting then
    stops at D*, at ``cap``, or earlier when the newest token's q falls under ``confidence``
    (0: never). Decisions read the past, the profile, the chooser and the draft only."""

    name = "cost"
    reads = ("cap", "confidence", "costs", "discount", "plan")
    reads_confidence = True  # should_continue's features: the newest token's q (a float)
    plans = True

    def costs_wanted(self) -> str | None:
        return self.config.costs

    def __init__(self, config: ControlConfig) -> None:
        self.config = config
        self.switch: CostSwitch | None = None
        self.shape: Shape | None = None
        self.planned = config.cap
        self.decided = False  # plan() ran this round
        super().__init__()

    def attach(self, profile: CostProfile) -> None:
        """Use `profile` from now on (a run attaches the profile it resolved once)."""
        self.switch = CostSwitch(profile, self.config.cap, discount=self.config.discount,
                                 plan=self.config.plan)

    def begin_round(self) -> None:
        super().begin_round()
        self.decided = False
        if self.switch is not None:
            self.switch.decision = None

    def plan(self, shape: Shape, rng: torch.Generator | Chooser) -> int:
        """This round's depth in 0..shape.depth (call after begin_round, before drafting)."""
        if self.switch is None:
            raise ValueError("the cost controller needs a cost profile (attach one)")
        self.planned = self.switch.decide(shape, rng)
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
        return {}

    def state(self) -> dict[str, Any]:
        out = super().state()
        out["switch"] = None if self.switch is None else self.switch.record()
        return out

    def max_len(self) -> int:
        return self.config.cap


class BetaTSController(_RoundRecorder):
    """Beta-TS (EESD Sec. 3.3, Alg. 2): theta ~ Beta(alpha, beta) afresh per draft step,
    chi ~ Bernoulli(theta); the posterior is updated by Eq. 3-4 (`beta_update`)."""

    name = "beta_ts"
    reads = ("alpha0", "beta0", "update", "cap")

    def __init__(self, config: ControlConfig) -> None:
        self.config = config
        self.alpha, self.beta = float(config.alpha0), float(config.beta0)
        super().__init__()

    def _params(self) -> dict[str, Any]:
        return {
            "alpha": self.alpha,
            "beta": self.beta,
            "mean": self.alpha / (self.alpha + self.beta),
        }

    def _update(self, drafted: int, accepted: int) -> dict[str, Any]:
        old = (self.alpha, self.beta)
        self.alpha, self.beta = beta_update(*old, drafted, accepted, self.config.update)
        return {
            "rule": self.config.update,
            "d_alpha": self.alpha - old[0],
            "d_beta": self.beta - old[1],
        }

    def max_len(self) -> int:
        return self.config.cap

    def should_continue(
        self, drafted: int, rng: torch.Generator | Chooser, features: Features = None
    ) -> bool:
        if self._at_limit(drafted, "cap"):
            return False
        chooser = as_chooser(rng)
        theta = sample_beta(self.alpha, self.beta, chooser)  # Alg. 1 step 8
        chi, u = chooser.accept(theta)  # Alg. 1 step 9
        return self._record({"step": drafted, "theta": theta, "uniform": u, "continue": bool(chi)})


class CaliTSController(_RoundRecorder):
    """Cali-TS (EESD Sec. 3.3, Alg. 3): theta ~ N(mu, sigma^2) per draft step (Eq. 6-7), blending
    the predictor's theta_M with the sample mean theta_hat (Eq. 8; by default with the fix of
    docs/derivations.md, EESD); theta is clipped to [0, 1] before chi ~ Bernoulli(theta)."""

    name = "cali_ts"
    reads = ("sigma_m", "sigma_s", "theta_hat0", "theta_hat_rule", "cap")

    def __init__(self, config: ControlConfig, predictor: Predictor | None = None) -> None:
        """predictor: features -> theta_M (EESD Eq. 5); None: the constant config.theta_m."""
        self.config = config
        self.predictor = predictor if predictor is not None else ConstantPredictor(config.theta_m)
        self.n, self.t, self.theta_hat = 0, 0, float(config.theta_hat0)
        super().__init__()

    def _params(self) -> dict[str, Any]:
        c = self.config  # mu needs each step's theta_M (see steps); sigma and w_model do not
        _, sigma, w_model = cali_posterior(0.0, self.theta_hat, self.n, c.sigma_m, c.sigma_s)
        return {
            "n": self.n,
            "t": self.t,
            "theta_hat": self.theta_hat,
            "sigma": sigma,
            "w_model": w_model,
        }

    def _update(self, drafted: int, accepted: int) -> dict[str, Any]:
        rule = self.config.theta_hat_rule
        self.theta_hat, self.t = theta_hat_update(self.theta_hat, self.t, accepted, rule)
        self.n += 1
        return {"rule": rule, "q_v": accepted + 1}

    def max_len(self) -> int:
        return self.config.cap

    def should_continue(
        self, drafted: int, rng: torch.Generator | Chooser, features: Features = None
    ) -> bool:
        if self._at_limit(drafted, "cap"):
            return False
        chooser = as_chooser(rng)
        theta_m = float(self.predictor(features))  # Eq. 5
        if not 0.0 <= theta_m <= 1.0:
            raise ValueError(f"predictor must return theta_M in [0, 1], got {theta_m}")
        c = self.config
        mu, sigma, w_model = cali_posterior(theta_m, self.theta_hat, self.n, c.sigma_m, c.sigma_s)
        raw = mu + sigma * sample_normal(chooser)  # Eq. 6-7
        theta = min(1.0, max(0.0, raw))
        chi, u = chooser.accept(theta)
        step = {
            "step": drafted,
            "theta_M": theta_m,
            "mu": mu,
            "sigma": sigma,
            "w_model": w_model,
            "theta_raw": raw,
            "theta": theta,
            "clipped": theta != raw,
            "uniform": u,
            "continue": bool(chi),
        }
        return self._record(step)


# ------------------------------------------------------------------------------------ factory


def make_controller(config: ControlConfig, *, gamma: int) -> Controller:
    """The controller ``config.controller`` names, built from ``config`` unchanged.

    gamma: the fixed controller's length and the heuristic's first length (capped at cap).
    """
    kind = config.controller
    if kind == "fixed":
        return FixedController(gamma=gamma)
    if kind == "heuristic":
        return HeuristicController(config, start=min(gamma, config.cap))
    if kind == "beta_ts":
        return BetaTSController(config)
    if kind == "cali_ts":
        return CaliTSController(config)
    if kind == "confidence":
        return ConfidenceController(config)
    if kind == "cost":
        return CostController(config)
    raise ConfigError(f"unknown controller '{kind}' (choose from {', '.join(CONTROLLER_KINDS)})")
