"""4-bit packed linears (engine.kernels.packed4) on a tiny llama written as a GGUF (Q4_1 linears,
a Q8_0 head): lossless packing, the 16-bit activations' bound, row independence, the engine's greedy
on the packed model, refusals."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import engine
from engine.core.errors import ConfigError
from engine.execution.placement import unhooked_copy
from engine.kernels import layout, packed4
from engine.kernels.packed4 import (
    GROUP,
    Packed4Linear,
    Packed8Linear,
    pack_head,
    pack_linears,
    quantize_q4_1,
    unpack_linears,
)
from engine.run.models import load_model, model_from_config, tiny_config
from engine.run.specs import default_draft, parse_model_spec
from tests.gguf_tiny import load_packed, write_gguf
from tests.oracles import qmm_error_bound

LAYERS = 2
HEADS, KV_HEADS = 4, 2


def _tiny():
    cfg = tiny_config("llama", vocab_size=64, layers=LAYERS, hidden_size=32,
                      intermediate_size=64, num_attention_heads=HEADS,
                      num_key_value_heads=KV_HEADS)
    return model_from_config(cfg, seed=0)


@pytest.fixture
def packed(tmp_path):
    model = _tiny()
    expected = write_gguf(tmp_path / "tiny.gguf", model)
    n = pack_linears(model, tmp_path / "tiny.gguf")
    assert n == 7 * LAYERS
    return model, expected


@pytest.fixture
def packed_head(tmp_path):
    """The tiny llama as a GGUF with Q4_1 linears and a Q8_0 head, loaded and packed."""
    model = _tiny()
    expected = write_gguf(tmp_path / "tiny.gguf", model, head=True)
    return load_packed(model, tmp_path / "tiny.gguf", expected), expected


def _bound(m: Packed4Linear | Packed8Linear, x: torch.Tensor) -> torch.Tensor:
    """qmm_error_bound of m's weight |W| (Q4_1 or Q8_0)."""
    return qmm_error_bound(m.blocks().dequantize().abs(), x, GROUP)  # (R, out)


def test_packing_q4_1_is_lossless(packed):
    model, expected = packed
    for name, w in expected.items():
        m = model.get_submodule(name)
        assert isinstance(m, Packed4Linear)
        assert torch.equal(m.dequantize(), w), name


def test_packed_layer_stays_within_the_16_bit_activation_bound_of_the_dequantised_layer(
        packed):
    model, expected = packed
    gen = torch.Generator().manual_seed(0)
    for name, w in expected.items():
        m = model.get_submodule(name)
        x = torch.randn(2, 3, m.in_features, generator=gen)  # (2, 3, in)
        y, ref = m(x), x @ w.T  # (2, 3, out)
        assert y.shape == ref.shape and y.dtype == torch.float32
        bound = _bound(m, x.view(-1, m.in_features)).view_as(ref)
        assert ((y - ref).abs() <= bound).all(), name
        assert (y - ref).abs().max() > 0  # 16-bit activations: not the fp32 product itself


def test_packing_a_q8_0_head_is_lossless_and_keeps_its_tied_weight(packed_head):
    model, expected = packed_head
    head = model.get_output_embeddings()
    assert isinstance(head, Packed8Linear)
    assert torch.equal(head.dequantize(), expected["lm_head"])
    assert torch.equal(head.weight, expected["lm_head"])  # the dense weight it was tied to


def test_packed_head_stays_within_the_16_bit_activation_bound_of_the_dequantised_head(
        packed_head):
    model, expected = packed_head
    head, w = model.get_output_embeddings(), expected["lm_head"]
    x = torch.randn(5, head.in_features, generator=torch.Generator().manual_seed(1))  # (5, in)
    y, ref = head(x), x @ w.T  # (5, V)
    assert y.dtype == torch.float32
    assert ((y - ref).abs() <= _bound(head, x)).all()
    assert (y - ref).abs().max() > 0  # 16-bit activations: not the fp32 product itself


