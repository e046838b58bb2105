"""The exactness checks on oneDNN-packed weights (engine.kernels.layout).

A toy model (under PACK_MIN_BYTES of linear weight) runs stock, so the other model tests take
the stock path. Here the floor is lowered: the tiny models get packed copies, forwards of
1-3 rows run padded (the default rule) and larger ones packed, and the greedy token methods
and the beam methods must still give ``generate()``'s tokens (and beam scores).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import engine.kernels.layout as layout
from engine.kernels.layout import LayoutRule, _can_pack, _packed_weight
from engine.run.api import generate
from engine.run.models import load_pair, model_from_config, tiny_config
from tests.model.test_beam_methods import assert_same_beams, hf_beams, prompt, set_generation

pytestmark = pytest.mark.skipif(not _can_pack(), reason="this torch has no oneDNN")


@pytest.fixture
def packed(monkeypatch):
    """Tiny models packed, under the default rule (padded under SMALL_ROWS rows)."""
    monkeypatch.setattr(layout, "PACK_MIN_BYTES", 0)
    monkeypatch.setattr(layout, "_RULE", [LayoutRule()])


def _pair(draft=None):
    target = model_from_config(tiny_config("llama", vocab_size=64, layers=2,
                                           initializer_range=0.3), seed=0)
    pair = load_pair(target=target, draft=draft)
    linears = [m for m in pair.target.modules() if type(m) is nn.Linear]
    assert linears and all(_packed_weight(m) is not None for m in linears)  # really packed
    return pair


@pytest.mark.parametrize("method,params", [
    ("greedy", {}), ("sd", {"gamma": 3}), ("mcsd", {"k_config": "2x2x2"}),
    ("greedy_drafts", {"k_config": "3x2"}),
])
def test_greedy_token_methods_on_packed_weights_equal_generate(packed, method, params):
    pair = _pair("ngram")
    set_generation(pair.target)
    for seed in range(2):
        ids = prompt(seed)
        with torch.no_grad():
            ref = pair.target.generate(torch.tensor([ids]), do_sample=False,
                                       max_new_tokens=16)[0, len(ids):].tolist()
        trace = generate(pair, ids, method, max_new_tokens=16, **params)
        assert list(trace.token_ids) == ref, (method, seed)


@pytest.mark.parametrize("method,params", [
    ("beam", {"beams": 3}), ("atspeed_strict", {"beams": 2, "draft_beams": 4, "gamma": 2}),
])
def test_beam_methods_on_packed_weights_equal_generate(packed, method, params):
    pair = _pair("ngram")
    set_generation(pair.target)
    for seed in range(2):
        ids = prompt(seed)
        trace = generate(pair, ids, method, max_new_tokens=10, **params)
        assert_same_beams(trace, hf_beams(pair.target, ids, params["beams"], 10), None)
