"""How many torch threads the engine's model work uses: one rule for the CLI, the app and the
benchmarks.

``SPECVIZ_THREADS`` wins when set (``engine.load_pair`` applies it to a CPU pair, so a script of the
Python API runs at the count its benchmark names). Otherwise the count is measured, not assumed:
once a CPU pair is loaded, a plain target step runs under one thread and under every usable core,
interleaved (:func:`fastest`, from ``engine.run.api.tune_threads``), and the faster count is kept
for the process. Why measured: on a quiet 2-core Intel Xeon (embedded SmolLM2-135M, greedy, 200
tokens) one thread took 10.4 s and two 6.4 s (mcsd 5.9 s and 3.8 s), while on a 2-core AMD EPYC one
thread was the faster (48 tokens: 3.68 s against 3.81 s on the command line, 3.7-4.1 s against
4.1-5.7 s inside the app). Benchmarks set ``SPECVIZ_THREADS=1`` and say so.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Callable

import torch

from engine.core.errors import ConfigError

ENV = "SPECVIZ_THREADS"
CALIBRATION_REPS = 3
TIE = 0.03  # a count must be this much faster than fewer threads to be chosen


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def thread_count() -> int | None:
    """SPECVIZ_THREADS, checked; None when unset (then measured per pair)."""
    given = os.environ.get(ENV, "").strip()
    if given:
        if not given.isdigit() or int(given) < 1:
            raise ConfigError(f"{ENV} must be a positive integer, got {given!r}")
        return int(given)
    return None


def configure() -> int:
    """Apply SPECVIZ_THREADS to torch when set (call from the thread that does the model
    work); the count in force."""
    n = thread_count()
    if n is not None and torch.get_num_threads() != n:
        torch.set_num_threads(n)
    return torch.get_num_threads()


def candidates() -> tuple[int, ...]:
    """The counts a measurement chooses between: one thread and every usable core."""
    cores = usable_cores()
    return (1, cores) if cores > 1 else (1,)


def fastest(step: Callable[[], object], counts: tuple[int, ...], reps: int = CALIBRATION_REPS,
            clock: Callable[[], float] = time.perf_counter) -> tuple[int, dict[int, float]]:
    """Time ``step()`` under each thread count, interleaved ``reps`` times, and set torch to
    the count with the lowest median seconds (fewer threads unless more are faster by more
    than TIE). Returns (that count, count -> median seconds)."""
    times: dict[int, list[float]] = {n: [] for n in counts}
    for _ in range(reps):
        for n in counts:
            torch.set_num_threads(n)
            t0 = clock()
            step()
            times[n].append(clock() - t0)
    med = {n: statistics.median(v) for n, v in times.items()}
    best = counts[0]
    for n in counts[1:]:
        if med[n] < med[best] * (1 - TIE):
            best = n
    torch.set_num_threads(best)
    return best, med
