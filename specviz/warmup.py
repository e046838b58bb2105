"""The compiled steps' warm-up: a packed target's common step shapes compiled on a thread of
their own while the model thread serves runs eagerly, with the same bits.

app.py turns compiled steps on at start (``serve_compiled``, where a C++ compiler exists for
inductor); the pair cache (specviz.pairs) starts ``warm_up`` when it loads a pair; the page's
status line reads ``WARMUP.note()`` (specviz.ui).
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from dataclasses import dataclass

import engine
from engine.core import static_kv, threads
from engine.core.cached_model import CachedModel, warm_shapes, warming

log = logging.getLogger("specviz")


@dataclass
class Warmup:
    """What the warm-up thread (warm_up) has done (module state: one per process, read by
    the UI's status line)."""

    pair: str = ""  # the target it compiles for
    done: int = 0  # step shapes made
    total: int = 0
    seconds: float = 0.0  # spent so far

    def note(self) -> str:
        """One line for the UI ('' once every shape is made, or when there is none)."""
        if self.done >= self.total:
            return ""
        return (f"compiling step shapes in the background: {self.done} / {self.total} "
                f"({self.seconds:.0f} s so far); until then steps run eagerly, with the "
                "same bits")


WARMUP = Warmup()  # the process's: its warm-up thread outlives the request that loaded


def serve_compiled() -> bool:
    """app.py, at start: a packed target on this CPU runs compiled steps (made by warm_up on
    a thread of their own, engine.core.static_kv.POLICY) where a C++ compiler exists for
    inductor; else one log line and eager steps. Whether it does."""
    from engine.core import qmm

    if not (shutil.which("c++") or shutil.which("g++") or os.environ.get("CXX")) or \
            qmm.library() is None:
        log.warning("no C++ compiler for inductor here: packed targets run eager steps")
        return False
    static_kv.POLICY.packed = True
    return True


def warm_up(pair: engine.ModelPair) -> threading.Thread | None:
    """Compile the pair's common step shapes (its target's and a token-input drafter's
    runner) on a thread of their own, in their own KV buffers, while the model thread serves
    runs eagerly (it never compiles: specviz.worker); the warm buffers go back to the pool at
    the end and later runs take them. None where the pair runs eagerly."""
    runners = [r for r in (CachedModel(pair.target), pair.drafter.runner())
               if isinstance(r, CachedModel) and warm_shapes(r)]
    if not runners:
        return None
    WARMUP.pair, WARMUP.done, WARMUP.seconds = pair.target_name, 0, 0.0
    WARMUP.total = sum(warm_shapes(r) for r in runners)
    log.info("compiling %d step shapes of %s in the background; steps run eagerly meanwhile",
             WARMUP.total, pair.target_name)
    thread = threading.Thread(target=_warming, args=(runners,), name="specviz-warm-up",
                              daemon=True)
    thread.start()
    return thread


def _warming(runners: list[CachedModel]) -> None:
    threads.configure()
    start = time.monotonic()
    try:
        for runner in runners:
            for _ in warming(runner):
                WARMUP.done += 1
                WARMUP.seconds = time.monotonic() - start
                log.info("warm-up: step shape %d / %d made (%.0f s)", WARMUP.done,
                         WARMUP.total, WARMUP.seconds)
    except Exception:  # noqa: BLE001 - runs keep the eager path; the log says why
        WARMUP.total = WARMUP.done
        log.warning("warm-up stopped: steps run eagerly", exc_info=True)
