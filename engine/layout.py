"""CPU matrix products for the few-token forwards of speculative decoding.

A verify pass feeds a handful of tokens (a draft chain, a tree, K beams). On this CPU build
(MKL, fp32, one thread) ``F.linear`` over a row-major weight re-reads the weight for every
three input rows until 16: the 49,152 x 576 LM head costs 13 ms for 1-3 rows, 25 ms for 4-6,
40 ms for 7-9, 55 ms for 10-12, 64 ms for 13-15 and 33 ms for 16 (measured, single thread).
Over a column-major weight (same values, transposed strides) it runs one streaming GEMM from
4 rows on but pays a pass per row below that. Measured per 1536 x 576 weight streamed from
memory (90 of them in turn, as a forward does): row-major 0.46 / 0.44 / 0.52 / 0.87 / 1.29 ms
for 1 / 2 / 3 / 4 / 8 rows, column-major 0.36 / 0.69 / 0.75 / 0.74 / 0.85 ms.

So a CPU model keeps both layouts of every decoder linear weight (:func:`prepare`; the tied
embedding / LM head excepted) and a forward of ``rows`` rows runs under :func:`layout_for`:
column-major from GEMM_ROWS rows on, the stock row-major layout otherwise and outside (so
``generate()``, training and saving see the stock model). The LM head, which the engine applies
itself, runs as ``(W @ h^T)^T`` from GEMM_ROWS rows on (:func:`head_logits`). Nothing in a
modeling file or a value changes; only the order of floating-point sums does, as with any
change of batch shape, and the exactness tests run with it. Models whose linear weights exceed
DUAL_LIMIT_BYTES keep one layout (the copy would cost that much memory again).
"""

from __future__ import annotations

from contextlib import contextmanager
from weakref import WeakKeyDictionary

import torch
from torch import nn

GEMM_ROWS = 4  # from this many rows on, column-major weights and the head as one GEMM
DUAL_LIMIT_BYTES = 2 * 1024**3  # at most this much linear weight gets a second layout

_LAYOUTS: WeakKeyDictionary = WeakKeyDictionary()  # nn.Linear -> (row-major, column-major)
_MODELS: WeakKeyDictionary = WeakKeyDictionary()  # model -> its nn.Linear with both layouts


def _linears(model: nn.Module) -> list[nn.Linear]:
    embed = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    tied = embed.weight if embed is not None else None
    return [m for m in model.modules() if isinstance(m, nn.Linear)
            and m.weight is not tied and m.weight.device.type == "cpu" and m.weight.dim() == 2]


def prepare(model: nn.Module) -> nn.Module:
    """Give every decoder linear weight of a CPU model a column-major twin (the module keeps
    its row-major weight); models over DUAL_LIMIT_BYTES are left as they are."""
    mods = _linears(model)
    new = [m for m in mods if m not in _LAYOUTS]
    if sum(m.weight.numel() * m.weight.element_size() for m in new) > DUAL_LIMIT_BYTES:
        return model
    for m in new:
        row = m.weight.data.contiguous()  # (out, in), strides (in, 1)
        m.weight.data = row
        _LAYOUTS[m] = (row, row.t().contiguous().t())  # twin: strides (1, out)
    _MODELS[model] = [m for m in mods if m in _LAYOUTS]
    return model


@contextmanager
def layout_for(model: nn.Module, rows: int):
    """Within the block, the prepared model's linear weights are column-major when a forward
    of ``rows`` rows (batch x tokens) gains from it; stock row-major again after."""
    mods = _MODELS.get(model)
    if not mods or rows < GEMM_ROWS:
        yield
        return
    for m in mods:
        m.weight.data = _LAYOUTS[m][1]
    try:
        yield
    finally:
        for m in mods:
            m.weight.data = _LAYOUTS[m][0]


def head_logits(head: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """The LM head on (..., d) hidden states -> (..., V) logits, as one streaming GEMM for
    GEMM_ROWS rows or more on a CPU nn.Linear head without bias; else head(hidden)."""
    rows = hidden.numel() // hidden.shape[-1]
    if (type(head) is not nn.Linear or head.bias is not None or rows < GEMM_ROWS
            or hidden.device.type != "cpu"):
        return head(hidden)
    flat = hidden.reshape(rows, hidden.shape[-1])  # (R, d)
    out = torch.mm(head.weight, flat.t()).t()  # (R, V)
    return out.reshape(*hidden.shape[:-1], out.shape[-1])  # (..., V)
