"""The one way the Bench, Tune and Check tabs run their long model jobs (a Bench set, a tune,
a check): ``Runner`` and ``Job``.

A long job is one engine call (``run_set``, ``run_tune``, ``run_check``) run as one unit on the
model thread (specviz.worker) inside ``engine.run.pacing.between_rounds``: at every pause
point the engine offers, the model thread lets the other jobs in (``ModelWorker.pause_point``).
A check offers one after every round of its runs and between its runs, so another session's
Run waits about one round of it (or its reference generate() at temperature 0, one call). A
Bench set and a tune offer one between their timed segments, each benchmark run and its
reference generate() (engine.bench.interleaved.measure_run), and between their runs: a speedup
compares the two segments, and each, run whole, holds no other session's model work, so
both meet the same conditions (another session's handler rendering on the same cores slows
both alike); another session's Run waits at most one such segment (about a plain decode of
the set's max_new_tokens). A transformers mode's run is always whole. The seconds spent
letting others in are counted apart (``Job.yielded_s``); a tune's trial seconds and a check's
sizing run are on the pacing's own clock.

The handler's side: ``Runner.session`` gives the request its ``Job`` (refused in one line
while another job of a one-at-a-time runner runs: a Bench set, a tune), ``Runner.start`` puts
the engine call on the model thread with ``progress`` and ``cancelled`` bound to the job, and
``Job.follow`` yields the progress events that arrived, every poll, until the job has ended.
``Runner.cancel`` stops a session's job after its current run; a handler that goes away
(a client that leaves) stops its job too. ``Runner.run_dir`` makes a run folder in the temp
folder, the newest ``keep`` kept.
"""

from __future__ import annotations

import queue
import shutil
import tempfile
import threading
import time
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from engine.core.errors import ConfigError
from engine.run.pacing import between_rounds, pause
from specviz.worker import WORKER


class Job:
    """One long job of a session: its progress events, its stop flag and, once started, its
    future on the model thread."""

    def __init__(self, max_seconds: float | None = None) -> None:
        self.deadline = None if max_seconds is None else time.monotonic() + max_seconds
        self.began = 0.0  # when the model thread took it up (time.monotonic)
        self.stop = threading.Event()  # a cancel: the engine stops after its current run
        self.events: queue.SimpleQueue = queue.SimpleQueue()
        self.future: Future | None = None
        self.yielded_s = 0.0  # seconds the model thread spent on others' work inside it
        self.holders = 1  # the handler, and the model thread once started: the runner is
        # free when both have let go

    def progress(self, *event: Any) -> None:
        """The engine's progress callback (on the model thread): keep the event for the
        handler, then let other jobs in (a pause point between the job's runs)."""
        self.events.put(event)
        pause()

    def cancelled(self) -> bool:
        """The engine's cancel poll: Cancel pressed, the handler gone or the time cap passed."""
        return self.stop.is_set() or (self.deadline is not None and
                                      time.monotonic() > self.deadline)

    def follow(self, poll_s: float) -> Iterator[list[tuple]]:
        """The progress events that arrived since the last yield (maybe none), every poll_s
        while the job runs, and once more after it has ended (then ``result``)."""
        while True:
            finished = self.future.done()
            batch = []
            while not self.events.empty():
                batch.append(self.events.get())
            yield batch
            if finished:
                return
            time.sleep(poll_s)

    def result(self) -> Any:
        """The engine call's return value (or its exception), once it has ended."""
        return self.future.result()

    @property
    def own_s(self) -> float:
        """Seconds since the model thread took the job up, less those it spent on other
        sessions' work inside it."""
        return time.monotonic() - self.began - self.yielded_s

    def waited(self) -> str:
        """' (and N s more while other sessions' model work ran)', or '' under a second."""
        return (f" (and {self.yielded_s:.0f} s more while other sessions' model work ran)"
                if self.yielded_s >= 1 else "")


class Runner:
    """A tab's long jobs: at most one at a time per process when ``one_at_a_time`` (a Bench
    set or a tune runs for minutes), each session's job by its session for Cancel, and the
    tab's run folders under ``runs_dir`` (the newest ``keep`` kept)."""

    def __init__(self, what: str, *, one_at_a_time: bool, runs_dir: Path | None = None,
                 keep: int = 10) -> None:
        self.what = what  # "a benchmark": the busy and cancel messages say it
        self.runs_dir, self.keep = runs_dir, keep
        self._busy = threading.Lock() if one_at_a_time else None
        self._jobs: dict[str, Job] = {}  # session -> its job running now
        self._lock = threading.Lock()

    @contextmanager
    def session(self, request: Any = None, max_seconds: float | None = None
                ) -> Iterator[Job]:
        """A job for this request's session, refused in one line while another job of this
        runner runs (one at a time); on the way out (the end, an error, a client that left)
        the job is told to stop and the runner is free once it has stopped."""
        if self._busy is not None and not self._busy.acquire(blocking=False):
            raise ConfigError(f"{self.what} is running in this app; try again when it ends")
        key = _session_key(request)
        job = Job(max_seconds)
        with self._lock:
            self._jobs[key] = job
        try:
            yield job
        finally:
            job.stop.set()
            with self._lock:
                if self._jobs.get(key) is job:
                    del self._jobs[key]
            self._let_go(job)

    def _let_go(self, job: Job) -> None:
        """One of the job's holders is done with it; the last one frees the runner."""
        with self._lock:
            job.holders -= 1
            last = job.holders == 0
        if last and self._busy is not None:
            self._busy.release()

    def start(self, job: Job, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """Run ``fn(*args, progress=job.progress, **kwargs)`` on the model thread as one unit
        that lets other jobs in at its pause points (module docstring)."""
        with self._lock:
            job.holders += 1
        job.future = WORKER.submit(self._paced, job, fn, args, kwargs)

    def cancel(self, request: Any = None) -> bool:
        """Stop this session's job after its current run; whether it had one."""
        with self._lock:
            job = self._jobs.get(_session_key(request))
        if job is None:
            return False
        job.stop.set()
        return True

    def _paced(self, job: Job, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        """On the model thread: the engine call, the model thread's pause point its pacing
        hook; the runner let go before the caller sees the result."""
        job.began = time.monotonic()
        try:
            with between_rounds(lambda: WORKER.pause_point()) as block:
                try:
                    return fn(*args, progress=job.progress, **kwargs)
                finally:
                    job.yielded_s = block.yielded_s
        finally:
            self._let_go(job)

    def run_dir(self, prefix: str) -> Path:
        """A new folder for a job's files under ``runs_dir``, the oldest beyond ``keep``
        removed."""
        self.runs_dir.mkdir(parents=True, exist_ok=True)
        old = sorted(self.runs_dir.iterdir(), key=lambda p: p.stat().st_mtime)
        for stale in old[: max(0, len(old) - self.keep + 1)]:
            shutil.rmtree(stale, ignore_errors=True)
        return Path(tempfile.mkdtemp(prefix=prefix, dir=self.runs_dir))


def _session_key(request: Any) -> str:
    return getattr(request, "session_hash", None) or "local"
