"""How many torch threads the engine's model work uses: one rule for the CLI, the app and
the benchmarks.

``SPECVIZ_THREADS`` wins when set. Otherwise: one thread on a machine with at most two usable
cores, torch's own default (its physical cores) on a larger one. Measured on this project's
2-core CPU machine (embedded SmolLM2-135M, greedy, 48 tokens): one thread 3.68 s against two
threads 3.81 s on the command line, and inside the app, where a second OpenMP team competes
with the server's own thread, two threads were slower and noisier still (4.1-5.7 s against
3.7-4.1 s). Larger machines were not measured here; torch's default is left alone there.
"""

from __future__ import annotations

import os

import torch

from engine.core.errors import ConfigError

ENV = "SPECVIZ_THREADS"


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def thread_count() -> int | None:
    """The rule above; None = leave torch's default."""
    given = os.environ.get(ENV, "").strip()
    if given:
        if not given.isdigit() or int(given) < 1:
            raise ConfigError(f"{ENV} must be a positive integer, got {given!r}")
        return int(given)
    return 1 if usable_cores() <= 2 else None


def configure() -> int:
    """Apply the rule to torch (call from the thread that does the model work)."""
    n = thread_count()
    if n is not None and torch.get_num_threads() != n:
        torch.set_num_threads(n)
    return torch.get_num_threads()
