"""engine.kernels.layout: a CPU model's linear modules run through their oneDNN-packed copies only
inside forwards whose row count the machine's rule sends that way, give the stock logits (rows
padded to SMALL_ROWS and the padding dropped), and the stock forward is back afterwards; the
rule is the cheapest measured path per row count."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import engine.kernels.layout as layout
from engine.drafters.early_exit import ShortlistHead
from engine.kernels.layout import (
    SMALL_ROWS,
    LayoutRule,
    _can_pack,
    _packed_weight,
    head_logits,
    layout_for,
    packed_active,
    prepare,
)
from engine.run.models import model_from_config, tiny_config

pytestmark = pytest.mark.skipif(not _can_pack(), reason="this torch has no oneDNN")


def _tiny():
    return prepare(model_from_config(tiny_config("llama", vocab_size=64, layers=2), seed=0))


def _linears(model):
    tied = model.get_input_embeddings().weight
    return [m for m in model.modules() if isinstance(m, nn.Linear) and m.weight is not tied]


@pytest.fixture(autouse=True)
def default_rule(monkeypatch):
    """Each test starts from the default rule (padded under SMALL_ROWS) and leaves it; the
    tiny models here are packed (a toy model is not, by default: test below)."""
    monkeypatch.setattr(layout, "PACK_MIN_BYTES", 0)
    layout.set_rule(LayoutRule())
    yield
    layout.set_rule(LayoutRule())


def test_a_toy_model_and_a_small_shortlisted_head_stay_stock(monkeypatch):
    """Under PACK_MIN_BYTES a packed call's fixed cost exceeds the product: no packed copy,
    the stock forward at every row count, the same logits."""
    monkeypatch.setattr(layout, "PACK_MIN_BYTES", 4 * 1024**2)
    model = _tiny()
    assert all(_packed_weight(m) is None for m in _linears(model))
    ids = torch.tensor([[1, 2, 3]])  # (1, 3)
    head = ShortlistHead(model.get_output_embeddings(), torch.arange(0, 64, 2))
    x = torch.randn(2, model.config.hidden_size)  # (2, d)
    with torch.no_grad():
        with layout_for(model, 1):
            assert not any(packed_active(m) for m in _linears(model))
            out = model(ids).logits
        assert torch.equal(out, model(ids).logits)
        assert torch.equal(layout.weight_product(head, x), x @ head.weight.T)
    assert _packed_weight(head) is None


def test_packed_copies_only_inside_a_forward_the_rule_sends_there():
    model = _tiny()
    layout.set_rule(LayoutRule(small=("stock", "packed", "padded")))
    before = [m.weight.detach().clone() for m in _linears(model)]
    assert not any(packed_active(m) for m in _linears(model))
    with layout_for(model, 1):
        assert not any(packed_active(m) for m in _linears(model))
    for rows in (2, 3, SMALL_ROWS, 40):
        with layout_for(model, rows):
            assert all(packed_active(m) for m in _linears(model))
    assert not any(packed_active(m) for m in _linears(model))  # restored
    assert all(torch.equal(m.weight, w) for m, w in zip(_linears(model), before))


def test_the_stock_forward_is_restored_when_the_forward_fails():
    model = _tiny()
    with pytest.raises(RuntimeError, match="forward failed"):
        with layout_for(model, 2):
            raise RuntimeError("forward failed")
    assert not any(packed_active(m) for m in _linears(model))


def test_a_forward_gives_the_same_logits_through_the_packed_copies():
    model = _tiny()
    ids = torch.randint(0, 64, (2, 9))
    with torch.no_grad():
        stock = model(input_ids=ids).logits  # (2, 9, V), stock weights
        with layout_for(model, ids.numel()):
            packed = model(input_ids=ids).logits
    assert not torch.equal(stock, torch.zeros_like(stock))
    assert torch.allclose(stock, packed, atol=1e-5)


@pytest.mark.parametrize("tokens", range(1, SMALL_ROWS + 1))
def test_few_row_forwards_are_padded_and_give_the_stock_logits(tokens):
    model = _tiny()
    ids = torch.randint(0, 64, (1, tokens), generator=torch.Generator().manual_seed(tokens))
    with torch.no_grad():
        stock = model(input_ids=ids).logits  # (1, tokens, V)
        with layout_for(model, ids.numel()):
            assert all(packed_active(m) for m in _linears(model))
            packed = model(input_ids=ids).logits
    assert packed.shape == stock.shape
    assert torch.allclose(stock, packed, atol=1e-5)


def test_a_padded_product_keeps_each_row_and_drops_the_padding():
    from engine.kernels import layout

    w, b = torch.randn(7, 5), torch.randn(7)
    packed = torch.ops.mkldnn._reorder_linear_weight(w, layout.PACK_HINT)
    for rows in (1, 2, 3):
        x = torch.randn(rows, 5)
        out = layout._packed_linear(packed, b, x, SMALL_ROWS)
        assert out.shape == (rows, 7)
        assert torch.allclose(out, x @ w.T + b, atol=1e-5)
        assert not torch.allclose(out, x @ w.T, atol=1e-3)  # the bias counts (not zeros)


def test_a_packed_forward_with_a_wrong_copy_would_differ():
    """Negative control: the comparison above sees the packed path (a corrupted copy shows)."""
    from engine.kernels import layout

    model = _tiny()
    for lin in _linears(model):  # every decoder linear's packed copy scaled by 2
        layout._PACKED[lin] = (torch.ops.mkldnn._reorder_linear_weight(
            2 * lin.weight.detach(), layout.PACK_HINT), layout._stamp(lin))
    ids = torch.randint(0, 64, (1, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        stock = model(input_ids=ids).logits
        with layout_for(model, ids.numel()):
            packed = model(input_ids=ids).logits
    assert not torch.allclose(stock, packed, atol=1e-3)


def test_grad_mode_uses_the_stock_weights():
    model = _tiny()
    ids = torch.randint(0, 64, (1, 9))
    with layout_for(model, ids.numel()):
        loss = model(input_ids=ids).logits.sum()
    loss.backward()
    assert all(m.weight.grad is not None for m in _linears(model))


def test_head_logits_equal_the_head_for_few_and_many_rows():
    model = _tiny()
    head = model.get_output_embeddings()
    for rows in (1, 2, SMALL_ROWS - 1, SMALL_ROWS, 13, 40):
        h = torch.randn(1, rows, head.weight.shape[1])
        with torch.no_grad():
            assert torch.allclose(head_logits(head, h), head(h), atol=1e-5)
    other = nn.Linear(16, 50, bias=False)  # never prepared: the stock head
    h = torch.randn(1, 13, 16)
    with torch.no_grad():
        assert torch.allclose(head_logits(other, h), other(h), atol=1e-6)


def test_a_weight_changed_after_packing_is_used_stock_never_stale():
    model = _tiny()
    ids = torch.randint(0, 64, (1, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        for lin in _linears(model):
            lin.weight.mul_(1.5)  # in place: the packed copies do not hold these weights
        model.get_output_embeddings().weight.add_(0.01)
        stock = model(input_ids=ids).logits
        with layout_for(model, ids.numel()):
            packed = model(input_ids=ids).logits
        h = torch.randn(1, 9, model.config.hidden_size)
        head = model.get_output_embeddings()
        assert torch.allclose(head_logits(head, h), head(h), atol=1e-6)
    assert torch.allclose(stock, packed, atol=1e-5)


def test_nested_blocks_leave_the_outer_block_packed_and_restore_everything():
    model = _tiny()
    with layout_for(model, 1):
        with layout_for(model, 1):
            pass
        assert all(packed_active(m) for m in _linears(model))  # the outer block's still on
    assert not any(packed_active(m) for m in _linears(model))


def test_head_logits_keep_a_heads_bias():
    head = nn.Linear(16, 50, bias=True)
    holder = nn.Module()
    holder.lm_head = head
    holder.get_output_embeddings = lambda: head
    prepare(holder)
    h = torch.randn(1, 13, 16)
    with torch.no_grad():
        assert torch.allclose(head_logits(head, h), head(h), atol=1e-5)


def test_a_shortlisted_head_uses_a_packed_copy_and_repacks_a_changed_weight():
    gen = torch.Generator().manual_seed(3)
    head = nn.Linear(16, 64, bias=False)
    short = ShortlistHead(head, torch.randperm(64, generator=gen)[:24])

    def stock(h):  # (..., V): the shortlist's logits, the dtype's minimum elsewhere
        out = torch.full((*h.shape[:-1], 64), torch.finfo(h.dtype).min)
        out[..., short.ids] = h @ short.weight.T
        return out

    with torch.no_grad():
        for rows in (1, 3, 9):
            h = torch.randn(rows, 16, generator=gen)
            assert torch.allclose(short(h), stock(h), atol=1e-5)
        assert _packed_weight(short) is not None  # the product ran through a packed copy
        # the engine's head_logits reads such a head whole (V logits), not its packed copy
        assert torch.allclose(head_logits(short, h), stock(h), atol=1e-5)
        short.weight.mul_(2.0)  # in place: the packed copy is stale now
        h = torch.randn(5, 16, generator=gen)
        assert torch.allclose(short(h), stock(h), atol=1e-5)


def test_a_shortlisted_head_over_the_memory_cap_keeps_one_copy(monkeypatch):
    head = ShortlistHead(nn.Linear(16, 64, bias=False), torch.arange(0, 64, 2))
    monkeypatch.setattr(layout, "DUAL_LIMIT_BYTES", head.weight.numel() * 4 - 1)
    h = torch.randn(3, 16)
    with torch.no_grad():
        out = head(h)
    assert _packed_weight(head) is None  # no second copy of a weight over the cap
    assert torch.allclose(out[:, head.ids], h @ head.weight.T, atol=1e-6)


def test_calibration_takes_the_cheapest_measured_path_at_each_row_count():
    model = _tiny()
    cost = {"stock": (1.0, 1.0, 9.0), "packed": (2.0, 0.5, 8.0), "padded": (3.0, 3.0, 1.0)}
    rule = layout.calibrate(model, timer=lambda m, rows, path: cost[path][rows - 1])
    assert rule.small == ("stock", "packed", "padded")
    assert rule.path(1) == "stock" and rule.path(SMALL_ROWS) == "packed"
    assert set(rule.measured_ms) == {f"{r} {p}" for r in (1, 2, 3) for p in layout.PATHS}


def test_a_small_model_leaves_the_default_rule_and_a_measured_one_is_kept():
    layout.measure_rule(_tiny())  # far under CALIBRATE_BYTES
    assert layout.rule() == LayoutRule()


def test_a_stock_path_gives_the_stock_logits_and_skips_the_packed_head():
    model = _tiny()
    layout.set_rule(LayoutRule(small=("stock", "stock", "stock")))
    ids = torch.randint(0, 64, (1, 2))
    with torch.no_grad():
        stock = model(input_ids=ids).logits
        with layout_for(model, ids.numel()):
            assert not any(packed_active(m) for m in _linears(model))
            h = model.model(input_ids=ids).last_hidden_state
            assert torch.equal(head_logits(model.lm_head, h), model.lm_head(h))
    assert torch.allclose(stock, model.lm_head(h), atol=1e-6)
