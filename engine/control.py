"""Draft-length controllers: fixed, heuristic, Beta-TS and Cali-TS (EESD, Liu et al. 2024).

The round loop drafts one token at a time and, after each drafted token, asks
:meth:`Controller.should_continue` (EESD Alg. 1 steps 6-11: draft first, then sample theta, then
chi ~ Bernoulli(theta), stop on chi = 0). After verification it calls
:meth:`Controller.observe` (Alg. 1 step 18). The paper bounds a round only by the token budget
(Alg. 1 step 5); here a hard cap K_max bounds every round too (docs/derivations.md, EESD).

The posterior is per request (Alg. 1 step 1): build one controller per generation.
``features`` are opaque here: they go unchanged to a Cali-TS predictor (an
:class:`engine.predictor.CaliFeatures` for the trained one, None for a constant theta_M).
Every random draw goes through a :class:`~engine.sampling.Chooser` (or a ``torch.Generator``
wrapped into one), never the global RNG. ``state()`` is the JSON snapshot the trace stores.
The math (variates, densities, posterior updates) is in :mod:`engine.posterior`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, Callable, Protocol

import torch

from engine.errors import ConfigError
from engine.posterior import (
    BETA_RULES,
    THETA_HAT_RULES,
    beta_update,
    cali_posterior,
    sample_beta,
    sample_normal,
    theta_hat_update,
)
from engine.sampling import Chooser, as_chooser

Features = Any  # what a Cali-TS predictor reads (see module docstring); None: nothing
Predictor = Callable[[Features], float]  # features -> theta_M in [0, 1] (EESD Eq. 5)


# ------------------------------------------------------------------------------------ configs


def _param(default: Any, help: str, choices: tuple[str, ...] = ()) -> Any:
    """A config field whose help text and choices feed CONTROLLER_PARAMS."""
    return field(default=default, metadata={"help": help, "choices": choices})


def _check(ok: bool, message: str) -> None:
    """Raise ConfigError(message) unless ok."""
    if not ok:
        raise ConfigError(message)


@dataclass(frozen=True)
class FixedConfig:
    gamma: int = _param(5, "draft tokens per round")

    def __post_init__(self) -> None:
        _check(self.gamma >= 1, f"gamma must be >= 1, got {self.gamma}")


@dataclass(frozen=True)
class HeuristicConfig:
    start: int = _param(5, "initial draft length (+2 after a fully accepted round, else -1)")
    cap: int = _param(16, "hard cap on the draft length")

    def __post_init__(self) -> None:
        _check(1 <= self.start <= self.cap, f"need 1 <= start <= cap, got {self.start}, {self.cap}")


@dataclass(frozen=True)
class BetaTSConfig:
    alpha0: float = _param(1.0, "Beta prior alpha_0 (EESD Eq. 2)")
    beta0: float = _param(1.0, "Beta prior beta_0 (EESD Eq. 2)")
    update: str = _param("paper", "update rule: Eq. 3-4 as printed or textbook counts", BETA_RULES)
    cap: int = _param(16, "hard cap K_max on the draft length")

    def __post_init__(self) -> None:
        _check(self.alpha0 > 0 and self.beta0 > 0, "alpha0 and beta0 must be positive")
        _check(self.update in BETA_RULES, f"update must be one of {BETA_RULES}, got {self.update}")
        _check(self.cap >= 1, f"cap must be >= 1, got {self.cap}")


@dataclass(frozen=True)
class CaliTSConfig:
    sigma_M: float = _param(0.4, "prior std of the predictor theta_M (EESD Eq. 6-7)")
    sigma_S: float = _param(0.25, "sampling std sigma_chi / sqrt(k) (EESD Eq. 6-7)")
    theta_hat0: float = _param(0.5, "initial sample mean theta_hat_0 (EESD Eq. 8)")
    theta_hat_rule: str = _param("accepted", "theta_hat numerator: a or |Q_v|", THETA_HAT_RULES)
    cap: int = _param(16, "hard cap K_max on the draft length")

    def __post_init__(self) -> None:
        _check(self.sigma_M > 0 and self.sigma_S > 0, "sigma_M and sigma_S must be positive")
        _check(0 <= self.theta_hat0 <= 1, f"theta_hat0 must be in [0, 1], got {self.theta_hat0}")
        _check(self.theta_hat_rule in THETA_HAT_RULES, f"theta_hat_rule not in {THETA_HAT_RULES}")
        _check(self.cap >= 1, f"cap must be >= 1, got {self.cap}")


@dataclass(frozen=True)
class ConstantPredictor:
    """Trivial Cali-TS predictor: theta_M is a constant, whatever the features."""

    theta_M: float = 0.5

    def __post_init__(self) -> None:
        _check(0 <= self.theta_M <= 1, f"theta_M must be in [0, 1], got {self.theta_M}")

    def __call__(self, features: Features = None) -> float:
        return self.theta_M


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


class _RoundRecorder:
    """Shared round bookkeeping: posterior before/after, per-step records, cap and outcome."""

    name = "base"
    config: Any

    def __init__(self) -> None:
        self.begin_round()

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
            "config": asdict(self.config),
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

    def __init__(self, gamma: int = FixedConfig.gamma) -> None:
        self.config = FixedConfig(gamma)
        super().__init__()

    def _params(self) -> dict[str, Any]:
        return {"length": self.config.gamma}

    def _update(self, drafted: int, accepted: int) -> dict[str, Any]:
        return {}

    def max_len(self) -> int:
        return self.config.gamma


class HeuristicController(_LengthController):
    """transformers' assisted-decoding heuristic: +2 after an all-accepted round, else -1."""

    name = "heuristic"

    def __init__(self, start: int = HeuristicConfig.start, cap: int = HeuristicConfig.cap):
        self.config = HeuristicConfig(start, cap)
        self.length = start
        super().__init__()

    def _params(self) -> dict[str, Any]:
        return {"length": self.length}

    def _update(self, drafted: int, accepted: int) -> dict[str, Any]:
        if drafted > 0:  # nothing verified: keep the length
            grow = accepted == drafted
            self.length = min(self.length + 2, self.config.cap) if grow else max(1, self.length - 1)
        return {}

    def max_len(self) -> int:
        return self.length


