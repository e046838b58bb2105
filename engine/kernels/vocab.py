"""The round's vocabulary-sized reads of a CPU logits row in one compiled call each: the first
maximum (a temperature-0 verify's target token) and the k most likely tokens with their
softmax probabilities (the trace's ``p_top`` slices). vocab.c has the computation.

Why a kernel: torch's versions of these reads (:func:`engine.core.sampling.first_max`,
``torch.argmax``, and :func:`engine.core.sampling.top_probs`, a softmax and ``torch.topk``; a
two-level block search in torch took some twenty operator calls for the top-k), and right
after a target forward, which streams the weights through the caches, each call ran 5-10x its
warm time: on the Intel Xeon a greedy round's top-10 slice took 0.8 ms and its argmax 0.2 ms
of a 19 ms round (docs/benchmarks.md, "The round's vocabulary reads").

vocab.c is built once per machine like qmm.c (:func:`engine.kernels.qmm.compile_native`:
the C compiler, ``-march=native``, cached by source, flags and CPU) and called through ctypes.
Where it does not build, or for a tensor it does not take (not fp32, not on the CPU, its last
dimension strided), or a row whose maximum is not finite, the torch versions answer: the same
ids (ties aside: the kernel lists equal entries lower index first) and probabilities within
1e-6 relative.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from engine.core import sampling
from engine.kernels import qmm

SOURCE = Path(__file__).with_name("vocab.c")
MAX_K = 64  # the most entries vocab_top keeps a row (vocab.c)


@functools.lru_cache(maxsize=1)
def library() -> ctypes.CDLL | None:
    """vocab.c built for this machine and loaded; None where no C compiler builds it."""
    return build(qmm.native_path(SOURCE))


def build(out: Path, defines: tuple[str, ...] = ()) -> ctypes.CDLL | None:
    """vocab.c built into `out` with -D `defines` (VOCAB_PLAIN: no AVX2 path, as on a machine
    without it) and declared; None where it does not build."""
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    return qmm.declared(qmm.compile_native(SOURCE, out, defines=defines),
                        vocab_argmax=([p, i64], i64),
                        vocab_top=([p, i64, i64, i64, i64, p, p], ctypes.c_int),
                        vocab_exp_terms=([p, i64, ctypes.c_float, p], None))


def _takes(x: torch.Tensor) -> bool:
    return x.dtype == torch.float32 and x.device.type == "cpu" and x.stride(-1) == 1


def first_max(x: torch.Tensor) -> int:
    """``int(torch.argmax(x))`` of a vector x (n,): the first maximum, a NaN counting as the
    maximum (the kernel, else :func:`engine.core.sampling.first_max`)."""
    lib = library() if x.dim() == 1 and x.shape[0] > 0 and _takes(x) else None
    if lib is None:
        return sampling.first_max(x)
    return int(lib.vocab_argmax(x.data_ptr(), x.shape[0]))


def top_probs(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k most likely entries of softmax(logits) per row, largest first: (ids, probs), both
    (m, k), int64 and float32, for logits (m, V) (k clipped to V); the kernel, else (a row
    whose maximum is not finite included) :func:`engine.core.sampling.top_probs`."""
    m, n = logits.shape
    k = min(k, n)
    lib = library() if _takes(logits) and 0 < k <= MAX_K else None
    if lib is not None and m > 0:
        ids = torch.empty(m, k, dtype=torch.long)  # (m, k)
        probs = torch.empty(m, k, dtype=torch.float32)  # (m, k)
        if lib.vocab_top(logits.data_ptr(), m, n, logits.stride(0), k, ids.data_ptr(),
                         probs.data_ptr()) == 0:
            return ids, probs
    return sampling.top_probs(logits, k)
