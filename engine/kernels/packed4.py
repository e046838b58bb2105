"""4-bit packed linear layers: a GGUF's Q4_1 weights kept packed in memory and multiplied by
engine.kernels.qmm's 4-bit weight x 16-bit activation kernel.

Q4_1 (ggml) stores each weight row in blocks of 32 input columns, 20 bytes a block: d and m
(fp16), then 16 bytes of 4-bit q (byte j holds q_j in its low nibble and q_{j+16} in its
high one), and w = d * q + m. :class:`Packed4Linear` keeps q, d and m exactly, rearranged into
qmm's tiled layout (:func:`engine.kernels.qmm.pack`), so :meth:`Packed4Linear.dequantize` gives
back the GGUF's dequantised weight bit for bit.

The kernel quantises each row of activations per block of 32 to 16 bits (dx = max|x| / 32767)
and sums exact integer dot products scaled in fp32: that rounding of the activations is what
separates a packed layer from the dequantised fp32 layer (tests/oracles.qmm_error_bound bounds
it: half a step dx of each activation, times |w|; measured, 4e-5 of a layer's largest output).
:func:`set_activation_bits` sets 8 bits instead (dx = max|x| / 127, llama.cpp's numerics for
this file: `embedded-q4:a8`, 1.3e-2 of a layer's largest output), which about halves the cost
of a row past the first (AVX2).

:func:`pack_linears` swaps the linear layers of a stock transformers model loaded from the
same GGUF (dequantised) for Packed4Linear, naming them with transformers' own GGUF name map
and tensor processor (which also undoes llama.cpp's row permutation of the q and k
projections). A linear tensor of another type is refused. Reading the GGUF and packing take
10-30 s, so :func:`save_packed` keeps the packed layers' buffers in one safetensors file (the
loader's cache) and :func:`load_packed` swaps them into a fresh dequantised model.

The LM head of the embedded model is tied to its Q8_0 input embedding (w = d * q per block of
32, q in -128..127, d fp16). :func:`pack_head` keeps it as :class:`Packed8Linear`: its blocks
in qmm's Q8_0 layout (q's bytes and d), run by qmm's Q8_0 product (one integer dot product
and one fused multiply-add a block, as llama.cpp's Q8_0 dot products): 34 bytes a block of 32
streamed, as the file stores it, where the fp32 head streamed 128 (and the product of its two
4-bit halves that ran it before, 40, with twice the integer work). The head keeps the fp32
weight it is tied to (the embedding's own tensor, no copy), which a drafter's shortlisted
head and training read; its output is the packed product. The embedding and the norms stay
as the dequantised model has them.

The kernel computes each output row from that row alone (tested: a product over R rows equals
the R one-row products bit for bit), so a packed layer gives a token the same output in a
one-token step and in a verify forward; what still moves with a forward's shape is the fp32
part between the layers (attention and its reductions), whose float-order differences the
rounding of the next layer's input can magnify (rarely: its step is a 32767th of a block's
largest input).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from engine.core.errors import ConfigError
from engine.kernels import qmm
from engine.kernels.siblings import fuse_siblings

GROUP = qmm.GROUP  # Q4_1's and Q8_0's block: input columns sharing one (d, m) / one d
BLOCK_BYTES = 20  # Q4_1: d (fp16), m (fp16), 16 bytes of packed q
Q8_BLOCK_BYTES = 34  # Q8_0: d (fp16), 32 int8 q
ROW_MULTIPLE = qmm.TILE  # the kernel tiles output rows by 16


@dataclass(frozen=True)
class Q4Blocks:
    """One Q4_1 weight, unpacked from its blocks: w = d * q + m per block of GROUP."""

    name: str  # the GGUF tensor's name
    q: torch.Tensor  # (out, in) uint8 in 0..15
    d: torch.Tensor  # (out, in / GROUP) fp16
    m: torch.Tensor  # (out, in / GROUP) fp16

    def dequantize(self) -> torch.Tensor:
        """The fp32 weight (out, in), computed as gguf's own dequantisation does."""
        n, k = self.q.shape
        q = self.q.view(n, k // GROUP, GROUP).float()  # (out, in / G, G)
        w = q * self.d.float()[..., None] + self.m.float()[..., None]  # (out, in / G, G)
        return w.view(n, k)


def q4_1_blocks(raw: np.ndarray, name: str) -> Q4Blocks:
    """Q4Blocks of a Q4_1 tensor's raw rows: (out, in / GROUP * BLOCK_BYTES) uint8."""
    rows = torch.from_numpy(np.array(raw, dtype=np.uint8))  # (out, nb * 20), a copy
    n = rows.shape[0]
    blocks = rows.view(n, -1, BLOCK_BYTES)  # (out, nb, 20)
    d = blocks[..., 0:2].contiguous().view(torch.float16)[..., 0]  # (out, nb)
    m = blocks[..., 2:4].contiguous().view(torch.float16)[..., 0]  # (out, nb)
    qs = blocks[..., 4:]  # (out, nb, 16)
    q = torch.cat([qs & 0x0F, qs >> 4], dim=-1)  # (out, nb, 32): q_j, then q_{j+16}
    return Q4Blocks(name, q.reshape(n, -1), d, m)


def quantize_q4_1(w: torch.Tensor, name: str = "") -> Q4Blocks:
    """Q4Blocks of an fp32 weight (out, in), block by block as ggml's Q4_1 reference
    quantiser does: m = min, d = (max - min) / 15, q = min(15, floor((w - m) / d + 1/2)), d
    and m then stored in fp16."""
    n, k = w.shape
    wb = w.detach().float().reshape(n, k // GROUP, GROUP)  # (out, in / G, G)
    lo, hi = wb.amin(-1), wb.amax(-1)  # (out, in / G)
    d = (hi - lo) / 15
    inv = torch.where(d != 0, 1 / d, torch.zeros_like(d))  # (out, in / G)
    q = ((wb - lo[..., None]) * inv[..., None] + 0.5).floor().clamp(0, 15)  # (out, in/G, G)
    return Q4Blocks(name, q.to(torch.uint8).reshape(n, k), d.half(), lo.half())


@dataclass(frozen=True)
class Q8Blocks:
    """One Q8_0 weight, unpacked from its blocks: w = d * q per block of GROUP."""

    name: str
    q: torch.Tensor  # (out, in) int8
    d: torch.Tensor  # (out, in / GROUP) fp16

    def dequantize(self) -> torch.Tensor:
        """The fp32 weight (out, in), computed as gguf's own dequantisation does."""
        n, k = self.q.shape
        q = self.q.view(n, k // GROUP, GROUP).float()  # (out, in / G, G)
        return (q * self.d.float()[..., None]).view(n, k)  # (out, in)


def q8_0_blocks(raw: np.ndarray, name: str) -> Q8Blocks:
    """Q8Blocks of a Q8_0 tensor's raw rows: (out, in / GROUP * Q8_BLOCK_BYTES) uint8."""
    rows = torch.from_numpy(np.array(raw, dtype=np.uint8))  # (out, nb * 34), a copy
    n = rows.shape[0]
    blocks = rows.view(n, -1, Q8_BLOCK_BYTES)  # (out, nb, 34)
    d = blocks[..., 0:2].contiguous().view(torch.float16)[..., 0]  # (out, nb)
    q = blocks[..., 2:].contiguous().view(torch.int8)  # (out, nb, 32)
    return Q8Blocks(name, q.reshape(n, -1), d)


def _packable_shape(name: str, q: torch.Tensor) -> tuple[int, int]:
    """(in, out) of a weight's (out, in) q; ConfigError where the kernel cannot take it."""
    n, k = q.shape
    if k % GROUP or n % ROW_MULTIPLE:
        raise ConfigError(f"cannot pack {name}: shape {n}x{k} (the 4-bit kernel needs a "
                          f"multiple of {GROUP} inputs, {ROW_MULTIPLE} outputs)")
    return k, n


class Packed4Linear(nn.Module):
    """y = x W^T (+ b) with W kept as its Q4_1 blocks in the layout of engine.kernels.qmm, run
    by qmm's 4-bit x 16-bit kernel (module docstring). A layer in a set of siblings
    (:mod:`engine.kernels.siblings`) takes its columns of their one product."""

    siblings = None  # the SiblingProduct this layer's buffers are rows of, where it has one
    sibling_start = 0  # its first column there

    def __init__(self, blocks: Q4Blocks, bias: torch.Tensor | None = None):
        super().__init__()
        self.in_features, self.out_features = _packable_shape(blocks.name, blocks.q)
        qw, dw, mw = qmm.pack(blocks.q, blocks.d, blocks.m)
        self.register_buffer("qw", qw)  # packed 4-bit q, the kernel's layout
        self.register_buffer("dw", dw)  # (out / 16, in / G, 16) fp16 bits: d
        self.register_buffer("mw", mw)  # (out / 16, in / G, 16) fp16 bits: m
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(),
                                                           requires_grad=False)
        self.bits = 16  # the activations' width in the kernel (set_activation_bits)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, q4 group={GROUP}, activations {self.bits} bits")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)  # (R, in)
        if flat.dtype != torch.float32:
            flat = flat.float()
        if self.siblings is not None and self.siblings.holds(self):  # its columns of the
            out = self.siblings.columns(self, x, flat)  # siblings' one product: (R, out)
        else:
            out = qmm.matmul(flat, self.qw, self.dw, self.mw, self.out_features,
                             self.bits)  # (R, out)
        if x.dtype != torch.float32:
            out = out.to(x.dtype)
        out = out.view(*x.shape[:-1], self.out_features)  # (..., out)
        return out if self.bias is None else out + self.bias

    def blocks(self, name: str = "") -> Q4Blocks:
        """The Q4_1 weight this module holds (q, d and m exact)."""
        q, d, m = qmm.unpack(self.qw, self.dw, self.mw, self.out_features, self.in_features)
        return Q4Blocks(name, q, d, m)

    def dequantize(self) -> torch.Tensor:
        """The fp32 weight (out, in) = d * q + m: the GGUF's dequantised weight exactly."""
        return self.blocks().dequantize()

    def to_linear(self) -> nn.Linear:
        """A stock fp32 nn.Linear with the dequantised weight (a trainable copy)."""
        lin = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None)
        with torch.no_grad():
            lin.weight.copy_(self.dequantize())
            if self.bias is not None:
                lin.bias.copy_(self.bias)
        return lin


class Packed8Linear(nn.Module):
    """y = x W^T for a Q8_0 weight W = d q kept as its blocks in qmm's Q8_0 layout
    (:func:`engine.kernels.qmm.pack8`: one byte a weight, one fp16 d a block), run by qmm's
    Q8_0 product (module docstring). ``weight`` is the fp32 weight the module was tied to (not
    copied): read by those who need the dense weight (a shortlisted head, training), never by
    forward."""

    def __init__(self, blocks: Q8Blocks, weight: nn.Parameter):
        super().__init__()
        self.in_features, self.out_features = _packable_shape(blocks.name, blocks.q)
        qw, dw = qmm.pack8(blocks.q, blocks.d)
        self.register_buffer("qw", qw)  # q's bytes, the kernel's Q8_0 layout
        self.register_buffer("dw", dw)  # (out / 16, in / G, 16) fp16 bits: d
        self.weight = weight
        self.bits = 16  # the activations' width in the kernel (set_activation_bits)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"q8 group={GROUP}, activations {self.bits} bits")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).float()  # (R, in)
        y = qmm.matmul(flat, self.qw, self.dw, None, self.out_features, self.bits)  # (R, out)
        return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)  # (..., out)

    def blocks(self, name: str = "") -> Q8Blocks:
        """The Q8_0 weight this module holds (q and d exact)."""
        q, d = qmm.unpack8(self.qw, self.dw, self.out_features, self.in_features)
        return Q8Blocks(name, q, d)

    def dequantize(self) -> torch.Tensor:
        """The fp32 weight (out, in) = d * q: the GGUF's dequantised weight exactly."""
        return self.blocks().dequantize()

    def to_linear(self) -> nn.Linear:
        """A stock fp32 nn.Linear with the dequantised weight (a trainable copy)."""
        lin = nn.Linear(self.in_features, self.out_features, bias=False)
        with torch.no_grad():
            lin.weight.copy_(self.dequantize())
        return lin


