"""engine.core.attention: the grouped-query attention of compiled steps equals transformers'
sdpa attention (which repeats every key/value head), eager forwards keep sdpa's bits, and only
a model on sdpa is switched to it."""

from __future__ import annotations

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from engine.core import attention
from tests.conftest import tiny_pair


class _Heads(torch.nn.Module):
    """What sdpa_attention_forward reads from an attention module."""

    def __init__(self, groups: int):
        super().__init__()
        self.num_key_value_groups, self.is_causal, self.training = groups, True, False


def _inputs(W: int, H: int, KV: int, q: int, S: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    query = torch.randn(W, H, q, 16, generator=gen)  # (W, H, q, D)
    key = torch.randn(W, KV, S, 16, generator=gen)  # (W, KV, S, D)
    value = torch.randn(W, KV, S, 16, generator=gen)  # (W, KV, S, D)
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
    ours, _ = attention.grouped_attention(module, query, key, value, mask, scaling=0.25)
    theirs, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=0.25)
    assert torch.equal(ours, theirs)


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
    model = tiny_pair().target
    assert model.config._attn_implementation == "sdpa"
    attention.use_grouped(model)
    assert model.config._attn_implementation == attention.NAME
    model.config._attn_implementation = "eager"
    attention.use_grouped(model)
    assert model.config._attn_implementation == "eager"
