"""Baselines through the round loop equal generate() on tiny models (two families)."""

from __future__ import annotations

import pytest
import torch

import engine
from engine.core.errors import ConfigError
from tests.conftest import tiny_pair

PROMPTS = [[3, 4, 5, 6], [10, 2, 7], [9, 9, 9, 9, 9, 1, 3]]


def _generate_ids(pair, prompt, **kw):
    out = pair.target.generate(torch.tensor([prompt]), do_sample=False, **kw)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_is_token_identical_to_generate(family, prompt):
    pair = tiny_pair(family)
    trace = engine.generate(pair, prompt, "greedy", max_new_tokens=24)
    assert list(trace.token_ids) == _generate_ids(pair, prompt, max_new_tokens=24)
    assert trace.stats.target_calls == len(trace.token_ids)


def _frequent_token(pair, prompt):
    ids = _generate_ids(pair, prompt, max_new_tokens=24)
    return max(set(ids[2:]), key=ids[2:].count)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_greedy_stops_at_eos_like_generate(family):
    pair = tiny_pair(family)
    prompt = PROMPTS[0]
    eos = _frequent_token(pair, prompt)
    pair.target.generation_config.eos_token_id = eos
    trace = engine.generate(pair, prompt, "greedy", max_new_tokens=24)
    ref = _generate_ids(pair, prompt, max_new_tokens=24)
    assert list(trace.token_ids) == ref
    assert trace.token_ids[-1] == eos and len(ref) < 24
    assert trace.stop_reason == "eos"


def test_sampling_is_reproducible_from_the_seed_and_varies_with_it():
    pair = tiny_pair()
    a = engine.generate(pair, PROMPTS[0], "sample", max_new_tokens=16, seed=7)
    b = engine.generate(pair, PROMPTS[0], "sample", max_new_tokens=16, seed=7)
    c = engine.generate(pair, PROMPTS[0], "sample", max_new_tokens=16, seed=8)
    assert a.token_ids == b.token_ids
    assert a.token_ids != c.token_ids


def test_iter_rounds_yields_one_round_per_token_for_greedy():
    pair = tiny_pair()
    rounds = list(engine.iter_rounds(pair, PROMPTS[1], "greedy", max_new_tokens=5))
    assert [len(r.committed) for r in rounds] == [1] * 5
    assert all(set(r.timings) >= {"propose", "score", "verify", "commit"} for r in rounds)


def test_mismatched_vocabularies_are_refused_naming_both_sizes():
    from engine.run.models import tiny_config

    with pytest.raises(ConfigError, match="target vocab size 64, draft 32"):
        engine.load_pair(target=tiny_config(vocab_size=64), draft=tiny_config(vocab_size=32),
                         device="cpu")


def test_early_exit_drafter_shares_the_targets_weights():
    pair = tiny_pair(layers=4, early_exit_layers=2)
    draft = pair.drafter.model
    assert len(draft.model.layers) == 2
    assert draft.model.layers[0] is pair.target.model.layers[0]
    assert draft.lm_head is pair.target.lm_head


@pytest.mark.parametrize("prompt,msg", [("", "prompt is empty"), ("   ", "prompt is empty")])
def test_empty_prompt_is_refused(prompt, msg):
    with pytest.raises(ConfigError, match=msg):
        engine.generate(tiny_pair(), prompt, "greedy")


def test_prompt_longer_than_the_context_window_is_refused():
    with pytest.raises(ConfigError, match="exceeds the context window of 512"):
        engine.generate(tiny_pair(), list(range(3, 60)) * 9, "greedy", max_new_tokens=10)


def test_unknown_method_is_refused():
    with pytest.raises(ConfigError, match="unknown method 'nope'"):
        engine.generate(tiny_pair(), [1, 2], "nope")