def _processor(model: nn.Module, reader):
    """transformers' tensor processor of the GGUF's architecture (its row fix-ups)."""
    from transformers.modeling_gguf_pytorch_utils import (
        TENSOR_PROCESSORS,
        TensorProcessor,
        read_field,
    )

    arch = read_field(reader, "general.architecture")[0]
    return TENSOR_PROCESSORS.get(arch, TensorProcessor)(config=_head_counts(model))


def _gguf_names(model: nn.Module, reader) -> dict[str, str]:
    """HF module name -> GGUF tensor name, by gguf-py's name map of the file's architecture
    (the map transformers' GGUF loader builds its own from)."""
    from gguf import MODEL_ARCH_NAMES, get_tensor_name_map
    from transformers.modeling_gguf_pytorch_utils import read_field

    arch_name = read_field(reader, "general.architecture")[0]
    arch = next((a for a, n in MODEL_ARCH_NAMES.items() if n == arch_name), None)
    if arch is None:
        raise ConfigError(f"cannot pack a GGUF of architecture '{arch_name}'")
    name_map = get_tensor_name_map(arch, int(model.config.num_hidden_layers))
    names = {}
    for hf_name, module in model.named_modules():
        gguf_name = name_map.get_name(hf_name) if type(module) is nn.Linear else None
        if gguf_name is not None:
            names[hf_name] = gguf_name + ".weight"
    return names


