"""CPU matrix products for the few-token forwards of speculative decoding.

A verify pass feeds a handful of tokens (a draft chain, a tree, K x N beams). On this CPU build
(fp32, one thread) ``F.linear`` over the stock row-major weight repacks the weight for every
call, and the cost grows with the rows until 16: a 1536 x 576 weight streamed from memory costs
0.38 / 0.41 / 0.70 / 0.88 / 0.78 / 0.98 / 1.56 ms for 1 / 2 / 4 / 8 / 16 / 32 / 64 rows, the
49,152 x 576 LM head 12 / 12 / 24 / 38 / 25 / 43 / 46 ms. The same product over a weight that
oneDNN packed once (``torch.ops.mkldnn._reorder_linear_weight``) costs 0.44 / 0.44 / 0.41 /
0.47 / 0.58 / 1.11 / 1.22 ms, the head 11 / 12 / 12 / 13 / 18 / 24 / 37 ms (measured, one
thread, median of 4 passes over 90 weights): from 4 rows on it is nearly the price of one.

At the small end on an AMD EPYC (Zen 4; same kind of run): stock
0.30 / 0.48 / 0.57 / 0.40 ms for 1 / 2 / 3 / 4 rows, the head 9.7 / 22 / 33 / 16 ms; packed
0.23 / 0.27 / 0.20 / 0.17 ms, the head 6.7 / 8.3 / 5.5 / 5.1 ms: packed is cheaper at every row
count, and oneDNN's kernel for 1-3 rows is slower than for 4, so fewer rows are padded to
PAD_ROWS (zero rows, their outputs dropped): 0.20 / 0.19 / 0.19 ms, the head 5.3 / 5.1 / 4.9 ms.

So a CPU fp32 model keeps a packed copy of every decoder linear weight and of the LM head
(:func:`prepare`), and a forward of ``rows`` rows runs under :func:`layout_for`: from GEMM_ROWS
rows on (now every forward) its linear modules use the packed copy, the stock weight outside
(so ``generate()``, training and saving see the stock model). The LM head, which the engine
applies itself, does the same (:func:`head_logits`), and so does a drafter's shortlisted head
(:func:`weight_product`: an 8,192 x 576 shortlist costs 0.9 ms for 4 rows packed, 2.4 ms
stock). Nothing in a modeling file or a value changes;
only the order of floating-point sums does, as with any change of batch shape, and the
exactness tests run with it. Models whose weights exceed DUAL_LIMIT_BYTES keep one copy (the
packed copy would cost that much memory again); a torch without oneDNN keeps the stock path. A
weight replaced or changed in place after packing (its storage or version counter moved) is
used stock from then on, never through a stale copy (a shortlisted head's is packed afresh).
"""

from __future__ import annotations

from contextlib import contextmanager
from weakref import WeakKeyDictionary

import torch
from torch import nn

GEMM_ROWS = 1  # from this many rows on, the packed weights (measured: every row count gains)
PACK_HINT = 8  # the row count oneDNN packs for (flat cost from 1 to 16 rows, measured)
PAD_ROWS = 4  # fewer rows are padded with zero rows to this many (cheaper kernel, measured)
DUAL_LIMIT_BYTES = 2 * 1024**3  # at most this much weight gets a packed copy

_PACKED: WeakKeyDictionary = WeakKeyDictionary()  # nn.Linear or a head -> (packed, stamp)
_MODELS: WeakKeyDictionary = WeakKeyDictionary()  # model -> its nn.Linear with a packed copy


def _can_pack() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn,
                                                            "_reorder_linear_weight")


def _packable(m: nn.Module) -> bool:
    return (type(m) is nn.Linear and m.weight.device.type == "cpu"
            and m.weight.dtype == torch.float32 and m.weight.dim() == 2)


def _linears(model: nn.Module) -> list[nn.Linear]:
    """The decoder linear modules (the tied embedding / LM head excepted)."""
    embed = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    tied = embed.weight if embed is not None else None
    return [m for m in model.modules() if _packable(m) and m.weight is not tied]


def _stamp(m: nn.Linear) -> tuple[int, int]:
    """What changes when the weight does: its storage and its in-place version counter."""
    return (m.weight.data_ptr(), m.weight._version)


def _pack(m: nn.Linear) -> None:
    if m not in _PACKED:
        _PACKED[m] = (torch.ops.mkldnn._reorder_linear_weight(m.weight.detach(), PACK_HINT),
                      _stamp(m))


def _packed_weight(m: nn.Module) -> torch.Tensor | None:
    """m's packed copy while it still holds m's weight (None: never packed, or the weight was
    replaced or changed in place since: the stock weight is then the only truth)."""
    entry = _PACKED.get(m)
    return entry[0] if entry is not None and entry[1] == _stamp(m) else None