def test_a_packed_product_of_many_rows_equals_its_one_row_products(packed_head):
    model, _ = packed_head
    mods = [model.model.layers[0].mlp.down_proj, model.get_output_embeddings()]
    assert isinstance(mods[0], Packed4Linear) and isinstance(mods[1], Packed8Linear)
    for m in mods:
        x = torch.randn(7, m.in_features, generator=torch.Generator().manual_seed(2))  # (7, in)
        rows = torch.cat([m(x[i:i + 1]) for i in range(7)])  # (7, out)
        assert torch.equal(m(x), rows), type(m).__name__


def test_a_head_the_gguf_does_not_hold_as_its_q8_0_weight_stays_a_stock_linear(tmp_path):
    model = _tiny()
    write_gguf(tmp_path / "none.gguf", model)  # no output tensor
    assert not pack_head(model, tmp_path / "none.gguf")
    write_gguf(tmp_path / "q8.gguf", model, head=True)  # Q8_0, but the head is not its value
    assert not pack_head(model, tmp_path / "q8.gguf")  # (not loaded from this file)
    assert type(model.get_output_embeddings()) is nn.Linear


def test_a_drafters_copy_of_a_packed_head_is_a_stock_linear(packed_head):
    model, expected = packed_head
    lin = unpack_linears(model.get_output_embeddings())
    assert type(lin) is nn.Linear and torch.equal(lin.weight, expected["lm_head"])


@pytest.mark.parametrize("fixture", ["packed", "packed_head"])
def test_engine_greedy_and_sd_on_a_packed_model_equal_its_generate(fixture, request):
    model, _ = request.getfixturevalue(fixture)
    pair = engine.load_pair(target=model, draft=None, device="cpu", early_exit_layers=1)
    prompt = [3, 17, 5, 9]
    ref = model.generate(torch.tensor([prompt]), do_sample=False,
                         max_new_tokens=16)[0, len(prompt):].tolist()
    for method, params in (("greedy", {}), ("sd", {"gamma": 3})):
        trace = engine.generate(pair, prompt, method, max_new_tokens=16, **params)
        assert list(trace.token_ids) == ref and len(ref) > 4, method


def test_layout_packing_leaves_packed4_linears_alone(packed):
    model, _ = packed
    mods = [m for m in model.modules() if isinstance(m, Packed4Linear)]
    assert mods and all(m not in layout._linears(model) for m in mods)
    with layout.layout_for(model, 4):
        assert not any(layout.packed_active(m) for m in mods)


def test_a_drafters_copy_of_a_packed_layer_is_a_stock_linear(packed):
    model, expected = packed
    copy = unhooked_copy(model.model.layers[-1])
    proj = copy.self_attn.q_proj
    assert type(proj) is nn.Linear
    assert torch.equal(proj.weight, expected[f"model.layers.{LAYERS - 1}.self_attn.q_proj"])


def test_a_linear_tensor_of_another_type_is_refused_in_one_line(tmp_path):
    import gguf

    model = _tiny()
    write_gguf(tmp_path / "bad.gguf", model,
               {"blk.1.ffn_up.weight": gguf.GGMLQuantizationType.Q8_0})
    with pytest.raises(ConfigError) as e:
        pack_linears(model, tmp_path / "bad.gguf")
    assert str(e.value) == ("cannot pack GGUF tensor blk.1.ffn_up.weight: type Q8_0 "
                            "(4-bit packing takes Q4_1 only)")


def test_embedded_q4_spec_parses_and_keeps_the_embedded_default_drafter():
    spec = parse_model_spec("embedded-q4")
    assert spec.kind == "embedded-q4"
    assert default_draft("embedded-q4") == default_draft("embedded")


def test_embedded_q4_a8_is_another_target_with_8_bit_activations_and_its_own_presets():
    from engine.run.specs import pair_key, spec_key
    from engine.run.tuned import tuned_settings

    assert spec_key(parse_model_spec("embedded-q4")) == ("embedded-q4", "", "{}", "", None, "")
    assert default_draft("ngram") == default_draft("embedded-q4:a4") == ""  # not a target
    spec = parse_model_spec("embedded-q4:a8")
    assert (spec.kind, spec.bits, parse_model_spec("embedded-q4").bits) == ("embedded-q4", 8, 16)
    assert default_draft("embedded-q4:a8") == default_draft("embedded")
    assert pair_key("embedded-q4:a8", "ngram+feature") != pair_key("embedded-q4", "ngram+feature")
    assert tuned_settings("embedded-q4:a8", "ngram+feature")["sd"]  # its preset row
    with pytest.raises(ConfigError) as e:
        parse_model_spec("embedded-q4:a4")
    assert str(e.value) == ("bad model spec 'embedded-q4:a4': 'embedded-q4' takes ':a8' "
                            "(8-bit activations) or nothing")


