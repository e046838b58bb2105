from __future__ import annotations

import pytest

from engine.config import COMMON_PARAMS, ParamSpec, parse_k_config, validate_params
from engine.errors import ConfigError


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
])
def test_common_params_are_validated_with_one_line_messages(name, value, msg):
    with pytest.raises(ConfigError, match=msg):
        validate_params(COMMON_PARAMS, {name: value}, "greedy")


def test_unknown_parameter_names_the_method():
    with pytest.raises(ConfigError, match="unknown parameter 'gamma' for method 'greedy'"):
        validate_params(COMMON_PARAMS, {"gamma": 3}, "greedy")


def test_defaults_are_filled_and_strings_converted():
    spec = ParamSpec("beams", int, 4, "beams", min=1)
    out = validate_params(COMMON_PARAMS + (spec,), {"beams": "2", "top_p": "0.5"}, "beam")
    assert out["beams"] == 2 and out["top_p"] == 0.5 and out["max_new_tokens"] == 64
