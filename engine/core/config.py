"""Typed configuration: run settings, parameter schemas and their validation.

Every method declares its parameters as :class:`ParamSpec` rows; the CLI builds flags and
the UI builds widgets from the same rows, so a new method needs no CLI or UI change. A
method's typed config is a frozen dataclass with one field per row (names and types only:
defaults, help and ranges stay in the rows), built by :func:`config_from_params`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, TypeVar, get_type_hints

from engine.core.errors import ConfigError
from engine.core.sampling import Warp


@dataclass(frozen=True)
class ParamSpec:
    """One method parameter: name, type, default, help, and its valid range.

    advanced: shown under the UI's "Advanced" accordion instead of with the everyday
    parameters (priors, sigmas, update-rule and implementation switches); the CLI is
    unaffected.
    normalise: rewrites the given values (name -> value, a name left out or None: not given)
    before any row checks them: a deprecated spelling into the canonical one, a conflicting
    combination into a ConfigError (see :func:`normalised`).
    """

    name: str
    type: type
    default: Any
    help: str
    choices: tuple = ()
    min: float | None = None
    max: float | None = None
    min_exclusive: bool = False
    advanced: bool = False
    normalise: Callable[[dict[str, Any]], dict[str, Any]] | None = field(
        default=None, compare=False, repr=False)

    def with_default(self, default: Any) -> ParamSpec:
        """This row with another default (checked against the row): a method that needs its
        own default of a shared row derives it here, so the name's meaning, type, range and
        help stay declared once."""
        return replace(self, default=self.parse(default))

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def parse(self, value: Any) -> Any:
        """Convert and validate a user value; raises ConfigError with a one-line message."""
        try:
            v = _convert(self.type, value)
        except (TypeError, ValueError):
            raise ConfigError(f"{self.name}: expected {self.type.__name__}, got {value!r}")
        if isinstance(v, float) and not math.isfinite(v):  # nan passes every comparison
            raise ConfigError(f"{self.name} must be a finite number, got {v}")
        if self.choices and v not in self.choices:
            raise ConfigError(f"{self.name} must be one of {', '.join(map(str, self.choices))}")
        if self.min is not None and (v < self.min or (self.min_exclusive and v == self.min)):
            op = ">" if self.min_exclusive else ">="
            raise ConfigError(f"{self.name} must be {op} {self.min}, got {v}")
        if self.max is not None and v > self.max:
            raise ConfigError(f"{self.name} must be <= {self.max}, got {v}")
        return v


def _convert(kind: type, value: Any) -> Any:
    if kind is bool:
        if isinstance(value, str):
            if value.lower() in ("1", "true", "yes", "on"):
                return True
            if value.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(value)
        return bool(value)
    if isinstance(value, bool) and kind in (int, float):  # JSON's true is no number
        raise ValueError(value)
    if kind is int and isinstance(value, float) and not value.is_integer():
        raise ValueError(value)
    if kind is int and isinstance(value, str):
        return int(value.strip())
    return kind(value)


# Parameters every method takes.
COMMON_PARAMS: tuple[ParamSpec, ...] = (
    ParamSpec("max_new_tokens", int, 64, "tokens to generate at most", min=1, max=4096),
    ParamSpec("seed", int, 0, "seed of the run's torch.Generator", min=0, max=2**63 - 1),
    ParamSpec("temperature", float, 0.0, "0 = greedy/argmax; > 0 = sampling", min=0.0, max=10.0),
    ParamSpec("top_k", int, 0, "keep the k most likely tokens (0 = off)", min=0),
    ParamSpec("top_p", float, 1.0, "nucleus mass in (0, 1]", min=0.0, max=1.0,
              min_exclusive=True),
)


@dataclass(frozen=True)
class RunConfig:
    """Settings shared by every method."""

    max_new_tokens: int = 64
    seed: int = 0
    warp: Warp = field(default_factory=Warp)

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> RunConfig:
        warp = Warp(params["temperature"], params["top_k"], params["top_p"])
        return cls(params["max_new_tokens"], params["seed"], warp)


def parse_k_config(text: str | tuple[int, ...]) -> tuple[int, ...]:
    """'4x2x2' or '4,2,2' -> (4, 2, 2): MCSD's k-config, children per depth (MCSD §4.3-4.4)."""
    if isinstance(text, tuple):
        ks = text
    else:
        parts = str(text).replace(",", "x").lower().split("x")
        try:
            ks = tuple(int(p) for p in parts if p.strip())
        except ValueError:
            raise ConfigError(f"k_config must look like 4x2x2, got {text!r}")
    if not ks or any(k < 1 for k in ks) or len(ks) > 16:
        raise ConfigError(f"k_config needs 1..16 positive branching factors, got {text!r}")
    nodes, width = 0, 1
    for k in ks:
        width *= k
        nodes += width
    if nodes > 512:
        raise ConfigError(f"k_config {text!r} makes {nodes} nodes per tree (limit 512)")
    return ks