def _head_counts(model: nn.Module) -> dict[str, int]:
    """The config keys transformers' tensor processors read (the q / k row permutation)."""
    cfg = model.config
    return {"num_attention_heads": int(cfg.num_attention_heads),
            "num_key_value_heads": int(getattr(cfg, "num_key_value_heads", None)
                                       or cfg.num_attention_heads)}


def gguf_reader(source):
    """A GGUFReader of `source` (a path, or a reader already open, returned as is): parsing
    the embedded file's fields (its 49,152-entry vocabulary) takes seconds, so a caller
    packing several parts of one model opens it once."""
    from gguf import GGUFReader

    return source if isinstance(source, GGUFReader) else GGUFReader(str(source))


def gguf_linears(model: nn.Module, path) -> dict[str, Q4Blocks]:
    """HF module name -> Q4Blocks for every nn.Linear of `model` (loaded from the GGUF at
    `path`, a path or a :func:`gguf_reader`) that the GGUF holds as its own tensor, the LM
    head excepted (the engine reads its weight); ConfigError (one line) for a linear tensor
    of a type other than Q4_1."""
    from gguf import GGMLQuantizationType

    reader = gguf_reader(path)
    tensors = {t.name: t for t in reader.tensors}
    processor = _processor(model, reader)
    names = _gguf_names(model, reader)
    head = model.get_output_embeddings()
    out = {}
    for hf_name, module in model.named_modules():
        if type(module) is not nn.Linear or module is head or hf_name not in names:
            continue
        t = tensors.get(names[hf_name])
        if t is None:
            continue
        if t.tensor_type != GGMLQuantizationType.Q4_1:
            raise ConfigError(f"cannot pack GGUF tensor {t.name}: type {t.tensor_type.name} "
                              "(4-bit packing takes Q4_1 only)")
        raw = processor.process(weights=np.asarray(t.data), name=t.name).weights  # HF rows
        out[hf_name] = q4_1_blocks(raw, t.name)
    return out


