"""CPU matrix products for the few-token forwards of speculative decoding.

A verify pass feeds a handful of tokens (a draft chain, a tree, K x N beams). On this CPU build
(fp32, one thread) ``F.linear`` over the stock row-major weight repacks the weight for every
call, and the cost grows with the rows until 16: a 1536 x 576 weight streamed from memory costs
0.38 / 0.41 / 0.70 / 0.88 / 0.78 / 0.98 / 1.56 ms for 1 / 2 / 4 / 8 / 16 / 32 / 64 rows, the
49,152 x 576 LM head 12 / 12 / 24 / 38 / 25 / 43 / 46 ms. The same product over a weight that
oneDNN packed once (``torch.ops.mkldnn._reorder_linear_weight``) costs 0.44 / 0.44 / 0.41 /
0.47 / 0.58 / 1.11 / 1.22 ms, the head 11 / 12 / 12 / 13 / 18 / 24 / 37 ms (measured, one
thread, median of 4 passes over 90 weights): from 4 rows on it is nearly the price of one.

Under 4 rows machines differ, so the path is measured, not assumed. On an AMD EPYC (Zen 4)
packed beat stock at every row count (1 / 2 / 3 / 4 rows: stock 0.30 / 0.48 / 0.57 / 0.40 ms,
packed 0.23 / 0.27 / 0.20 / 0.17 ms), and oneDNN's kernel for 1-3 rows was slower than for 4,
so padding 1-3 rows with zero rows to SMALL_ROWS (their outputs dropped) was cheaper still. On
an Intel Xeon (AVX512-BF16) a whole 1-row forward of SmolLM2-135M took 50 ms stock against
67 ms packed and 70 ms padded, 2 rows 54 / 71 / 74 ms, and packed won from 4 rows on (83 / 78 /
76 ms). :func:`calibrate` times one forward's linear products of 1, 2 and 3 rows on each path
(stock, packed, padded) when the first large model is prepared (CALIBRATE_BYTES, about half a
second for SmolLM2-135M) and :func:`rule` then sends each forward the cheapest way; smaller
(test) models keep the default rule, padded.

So a CPU fp32 model keeps a packed copy of every decoder linear weight and of the LM head
(:func:`prepare`), and a forward of ``rows`` rows runs under :func:`layout_for`: where the
rule's path is packed or padded its linear modules use the packed copy, the stock weight outside
(so ``generate()``, training and saving see the stock model). The LM head, which the engine
applies itself, does the same (:func:`head_logits`), and so does a drafter's shortlisted head
(:func:`weight_product`: an 8,192 x 576 shortlist costs 0.9 ms for 4 rows packed, 2.4 ms
stock). Nothing in a modeling file or a value changes;
only the order of floating-point sums does, as with any change of batch shape, and the
exactness tests run with it (the embedded model's, and tests/model/test_packed_exactness.py
on packed tiny models). A toy model (under PACK_MIN_BYTES of linear weight, e.g. the
tests' tiny models and ``tiny`` specs) stays stock: a packed or padded call costs a fixed 30-35
us, more than the whole product of a small weight (measured, one thread, AMD EPYC, 1 / 2 / 3
rows: a 32 x 16 weight 5 / 5 / 6 us stock against 41 / 40 / 40 padded; 512 x 256: 20 / 33 /
49 against 51 / 51 / 52; 1024 x 384: 41 / 104 / 140 against 85 / 90 / 81); the packed paths'
own tests lower the floor. Models whose weights exceed DUAL_LIMIT_BYTES keep one copy (the
packed copy would cost that much memory again); a torch without oneDNN keeps the stock path. A
weight replaced or changed in place after packing (its storage or version counter moved) is
used stock from then on, never through a stale copy (a shortlisted head's is packed afresh).

Both stay module state, not a pair's: the rule is a fact about this machine, shared by every
model of the process, and a packed copy belongs to its weight (kept while the weight lives).
"""

from __future__ import annotations

import statistics
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable
from weakref import WeakKeyDictionary

import torch
from torch import nn

PACK_HINT = 8  # the row count oneDNN packs for (flat cost from 1 to 16 rows, measured)
SMALL_ROWS = 4  # forwards of fewer rows take the path the machine's LayoutRule names; from
# this many rows on, the packed copies (cheaper on every machine measured)
PATHS = ("stock", "packed", "padded")  # padded: packed, rows padded with zero rows to SMALL_ROWS
DUAL_LIMIT_BYTES = 2 * 1024**3  # at most this much weight gets a packed copy
CALIBRATE_BYTES = 64 * 1024**2  # the first model with this much linear weight measures the rule
PACK_MIN_BYTES = 4 * 1024**2  # a model (or shortlisted head) with less linear weight stays stock
CALIBRATION_REPS = 5