def normalised(specs: tuple[ParamSpec, ...], given: Mapping[str, Any]) -> dict[str, Any]:
    """The given values with every row's ``normalise`` applied (a deprecated spelling in the
    canonical one; ConfigError on a conflicting combination); unchanged when no row has one.
    A value a row implies for a name the rows lack is left out (the cost switch implies
    ``controller=fixed``, which a beam method has no row for). Apply it to one layer of
    values (the caller's, a pair's tuned settings) before merging layers, so a value given
    in one layer sets aside the other layer's values it implies."""
    out = dict(given)
    names = {s.name for s in specs}
    for s in specs:
        if s.normalise is not None:
            out = {k: v for k, v in s.normalise(out).items() if k in names or k in given}
    return out


def layered(specs: tuple[ParamSpec, ...], tuned: Mapping[str, Any],
            given: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Given values (None: not given) over tuned ones (a pair's measured best settings),
    each layer :func:`normalised` on its own: (the tuned values left standing, the given
    values). A tuned value stands, with the values it implies (switch=cost: controller=fixed),
    unless a value of one of their names is given or they conflict with the given ones (a
    given controller=beta_ts or controller=fixed sets a tuned switch=cost aside, and a given
    switch=off the controller=fixed it implied): the given layer wins, and only a conflict
    within it is a ConfigError."""
    given = normalised(specs, {k: v for k, v in given.items() if v is not None})
    tuned = normalised(specs, tuned)
    implied = {j for k, v in tuned.items() for j in normalised(specs, {k: v}) if j != k}
    kept: dict[str, Any] = {}
    for k, v in tuned.items():
        if k in implied:
            continue  # stands or falls with the value that implies it
        group = {j: tuned.get(j, w) for j, w in normalised(specs, {k: v}).items()}
        if any(j in given for j in group):
            continue
        try:
            normalised(specs, {**given, **kept, **group})
        except ConfigError:
            continue
        kept.update(group)
    return kept, given


def validate_params(specs: tuple[ParamSpec, ...], given: dict[str, Any],
                    method: str) -> dict[str, Any]:
    """Defaults filled in, values converted (after :func:`normalised`); unknown names
    rejected."""
    given = normalised(specs, given)
    known = {s.name: s for s in specs}
    unknown = [k for k in given if k not in known]
    if unknown:
        raise ConfigError(
            f"unknown parameter '{unknown[0]}' for method '{method}' "
            f"(known: {', '.join(sorted(known))})"
        )
    out = {s.name: s.default for s in specs}
    for k, v in given.items():
        if v is not None:
            out[k] = known[k].parse(v)
    return out


C = TypeVar("C")


def config_from_params(cls: type[C], specs: tuple[ParamSpec, ...],
                       params: Mapping[str, Any]) -> C:
    """The typed config ``cls`` from parameter values: one field per row of ``specs``, each
    value through ParamSpec.parse (missing or None: the row's default); names without a row
    (the common parameters) are ignored; the values go through :func:`normalised` first."""
    params = normalised(specs, params)
    values = {}
    for s in specs:
        v = params.get(s.name)
        values[s.name] = s.parse(s.default if v is None else v)
    return cls(**values)


def check_config_fields(cls: type, specs: tuple[ParamSpec, ...]) -> None:
    """Raise TypeError unless the dataclass ``cls`` has exactly one field per row of
    ``specs``, of the row's type (so a config and its rows cannot drift)."""
    hints = get_type_hints(cls)
    got = {f.name: hints[f.name] for f in fields(cls)}
    want = {s.name: s.type for s in specs}
    if got != want or len(specs) != len(want):
        raise TypeError(f"{cls.__name__} fields {got} do not match its ParamSpec rows {want}")
