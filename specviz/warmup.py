"""The compiled steps' warm-up: a packed target's common step shapes compiled on a thread of
their own while the model thread serves runs eagerly, with the same bits.

app.py turns compiled steps on at start (``serve_compiled``, where a C++ compiler exists for
inductor); the pair cache (specviz.pairs) starts ``warm_up`` when it loads a pair; the page's
status line reads ``WARMUP.note()`` (specviz.ui).

The compiler is Python (dynamo, inductor's code generation) holding the GIL for seconds at a
time, and every op of an eager step releases the GIL and takes it back: at Python's default
switch interval (5 ms) each op of a run beside a compile waits up to 5 ms (the convoy effect;
a first Run in the app took 78 s during a compile). While it compiles the warm-up sets the
interval to ``SWITCH_S`` and restores it when it goes idle (2-core AMD EPYC, under load,
greedy through the engine beside a busy Python thread: 37.3 s at 5 ms, 10.9 s at 0.1 ms,
15.8 s alone). Inductor's compile workers take every core but one (``serve_compiled``): on a
2-core machine two workers and a run would share two cores.

A shorter interval still left a greedy Run beside a compile up to 13x slower than alone (the
UI benchmark, 2-core AMD EPYC Zen 5, cold inductor cache). Three things fix it. The model
thread never builds the steps' C++ kernels (its first Run built them: about 12 s of
compiler; ``qmm.BUILDS``): the warm-up builds them first. While the warm-up runs, the model
thread's units use at most usable cores - 1 torch threads (``ModelWorker.thread_cap``: a
two-thread team beside the compiler took 1.6-1.8 s for what took 0.7 s alone). And the
warm-up yields to the runs and renders: its thread traces its
own Python calls (``sys.settrace``, this thread only) and, at any call made while the model
thread has work or a page handler is in flight (``WORKER.idle`` clear), waits until neither
is left. A Run then has the GIL to itself; the compile goes on in the app's idle time, slower
traced: the five shapes of the default target took 124 s to load from inductor's disk cache
in an idle app against 37 s untraced in a script, and 517 s cold against about 165 s.
A thread paused anywhere may hold a lock another needs (an
import's module lock, dynamo's compile lock, a log handler's): so while it waits it watches
the CPU time of the rest of the process, and where the others used less than STALLED of a
POLL_S interval (they wait, maybe for a lock this thread holds, or for a client) it goes on
for RESUME_S before it pauses again (a lock it holds is released within a few such slices).
Where nothing else runs a pause gives nothing anyway.
"""

from __future__ import annotations

import logging
import queue
import sys
import threading
import time

import engine
from engine.execution import static_kv
from engine.execution.cached_model import CachedModel, warm_shapes, warming
from engine.kernels import qmm, threads
from specviz.worker import WORKER, ModelWorker

log = logging.getLogger("specviz")
SWITCH_S = 1e-4  # the GIL's switch interval while the warm-up compiles (module docstring)
POLL_S = 0.05  # a paused warm-up looks this often whether the others still work
STALLED = 0.25  # ... and goes on where they used less than this share of one core meanwhile
RESUME_S = 0.25  # ... for this long before its next pause


