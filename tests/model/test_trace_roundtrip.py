"""Every method's trace, written as JSON, passes the app's import checks and reads back
equal: the import door refuses bad files without refusing the engine's own."""

from __future__ import annotations

import pytest

import engine
from specviz.trace_file import parse_trace
from tests.conftest import tiny_pair

SAMPLING_ONLY = {"sample", "beam_sample", "dsbd", "atspeed_relaxed"}
SMALL = {"beams": 2, "draft_beams": 2, "gamma": 2, "k_config": "2x2"}


@pytest.fixture(scope="module")
def pair():
    return tiny_pair()


@pytest.mark.parametrize("method", sorted(engine.METHODS))
def test_every_methods_trace_imports_back_equal(pair, method):
    names = {p.name for p in engine.METHODS[method].all_params}
    params = {k: v for k, v in SMALL.items() if k in names}
    if "optimal" in names:
        params["optimal"] = True  # its per-position records ride in extras
    trace = engine.generate(pair, [3, 4, 5], method, max_new_tokens=4, seed=1,
                            temperature=1.0 if method in SAMPLING_ONLY else 0.0, **params)
    text = trace.to_json()
    assert parse_trace(text).to_json() == text
