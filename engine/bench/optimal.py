"""Timing of engine.verify.optimal: how long one alpha* call takes on a full-size vocabulary."""

from __future__ import annotations

import statistics
import time

import torch

from engine.verify.optimal import SCHEMES, alpha_star


def bench_optimal(V: int = 49152, ns=(2, 3, 4), repeats: int = 20,
                  seed: int = 0) -> dict[str, float]:
    """Median ms per alpha_star call, per scheme and n, on one random (p, q) pair.

    p and q are heavy-tailed and correlated: q = softmax(3 z1), p = softmax(3 (0.8 z1 +
    0.6 z2)), z ~ N(0, 1) from a seeded generator (lognormal, a Dirichlet-like spread).
    Returns {"<scheme>/n=<n>": ms}.
    """
    gen = torch.Generator().manual_seed(seed)
    z1, z2 = torch.randn(2, V, generator=gen, dtype=torch.float64)  # (V,) each
    q = torch.softmax(3.0 * z1, 0)
    p = torch.softmax(3.0 * (0.8 * z1 + 0.6 * z2), 0)
    out = {}
    for scheme in SCHEMES:
        for n in ns:
            alpha_star(p, q, n, scheme)  # warm-up
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                alpha_star(p, q, n, scheme)
                times.append(1e3 * (time.perf_counter() - start))
            out[f"{scheme}/n={n}"] = statistics.median(times)
    return out
