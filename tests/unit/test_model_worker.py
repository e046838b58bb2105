"""The app's model thread (specviz.worker.ModelWorker): jobs take turns a unit at a time, a long
job of one unit lets the others in at its pause points, results, exceptions and cancellation
reach their callers, and a call from the model thread runs at once. Ordering only: every
test holds the thread with events, or drives it with a fake clock, never with wall time."""

from __future__ import annotations

import contextvars
import queue
import threading
from concurrent.futures import CancelledError

import pytest

from engine import settle
from specviz import streaming
from specviz.worker import ModelWorker
from tests.ui.helpers import TINY

WAIT_S = 30  # a hang guard only: every wait below ends as soon as the thread gets there


def _steps(log: list, name: str, n: int, result=None):
    """A step job of n units, each logged as name + its index."""
    for i in range(n):
        log.append(f"{name}{i}")
        yield
    return result if result is not None else name


def _hold(worker: ModelWorker) -> threading.Event:
    """Hold the model thread until the returned event is set (jobs submitted meanwhile queue)."""
    release, held = threading.Event(), threading.Event()

    def hold():
        held.set()
        release.wait(WAIT_S)

    worker.submit(hold)
    assert held.wait(WAIT_S)
    return release


def test_two_step_jobs_take_turns_one_unit_at_a_time():
    w, log = ModelWorker(), []
    release = _hold(w)
    a = w.submit_steps(_steps(log, "a", 3))
    b = w.submit_steps(_steps(log, "b", 3))
    release.set()
    assert (a.result(WAIT_S), b.result(WAIT_S)) == ("a", "b")
    assert log == ["a0", "b0", "a1", "b1", "a2", "b2"]


def test_a_call_made_while_a_long_step_job_runs_starts_after_at_most_one_unit():
    w, log = ModelWorker(), []
    inside, go = threading.Event(), threading.Event()

    def long_job():
        log.append("long0")
        inside.set()
        go.wait(WAIT_S)  # the call below is submitted while this unit runs
        yield
        for i in range(1, 50):
            log.append(f"long{i}")
            yield
        return "long"

    job = w.submit_steps(long_job())
    assert inside.wait(WAIT_S)
    call = w.submit(lambda: log.append("call") or "called")
    go.set()
    assert call.result(WAIT_S) == "called" and job.result(WAIT_S) == "long"
    assert log[:3] == ["long0", "call", "long1"] and len(log) == 51


def test_a_pause_point_runs_the_other_jobs_units_and_none_of_its_own():
    w, log = ModelWorker(), []
    inside, go = threading.Event(), threading.Event()

    def pausing_steps():
        log.append("p0 start")
        inside.set()
        go.wait(WAIT_S)
        w.pause_point()  # its own next unit must not run here (the generator is running)
        log.append("p0 end")
        yield
        log.append("p1")
        return "p"

    job = w.submit_steps(pausing_steps())
    assert inside.wait(WAIT_S)
    a = w.submit_steps(_steps(log, "a", 2))
    b = w.submit_steps(_steps(log, "b", 2))
    go.set()
    assert [f.result(WAIT_S) for f in (job, a, b)] == ["p", "a", "b"]
    paused = log[1:log.index("p0 end")]
    assert paused[:2] == ["a0", "b0"] and not any(x.startswith("p") for x in paused)
    assert log.index("p1") > log.index("p0 end")


def test_a_pause_gives_the_others_about_as_long_as_the_caller_ran():
    now = [0.0]
    w, log = ModelWorker(clock=lambda: now[0]), []
    inside, go = threading.Event(), threading.Event()

    def other():  # units of 1 s each
        for i in range(100):
            now[0] += 1.0
            log.append(i)
            yield

    def long_job():  # ran 10 s, pauses, then ends
        inside.set()
        go.wait(WAIT_S)
        now[0] += 10.0
        w.pause_point()
        return len(log)

    job = w.submit(long_job)
    assert inside.wait(WAIT_S)
    rest = w.submit_steps(other())
    go.set()
    assert job.result(WAIT_S) == 10  # 10 units of 1 s, then the caller's turn again
    rest.result(WAIT_S)


def test_a_pause_with_nothing_waiting_returns_at_once_and_is_for_the_model_thread_only():
    w = ModelWorker()
    assert w.call(lambda: w.pause_point() or "back") == "back"
    with pytest.raises(RuntimeError, match="model thread"):
        w.pause_point()


def test_exceptions_reach_their_own_caller_and_the_thread_keeps_serving():
    w, log = ModelWorker(), []

    def failing_steps():
        log.append("f0")
        yield
        raise ValueError("boom in unit 2")

    def pauses_over_a_failure():
        w.pause_point()
        return "unharmed"

    release = _hold(w)
    failing = w.submit_steps(failing_steps())
    plain = w.submit(lambda: 1 / 0)
    pauser = w.submit(pauses_over_a_failure)
    release.set()
    with pytest.raises(ValueError, match="boom in unit 2"):
        failing.result(WAIT_S)
    with pytest.raises(ZeroDivisionError):
        plain.result(WAIT_S)
    assert pauser.result(WAIT_S) == "unharmed"
    assert w.call(lambda: "still serving") == "still serving"


def test_a_job_cancelled_before_its_first_unit_never_runs():
    w, log = ModelWorker(), []
    release = _hold(w)
    job = w.submit_steps(_steps(log, "x", 2))
    assert job.cancel()
    release.set()
    assert w.call(lambda: "after") == "after"
    with pytest.raises(CancelledError):
        job.result(WAIT_S)
    assert log == []


