"""Draft-length controllers: fixed, heuristic, Beta-TS and Cali-TS (EESD, Liu et al. 2024),
the draft-confidence rule of transformers' assisted decoding and the cost switch. This module
is their entry point (:func:`make_controller` and the names callers import); each family lives
in its own module (length, cost_controller, thompson) over the shared interface and round
bookkeeping (recorder) and the parameters (config).

The round loop drafts one token at a time and, after each drafted token, asks
:meth:`Controller.should_continue` (EESD Alg. 1 steps 6-11: draft first, then sample theta, then
chi ~ Bernoulli(theta), stop on chi = 0). After verification it calls
:meth:`Controller.observe` (Alg. 1 step 18). The paper bounds a round only by the token budget
(Alg. 1 step 5); here a hard cap K_max bounds every round too (docs/derivations.md, EESD).

The posterior is per request (Alg. 1 step 1): build one controller per generation.
``features`` are opaque here: they go unchanged to a Cali-TS predictor (an
:class:`engine.control.predictor.CaliFeatures` for the trained one, None for a constant theta_M).
Every random draw goes through a :class:`~engine.core.sampling.Chooser` (or a ``torch.Generator``
wrapped into one), never the global RNG. ``state()`` is the ControllerState the trace stores.
The math (variates, densities, posterior updates) is in :mod:`engine.control.posterior`.

Parameters are declared once, as the CONTROL_PARAMS rows (one spelling, lower case: sigma_m
is the paper's sigma_M); :class:`ControlConfig` holds their values and
:func:`make_controller` builds the kind it names.
"""

from __future__ import annotations

from engine.control.config import (  # noqa: F401 - the package's one entry point
    CONTROL_PARAMS,
    CONTROLLER_KINDS,
    SWITCH_KINDS,
    ControlConfig,
    control_config,
)
from engine.control.cost_controller import CostController
from engine.control.length import ConfidenceController, FixedController, HeuristicController
from engine.control.recorder import Controller, Features, Predictor  # noqa: F401
from engine.control.thompson import (  # noqa: F401
    BetaTSController,
    CaliTSController,
    ConstantPredictor,
)
from engine.core.errors import ConfigError


def make_controller(config: ControlConfig, *, gamma: int) -> Controller:
    """The controller ``config.kind`` names (the cost controller under ``switch=cost``, else
    ``config.controller``), built from ``config`` unchanged.

    gamma: the fixed controller's length and the heuristic's first length (capped at cap).
    """
    kind = config.kind
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
