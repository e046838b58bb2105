"""engine.kernels.attention: the grouped-query attention of compiled steps equals transformers'
sdpa attention (which repeats every key/value head), eager forwards keep sdpa's bits (several
rows on a CPU without repeating a head), and only a model on sdpa is switched to it."""

from __future__ import annotations

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from engine.kernels import attention
from tests.conftest import tiny_pair


class _Heads(torch.nn.Module):
    """What sdpa_attention_forward reads from an attention module."""

    def __init__(self, groups: int):
        super().__init__()
        self.num_key_value_groups, self.is_causal, self.training = groups, True, False


def _inputs(W: int, H: int, KV: int, q: int, S: int, seed: int, D: int = 16):
    gen = torch.Generator().manual_seed(seed)
    query = torch.randn(W, H, q, D, generator=gen)  # (W, H, q, D)
    key = torch.randn(W, KV, S, D, generator=gen)  # (W, KV, S, D)
    value = torch.randn(W, KV, S, D, generator=gen)  # (W, KV, S, D)
    mask = torch.zeros(W, 1, q, S)  # (W, 1, q, S) additive
    mask[..., S - q - 3:] = torch.finfo(torch.float32).min  # unwritten slots
    mask[0, 0, 0, 1] = torch.finfo(torch.float32).min  # a node that does not see slot 1
    return query, key, value, mask


