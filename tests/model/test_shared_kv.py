"""First-N-layer KV sharing between the early exit and the target (engine.drafters.shared,
EESD §1.2): same rounds and probabilities as separate caches, layers 1..N run once per position, and
refusals for what it does not cover."""

from __future__ import annotations

import pytest
import torch

import engine
from engine.core.errors import ConfigError
from engine.drafters.early_exit import EarlyExitDrafter
from engine.drafters.shared import SharedSide, SharedTrunk
from engine.run.api import calibrate
from tests.conftest import perturbed_exit_layer, tiny_pair


def _pair(family="llama", trained=True):
    pair = tiny_pair(family, layers=4, early_exit_layers=2)
    if trained:
        pair.drafter = EarlyExitDrafter(pair.target, 2, perturbed_exit_layer(pair.target, 2, 1))
    return pair


def _run(pair, share, **kw):
    return engine.generate(pair, [3, 4, 5, 6], "eesd", share_kv=share, max_new_tokens=28,
                           **kw)


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "mistral"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_shared_cache_gives_the_rounds_and_probabilities_of_separate_caches(family,
                                                                              temperature):
    pair = _pair(family)
    kw = dict(temperature=temperature, seed=3, controller="fixed", gamma=3)
    shared, separate = _run(pair, True, **kw), _run(pair, False, **kw)
    assert shared.token_ids == separate.token_ids
    assert [r.accepted for r in shared.rounds] == [r.accepted for r in separate.rounds]
    for a, b in zip(shared.rounds, separate.rounds):
        for ta, tb in zip(a.p_top, b.p_top):
            assert ta.token_ids == tb.token_ids
            torch.testing.assert_close(torch.tensor(ta.probs), torch.tensor(tb.probs),
                                       atol=2e-5, rtol=0)
    if temperature == 0.0:
        ref = pair.target.generate(torch.tensor([[3, 4, 5, 6]]), do_sample=False,
                                   max_new_tokens=28)[0, 4:].tolist()
        assert list(shared.token_ids) == ref


@pytest.mark.parametrize("trained", [True, False])
def test_layers_one_to_n_run_once_per_position_when_shared(trained):
    pair = _pair(trained=trained)
    calibrate(pair, 1)  # the cost model's one-off plain-step calibration, not counted
    layers = pair.target.model.layers
    counts = {}

    def counter(name):
        def hook(module, args, kwargs):
            h = args[0] if args else kwargs["hidden_states"]
            counts[name] = counts.get(name, 0) + h.shape[1]
        return hook

    handles = [layers[0].register_forward_pre_hook(counter("first"), with_kwargs=True),
               layers[2].register_forward_pre_hook(counter("deep"), with_kwargs=True)]
    try:
        _run(pair, True, controller="fixed", gamma=3)
        shared = dict(counts)
        counts.clear()
        _run(pair, False, controller="fixed", gamma=3)
        separate = dict(counts)
    finally:
        for h in handles:
            h.remove()
    # shared: every position the target scores went through layer 1 exactly once
    assert shared["first"] == shared["deep"]
    assert separate["deep"] == shared["deep"]
    assert separate["first"] > separate["deep"]  # the drafter ran layer 1 again


def test_the_trunk_refuses_widths_and_trees_it_does_not_cover():
    pair = _pair()
    trunk = SharedTrunk(pair.target, pair.drafter)
    with pytest.raises(ConfigError, match="width 1"):
        trunk.start(torch.tensor([[3, 4], [5, 6]]))
    side = SharedSide(trunk, "target")
    side.start(torch.tensor([[3, 4, 5]]))
    with pytest.raises(ConfigError, match="chain"):
        side.feed(torch.tensor([[7, 8]]), torch.tensor([[-1, -1]]))  # two siblings
    draft = SharedSide(trunk, "draft")
    with pytest.raises(ConfigError, match="another sequence"):
        draft.start(torch.tensor([[9, 9, 9]]))


def test_rounds_record_cache_lengths_before_the_rollback():
    pair = _pair()
    prompt = [3, 4, 5, 6]
    trace = engine.generate(pair, prompt, "eesd", max_new_tokens=20,
                            controller="fixed", gamma=3)
    committed = len(prompt)
    for r in trace.rounds:
        kv = r.extras.kv_cache
        fed = committed + r.drafted  # root ... last draft, all scored by the target
        assert kv["shared"] == kv["deep"] == fed
        assert kv["ee"] == fed - 1  # the drafter never feeds its last draft
        assert kv["kept"] == committed + r.accepted
        committed += len(r.committed)
    assert committed == len(prompt) + len(trace.token_ids)


def test_a_target_on_a_fixed_shape_path_keeps_separate_caches_and_its_own_steps(monkeypatch):
    """share_kv (the default) shares where the target's steps are dynamic; on the static path
    (as on the captured and compiled ones) the shared trunk's dynamic cache would take the
    target off its fixed-shape steps, so the caches stay separate: the drafter's name says so,
    every target forward runs static, and the tokens are generate()'s."""
    pair = _pair()
    kw = dict(controller="fixed", gamma=3, max_new_tokens=28)
    shared = engine.generate(pair, [3, 4, 5, 6], "eesd", **kw)
    assert "KV shared" in shared.rounds[0].extras.drafter
    monkeypatch.setenv("SPECVIZ_KV", "static")
    alone = engine.generate(pair, [3, 4, 5, 6], "eesd", **kw)
    assert "KV shared" not in alone.rounds[0].extras.drafter
    assert set(alone.stats.step_paths) >= {"target:static"}
    assert not any(p.startswith("target:") and p != "target:static"
                   for p in alone.stats.step_paths)
    ref = pair.target.generate(torch.tensor([[3, 4, 5, 6]]), do_sample=False,
                               max_new_tokens=28)[0, 4:].tolist()
    assert list(alone.token_ids) == list(shared.token_ids) == ref