def test_a_drafters_own_packed_layers_take_the_targets_activation_width(packed_head):
    from engine.drafters.early_exit import ShortlistHead
    from engine.kernels.packed4 import (
        Packed8Linear,
        activation_bits,
        quantize_linears,
        set_activation_bits,
    )

    model, _ = packed_head
    head = model.get_output_embeddings()
    assert isinstance(head, Packed8Linear) and activation_bits(model) == 16
    try:
        assert set_activation_bits(model, 8) > 1 and activation_bits(model) == 8
        assert ShortlistHead(head, torch.arange(5)).q4.bits == 8
        layer = torch.nn.Sequential(torch.nn.Linear(64, 32))
        assert quantize_linears(layer, activation_bits(model)) == 1 and layer[0].bits == 8
        with pytest.raises(ConfigError, match="activation bits must be one of"):
            set_activation_bits(model, 4)
        other = torch.nn.Sequential(torch.nn.Linear(64, 32))
        with pytest.raises(ConfigError, match="activation bits must be one of"):
            quantize_linears(other, 4)
        assert type(other[0]) is torch.nn.Linear  # refused before anything was swapped
    finally:
        set_activation_bits(model, 16)


def test_embedded_q4_off_the_cpu_is_refused_before_loading():
    with pytest.raises(ConfigError, match="CPU only"):
        load_model("embedded-q4", torch.device("cuda"), torch.float32)


def test_feature_drafter_over_a_packed_target_drafts_with_stock_layers(packed):
    model, _ = packed
    pair = engine.load_pair(target=model, draft="feature", device="cpu")
    layer = pair.drafter.parts.layer
    assert not any(isinstance(m, Packed4Linear) for m in layer.modules())
    prompt = [3, 17, 5, 9]
    ref = model.generate(torch.tensor([prompt]), do_sample=False,
                         max_new_tokens=16)[0, len(prompt):].tolist()
    trace = engine.generate(pair, prompt, "sd", max_new_tokens=16, gamma=3)
    assert list(trace.token_ids) == ref


def test_quantize_q4_1_puts_each_weight_on_its_blocks_grid_within_half_a_step():
    w = torch.randn(32, 64, generator=torch.Generator().manual_seed(3))  # (out, in)
    b = quantize_q4_1(w)
    d = b.d.float().repeat_interleave(GROUP, dim=1)  # (out, in)
    m = b.m.float().repeat_interleave(GROUP, dim=1)  # (out, in)
    err = (b.dequantize() - w).abs()  # (out, in)
    assert (err <= 0.5 * d + 2**-10 * (m.abs() + 15 * d) + 1e-6).all()  # fp16 d and m
    q = b.q.view(32, 2, GROUP)
    assert (q.amin(-1) == 0).all() and (q.amax(-1) == 15).all()  # min and max on the grid


def test_a_trained_feature_drafter_over_a_packed_target_runs_in_4_bits_and_stays_exact(
        packed, tmp_path):
    from engine.drafters.feature import FeatureParts, save_feature

    model, _ = packed
    path = save_feature(tmp_path / "feature.safetensors", model, FeatureParts(model))
    pair = engine.load_pair(target=model, draft=f"feature:{path}", device="cpu")
    parts = pair.drafter.parts
    assert isinstance(parts.fc, Packed4Linear) and "4-bit" in pair.drafter.name
    assert sum(isinstance(m, Packed4Linear) for m in parts.layer.modules()) == 7
    prompt = [3, 17, 5, 9]
    ref = model.generate(torch.tensor([prompt]), do_sample=False,
                         max_new_tokens=16)[0, len(prompt):].tolist()
    trace = engine.generate(pair, prompt, "sd", max_new_tokens=16, gamma=3)
    assert list(trace.token_ids) == ref