@pytest.mark.parametrize("W,H,KV,q", [(1, 9, 3, 1), (2, 4, 2, 5), (1, 4, 4, 3), (3, 6, 1, 2)])
def test_grouped_attention_equals_sdpas_over_repeated_heads(W, H, KV, q):
    query, key, value, mask = _inputs(W, H, KV, q, S=24, seed=W + H + q)
    ours = attention.grouped(query, key, value, mask, 0.25)  # (W, q, H, D)
    theirs, _ = sdpa_attention_forward(_Heads(H // KV), query, key, value, mask, scaling=0.25)
    assert ours.shape == theirs.shape == (W, q, H, 16)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


def test_a_wrong_head_grouping_is_caught_by_the_comparison():
    query, key, value, mask = _inputs(1, 4, 2, 3, S=24, seed=1)
    swapped = key[:, [1, 0]]  # query head h reading key/value head 1 - h // 2
    ours = attention.grouped(query, swapped, value, mask, 0.25)
    theirs, _ = sdpa_attention_forward(_Heads(2), query, key, value, mask, scaling=0.25)
    assert (ours - theirs).abs().max() > 1e-2


def test_an_eager_forward_keeps_sdpas_bits():
    query, key, value, mask = _inputs(2, 4, 2, 3, S=24, seed=2)
    module = _Heads(2)
    with torch.no_grad():
        ours, _ = attention.grouped_attention(module, query, key, value, mask, scaling=0.25)
    theirs, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=0.25)
    assert torch.equal(ours, theirs)


@pytest.mark.parametrize("W,H,KV,q,S,dtype", [
    (1, 9, 3, 4, 300, torch.float32), (1, 9, 3, 16, 600, torch.float32),
    (2, 4, 2, 2, 40, torch.float32), (4, 9, 3, 3, 129, torch.float32),
    (1, 8, 1, 5, 77, torch.float32), (2, 9, 3, 6, 200, torch.bfloat16)])
def test_an_eager_cpu_forward_of_several_rows_keeps_sdpas_bits_without_repeating_heads(
        W, H, KV, q, S, dtype, monkeypatch):
    query, key, value, _ = _inputs(W, H, KV, q, S, seed=S + q, D=64)
    query, key, value = query.to(dtype), key.to(dtype), value.to(dtype)
    gen = torch.Generator().manual_seed(q)
    sees = torch.ones(q, q).tril().bool() & ~((torch.rand(W, 1, q, q, generator=gen) < 0.4)
                                             .tril(-1))  # (W, 1, q, q): a forest of nodes
    mask = torch.zeros(W, 1, q, S, dtype=dtype)  # (W, 1, q, S) additive: the prefix seen
    mask[..., S - q:] = torch.zeros(W, 1, q, q, dtype=dtype).masked_fill(
        ~sees, torch.finfo(dtype).min)
    assert not sees.all()  # some node does not see an earlier node
    module = _Heads(H // KV)
    theirs, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=0.125)

    def no_sdpa_function(*a, **k):
        raise AssertionError("transformers' sdpa function (repeat_kv) was called")

    monkeypatch.setattr(attention, "sdpa_attention_forward", no_sdpa_function)
    with torch.no_grad():
        ours, _ = attention.grouped_attention(module, query, key, value, mask, scaling=0.125)
    assert ours.shape == theirs.shape == (W, q, H, 64) and ours.is_contiguous()
    assert torch.equal(ours, theirs)


@pytest.mark.parametrize("case", ["one row", "no mask", "a bool mask", "gradients",
                                  "as many key/value heads as query heads"])
def test_other_eager_forwards_go_to_transformers_sdpa_function(case, monkeypatch):
    KV, q = (4, 3) if case.startswith("as many") else (2, 1 if case == "one row" else 3)
    query, key, value, mask = _inputs(1, 4, KV, q, S=24, seed=5)
    mask = {"no mask": None, "a bool mask": mask == 0}.get(case, mask)
    called = []
    real = attention.sdpa_attention_forward
    monkeypatch.setattr(attention, "sdpa_attention_forward",
                        lambda *a, **k: called.append(1) or real(*a, **k))
    with torch.set_grad_enabled(case == "gradients"):
        attention.grouped_attention(_Heads(4 // KV), query, key, value, mask, scaling=0.25)
    assert called, case


def _stock() -> torch.nn.Module:
    """A tiny target as transformers builds it (load_pair gives it the engine's attention)."""
    model = tiny_pair().target
    model.config._attn_implementation = "sdpa"
    return model


def test_every_model_the_engine_runs_on_a_cpu_gets_it_with_the_same_logits():
    from engine.execution.cached_model import CachedModel

    stock, ours = _stock(), _stock()
    CachedModel(ours)
    assert ours.config._attn_implementation == attention.NAME
    assert stock.config._attn_implementation == "sdpa"
    ids = torch.tensor([[5, 9, 3, 17, 40, 2, 8, 11]])
    mask = torch.zeros(1, 1, 8, 8)
    allowed = torch.ones(8, 8).tril().bool()
    allowed[6, 5] = allowed[7, 5] = False  # two nodes on another branch than node 5
    mask.masked_fill_(~allowed, torch.finfo(torch.float32).min)
    with torch.no_grad():
        a = stock(input_ids=ids, attention_mask=mask).logits

    def no_sdpa_function(*args, **kw):
        raise AssertionError("transformers' sdpa function (repeat_kv) was called")

    with torch.no_grad(), pytest.MonkeyPatch.context() as mp:
        mp.setattr(attention, "sdpa_attention_forward", no_sdpa_function)
        b = ours(input_ids=ids, attention_mask=mask).logits
    assert torch.equal(a, b)


def test_generate_with_prompt_lookup_gives_the_stock_models_tokens():
    """Multi-token forwards over a cache: the masks sdpa gets, not none (slot 0 onwards)."""
    stock, ours = _stock(), _stock()
    attention.use_engine_attention(ours)
    ids = torch.tensor([[5, 9, 3, 17, 5, 9, 3, 17, 5, 9]])
    kw = dict(do_sample=False, max_new_tokens=16, prompt_lookup_num_tokens=3)
    assert torch.equal(stock.generate(ids, **kw), ours.generate(ids, **kw))


def test_a_compiled_forward_takes_the_grouped_path():
    query, key, value, mask = _inputs(1, 4, 2, 2, S=24, seed=3)
    module = _Heads(2)

    def f(qu, k, v, m):
        return attention.grouped_attention(module, qu, k, v, m, scaling=0.25)[0]

    torch._dynamo.reset()
    graph = torch._dynamo.explain(f)(query, key, value, mask)
    ops = {str(n.target) for g in graph.graphs for n in g.graph.nodes}
    assert not any("scaled_dot_product" in op for op in ops)  # no sdpa kernel, no head copy
    torch.testing.assert_close(torch.compile(f, dynamic=False)(query, key, value, mask),
                               attention.grouped(query, key, value, mask, 0.25))


@pytest.mark.parametrize("case", ["no mask", "sliding window", "dropout"])
def test_a_compiled_forward_the_grouped_path_does_not_cover_goes_to_sdpa(case):
    query, key, value, mask = _inputs(1, 4, 2, 2, S=24, seed=4)
    module = _Heads(2)
    kw = {"sliding_window": 8} if case == "sliding window" else {}
    dropout = 0.5 if case == "dropout" else 0.0
    m = None if case == "no mask" else mask

    def f(qu, k, v):
        return attention.grouped_attention(module, qu, k, v, m, dropout=dropout, scaling=0.25,
                                           **kw)[0]

    torch._dynamo.reset()
    graph = torch._dynamo.explain(f)(query, key, value)
    ops = {str(n.target) for g in graph.graphs for n in g.graph.nodes}
    assert any("scaled_dot_product" in op for op in ops), case


def test_only_a_model_on_sdpa_is_given_the_grouped_attention():
    model = _stock()
    assert model.config._attn_implementation == "sdpa"
    attention.use_engine_attention(model)
    assert model.config._attn_implementation == attention.NAME
    model.config._attn_implementation = "eager"
    attention.use_engine_attention(model)
    assert model.config._attn_implementation == "eager"


def test_a_copied_layers_own_config_is_given_the_engine_attention_too():
    """A drafter's layer copied from the target (feature drafter, early exit's extra layer)
    holds its own copy of the config: its attention reads that one, not the model's."""
    import copy

    model = _stock()
    model.model.layers[0] = copy.deepcopy(model.model.layers[0])  # its config: a copy
    copied = model.model.layers[0].self_attn.config
    assert copied is not model.config and copied._attn_implementation == "sdpa"
    attention.use_engine_attention(model)
    assert model.config._attn_implementation == attention.NAME
    assert copied._attn_implementation == attention.NAME
    assert model.model.layers[1].self_attn.config is model.config


def test_a_drafters_unpacked_layer_leaves_a_packed_targets_attention_as_the_target_chose():
    """An untrained feature drafter over a packed target copies (and unpacks) the target's last
    layer and shares its rotary embedding, which holds the target's config: the drafter's
    layer takes the grouped attention, the target keeps rowattn."""
    from engine.drafters.feature import FeatureDrafter
    from engine.execution.cached_model import CachedModel
    from engine.kernels import rowattn
    from engine.kernels.packed4 import is_packed, quantize_linears

    pair = tiny_pair(layers=2, early_exit_layers=1, seed=3)
    quantize_linears(pair.target.model, 8)
    assert rowattn.library() is not None  # the kernel builds here (a C++ compiler)
    CachedModel(pair.target)
    assert pair.target.config._attn_implementation == attention.ROWS_NAME
    drafter = FeatureDrafter(pair.target)
    layer = drafter.model.model.layers[0]
    assert not is_packed(layer) and drafter.model.model.rotary_emb.config is pair.target.config
    CachedModel(drafter.model)
    assert pair.target.config._attn_implementation == attention.ROWS_NAME
    assert layer.self_attn.config._attn_implementation == attention.NAME
