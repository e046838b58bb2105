"""The controllers' parameters: the CONTROL_PARAMS rows (one spelling, lower case: sigma_m
is the paper's sigma_M), :class:`ControlConfig` holding their values, and the one checker.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.control.cost import PLANS
from engine.control.guard import GUARDS
from engine.control.posterior import (
    BETA_RULES,
    THETA_HAT_RULES,
)
from engine.core.config import ParamSpec, check_config_fields, config_from_params, validate_params
from engine.core.errors import ConfigError

CONTROLLER_KINDS = ("fixed", "heuristic", "beta_ts", "cali_ts", "confidence")
SWITCH_KINDS = ("off", "cost")  # the cost-aware switch, spelt as the beam methods spell it


def normalise_switch(given: dict[str, Any]) -> dict[str, Any]:
    """The given ``controller``/``switch`` values in their canonical spelling (None or left
    out: not given). The cost switch plans each round's depth itself, in place of a length
    controller: ``switch=cost`` goes with ``controller=fixed`` (set when not given), any other
    controller given with it is a ConfigError; ``controller=cost`` is the deprecated
    spelling of ``switch=cost``. (A length controller given over a pair's tuned
    ``switch=cost`` sets the tuned value aside: ``engine.core.config.layered``.)"""
    out = dict(given)
    controller, switch = out.get("controller"), out.get("switch")
    if controller == "cost":  # deprecated: the cost switch was once a controller kind
        if switch is not None and switch != "cost":
            raise ConfigError(f"controller=cost (deprecated: use switch=cost) conflicts with "
                              f"switch={switch}")
        controller, switch = None, "cost"
    if switch == "cost":
        if controller is not None and controller != "fixed":
            raise ConfigError(f"switch=cost plans the draft depth itself and cannot combine "
                              f"with controller={controller} (use controller=fixed or "
                              f"switch=off)")
        out["controller"], out["switch"] = "fixed", "cost"
    return out


# ------------------------------------------------------------------------------------ configs

# the cost switch's rows, which the beam methods take too (engine.methods.beam_forest)
SWITCH = ParamSpec(
    "switch", str, "off", "cost-aware switch: 'cost' plans each round's draft depth (0: a plain "
    "target step) from the acceptance so far and the cost profile, in place of a length "
    "controller (controller=cost: deprecated spelling)", choices=SWITCH_KINDS,
    normalise=normalise_switch)
COSTS = ParamSpec("costs", str, "measured", "the cost profile the cost switch plans with: "
                  "'measured' on this machine or a stored one (e.g. h100)", advanced=True)

CONTROL_PARAMS: tuple[ParamSpec, ...] = (  # everyday: the kinds; advanced: cap, priors, rules
    ParamSpec("controller", str, "fixed", "draft-length controller (a tree's depth controller: "
              "fixed = every level of the k-config)", choices=CONTROLLER_KINDS),
    SWITCH,
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
    COSTS,
    ParamSpec("discount", float, 0.9, "cost controller: how much of the acceptance "
              "posterior each drafted round keeps (1: never forget)", min=0.0, max=1.0,
              advanced=True),
    ParamSpec("plan", str, "mean", "cost controller: plan at the acceptance posterior's "
              "means or at a Thompson draw from it", choices=PLANS, advanced=True),
    ParamSpec("guard", str, "off", "cost controller: 'timed' plans plain for the rest of the "
              "run where its drafted rounds, timed in the run, commit fewer tokens a second "
              "than its plain ones (a seed then does not reproduce a sampled run)",
              choices=GUARDS, advanced=True),
)


@dataclass(frozen=True, kw_only=True)
class ControlConfig:
    """A token method's draft-length controller: one field per CONTROL_PARAMS row (defaults,
    help and ranges are the rows'; build it with :func:`control_config`). The configs of sd,
    mcsd and eesd extend it, so a method's config is its controller's config too."""

    controller: str  # one of CONTROLLER_KINDS
    switch: str  # one of SWITCH_KINDS: "cost" = the cost controller (controller is "fixed")
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
    costs: str  # cost controller: cost profile name (engine.run.profile)
    discount: float  # cost controller: posterior kept per drafted round
    plan: str  # cost controller: one of PLANS (Thompson draw or posterior means)
    guard: str  # cost controller: one of GUARDS (engine.control.guard)


    @property
    def kind(self) -> str:
        """The controller that runs: "cost" under the cost switch, else ``controller``."""
        return "cost" if self.switch == "cost" else self.controller


check_config_fields(ControlConfig, CONTROL_PARAMS)


def control_config(**values: Any) -> ControlConfig:
    """A ControlConfig from keyword values; the rest take the CONTROL_PARAMS defaults.
    Unknown names and out-of-range values raise ConfigError."""
    return config_from_params(ControlConfig, CONTROL_PARAMS,
                              validate_params(CONTROL_PARAMS, values, "controller"))


def check(ok: bool, message: str) -> None:
    """Raise ConfigError(message) unless ok."""
    if not ok:
        raise ConfigError(message)
