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


@pytest.mark.parametrize("method", ["greedy", "sd"])
def test_each_committed_tokens_top_slice_is_the_targets_softmax_there(method):
    """RoundTrace.p_top holds, at each committed position of beam 0, the ten most likely
    tokens of the target's law there: the softmax of a plain forward over the prompt and the
    tokens before it (a vocabulary of 2,048)."""
    import torch

    pair = tiny_pair(vocab_size=2048)
    prompt = [3, 4, 5]
    trace = engine.generate(pair, prompt, method, max_new_tokens=12, seed=1, temperature=0.0)
    tokens = [c.token_id for r in trace.rounds for c in r.committed]
    slices = [t for r in trace.rounds for t in r.p_top]
    assert len(slices) == len(tokens) == 12
    assert method == "greedy" or max(r.accepted for r in trace.rounds) > 0  # slices past a
    # drafted node's accepted path read node logits
    with torch.no_grad():
        logits = pair.target(torch.tensor([prompt + tokens])).logits[0]  # (L, V)
    for i, top in enumerate(slices):
        val, ids = torch.topk(torch.softmax(logits[len(prompt) - 1 + i].float(), -1), 10)
        assert top.token_ids == tuple(ids.tolist()), i
        assert top.token_ids[0] == tokens[i]
        assert torch.allclose(torch.tensor(top.probs), val, atol=1e-5), i
