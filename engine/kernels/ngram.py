"""The n-gram draft law (engine.drafters.ngram.ngram_law) in one compiled call: ngram.c.

Why a kernel: the law is some thirty numpy calls on a context of a few hundred ids (42 us
warm on the Intel Xeon, a 350-token context), and a round reads it at every drafted node and
at a root whose suffix recurs (engine.drafters.ngram.RecurringGrams says which), right after
a target forward has streamed the weights through the caches, where each call runs several
times its warm time: 94-112 us a call in ``sd``'s rounds (in-process wrappers, 8 tuning
prompts; 34-38 us with the kernel, 7.5 us warm). ngram.c reads it in one pass and a sort of
the followers.

ngram.c is built once per machine like vocab.c (:func:`engine.kernels.qmm.compile_native`) and
called through ctypes; where it does not build, :func:`law` answers None and the drafter's
numpy version runs: the same followers and the same probabilities (the kernel adds as numpy's
pairwise sum does; tests/unit/test_ngram.py compares them).
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import numpy as np

from engine.kernels import qmm

SOURCE = Path(__file__).with_name("ngram.c")


@functools.lru_cache(maxsize=1)
def library() -> ctypes.CDLL | None:
    """ngram.c built for this machine and loaded; None where no C compiler builds it."""
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    return qmm.declared(qmm.compile_native(SOURCE, qmm.native_path(SOURCE)),
                        ngram_law=([p, i64, i64, i64, ctypes.c_double, p, p, p], i64))


def law(context: np.ndarray, max_n: int, min_n: int, recency: float
        ) -> tuple[np.ndarray, np.ndarray] | None:
    """((k,) follower ids ascending, (k,) probabilities) after ``context`` (L,) int64, as
    engine.drafters.ngram.ngram_law states the law; None where the kernel is not built or
    for lengths under 1 (the drafter refuses them; the numpy version answers)."""
    lib = library() if min_n >= 1 and max_n >= 1 else None
    if lib is None:
        return None
    ctx = np.ascontiguousarray(context, dtype=np.int64)  # (L,)
    L = int(ctx.shape[0])
    tokens = np.empty(max(L, 1), dtype=np.int64)  # (L,) at most L - 1 followers
    probs = np.empty(max(L, 1))  # (L,)
    work = np.empty(max(2 * L, 2), dtype=np.int64)  # (2 L,) (follower, 1 + start) pairs
    k = lib.ngram_law(ctx.ctypes.data, L, int(max_n), int(min_n), float(recency),
                      tokens.ctypes.data, probs.ctypes.data, work.ctypes.data)
    return tokens[:k], probs[:k]
