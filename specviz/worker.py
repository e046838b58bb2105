"""The app's model thread: ``WORKER``, the one thread that runs every model load and forward
of the process, its jobs served in turn.

Every load and every forward runs on ``WORKER``, one dedicated thread with the engine's thread
rule (engine/kernels/threads.py): torch keeps one OpenMP team, and no two jobs use the weights at
the same time. The thread serves its jobs in turn (round-robin), one unit of work each: a
decode (a Run, each Compare method: specviz.streaming) is a step job of one round a step; a
load or any other call is one unit; a Bench set, a tune or a Check is one unit that lets the
others in at the pause points the engine offers (``pause_point``, called from the engine's
pacing hook: specviz.jobs): a check's after each round of its runs, a Bench set's and a
tune's between their timed segments. So another session's Run starts after about one round
of each job ahead of it (or one whole timed segment of a Bench set or a tune), instead of
after all of them (Gradio lets up to ``specviz.wiring.MODEL_SLOTS`` model events
run at once; this thread shares the model among them). A unit is whole engine calls, never
part of one, so a run's tokens do not depend on what else runs.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from concurrent.futures import Future
from contextvars import Context
from typing import Any, Callable, Iterator

import torch

from engine.execution import static_kv
from engine.kernels import threads


class ModelWorker:
    """One daemon thread that runs every model call of the process, its jobs served in turn.

    A job is a generator of units: ``submit_steps`` takes one whose every ``next()`` is one
    unit (a decode: one round), ``submit`` / ``call`` a function, run as a single unit. The
    thread runs one unit of the job at the head of its ready queue, then puts the job back at
    the tail unless it finished, so jobs take turns unit by unit (round-robin) and a new job
    starts after at most one unit of each job ahead of it. A long job that is one unit (a
    Bench set, a tune, a Check) lets others in at ``pause_point``, which it calls between
    whole engine calls (a round, a timed segment). Never inside one engine call: a unit is
    whole engine calls, so runs keep their tokens. Each unit runs in a context of its own
    (``contextvars``), so what one job sets there (its engine pacing hook) reaches no other.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._ready: deque[tuple[Iterator, Future]] = deque()
        self._wake = threading.Condition()
        self._clock = clock
        self._slice_start = 0.0  # when the unit running now started or last resumed
        self.thread = threading.Thread(target=self._loop, name="specviz-model", daemon=True)
        self.threads = 0
        self.idle = threading.Event()  # set while no unit runs, none is ready and no
        # handler is in flight (the warm-up compiles only then: specviz.warmup)
        self.idle.set()
        self._in_unit = False
        self._serving = 0  # the page's handlers in flight (``serving``)
        self.thread_cap: int | None = None  # at most this many torch threads a unit (the
        # warm-up's compiler takes the other cores meanwhile: specviz.warmup)
        self._uncapped = 0  # the count a cap lowered, restored when the cap is lifted
        self.thread.start()

    @property
    def busy(self) -> bool:
        """A unit runs, a job is ready or a handler is in flight (the warm-up's compile waits
        meanwhile)."""
        return not self.idle.is_set()

    def _update_idle(self) -> None:  # under self._wake
        if self._ready or self._in_unit or self._serving:
            self.idle.clear()
        else:
            self.idle.set()

    @contextlib.contextmanager
    def serving(self) -> Iterator[None]:
        """Within: the process serves a request (a page handler: specviz.callbacks.guarded),
        so it is not idle; its renders share the GIL with the compiler as runs do."""
        with self._wake:
            self._serving += 1
            self.idle.clear()
        try:
            yield
        finally:
            with self._wake:
                self._serving -= 1
                self._update_idle()

    def _loop(self) -> None:
        self.threads = threads.configure()
        static_kv.POLICY.deferred = True  # a compiled step shape not made yet runs static
        # here (the same bits): no unit waits for a compile (specviz.warmup makes them)
        while True:
            with self._wake:
                self._in_unit = False
                while not self._ready:
                    self._update_idle()
                    self._wake.wait()
                job = self._ready.popleft()
                self._in_unit = True
            self._run_unit(job)

    def _run_unit(self, job: tuple[Iterator, Future]) -> None:
        """One unit of the job, in a fresh context; the job back at the tail of the queue
        unless it finished."""
        steps, fut = job
        self._apply_cap()
        self._slice_start = self._clock()
        if not fut.running() and not fut.set_running_or_notify_cancel():
            steps.close()  # cancelled before its first unit
            return
        try:
            Context().run(next, steps)
        except StopIteration as end:
            fut.set_result(end.value)
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            fut.set_exception(e)
        else:
            self._put(job)

    def _apply_cap(self) -> None:
        """torch's thread count within ``thread_cap`` (an OpenMP team larger than the cores
        left to it waits at every barrier for a core the compiler holds: a greedy run beside
        the warm-up's C++ compiler took 1.6-1.8 s on two threads against 0.7 s alone, 2-core
        AMD EPYC); the count before the cap back once it is lifted."""
        n, cap = torch.get_num_threads(), self.thread_cap
        if cap is not None and n > cap:
            self._uncapped = n
            torch.set_num_threads(cap)
        elif cap is None and self._uncapped:
            torch.set_num_threads(self._uncapped)
            self._uncapped = 0

    def _put(self, job: tuple[Iterator, Future]) -> None:
        with self._wake:
            self.idle.clear()
            self._ready.append(job)
            self._wake.notify()

    def submit_steps(self, steps: Iterator) -> Future:
        """Run a step job: each ``next(steps)`` one unit, in turn with the other jobs; the
        future gets the generator's return value (or its exception)."""
        fut: Future = Future()
        self._put((steps, fut))
        return fut

    def submit(self, fn: Callable, *args: Any, **kwargs: Any) -> Future:
        """Run fn(*args, **kwargs) on the model thread as one unit."""
        return self.submit_steps(_one_unit(fn, args, kwargs))

    def call(self, fn: Callable, *args: Any, **kwargs: Any) -> Any:
        """Run fn on the model thread and wait for its result (or exception); on the model
        thread itself, run it at once."""
        if threading.current_thread() is self.thread:
            return fn(*args, **kwargs)
        return self.submit(fn, *args, **kwargs).result()

    def call_steps(self, steps: Iterator) -> Any:
        """``submit_steps`` and wait for the result; on the model thread, run every step at
        once."""
        if threading.current_thread() is self.thread:
            return _to_end(steps)
        return self.submit_steps(steps).result()

    def pause_point(self) -> None:
        """Let the other jobs in, then return (call it on the model thread, between whole
        engine calls of a long unit).

        Every job ready when it is called runs one unit, in turn; then they go on taking
        turns until they have had about as long each as the caller ran since it last got the
        thread, or none is ready. The caller is not in the queue while it runs, so none of its
        own work runs here. A long job of one unit that starts here pauses in turn at its own
        pause points, and the caller resumes only when that job has ended."""
        if threading.current_thread() is not self.thread:
            raise RuntimeError("pause_point is for the model thread")
        now = self._clock()
        with self._wake:
            waiting = len(self._ready)
        until = now + (now - self._slice_start) * waiting
        turns = 0
        while True:
            with self._wake:
                if not self._ready or (turns >= waiting and self._clock() >= until):
                    break
                job = self._ready.popleft()
            self._run_unit(job)
            turns += 1
        self._slice_start = self._clock()


def _one_unit(fn: Callable, args: tuple, kwargs: dict) -> Iterator:
    """A job of one unit: the first next() runs fn, its result the StopIteration's value."""
    return fn(*args, **kwargs)
    yield  # a generator with no yield reached: never a step in between


def _to_end(steps: Iterator) -> Any:
    """Every step of a step job, at once; its return value."""
    while True:
        try:
            next(steps)
        except StopIteration as end:
            return end.value


WORKER = ModelWorker()  # the process's one model thread (the thread rule: one OpenMP team)