def test_a_trained_early_exit_over_a_packed_target_runs_its_own_layer_in_4_bits(
        packed, tmp_path):
    from engine.drafters.early_exit import init_extra_layer, load_trained, save_trained

    model, _ = packed
    path = save_trained(tmp_path / "ee.safetensors", model, 1, init_extra_layer(model, 1))
    drafter = load_trained(model, path)
    assert sum(isinstance(m, Packed4Linear) for m in drafter.extra_layer.modules()) == 7
    assert "4-bit" in drafter.name


def test_a_shortlisted_head_over_a_packed_head_runs_its_rows_in_4_bits(packed_head):
    from engine.drafters.early_exit import ShortlistHead

    model, expected = packed_head
    ids = torch.tensor([1, 5, 9, 20, 33])  # 5 rows: padded to one 16-row tile
    head = ShortlistHead(model.get_output_embeddings(), ids)
    assert isinstance(head.q4, Packed4Linear) and head.q4.out_features == 16
    h = torch.randn(3, head.weight.shape[1], generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        out = head(h)  # (3, V)
    w = head.q4.dequantize()[:5]  # (5, d): the shortlisted rows on their Q4_1 grids
    rows = quantize_q4_1(expected["lm_head"][ids])  # ... which quantise the dense rows
    assert torch.equal(w, rows.dequantize())
    assert ((out[:, ids] - h @ w.T).abs() <= qmm_error_bound(w.abs(), h, GROUP)).all()
    others = torch.ones(out.shape[-1], dtype=torch.bool)
    others[ids] = False
    assert (out[:, others] == torch.finfo(out.dtype).min).all()  # q is 0 off the shortlist


def test_a_q8_0_head_keeps_scales_fp16_holds_whatever_their_size():
    """The Q8_0 layout stores d as the file does (the product of two 4-bit halves that ran the
    head before needed 128 d in fp16 and refused d = 1000)."""
    from engine.kernels.packed4 import Q8Blocks

    q = torch.randint(-128, 128, (16, GROUP), generator=torch.Generator().manual_seed(3),
                      dtype=torch.int8)  # (out, in)
    d = torch.full((16, 1), 1000.0).half()
    head = Packed8Linear(Q8Blocks("big", q, d), nn.Parameter(torch.zeros(16, GROUP)))
    assert torch.equal(head.blocks().q, q) and torch.equal(head.blocks().d, d)
    x = torch.randn(3, GROUP, generator=torch.Generator().manual_seed(4))  # (3, in)
    w = q.float() * 1000.0  # (16, in)
    assert ((head(x) - x @ w.T).abs() <= _bound(head, x)).all()


def test_quantize_linears_swaps_the_linears_inside_a_module_not_the_module_itself():
    from engine.kernels.packed4 import quantize_linears

    block = nn.Sequential(nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 16))  # 16 inputs: kept
    assert quantize_linears(block) == 1
    assert isinstance(block[0], Packed4Linear) and type(block[2]) is nn.Linear
    with pytest.raises(ConfigError, match="not itself"):
        quantize_linears(nn.Linear(32, 16))


def test_a_shortlisted_head_under_autograd_uses_its_dense_rows(packed_head):
    from engine.drafters.early_exit import ShortlistHead

    model, _ = packed_head
    ids = torch.tensor([1, 5, 9])
    head = ShortlistHead(model.get_output_embeddings(), ids)
    h = torch.randn(2, head.weight.shape[1], generator=torch.Generator().manual_seed(5),
                    requires_grad=True)
    out = head(h)[:, ids]  # (2, 3): the dense rows, so a gradient reaches h
    torch.testing.assert_close(out, h @ head.weight.T)
    out.sum().backward()
    assert h.grad is not None and h.grad.abs().sum() > 0


def _dequantised(expected):
    """A fresh tiny llama holding the GGUF's dequantised weights, nothing packed."""
    model = _tiny()
    with torch.no_grad():
        for name, w in expected.items():
            model.get_submodule(name).weight.copy_(w)
    return model


