"""engine.kernels.siblings: a layer's q / k / v and gate / up products run as one, each layer
keeping the bits it gave alone; eagerly computed once per input (never stale), and once in a
compiled graph through the post-grad pass."""

from __future__ import annotations

import copy

import pytest
import torch

from engine.kernels import qmm
from engine.kernels.packed4 import Packed4Linear, quantize_linears
from engine.kernels.siblings import SiblingCSE, fuse_siblings
from engine.run.models import model_from_config, tiny_config


def _packed_model(bits: int, fuse: bool):
    cfg = tiny_config("llama", vocab_size=128, layers=2, hidden_size=64,
                      intermediate_size=96)  # k and v: 2 heads of 16 = 32 columns
    model = model_from_config(cfg, seed=3)
    if fuse:
        quantize_linears(model.model, bits)
    else:  # the same layers, each its own product
        import engine.kernels.packed4 as packed4

        real = packed4.fuse_siblings
        packed4.fuse_siblings = lambda module, layer_type: 0
        try:
            quantize_linears(model.model, bits)
        finally:
            packed4.fuse_siblings = real
    return model.eval()


def _count_products(monkeypatch) -> list:
    calls = []
    real = qmm.matmul

    def counting(x, qw, dw, mw, n, bits=16):
        calls.append(n)
        return real(x, qw, dw, mw, n, bits)

    monkeypatch.setattr(qmm, "matmul", counting)
    return calls


@pytest.mark.parametrize("bits", qmm.BITS)
def test_a_fused_layer_gives_every_projection_the_bits_it_gave_alone(bits):
    fused, alone = _packed_model(bits, True), _packed_model(bits, False)
    attn = fused.model.layers[0].self_attn
    assert attn.q_proj.siblings is attn.k_proj.siblings is attn.v_proj.siblings is not None
    assert alone.model.layers[0].self_attn.q_proj.siblings is None
    for rows in (1, 5):
        x = torch.randn(1, rows, 64, generator=torch.Generator().manual_seed(rows))
        for name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                     "mlp.gate_proj", "mlp.up_proj"):
            a = fused.model.layers[1].get_submodule(name)(x)
            b = alone.model.layers[1].get_submodule(name)(x)
            assert torch.equal(a, b), (name, rows)
        ids = torch.randint(0, 100, (1, 7), generator=torch.Generator().manual_seed(9))
        assert torch.equal(fused(ids).logits, alone(ids).logits)


def test_a_fused_sets_members_keep_their_weights_as_views_of_one_product():
    model = _packed_model(8, True)
    attn = model.model.layers[0].self_attn
    group = attn.q_proj.siblings
    assert group.n == 64 + 32 + 32
    assert [m.sibling_start for m in (attn.q_proj, attn.k_proj, attn.v_proj)] == [0, 64, 96]
    assert attn.k_proj.qw.untyped_storage().data_ptr() == group.qw.untyped_storage().data_ptr()
    dense = torch.cat([m.dequantize() for m in (attn.q_proj, attn.k_proj, attn.v_proj)])
    whole = Packed4Linear.__new__(Packed4Linear)
    torch.nn.Module.__init__(whole)
    whole.qw, whole.dw, whole.mw = group.qw, group.dw, group.mw
    whole.in_features, whole.out_features, whole.bias = 64, group.n, None
    assert torch.equal(whole.dequantize(), dense)
    assert fuse_siblings(model, Packed4Linear) == 0  # a set is fused once


def test_eagerly_the_siblings_share_one_product_of_an_unchanged_input(monkeypatch):
    model = _packed_model(8, True)
    attn = model.model.layers[0].self_attn
    calls = _count_products(monkeypatch)
    x = torch.randn(1, 3, 64, generator=torch.Generator().manual_seed(1))
    q, k = attn.q_proj(x), attn.k_proj(x)
    assert calls == [128]  # one product for q, k and v
    x.mul_(2)  # written in place: the stored product is stale
    k2 = attn.k_proj(x)
    assert calls == [128, 128] and torch.equal(k2, attn.k_proj(x.clone()))
    assert not torch.equal(k2, k)
    attn.v_proj(x.clone())  # another tensor: computed afresh
    assert len(calls) == 4
    assert torch.equal(q, attn.q_proj(x / 2))


def test_the_pass_merges_identical_products_unless_their_input_is_written_between():
    graph = torch.fx.Graph()
    x, w, d, m, cache = (graph.placeholder(n) for n in ("x", "qw", "dw", "mw", "cache"))
    op = torch.ops.specviz.qmm.default
    a = graph.call_function(op, (x, w, d, m, 48, 8))
    b = graph.call_function(op, (x, w, d, m, 48, 8))  # the same: merged
    graph.call_function(torch.ops.aten.add_.Tensor, (cache, a))  # writes another tensor
    c = graph.call_function(op, (x, w, d, m, 48, 8))  # still the same input: merged
    graph.call_function(torch.ops.aten.mul_.Tensor, (x, 2.0))  # writes x
    e = graph.call_function(op, (x, w, d, m, 48, 8))  # x changed: kept
    graph.output((a, b, c, e))
    SiblingCSE()(graph)
    products = [n for n in graph.nodes if n.target is op]
    assert len(products) == 2
    assert list(graph.nodes)[-1].args[0] == (a, a, a, products[1])