@dataclass(frozen=True)
class LayoutRule:
    """The path of a forward of 1, 2 and 3 rows (``small``: one of PATHS each), from
    SMALL_ROWS rows on packed; ``measured_ms``: the calibration's (rows, path) -> ms of every
    linear product of one forward, empty for the default rule."""

    small: tuple[str, str, str] = ("padded", "padded", "padded")
    measured_ms: dict = field(default_factory=dict, compare=False)

    def path(self, rows: int) -> str:
        return self.small[rows - 1] if 0 < rows < SMALL_ROWS else "packed"


_RULE = [LayoutRule()]  # this process's rule: the default until a model measures one

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
    modules keep their stock weights); models under PACK_MIN_BYTES or over DUAL_LIMIT_BYTES
    are left as they are."""
    if not _can_pack():
        return model
    mods = _linears(model)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is not None and _packable(head) and head not in mods:
        mods_and_head = [*mods, head]
    else:
        mods_and_head = mods
    if _weight_bytes(mods_and_head) < PACK_MIN_BYTES:
        return model  # a toy model: stock is cheaper at every row count
    new = [m for m in mods_and_head if m not in _PACKED]
    if sum(m.weight.numel() * m.weight.element_size() for m in new) > DUAL_LIMIT_BYTES:
        return model
    with torch.no_grad():
        for m in new:
            _pack(m)
    _MODELS[model] = mods
    if not _RULE[0].measured_ms:
        measure_rule(model)
    return model


def measure_rule(model: nn.Module) -> None:
    """Set this process's rule from a calibration on this prepared model, when it has
    CALIBRATE_BYTES of linear weight or more (a small model's timings say little)."""
    mods = _MODELS.get(model, [])
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    extra = [head] if head is not None and _packed_weight(head) is not None else []
    if _weight_bytes([*mods, *extra]) >= CALIBRATE_BYTES:
        set_rule(calibrate(model))


def _weight_bytes(mods: list[nn.Module]) -> int:
    return sum(m.weight.numel() * m.weight.element_size() for m in mods)


def rule() -> LayoutRule:
    """The rule every forward of this process follows."""
    return _RULE[0]


def set_rule(new: LayoutRule) -> None:
    _RULE[0] = new


def _time_product(m: nn.Module, rows: int, path: str) -> float:
    """Seconds of one product of `rows` rows through m's weight on `path` (median of
    CALIBRATION_REPS, after one warm-up)."""
    w = m.weight
    x = torch.randn(rows, w.shape[1], generator=torch.Generator().manual_seed(rows))  # (rows, in)
    bias = getattr(m, "bias", None)
    packed = _packed_weight(m)
    pad = SMALL_ROWS if path == "padded" else 1

    def once() -> None:
        if path == "stock" or packed is None:
            nn.functional.linear(x, w, bias)
        else:
            _packed_linear(packed, bias, x, pad)

    once()
    times = []
    for _ in range(CALIBRATION_REPS):
        t0 = time.perf_counter()
        once()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def calibrate(model: nn.Module, timer: Callable[[nn.Module, int, str], float] = _time_product
              ) -> LayoutRule:
    """Measure, on this machine, the linear products of one forward of 1, 2 and 3 rows on each
    path (one module per distinct weight shape, counted as often as the shape occurs, and the
    LM head) and return the rule that takes the cheapest path at each row count."""
    mods = _MODELS.get(model, [])
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is not None and _packed_weight(head) is not None and head not in mods:
        mods = [*mods, head]
    shapes: dict[tuple, list] = {}
    for m in mods:
        shapes.setdefault((tuple(m.weight.shape), m.bias is not None), []).append(m)
    ms = {}
    with torch.no_grad():
        for rows in range(1, SMALL_ROWS):
            for path in PATHS:
                ms[(rows, path)] = 1000 * sum(len(group) * timer(group[0], rows, path)
                                              for group in shapes.values())
    small = tuple(min(PATHS, key=lambda path: ms[(rows, path)]) for rows in range(1, SMALL_ROWS))
    return LayoutRule(small, {f"{rows} {path}": round(v, 3) for (rows, path), v in ms.items()})


def _packed_linear(packed: torch.Tensor, bias: torch.Tensor | None,
                   x: torch.Tensor, pad: int) -> torch.Tensor:
    """x (..., in) @ W^T + b through W's packed copy -> (..., out). Under `pad` rows the input
    is padded with zero rows (where oneDNN's kernel for 1-3 rows is slower than for 4), the
    padding's outputs dropped: each row's product does not depend on the other rows."""
    flat = x.reshape(-1, x.shape[-1])  # (R, in)
    rows = flat.shape[0]
    if 0 < rows < pad:
        flat = torch.cat([flat, flat.new_zeros(pad - rows, flat.shape[1])])  # (pad, in)
    out = torch.ops.mkldnn._linear_pointwise(flat, packed, bias, "none", [], "")  # (R', out)
    return out[:rows].reshape(*x.shape[:-1], out.shape[-1])  # (..., out)


class _Packed:
    """An nn.Linear's forward through its packed copy (checked fresh when the block began;
    stock F.linear when grad is needed)."""

    def __init__(self, m: nn.Linear, packed: torch.Tensor, pad: int):
        self.m, self.packed, self.pad = m, packed, pad

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        m = self.m
        if torch.is_grad_enabled() or x.dtype != torch.float32 or x.device.type != "cpu":
            return nn.functional.linear(x, m.weight, m.bias)
        return _packed_linear(self.packed, m.bias, x, self.pad)


def packed_active(m: nn.Module) -> bool:
    """Whether m's forward runs through its packed copy right now (for tests)."""
    return isinstance(m.__dict__.get("forward"), _Packed)


@contextmanager
def layout_for(model: nn.Module, rows: int):
    """Within the block, the prepared model's linear modules use their packed copies when the
    rule's path for a forward of ``rows`` rows (batch x tokens) is packed or padded; the stock
    forward again after."""
    mods = _MODELS.get(model)
    path = rule().path(rows)
    if not mods or path == "stock":
        yield
        return
    pad = SMALL_ROWS if path == "padded" else 1
    mine = []  # an outer block's or a hook's own instance-level forward is left alone
    for m in mods:
        packed = _packed_weight(m)  # None: the weight changed since packing, stays stock
        if packed is not None and "forward" not in m.__dict__:
            m.forward = _Packed(m, packed, pad)  # an instance attribute over nn.Linear.forward
            mine.append(m)
    try:
        yield
    finally:
        for m in mine:
            m.__dict__.pop("forward", None)


def weight_product(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """x (..., in) @ m.weight^T for a module with a 2-D weight that is not an nn.Linear (a
    shortlisted head): through a packed copy made on first use (CPU fp32 outside autograd,
    with oneDNN, from PACK_MIN_BYTES to DUAL_LIMIT_BYTES, where the rule's path for these rows
    is not stock;
    re-made when the weight changes), the stock product otherwise."""
    w = m.weight
    path = rule().path(x.numel() // x.shape[-1])
    if (path == "stock" or not _can_pack() or torch.is_grad_enabled() or x.dtype != torch.float32
            or x.device.type != "cpu" or w.dtype != torch.float32 or w.device.type != "cpu"
            or not PACK_MIN_BYTES <= w.numel() * w.element_size() <= DUAL_LIMIT_BYTES):
        return x @ w.T  # (..., out)
    packed = _packed_weight(m)
    if packed is None:  # never packed, or the weight changed since: pack it afresh
        _PACKED.pop(m, None)
        _pack(m)
        packed = _packed_weight(m)
    return _packed_linear(packed, None, x, SMALL_ROWS if path == "padded" else 1)  # (..., out)


def head_logits(head: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """The LM head on (..., d) hidden states -> (..., V) logits, through the head's packed copy
    on a prepared CPU head outside autograd where the rule's path for these rows is not
    stock; else head(hidden)."""
    rows = hidden.numel() // hidden.shape[-1]
    path = rule().path(rows)
    linear = type(head) is nn.Linear  # a shortlisted head packs its own (weight_product)
    packed = _packed_weight(head) if path != "stock" and linear else None
    if (packed is None or torch.is_grad_enabled() or hidden.dtype != torch.float32
            or hidden.device.type != "cpu"):
        return head(hidden)
    return _packed_linear(packed, head.bias, hidden, SMALL_ROWS if path == "padded" else 1)