def prepare(model: nn.Module) -> nn.Module:
    """Give every decoder linear weight and the LM head of a CPU fp32 model a packed copy (the
    modules keep their stock weights); models over DUAL_LIMIT_BYTES are left as they are."""
    if not _can_pack():
        return model
    mods = _linears(model)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is not None and _packable(head) and head not in mods:
        mods_and_head = [*mods, head]
    else:
        mods_and_head = mods
    new = [m for m in mods_and_head if m not in _PACKED]
    if sum(m.weight.numel() * m.weight.element_size() for m in new) > DUAL_LIMIT_BYTES:
        return model
    with torch.no_grad():
        for m in new:
            _pack(m)
    _MODELS[model] = mods
    return model


def _packed_linear(packed: torch.Tensor, bias: torch.Tensor | None,
                   x: torch.Tensor) -> torch.Tensor:
    """x (..., in) @ W^T + b through W's packed copy -> (..., out). Under PAD_ROWS rows the
    input is padded with zero rows (oneDNN's kernel for 1-3 rows is slower than for 4), the
    padding's outputs dropped: each row's product does not depend on the other rows."""
    flat = x.reshape(-1, x.shape[-1])  # (R, in)
    rows = flat.shape[0]
    if 0 < rows < PAD_ROWS:
        flat = torch.cat([flat, flat.new_zeros(PAD_ROWS - rows, flat.shape[1])])  # (PAD_ROWS, in)
    out = torch.ops.mkldnn._linear_pointwise(flat, packed, bias, "none", [], "")  # (R', out)
    return out[:rows].reshape(*x.shape[:-1], out.shape[-1])  # (..., out)


class _Packed:
    """An nn.Linear's forward through its packed copy (checked fresh when the block began;
    stock F.linear when grad is needed)."""

    def __init__(self, m: nn.Linear, packed: torch.Tensor):
        self.m, self.packed = m, packed

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        m = self.m
        if torch.is_grad_enabled() or x.dtype != torch.float32 or x.device.type != "cpu":
            return nn.functional.linear(x, m.weight, m.bias)
        return _packed_linear(self.packed, m.bias, x)


def packed_active(m: nn.Module) -> bool:
    """Whether m's forward runs through its packed copy right now (for tests)."""
    return isinstance(m.__dict__.get("forward"), _Packed)


@contextmanager
def layout_for(model: nn.Module, rows: int):
    """Within the block, the prepared model's linear modules use their packed copies when a
    forward of ``rows`` rows (batch x tokens) gains from it; the stock forward again after."""
    mods = _MODELS.get(model)
    if not mods or rows < GEMM_ROWS:
        yield
        return
    mine = []  # an outer block's or a hook's own instance-level forward is left alone
    for m in mods:
        packed = _packed_weight(m)  # None: the weight changed since packing, stays stock
        if packed is not None and "forward" not in m.__dict__:
            m.forward = _Packed(m, packed)  # an instance attribute over nn.Linear.forward
            mine.append(m)
    try:
        yield
    finally:
        for m in mine:
            m.__dict__.pop("forward", None)


def weight_product(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """x (..., in) @ m.weight^T for a module with a 2-D weight that is not an nn.Linear (a
    shortlisted head): through a packed copy made on first use (CPU fp32 outside autograd,
    with oneDNN, at most DUAL_LIMIT_BYTES; re-made when the weight changes), the stock product
    otherwise."""
    w = m.weight
    if (not _can_pack() or torch.is_grad_enabled() or x.dtype != torch.float32
            or x.device.type != "cpu" or w.dtype != torch.float32 or w.device.type != "cpu"
            or w.numel() * w.element_size() > DUAL_LIMIT_BYTES):
        return x @ w.T  # (..., out)
    packed = _packed_weight(m)
    if packed is None:  # never packed, or the weight changed since: pack it afresh
        _PACKED.pop(m, None)
        _pack(m)
        packed = _packed_weight(m)
    return _packed_linear(packed, None, x)  # (..., out)


def head_logits(head: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """The LM head on (..., d) hidden states -> (..., V) logits, through the head's packed copy
    for GEMM_ROWS rows or more on a prepared CPU head outside autograd; else head(hidden)."""
    rows = hidden.numel() // hidden.shape[-1]
    linear = type(head) is nn.Linear  # a shortlisted head packs its own (weight_product)
    packed = _packed_weight(head) if rows >= GEMM_ROWS and linear else None
    if (packed is None or torch.is_grad_enabled() or hidden.dtype != torch.float32
            or hidden.device.type != "cpu"):
        return head(hidden)
    return _packed_linear(packed, head.bias, hidden)