def test_a_compiled_step_runs_each_sets_product_once_with_the_eager_bits(monkeypatch):
    model = _packed_model(8, True)
    layer = model.model.layers[0]
    x = torch.randn(1, 4, 64, generator=torch.Generator().manual_seed(5))

    def f(v):
        return layer.self_attn.q_proj(v) + torch.cat([layer.self_attn.k_proj(v),
                                                      layer.self_attn.v_proj(v)], -1)

    want = f(x)
    seen = []
    cse = SiblingCSE()

    def counting_pass(graph):
        cse(graph)
        seen.append(sum(n.target is torch.ops.specviz.qmm.default for n in graph.nodes))

    class Pass(type(cse)):
        def __call__(self, graph):
            counting_pass(graph)

    torch._dynamo.reset()
    got = torch.compile(f, fullgraph=True, options={"post_grad_custom_post_pass": Pass(),
                                                    "fx_graph_cache": False})(x)
    assert seen == [1]
    assert torch.equal(got, want)


def test_a_deep_copy_of_a_fused_layer_keeps_its_own_set():
    model = _packed_model(8, True)
    layer = copy.deepcopy(model.model.layers[0])
    attn = layer.self_attn
    assert attn.q_proj.siblings is attn.k_proj.siblings
    assert attn.q_proj.siblings is not model.model.layers[0].self_attn.q_proj.siblings
    x = torch.randn(1, 2, 64, generator=torch.Generator().manual_seed(6))
    assert torch.equal(attn.v_proj(x), model.model.layers[0].self_attn.v_proj(x))


def test_a_stored_steps_key_tells_a_fused_model_from_one_without_sets():
    """A stored compiled step traced with the sets merges their products; the step store's
    key must not hand it to a model whose layers run alone (or the reverse)."""
    from engine.execution.step_store import model_key

    fused, alone = _packed_model(8, True), _packed_model(8, False)
    assert model_key(fused.model) != model_key(alone.model)
    assert model_key(fused.model) == model_key(_packed_model(8, True).model)


def test_a_members_output_is_its_own_and_the_set_lets_go_once_every_member_took_it():
    fused, alone = _packed_model(8, True), _packed_model(8, False)
    f, u = fused.model.layers[0].self_attn, alone.model.layers[0].self_attn
    x = torch.randn(1, 3, 64, generator=torch.Generator().manual_seed(7))
    a = f.q_proj(x)
    a.add_(1)  # the caller's own tensor: written in place
    assert torch.equal(f.q_proj(x), u.q_proj(x))  # not the written one
    k = f.k_proj(x)
    assert k.is_contiguous() and torch.equal(k.view(-1), u.k_proj(x).view(-1))
    f.v_proj(x)
    assert f.q_proj.siblings._last is None  # every member served: nothing held


def test_a_product_is_not_reused_across_padding_weights_or_inference_mode():
    fused, alone = _packed_model(8, True), _packed_model(8, False)
    f, u = fused.model.layers[0].self_attn, alone.model.layers[0].self_attn
    x = torch.randn(2, 64, generator=torch.Generator().manual_seed(8))  # 2 rows
    with qmm.padded_rows(2, 1):  # the q product's second row is padding
        f.q_proj(x)
    assert torch.equal(f.k_proj(x), u.k_proj(x))  # computed afresh, every row real
    f.q_proj(x)
    state = {k: v * 0 + 1 for k, v in u.k_proj.state_dict().items()}  # other weights
    f.k_proj.load_state_dict(state)  # written in place into the stack
    u.k_proj.load_state_dict(state)
    assert torch.equal(f.k_proj(x), u.k_proj(x))
    f.v_proj.load_state_dict({k: v.clone() for k, v in state.items()}, assign=True)
    assert not f.v_proj.siblings.holds(f.v_proj)  # its own buffers now: it computes alone
    u.v_proj.load_state_dict(state)
    assert torch.equal(f.v_proj(x), u.v_proj(x))
    with torch.inference_mode():
        y = torch.randn(1, 2, 64, generator=torch.Generator().manual_seed(9))
        assert torch.equal(fused(torch.tensor([[3, 4, 5]])).logits,
                           alone(torch.tensor([[3, 4, 5]])).logits)
        assert torch.equal(f.q_proj(y), u.q_proj(y))