def pack_linears(model: nn.Module, path) -> int:
    """Swap the nn.Linear layers of a stock transformers model, loaded (dequantised) from the
    GGUF at `path` (a path or a :func:`gguf_reader`), for Packed4Linear of that GGUF's Q4_1
    blocks; return how many."""
    found = gguf_linears(model, path)
    for hf_name, blocks in found.items():
        old = model.get_submodule(hf_name)
        model.set_submodule(hf_name, Packed4Linear(blocks, old.bias))
    return len(found)


def set_activation_bits(model: nn.Module, bits: int) -> int:
    """Quantise the activations of every packed layer in `model` to `bits` (qmm.BITS: 16, the
    packed target's; 8, llama.cpp's Q8_1 against Q4_1); return how many layers. Other numerics:
    a model whose layers run at 8 bits is another target, whose own generate() its speculative
    runs match (row invariance holds at either width). Set before its first forward: a
    compiled step keeps the width it was traced with."""
    if bits not in qmm.BITS:
        raise ConfigError(f"activation bits must be one of {qmm.BITS}, got {bits}")
    layers = [m for m in model.modules() if isinstance(m, (Packed4Linear, Packed8Linear))]
    for m in layers:
        m.bits = bits
    return len(layers)


def is_packed(model: nn.Module) -> bool:
    """Whether a model runs 4-bit packed layers (a packed target)."""
    return any(isinstance(m, Packed4Linear) for m in model.modules())


