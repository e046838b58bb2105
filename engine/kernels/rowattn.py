"""Row-invariant attention on the CPU: each output row is a function of its own query and of
the slots its mask lets it see, computed in a fixed order (rowattn.c's header has it in full),
its keys and values read as IEEE half precision: stored so (a compiled or static step's buffers,
engine/execution/static_kv.py: half the bytes a step reads), or fp32 rounded to half as they are
read (generate()'s cache), the same bits either way; the arithmetic is fp32 (llama.cpp's default
cache type, f16).

Why: with `qmm` (engine/kernels/qmm.py) a packed target's linear products already give a row the
same bits whatever else the forward holds; torch's attention kernels do not (a verify forward
of several rows and a one-row step block their sums differently), and those float-order
differences are what makes a packed target's logits differ between forward shapes (by up to
0.0055 on embedded-q4). With this kernel a packed target's eager forward gives every token the
same logits whether it is fed alone, in a chain or in a draft tree (tests/model/test_rowattn.py),
so an eager speculative run's tokens equal its own greedy's and generate()'s by construction.
A compiled step (SPECVIZ_KV=compiled) calls the kernel through the op ``specviz::rowattn``,
opaque to inductor as qmm's products are (its first call loads the ops' C++ kernels,
engine/kernels/ops.cpp, with qmm.native_op: later calls skip Python), so the compiled path of a
packed target is row-invariant as well (tests/model/test_compiled_kv.py), and with its norms
and rotary traced as ops (engine/kernels/eager_bits.py) it gives every token the eager path's
bits.

rowattn.c is built like qmm.c (qmm.compile_native: the machine's C compiler, -march=native,
cached per source, flags and CPU) and called through ctypes; :func:`reference` is the same
sums in float64 (the tests' oracle). Where no compiler builds it, :func:`library` is None
and engine/kernels/attention.py keeps torch's attention.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from engine.kernels import qmm

SOURCE = qmm.ROWATTN_SOURCE  # rowattn.c (named in qmm, which links it into the ops' C++ kernels)


def compile_at(out: Path, march: str = "native", defines: tuple[str, ...] = ()
               ) -> ctypes.CDLL | None:
    """rowattn.c built into `out` for `march` (with -D `defines`) and loaded (None where it
    does not build)."""
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    return qmm.declared(qmm.compile_native(SOURCE, out, march, defines), rowattn=(
        [p, p, p, p, p, p, i64, i64, i64, i64, i64, i64, ctypes.c_float, ctypes.c_int],
        ctypes.c_int))


@functools.lru_cache(maxsize=1)
def library() -> ctypes.CDLL | None:
    """rowattn.c built for this machine and loaded; None where no C compiler builds it."""
    return compile_at(qmm.native_path(SOURCE))


@functools.lru_cache(maxsize=8)
def visible(Q: int, S: int, causal: bool) -> torch.Tensor:
    """The additive mask transformers' sdpa applies when it is given none: (1, 1, Q, S); with
    `causal` (and Q > 1) query row i sees slots 0..i (torch's ``is_causal``, aligned at the
    first slot), else every slot. Made once per shape and shared (every layer of a forward
    asks for it): read it, never write it."""
    if not causal or Q == 1:
        return torch.zeros(1, 1, Q, S, dtype=torch.float32, device="cpu")
    i = torch.arange(Q)[:, None]
    j = torch.arange(S)[None, :]
    return torch.where(j <= i, 0.0, float("-inf")).float()[None, None]  # (1, 1, Q, S)


_STRIDES = ctypes.c_int64 * 16
KV_DTYPES = (torch.float16, torch.float32)  # what the kernel reads keys and values from


def attend(lib: ctypes.CDLL, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
           mask: torch.Tensor, scale: float) -> torch.Tensor:
    """Attention of H query heads over KV key/value heads (query head h reads key/value head
    h // (H / KV)) by `lib`.

    Args:
        query: (W, H, Q, D) fp32; key, value: (W, KV, S, D), both fp16 or both fp32 (read
            rounded to half: the same bits as their fp16 copies; any strides, the last
            dimension is made contiguous); mask: additive fp32 that broadcasts to (W, 1, Q, S)
            (-inf or the lowest finite float: hidden; a longer last dimension is cut to S, as
            sdpa's callers do; another shape raises RuntimeError).
    Returns:
        (W, Q, H, D) fp32, as transformers' attention functions return it.
    """
    if query.stride(-1) != 1:
        query = query.contiguous()
    if key.stride(-1) != 1:
        key = key.contiguous()
    if value.stride(-1) != 1:
        value = value.contiguous()
    W, H, Q, D = query.shape
    _, KV, S, DK = key.shape
    f32 = torch.float32
    if (key.shape[0] != W or DK != D or value.shape != key.shape or KV == 0 or H % KV
            or not (query.is_cpu and key.is_cpu and value.is_cpu and mask.is_cpu)
            or query.dtype != f32 or key.dtype not in KV_DTYPES or value.dtype != key.dtype):
        raise RuntimeError(f"rowattn: query {tuple(query.shape)}, key {tuple(key.shape)}, "
                           f"value {tuple(value.shape)} do not fit (an fp32 query, fp16 or "
                           "fp32 keys and values, on the CPU)")
    if mask.dim() != 4 or mask.shape[1] != 1 or mask.shape[-1] < S:
        raise RuntimeError(f"rowattn: a mask {tuple(mask.shape)} for {W} x {Q} rows over {S} "
                           "slots")
    if mask.shape[-1] != S:
        mask = mask[..., :S]
    if mask.dtype != f32 or mask.stride(-1) != 1:
        mask = mask.float().contiguous()
    if mask.shape[0] != W or mask.shape[2] != Q:
        mask = mask.expand(W, 1, Q, S)  # stride 0 where it broadcasts
    out = torch.empty(W, Q, H, D, dtype=f32, device="cpu")  # (W, Q, H, D)
    strides = _STRIDES(*query.stride(), *key.stride(), *value.stride(), *mask.stride())
    done = lib.rowattn(query.data_ptr(), key.data_ptr(), value.data_ptr(), mask.data_ptr(),
                       strides, out.data_ptr(), W, H, KV, Q, S, D, scale,
                       int(key.dtype == torch.float16))
    if done != 0:
        raise MemoryError("rowattn: no scratch memory")
    return out


def _op_python(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor,
               scale: float) -> torch.Tensor:
    """The op's Python kernel: it loads the C++ kernels of the compiled step's ops
    (qmm.native_op; later calls on CPU tensors go there) and computes this call itself."""
    qmm.load_op()
    return attend(library(), query, key, value, mask, scale)


# The op torch.compile sees (opaque to inductor, as qmm's): a compiled step of a packed target
# attends through the kernel too, so its rows keep the eager path's row invariance. Its
# Python kernel is registered for every backend; the C++ one (engine/kernels/ops.cpp), once
# loaded, for CPU, which the dispatcher takes first.
_LIB = torch.library.Library("specviz", "FRAGMENT")
_LIB.define("rowattn(Tensor query, Tensor key, Tensor value, Tensor mask, float scale) "
            "-> Tensor")
_LIB.impl("rowattn", _op_python, "CompositeExplicitAutograd")


@torch.library.register_fake("specviz::rowattn")
def _(query, key, value, mask, scale):
    W, H, Q, D = query.shape
    return query.new_empty(W, Q, H, D)


def reference(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              mask: torch.Tensor, scale: float) -> torch.Tensor:
    """The same attention in float64 over the keys and values rounded to half, as the kernel
    reads them (rows that see no slot give 0): (W, Q, H, D) fp64."""
    H, KV = query.shape[1], key.shape[1]
    key, value = key.half(), value.half()  # (W, KV, S, D) each
    mask = torch.where(mask <= torch.finfo(torch.float32).min, float("-inf"),
                       mask.double())  # (W or 1, 1, Q, S): the lowest float hides too
    k = key.double().repeat_interleave(H // KV, 1)  # (W, H, S, D)
    v = value.double().repeat_interleave(H // KV, 1)
    s = query.double() @ k.transpose(-1, -2) * scale + mask.double()  # (W, H, Q, S)
    seen = torch.isfinite(s).any(-1, keepdim=True)  # (W, H, Q, 1)
    p = torch.softmax(torch.where(seen, s, 0.0), -1) * seen
    return (p @ v).transpose(1, 2)  # (W, Q, H, D)
