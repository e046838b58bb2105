"""What the tuner tries per method: a list of exact settings (``Candidate``), the pair's
current defaults among them.

Each method's space is its spec's ``tune_space`` (declared with the method in
engine.methods), a short list of settings that differ in what matters for speed: the
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


def tunable() -> tuple[str, ...]:
    """The methods with settings to try (each method's ``MethodSpec.tune_space``)."""
    from engine.methods import METHODS

    return tuple(name for name, spec in METHODS.items() if spec.tune_space)


def default_methods() -> tuple[str, ...]:
    """What a tune that names no methods tunes: the methods whose spec says so
    (``tune_by_default``), the token methods first."""
    from engine.methods import METHODS

    chosen = [s for s in METHODS.values() if s.tune_space and s.tune_by_default]
    return tuple(s.name for s in sorted(chosen, key=lambda s: s.family != "token"))


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
    its defaults), then its space without duplicates and without the settings the method
    refuses at these common values (``MethodSpec.refuse``). ConfigError for a method without
    a space, an approximate method not asked for, or another bad candidate."""
    from engine.methods import METHODS

    if method not in METHODS:
        raise ConfigError(f"unknown method '{method}' (known: {', '.join(sorted(METHODS))})")
    spec = METHODS[method]
    if not spec.tune_space:
        raise ConfigError(f"{method} has no settings to tune (tunable: "
                          f"{', '.join(sorted(tunable()))})")
    if not spec.exact and not approximate:
        raise ConfigError(f"{method} is approximate by design: name it with "
                          "--approximate to tune it anyway")
    out: list[Candidate] = []
    seen: set[str] = set()
    for i, values in enumerate([dict(current), *spec.tune_space]):
        full = validate_params(spec.all_params, {**common, **values}, method)
        if i > 0 and spec.refuse is not None and spec.refuse(full):
            continue  # e.g. a temperature-0 setting in a tune at temperature > 0
        spec.make(full)  # a bad combination fails the plan
        key = json.dumps({k: full[k] for k in sorted(full) if k not in common}, default=str)
        if key in seen:
            continue
        seen.add(key)
        out.append(Candidate(method, CURRENT if i == 0 else _label(method, values),
                             tuple(sorted(values.items()))))
    return out