def test_a_call_from_the_model_thread_runs_at_once():
    w, log = ModelWorker(), []

    def nested():
        here = threading.get_ident()
        inner = w.call(lambda: threading.get_ident())
        steps = w.call_steps(_steps(log, "s", 3, result="done"))
        return here == inner == w.thread.ident, steps

    assert w.call(nested) == (True, "done")
    assert log == ["s0", "s1", "s2"]
    assert w.call_steps(_steps(log, "t", 2)) == "t" and log[-2:] == ["t0", "t1"]


def test_a_cancelled_decode_stops_after_its_current_round():
    """streaming.produce as a step job on a tiny model: cancel seen in the job's next turn."""
    w = ModelWorker()
    run = w.call(streaming.start_run, TINY, "", "hello world",
                 settle("greedy", {"max_new_tokens": 40}))
    out: queue.SimpleQueue = queue.SimpleQueue()
    cancel, go = threading.Event(), threading.Event()
    release = _hold(w)
    job = w.submit_steps(streaming.produce(lambda: run, out, cancel))
    w.submit(go.wait, WAIT_S)  # the decode's second round waits for this turn
    release.set()
    first = out.get(timeout=WAIT_S)
    assert len(first.rounds) == 1 and not first.final
    cancel.set()
    go.set()
    job.result(WAIT_S)
    items = [out.get(timeout=WAIT_S) for _ in range(2)]
    assert items[0].final and items[1] is streaming.DONE
    assert len(run.trace().rounds) == 2  # the round in progress, then stop
    assert run.done and run.stop_reason == "cancelled"


def test_a_unit_run_in_a_pause_point_never_sees_the_callers_context():
    """A long job's engine pacing hook lives in its context (a context variable): the units
    the model thread runs inside its pause point, each in a context of its own, do not see it."""
    w, seen = ModelWorker(), []
    mark: contextvars.ContextVar[str] = contextvars.ContextVar("mark", default="none")
    inside, go = threading.Event(), threading.Event()

    def long_job():
        mark.set("long job's")
        inside.set()
        go.wait(WAIT_S)
        w.pause_point()
        return mark.get()

    def other():
        seen.append(mark.get())
        yield
        seen.append(mark.get())

    job = w.submit(long_job)
    assert inside.wait(WAIT_S)
    rest = w.submit_steps(other())
    go.set()
    assert job.result(WAIT_S) == "long job's"
    rest.result(WAIT_S)
    assert seen == ["none", "none"]


def test_the_worker_is_idle_only_with_no_unit_running_none_ready_and_no_handler_in_flight():
    """``idle`` is what the compile warm-up waits for (specviz.warmup)."""
    worker = ModelWorker()
    assert worker.idle.wait(WAIT_S) and not worker.busy
    release = _hold(worker)
    assert worker.busy  # a unit runs
    queued = worker.submit(lambda: None)
    release.set()
    queued.result(WAIT_S)
    assert worker.idle.wait(WAIT_S)
    with worker.serving():
        assert worker.busy  # a page handler in flight
        worker.call(lambda: None)
        assert worker.busy  # the model thread is idle, the handler is not done
    assert worker.idle.is_set()


class _FailingRun:
    """A run whose round ``fail_at`` fails (an engine error mid-run) once ``seen`` is set
    (the handler has taken every round before it); its head counts the rounds it completed."""

    done, own_thread = False, False

    def __init__(self, fail_at: int, seen: threading.Event) -> None:
        self.completed, self.fail_at, self.seen = 0, fail_at, seen

    def __iter__(self):
        return self

    def __next__(self):
        if self.completed == self.fail_at:
            assert self.seen.wait(WAIT_S)
            raise RuntimeError("out of memory")
        self.completed += 1
        return type("Round", (), {"index": self.completed - 1, "nodes": ()})()

    def trace(self, with_rounds: bool = True):
        return type("Head", (), {"rounds_done": self.completed})()

    def cancel(self) -> None:
        pass


def test_a_run_that_fails_mid_way_hands_the_head_of_every_round_it_handed_out(monkeypatch):
    """Heads come at most every HEAD_EVERY_S, so the last one before a failure can count fewer
    rounds than the UI keeps (its summary and exports then contradict their own rounds): the
    failure first hands the head of the rounds so far, then the error."""
    seen = threading.Event()  # the failure waits until the handler holds the 3 rounds, so
    # its head comes in an update of its own
    monkeypatch.setattr(streaming, "start_run", lambda *a: _FailingRun(3, seen))
    got = []
    with pytest.raises(RuntimeError, match="out of memory"):
        for update in streaming.decode_stream(TINY, "", "hi", settle("greedy")):
            got.append(update)
            if sum(len(u.rounds) for u in got) == 3:
                seen.set()
    assert sum(len(u.rounds) for u in got) == 3
    heads = [u.head for u in got if u.head is not None]
    assert heads and heads[-1].rounds_done == 3 and not any(u.final for u in got)


def test_a_run_that_fails_in_its_first_round_hands_no_head(monkeypatch):
    """Nothing was handed out: no head of an empty run replaces what the page showed, only
    the error."""
    seen = threading.Event()
    seen.set()
    monkeypatch.setattr(streaming, "start_run", lambda *a: _FailingRun(0, seen))
    got = []
    with pytest.raises(RuntimeError, match="out of memory"):
        for update in streaming.decode_stream(TINY, "", "hi", settle("greedy")):
            got.append(update)
    assert got == []