class BetaTSController(_RoundRecorder):
    """Beta-TS (EESD Sec. 3.3, Alg. 2): theta ~ Beta(alpha, beta) afresh per draft step,
    chi ~ Bernoulli(theta); the posterior is updated by Eq. 3-4 (`beta_update`)."""

    name = "beta_ts"

    def __init__(
        self,
        alpha0: float = BetaTSConfig.alpha0,
        beta0: float = BetaTSConfig.beta0,
        update: str = BetaTSConfig.update,
        cap: int = BetaTSConfig.cap,
    ) -> None:
        self.config = BetaTSConfig(alpha0, beta0, update, cap)
        self.alpha, self.beta = float(alpha0), float(beta0)
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

    def __init__(
        self,
        predictor: Predictor | None = None,
        sigma_M: float = CaliTSConfig.sigma_M,
        sigma_S: float = CaliTSConfig.sigma_S,
        cap: int = CaliTSConfig.cap,
        theta_hat0: float = CaliTSConfig.theta_hat0,
        theta_hat_rule: str = CaliTSConfig.theta_hat_rule,
    ) -> None:
        self.config = CaliTSConfig(sigma_M, sigma_S, theta_hat0, theta_hat_rule, cap)
        self.predictor = predictor if predictor is not None else ConstantPredictor()
        self.n, self.t, self.theta_hat = 0, 0, float(theta_hat0)
        super().__init__()

    def _params(self) -> dict[str, Any]:
        c = self.config  # mu needs each step's theta_M (see steps); sigma and w_model do not
        _, sigma, w_model = cali_posterior(0.0, self.theta_hat, self.n, c.sigma_M, c.sigma_S)
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
        mu, sigma, w_model = cali_posterior(theta_m, self.theta_hat, self.n, c.sigma_M, c.sigma_S)
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

_KINDS: dict[str, tuple[type, type]] = {
    "fixed": (FixedController, FixedConfig),
    "heuristic": (HeuristicController, HeuristicConfig),
    "beta_ts": (BetaTSController, BetaTSConfig),
    "cali_ts": (CaliTSController, CaliTSConfig),
}


def _describe(config_cls: type) -> dict[str, dict[str, Any]]:
    """Parameter table of a config dataclass: type, default, help, choices."""
    return {
        f.name: {
            "type": f.type,
            "default": f.default,
            "help": f.metadata["help"],
            "choices": list(f.metadata["choices"]),
        }
        for f in fields(config_cls)
    }


_THETA_M_PARAM = {
    "type": "float",
    "default": 0.5,
    "choices": [],
    "help": "constant theta_M used when no trained predictor is given",
}

# kind -> parameter -> {"type", "default", "help", "choices"} (for the CLI and the UI)
CONTROLLER_PARAMS: dict[str, dict[str, dict[str, Any]]] = {
    kind: _describe(cfg) for kind, (_, cfg) in _KINDS.items()
}
CONTROLLER_PARAMS["cali_ts"]["theta_M"] = _THETA_M_PARAM


def make_controller(kind: str, **params: Any) -> Controller:
    """Build a controller by kind ("fixed", "heuristic", "beta_ts", "cali_ts").

    cali_ts also takes `predictor` (features -> theta_M) or `theta_M` (a constant predictor).
    """
    if kind not in _KINDS:
        raise ConfigError(f"unknown controller '{kind}' (choose from {', '.join(_KINDS)})")
    cls = _KINDS[kind][0]
    if kind == "cali_ts":
        theta_m = params.pop("theta_M", _THETA_M_PARAM["default"])
        params.setdefault("predictor", ConstantPredictor(float(theta_m)))
    known = set(CONTROLLER_PARAMS[kind]) | ({"predictor"} if kind == "cali_ts" else set())
    unknown = sorted(set(params) - known)
    if unknown:
        raise ConfigError(f"unknown parameter(s) {unknown} for controller '{kind}'")
    return cls(**params)
