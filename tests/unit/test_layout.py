"""engine.layout: a CPU model's column-major twin weights are used only inside forwards of
GEMM_ROWS rows or more, hold the same values, and the stock layout is back afterwards."""

from __future__ import annotations

import torch
from torch import nn

from engine.layout import GEMM_ROWS, head_logits, layout_for, prepare
from engine.models import model_from_config, tiny_config


def _tiny():
    return prepare(model_from_config(tiny_config("llama", vocab_size=64, layers=2), seed=0))


def _linears(model):
    tied = model.get_input_embeddings().weight
    return [m for m in model.modules() if isinstance(m, nn.Linear) and m.weight is not tied]


def test_column_major_twins_only_inside_a_forward_of_enough_rows():
    model = _tiny()
    before = [m.weight.detach().clone() for m in _linears(model)]
    assert all(m.weight.stride(1) == 1 for m in _linears(model))  # stock row-major
    with layout_for(model, GEMM_ROWS - 1):
        assert all(m.weight.stride(1) == 1 for m in _linears(model))
    with layout_for(model, GEMM_ROWS):
        mods = _linears(model)
        assert all(m.weight.stride(0) == 1 for m in mods)  # column-major
        assert all(torch.equal(m.weight, w) for m, w in zip(mods, before))
    assert all(m.weight.stride(1) == 1 for m in _linears(model))  # restored


def test_the_stock_layout_is_restored_when_the_forward_fails():
    model = _tiny()
    try:
        with layout_for(model, 2 * GEMM_ROWS):
            raise RuntimeError("forward failed")
    except RuntimeError:
        pass
    assert all(m.weight.stride(1) == 1 for m in _linears(model))


def test_a_forward_gives_the_same_logits_in_either_layout():
    model = _tiny()
    ids = torch.randint(0, 64, (1, 9))
    with torch.no_grad():
        stock = model(input_ids=ids).logits  # (1, 9, V), row-major weights
        with layout_for(model, ids.numel()):
            twin = model(input_ids=ids).logits
    assert torch.allclose(stock, twin, atol=1e-5)


def test_head_logits_equal_the_head_for_few_and_many_rows():
    head = nn.Linear(16, 50, bias=False)
    for rows in (1, GEMM_ROWS - 1, GEMM_ROWS, 13):
        h = torch.randn(1, rows, 16)
        assert torch.allclose(head_logits(head, h), head(h), atol=1e-5)
