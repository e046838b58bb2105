"""Thompson-sampling controllers of EESD (Liu et al. 2024): Beta-TS (Alg. 2) and Cali-TS with
its predictor of theta_M (a constant one here; the trained one in :mod:`engine.control.predictor`).
The math (variates, densities, posterior updates) is in :mod:`engine.control.posterior`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from engine.control.config import ControlConfig
from engine.control.posterior import (
    beta_update,
    cali_posterior,
    sample_beta,
    sample_normal,
    theta_hat_update,
)
from engine.control.recorder import Features, Predictor, RoundRecorder
from engine.core.sampling import Chooser, as_chooser


@dataclass(frozen=True)
class ConstantPredictor:
    """Trivial Cali-TS predictor: theta_M is a constant, whatever the features."""

    theta_m: float

    def __call__(self, features: Features = None) -> float:
        return self.theta_m


class BetaTSController(RoundRecorder):
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

    def should_continue(
        self, drafted: int, rng: torch.Generator | Chooser, features: Features = None
    ) -> bool:
        if self._at_limit(drafted, "cap"):
            return False
        chooser = as_chooser(rng)
        theta = sample_beta(self.alpha, self.beta, chooser)  # Alg. 1 step 8
        chi, u = chooser.accept(theta)  # Alg. 1 step 9
        return self._record({"step": drafted, "theta": theta, "uniform": u, "continue": bool(chi)})


class CaliTSController(RoundRecorder):
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
