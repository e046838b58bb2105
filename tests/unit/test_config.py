from __future__ import annotations

from dataclasses import FrozenInstanceError, dataclass, fields
from typing import get_type_hints

import pytest

from engine.core.config import (
    COMMON_PARAMS,
    ParamSpec,
    check_config_fields,
    config_from_params,
    parse_k_config,
    validate_params,
)
from engine.core.errors import ConfigError
from engine.methods import METHODS


def test_k_config_accepts_x_and_commas():
    assert parse_k_config("4x2x2") == (4, 2, 2)
    assert parse_k_config("4,2") == (4, 2)


@pytest.mark.parametrize("bad", ["", "4x0", "axb", "64x64"])
def test_bad_k_config_is_refused(bad):
    with pytest.raises(ConfigError):
        parse_k_config(bad)


@pytest.mark.parametrize("name,value,msg", [
    ("max_new_tokens", 0, "max_new_tokens must be >= 1"),
    ("temperature", -0.5, "temperature must be >= 0.0"),
    ("top_p", 0, "top_p must be > 0.0"),
    ("top_p", 1.01, "top_p must be <= 1.0"),
    ("seed", "x", "seed: expected int"),
    ("temperature", "nan", "temperature must be a finite number, got nan"),
    ("top_p", float("nan"), "top_p must be a finite number"),
    ("temperature", "inf", "temperature must be a finite number"),
    ("seed", 10**30, "seed must be <= 9223372036854775807"),  # torch.Generator's overflow
    ("max_new_tokens", True, "max_new_tokens: expected int, got True"),  # JSON's true
    ("temperature", False, "temperature: expected float, got False"),
])
def test_common_params_are_validated_with_one_line_messages(name, value, msg):
    with pytest.raises(ConfigError, match=msg):
        validate_params(COMMON_PARAMS, {name: value}, "greedy")


def test_a_method_float_parameter_refuses_nan():
    from engine.methods import METHODS

    spec = next(p for p in METHODS["dsbd"].params if p.name == "draft_confidence")
    with pytest.raises(ConfigError, match="draft_confidence must be a finite number"):
        spec.parse("nan")


def test_unknown_parameter_names_the_method():
    with pytest.raises(ConfigError, match="unknown parameter 'gamma' for method 'greedy'"):
        validate_params(COMMON_PARAMS, {"gamma": 3}, "greedy")


def test_defaults_are_filled_and_strings_converted():
    spec = ParamSpec("beams", int, 4, "beams", min=1)
    out = validate_params(COMMON_PARAMS + (spec,), {"beams": "2", "top_p": "0.5"}, "beam")
    assert out["beams"] == 2 and out["top_p"] == 0.5 and out["max_new_tokens"] == 64


# ------------------------------------------------------------- typed method configs


@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_method_config_has_exactly_its_param_rows_as_typed_frozen_fields(name):
    spec = METHODS[name]
    hints = get_type_hints(spec.config)
    assert sorted(f.name for f in fields(spec.config)) == sorted(p.name for p in spec.params)
    assert all(hints[p.name] is p.type for p in spec.params)
    assert spec.config.__dataclass_params__.frozen
    cfg = spec.configure({})  # every row's default
    assert {p.name: getattr(cfg, p.name) for p in spec.params} == {
        p.name: p.default for p in spec.params}
    with pytest.raises(FrozenInstanceError):
        setattr(cfg, "x", 1)


def test_config_from_params_parses_values_and_ignores_other_names():
    @dataclass(frozen=True, kw_only=True)
    class Two:
        beams: int
        on: bool

    specs = (ParamSpec("beams", int, 4, "beams", min=1), ParamSpec("on", bool, False, "on"))
    cfg = config_from_params(Two, specs, {"beams": "2", "on": "yes", "temperature": 0.5})
    assert cfg == Two(beams=2, on=True)
    assert config_from_params(Two, specs, {"beams": None}) == Two(beams=4, on=False)
    with pytest.raises(ConfigError, match="beams must be >= 1"):
        config_from_params(Two, specs, {"beams": 0})


def test_a_config_that_drifts_from_its_rows_is_refused():
    @dataclass(frozen=True)
    class Drifted:
        beams: float

    with pytest.raises(TypeError, match="Drifted"):
        check_config_fields(Drifted, (ParamSpec("beams", int, 4, "beams"),))
    with pytest.raises(TypeError):
        check_config_fields(Drifted, (ParamSpec("width", float, 4.0, "width"),))


def _make(name: str, **given):
    spec = METHODS[name]
    return spec.make(validate_params(spec.all_params, given, name))


@pytest.mark.parametrize("name", ["beam_sample", "dsbd", "atspeed_relaxed"])
def test_beam_sampling_methods_need_a_positive_temperature(name):
    assert METHODS[name].sampling_only
    _make(name)  # their default temperature is 1
    with pytest.raises(ConfigError, match="needs temperature > 0"):
        _make(name, temperature=0.0)


@pytest.mark.parametrize("name,given,msg", [
    ("atspeed_strict", {"beams": 4, "draft_beams": 3}, "draft_beams must be >= beams"),
    ("atspeed_relaxed", {"beams": 4, "draft_beams": 3}, "draft_beams must be >= beams"),
    ("dsbd", {"draft_beams": 2, "min_width": 3}, "min_width must be <= draft_beams"),
    ("mcsd", {"k_config": "4x0"}, "k_config"),
])
def test_bad_combinations_are_refused_when_the_method_is_built(name, given, msg):
    with pytest.raises(ConfigError, match=msg):
        _make(name, **given)