def activation_bits(model: nn.Module) -> int:
    """The activation width of a model's packed layers (16 where it has none)."""
    return next((m.bits for m in model.modules()
                 if isinstance(m, (Packed4Linear, Packed8Linear))), 16)


def quantize_linears(module: nn.Module, bits: int = 16) -> int:
    """Swap every nn.Linear inside `module` (in place) whose shape the kernel takes for a
    Packed4Linear of its weight quantised to Q4_1 (:func:`quantize_q4_1`), its activations
    quantised to `bits`; return how many.
    For a drafter's own layers over a packed target: q's numerics are the drafter's to choose
    (verification keeps the output p's), and a 4-bit layer streams an eighth of the bytes.
    Sibling layers (:mod:`engine.kernels.siblings`) then share one product."""
    found = [(name, m) for name, m in module.named_modules()
             if type(m) is nn.Linear and m.in_features % GROUP == 0
             and m.out_features % ROW_MULTIPLE == 0]
    if any(not name for name, _ in found):
        raise ConfigError("quantize_linears swaps the linears inside a module, not itself")
    if bits not in qmm.BITS:
        raise ConfigError(f"activation bits must be one of {qmm.BITS}, got {bits}")
    for name, m in found:
        module.set_submodule(name, Packed4Linear(quantize_q4_1(m.weight, name), m.bias))
    set_activation_bits(module, bits)
    fuse_siblings(module, Packed4Linear)
    return len(found)


def pack_head(model: nn.Module, path) -> bool:
    """Swap the LM head of a stock transformers model loaded (dequantised) from the GGUF at
    `path` (a path or a :func:`gguf_reader`) for a Packed8Linear when the GGUF holds it as
    Q8_0 (its own output tensor, or the token embedding it is tied to) and its weight is that
    tensor dequantised; return whether it did. The head keeps its fp32 weight as ``weight``
    (tied, not copied)."""
    from gguf import GGMLQuantizationType

    head = model.get_output_embeddings()
    if type(head) is not nn.Linear or head.bias is not None:
        return False
    tensors = {t.name: t for t in gguf_reader(path).tensors}
    t = tensors.get("output.weight") or tensors.get("token_embd.weight")
    if t is None or t.tensor_type != GGMLQuantizationType.Q8_0:
        return False
    blocks = q8_0_blocks(np.asarray(t.data), t.name)
    if blocks.q.shape != head.weight.shape or not torch.equal(blocks.dequantize(),
                                                               head.weight.detach()):
        return False
    model.set_submodule(_head_name(model, head), Packed8Linear(blocks, head.weight))
    return True