class Warmup:
    """The process's warm-up (module state: one per process, its thread outlives the
    request that loaded a pair; the UI's status line reads it): one thread compiling the
    queued runners' step shapes in turn, so two pairs loaded close together never compile
    at once; ``done`` / ``total`` count over everything queued since it last went idle."""

    def __init__(self, worker: ModelWorker = WORKER) -> None:
        self.pair = ""  # the target it compiles for now
        self.done = 0  # step shapes made
        self.total = 0
        self.seconds = 0.0  # spent so far
        self.paused_s = 0.0  # of which waiting for the app's work to end
        self.pausing = False  # waiting for it now
        self._worker = worker
        self._resume_until = 0.0  # the others stalled: no pause before this (monotonic)
        self.stalls = 0  # pauses ended because the others stalled
        self._queue: queue.Queue[tuple[str, list[CachedModel]]] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._switch = sys.getswitchinterval()  # the process's, restored when idle

    def note(self) -> str:
        """One line for the UI ('' once every shape is made, or when there is none)."""
        if self.done >= self.total:
            return ""
        paused = ", paused while a run goes on" if self.pausing else ""
        return (f"compiling step shapes in the background: {self.done} / {self.total} "
                f"({self.seconds:.0f} s so far{paused}); until then steps run eagerly, with "
                "the same bits")

    def add(self, name: str, runners: list[CachedModel]) -> threading.Thread:
        """Queue runners' shapes; the warm-up thread (started if idle) compiles them."""
        with self._lock:
            if self._thread is None:
                self.done, self.total, self.seconds, self.paused_s = 0, 0, 0.0, 0.0
                self.stalls = 0
                self._thread = threading.Thread(target=self._loop, name="specviz-warm-up",
                                                daemon=True)
                self._thread.start()
            self.total += sum(warm_shapes(r) for r in runners)
            self._queue.put((name, runners))
            return self._thread

    def _loop(self) -> None:
        threads.configure()
        start = time.monotonic()
        sys.setswitchinterval(min(self._switch, SWITCH_S))  # runs beside a compile
        self._worker.thread_cap = max(1, threads.usable_cores() - 1)  # a core for the compiler
        sys.settrace(self._yield_to_runs)  # this thread's Python calls only
        try:
            qmm.native_op()  # the steps' C++ kernels, built here (never on the model thread)
            self._compile_queued(start)
        finally:
            sys.settrace(None)
            self._worker.thread_cap = None
            sys.setswitchinterval(self._switch)

    def _yield_to_runs(self, frame, event, arg) -> None:
        """The warm-up thread's trace function, called at each Python call it makes: while
        the app has work, wait until it has none (module docstring). Returns None:
        no line events."""
        if not self._worker.idle.is_set() and time.monotonic() >= self._resume_until:
            self._pause()

    def _pause(self) -> None:
        """Wait while the app has work and the rest of the process uses the CPU for it."""
        start, self.pausing = time.monotonic(), True
        others = time.process_time() - time.thread_time()  # CPU seconds of the other threads
        while not self._worker.idle.wait(POLL_S):
            now = time.process_time() - time.thread_time()
            if now - others < STALLED * POLL_S:  # they wait (maybe for a lock held here):
                self._resume_until = time.monotonic() + RESUME_S  # go on a while
                self.stalls += 1
                break
            others = now
        self.paused_s += time.monotonic() - start
        self.pausing = False

    def _compile_queued(self, start: float) -> None:
        while True:
            with self._lock:
                if self._queue.empty():
                    self._thread = None
                    return
                name, runners = self._queue.get()
                self.pair = name
            try:
                for runner in runners:
                    for _ in warming(runner):
                        self.done += 1
                        self.seconds = time.monotonic() - start
                        log.info("warm-up: step shape %d / %d made (%.0f s, %.0f s of it "
                                 "paused for runs; %d pauses ended by stalls)", self.done,
                                 self.total, self.seconds, self.paused_s, self.stalls)
            except Exception:  # noqa: BLE001 - runs keep the eager path; the log says why
                self.total -= sum(warm_shapes(r) for r in runners)
                self.done = min(self.done, self.total)
                log.warning("warm-up of %s stopped: its steps run eagerly", name,
                            exc_info=True)


WARMUP = Warmup()


def serve_compiled() -> bool:
    """app.py, at start: a packed target on this CPU runs compiled steps (made by warm_up on
    a thread of their own, engine.execution.static_kv.POLICY) where a C++ compiler exists for
    inductor; else one log line and eager steps. Whether it does."""
    if not static_kv.can_compile():
        log.warning("no C++ compiler for inductor here: packed targets run eager steps")
        return False
    static_kv.POLICY.packed = True
    import torch._inductor.config as inductor

    # inductor's compile workers leave one core to the runs served meanwhile
    inductor.compile_threads = max(1, threads.usable_cores() - 1)
    return True


def warm_up(pair: engine.ModelPair) -> threading.Thread | None:
    """Compile the pair's common step shapes (its target's and its drafter model's
    runner) on the warm-up thread, in their own KV buffers, while the model thread serves
    runs eagerly (it never compiles: specviz.worker); the warm buffers go back to the pool at
    the end and later runs take them. The warm-up thread, or None where the pair runs
    eagerly."""
    runners = [r for r in (CachedModel(pair.target), pair.drafter.warm_runner())
               if isinstance(r, CachedModel) and warm_shapes(r)]
    if not runners:
        return None
    log.info("compiling %d step shapes of %s in the background; steps run eagerly meanwhile",
             sum(warm_shapes(r) for r in runners), pair.target_name)
    return WARMUP.add(pair.target_name, runners)
