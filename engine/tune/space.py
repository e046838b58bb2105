"""What the tuner tries per method: a list of exact settings (``Candidate``), the pair's
current defaults among them.

Each method's space is a short list of settings that differ in what matters for speed: the
controller and its thresholds, the fixed draft length, the MCSD k-config, confidence gates,
the beam draft width and depth, and the cost switch. Exactness is never a knob: every
candidate is one of the method's exact settings (verifier rules, ``optimal`` recording and
other switches that change the law or only add work are left at the method's defaults), and
an approximate method is tuned only when asked for by name, its label saying so.
Every candidate is validated by the method's own parameter rows and ``make`` (a bad value
fails the plan, not a trial).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping

from engine.core.config import validate_params
from engine.core.errors import ConfigError

CURRENT = "current"  # the label of the pair's current settings (tuned, else defaults)

# method -> settings to try (over the method's defaults; the pair's current ones are added)
SPACES: dict[str, tuple[dict[str, Any], ...]] = {
    "sd": (
        {"switch": "cost"},
        *({"controller": "fixed", "gamma": g} for g in (1, 2, 3, 4, 6)),
        {"controller": "heuristic"},
        *({"controller": "confidence", "confidence": c, "cap": 8} for c in (0.3, 0.5, 0.7)),
        {"controller": "beta_ts"},
        {"controller": "cali_ts"},
    ),
    "mcsd": (
        *({"k_config": k, "controller": "fixed"} for k in ("2x2", "3x2", "2x2x2", "4x2x2")),
        *({"k_config": k, "controller": "confidence", "confidence": c}
          for k in ("2x2", "2x2x2") for c in (0.3, 0.5)),
        *({"k_config": k, "switch": "cost"} for k in ("2x2", "2x2x2")),
    ),
    "greedy_drafts": (
        *({"k_config": k, "controller": "fixed"} for k in ("2x2", "3x2", "2x2x2")),
        {"k_config": "2x2x2", "switch": "cost"},
    ),
    "eesd": (
        {"switch": "cost"},
        *({"controller": "fixed", "gamma": g} for g in (1, 2, 3)),
        {"controller": "beta_ts"},
        {"controller": "cali_ts"},
    ),
    "atspeed_strict": tuple(
        {"draft_beams": n, "gamma": g, "draft_confidence": c, "switch": s}
        for n in (4, 8) for g in (1, 2) for c in (0.0, 0.3) for s in ("off", "cost")),
    "dsbd": tuple(
        {"gamma": g, "min_width": w, "draft_confidence": c, "switch": s}
        for g in (1, 2) for w in (1, 4) for c in (0.0, 0.5) for s in ("off", "cost")),
    "atspeed_relaxed": tuple(
        {"draft_beams": n, "gamma": g, "switch": s}
        for n in (4, 8) for g in (1, 2) for s in ("off", "cost")),
    "hf_prompt_lookup": tuple(
        {"prompt_lookup_num_tokens": n, "max_matching_ngram_size": m}
        for n in (2, 4, 10) for m in (2, 3)),
    "hf_assisted": tuple(
        {"num_assistant_tokens": n, "assistant_confidence_threshold": t}
        for n in (3, 8, 20) for t in (0.0, 0.4)),
    "hf_early_exit": tuple(
        {"num_assistant_tokens": n, "assistant_confidence_threshold": t}
        for n in (3, 8) for t in (0.0, 0.4)),
}
# tuned when the caller lists no methods: the speculative methods with a space, exact ones
DEFAULT_METHODS = ("sd", "mcsd", "eesd", "atspeed_strict", "dsbd")


@dataclass(frozen=True)
class Candidate:
    """One setting of a method: its label (``current`` or the bench syntax
    ``sd:controller=fixed:gamma=2``) and the values it sets over the method's defaults."""

    method: str
    label: str
    params: tuple[tuple[str, Any], ...]

    @property
    def values(self) -> dict[str, Any]:
        return dict(self.params)


def _label(method: str, values: Mapping[str, Any]) -> str:
    return ":".join([method, *(f"{k}={v}" for k, v in values.items())])


def candidates(method: str, current: Mapping[str, Any], common: Mapping[str, Any],
               *, approximate: bool = False) -> list[Candidate]:
    """The method's candidates: its current settings first (the pair's tuned values, else
    its defaults), then its space without duplicates. ConfigError for a method without a
    space, an approximate method not asked for, or a candidate the method refuses."""
    from engine.methods import METHODS

    if method not in METHODS:
        raise ConfigError(f"unknown method '{method}' (known: {', '.join(sorted(METHODS))})")
    if method not in SPACES:
        raise ConfigError(f"{method} has no settings to tune (tunable: "
                          f"{', '.join(sorted(SPACES))})")
    spec = METHODS[method]
    if not spec.exact and not approximate:
        raise ConfigError(f"{method} is approximate by design: name it with "
                          "--approximate to tune it anyway")
    out: list[Candidate] = []
    seen: set[str] = set()
    for i, values in enumerate([dict(current), *SPACES[method]]):
        full = validate_params(spec.all_params, {**common, **values}, method)
        spec.make(full)  # a bad combination fails the plan
        key = json.dumps({k: full[k] for k in sorted(full) if k not in common}, default=str)
        if key in seen:
            continue
        seen.add(key)
        out.append(Candidate(method, CURRENT if i == 0 else _label(method, values),
                             tuple(sorted(values.items()))))
    return out