def test_saved_packed_layers_load_into_a_fresh_model_bit_for_bit(packed_head, tmp_path):
    model, expected = packed_head
    assert packed4.save_packed(model, tmp_path / "packed.safetensors") == 7 * LAYERS + 1
    fresh = _dequantised(expected)
    dense_head = fresh.lm_head.weight
    assert packed4.load_packed(fresh, tmp_path / "packed.safetensors") == 7 * LAYERS + 1
    ours = dict(model.named_modules())
    for name, m in fresh.named_modules():
        if isinstance(m, (Packed4Linear, Packed8Linear)):
            assert type(m) is type(ours[name]), name
            for b in packed4.BUFFERS[type(m).__name__]:
                assert torch.equal(getattr(m, b), getattr(ours[name], b)), (name, b)
    assert fresh.lm_head.weight is dense_head  # tied to the weight it replaced, not copied
    ids = torch.tensor([[1, 5, 9, 2, 7]])
    with torch.no_grad():
        assert torch.equal(fresh(input_ids=ids).logits, model(input_ids=ids).logits)


def test_a_packed_file_that_does_not_fit_the_model_is_refused_and_swaps_nothing(
        packed_head, tmp_path):
    model, expected = packed_head
    packed4.save_packed(model, tmp_path / "packed.safetensors")
    other = model_from_config(tiny_config("llama", vocab_size=64, layers=LAYERS, hidden_size=64,
                                          intermediate_size=64, num_attention_heads=HEADS,
                                          num_key_value_heads=KV_HEADS), seed=0)
    with pytest.raises(ConfigError, match="does not fit layer"):
        packed4.load_packed(other, tmp_path / "packed.safetensors")
    assert not packed4.is_packed(other)


def test_a_truncated_packed_cache_is_dropped_and_the_model_packed_from_the_gguf(
        tmp_path, monkeypatch):
    """The loader's cache (engine.run.models._pack_embedded): a file that cannot be read
    (a crash mid-write) is deleted and the layers packed from the GGUF, then cached again."""
    from engine.run import models

    cached = tmp_path / "packed-0.safetensors"
    cached.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{")  # a header cut short
    packed_from_gguf = []
    monkeypatch.setattr(models, "packed_cache_file", lambda folder: cached)
    monkeypatch.setattr(packed4, "gguf_reader", lambda p: ("reader", p))
    monkeypatch.setattr(packed4, "pack_linears", lambda m, p: packed_from_gguf.append(p))
    monkeypatch.setattr(packed4, "pack_head", lambda m, p: True)
    monkeypatch.setattr(packed4, "save_packed", lambda m, p: p.write_bytes(b"new"))
    models._pack_embedded(_tiny(), tmp_path)
    assert len(packed_from_gguf) == 1 and cached.read_bytes() == b"new"


def test_packing_the_embedded_model_parses_its_gguf_once_for_the_linears_and_the_head(
        tmp_path, monkeypatch):
    """Parsing the embedded GGUF's fields takes seconds: the layers and the head are packed
    from one reader (engine.kernels.packed4.gguf_reader), which a reader passed in returns."""
    from engine.run import models

    opened, given = [], []
    monkeypatch.setattr(models, "packed_cache_file", lambda folder: tmp_path / "packed-1.st")
    monkeypatch.setattr(packed4, "gguf_reader", lambda p: opened.append(p) or object())
    monkeypatch.setattr(packed4, "pack_linears", lambda m, p: given.append(p))
    monkeypatch.setattr(packed4, "pack_head", lambda m, p: given.append(p))
    monkeypatch.setattr(packed4, "save_packed", lambda m, p: None)
    models._pack_embedded(_tiny(), tmp_path)
    assert len(opened) == 1 and len(given) == 2 and given[0] is given[1]
    assert not isinstance(given[0], (str, Path))


def test_a_gguf_reader_passed_in_is_used_as_it_is(tmp_path):
    from gguf import GGUFReader

    path = tmp_path / "tiny.gguf"
    write_gguf(path, _tiny())
    reader = GGUFReader(str(path))
    assert packed4.gguf_reader(reader) is reader
    assert isinstance(packed4.gguf_reader(path), GGUFReader)