PACKED_CLASSES = {"Packed4Linear": Packed4Linear, "Packed8Linear": Packed8Linear}
BUFFERS = {"Packed4Linear": ("qw", "dw", "mw"), "Packed8Linear": ("qw", "dw")}  # each class's
# kernel-layout buffers


def save_packed(model: nn.Module, path: str | Path) -> int:
    """Write every packed layer of `model` (its kernel-layout buffers, a Packed4Linear's bias,
    its class and shape) to one safetensors file at `path`, atomically; return how many."""
    from safetensors.torch import save_file

    tensors, layers = {}, {}
    for name, m in model.named_modules():
        if isinstance(m, (Packed4Linear, Packed8Linear)):
            layers[name] = [type(m).__name__, m.in_features, m.out_features]
            tensors.update({f"{name}.{b}": getattr(m, b).contiguous()
                            for b in BUFFERS[type(m).__name__]})
            if getattr(m, "bias", None) is not None:
                tensors[f"{name}.bias"] = m.bias.detach().contiguous()
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    save_file(tensors, str(tmp), metadata={"layers": json.dumps(layers)})
    os.replace(tmp, path)  # a half-written file is never read
    return len(layers)


def load_packed(model: nn.Module, path: str | Path) -> int:
    """Swap the stock nn.Linear layers of `model` named in a :func:`save_packed` file for the
    packed layers it holds (buffers as saved; a Packed8Linear tied to the fp32 weight it
    replaces, as :func:`pack_head` ties it); return how many. ConfigError, before anything is
    swapped, where the file does not fit the model (a layer missing, not a stock nn.Linear,
    or of another shape)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        layers = json.loads(f.metadata()["layers"])
        for name, (kind, k, n) in layers.items():
            try:
                old = model.get_submodule(name)
            except AttributeError as e:
                raise ConfigError(f"packed file {path} names a layer '{name}' the model "
                                  "lacks") from e
            if (type(old) is not nn.Linear or kind not in PACKED_CLASSES
                    or (old.in_features, old.out_features) != (k, n)):
                raise ConfigError(f"packed file {path} does not fit layer '{name}'")
        swaps = []
        for name, (kind, k, n) in layers.items():
            old = model.get_submodule(name)
            new = PACKED_CLASSES[kind].__new__(PACKED_CLASSES[kind])
            nn.Module.__init__(new)
            new.in_features, new.out_features, new.bits = k, n, 16
            for b in BUFFERS[kind]:
                new.register_buffer(b, f.get_tensor(f"{name}.{b}"))
            if kind == "Packed8Linear":
                new.weight = old.weight  # tied, not copied (pack_head)
            else:
                bias = (f.get_tensor(f"{name}.bias") if f"{name}.bias" in f.keys()
                        else None)
                new.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
            swaps.append((name, new))
    for name, new in swaps:
        model.set_submodule(name, new)
    return len(swaps)


def _head_name(model: nn.Module, head: nn.Module) -> str:
    return next(name for name, m in model.named_modules() if m is head)


def unpack_linears(module: nn.Module) -> nn.Module:
    """`module` with every Packed4Linear and Packed8Linear inside it replaced (in place) by its
    stock fp32 nn.Linear; such a module itself becomes its nn.Linear."""
    packed = [(name, m) for name, m in module.named_modules()
              if isinstance(m, (Packed4Linear, Packed8Linear))]
    for name, m in packed:
        lin = m.to_linear()
        if not name:
            return lin
        module.set_submodule(name, lin)
    return module
