"""The Bench, Tune and Check tabs' job runner (specviz.jobs): one job at a time where the tab
says so, until the model thread has left it; a cancel reaches its own session's job only; the
progress events reach the handler; the pause points between rounds and runs let other jobs
in, and the job's own time leaves that work out. Ordering, never wall time, except where the
time other work took is the thing measured."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import gradio as gr
import pytest

from engine.core.errors import ConfigError
from engine.run.pacing import pause
from specviz.jobs import Runner
from specviz.worker import WORKER

WAIT_S = 30  # a hang guard only


def _request(session: str):
    return SimpleNamespace(session_hash=session)


def _engine_call(go: threading.Event, progress, cancelled=lambda: False, runs: int = 3):
    """A stand-in for run_set: runs (each waiting for go), a progress report after each; a
    cancel seen before each run."""
    for i in range(runs):
        go.wait(WAIT_S)
        if cancelled():
            return f"cancelled after {i}"
        pause()  # a round's end
        progress(i + 1, runs)
    return "done"


def test_a_one_at_a_time_runner_refuses_a_second_job_until_the_model_thread_left_the_first():
    runner, go = Runner("a benchmark", one_at_a_time=True), threading.Event()
    with runner.session(_request("a")) as job:
        runner.start(job, _engine_call, go, cancelled=job.cancelled)
    # the handler has gone (a client that left): its job is told to stop, but still runs
    with pytest.raises(ConfigError, match="^a benchmark is running in this app; try again"):
        with runner.session(_request("b")):
            pass
    go.set()
    assert job.result() == "cancelled after 0"
    with runner.session(_request("b")) as again:  # free once the job has ended
        assert not again.stop.is_set()


def test_cancel_stops_its_own_sessions_job_only():
    runner, go = Runner("a check", one_at_a_time=False), threading.Event()
    with runner.session(_request("a")) as mine, runner.session(_request("b")) as theirs:
        runner.start(mine, _engine_call, go, cancelled=mine.cancelled)
        runner.start(theirs, _engine_call, go, cancelled=theirs.cancelled)
        assert runner.cancel(_request("a")) and not runner.cancel(_request("nobody"))
        go.set()
        assert mine.result() == "cancelled after 0" and theirs.result() == "done"


def test_follow_hands_every_progress_event_over_and_ends_with_the_job():
    runner, go = Runner("a tune", one_at_a_time=True), threading.Event()
    with runner.session() as job:
        runner.start(job, _engine_call, go)
        seen, batches = [], 0
        for batch in job.follow(0.01):
            batches += 1
            seen += batch
            go.set()
        assert seen == [(1, 3), (2, 3), (3, 3)] and batches >= 2 and job.result() == "done"


def test_the_time_other_jobs_take_inside_a_job_is_counted_apart():
    runner, go, nap = Runner("a check", one_at_a_time=False), threading.Event(), 0.2
    inside = threading.Event()

    def first_round_then_wait(progress):
        inside.set()
        go.wait(WAIT_S)
        pause()  # the other job's unit runs here
        return "mine"

    with runner.session() as job:
        runner.start(job, first_round_then_wait)
        assert inside.wait(WAIT_S)
        other = WORKER.submit(time.sleep, nap)
        go.set()
        assert job.result() == "mine" and other.result(WAIT_S) is None
    assert job.yielded_s >= nap
    assert job.own_s >= 0 and job.waited() == ""  # under a second: not worth a word


def test_a_job_error_reaches_its_handler_as_one_line():
    runner = Runner("a check", one_at_a_time=True)

    def failing(progress):
        raise ConfigError("bad prompt set")

    with runner.session() as job:
        runner.start(job, failing)
        with pytest.raises(ConfigError, match="bad prompt set"):
            list(job.follow(0.01)) and job.result()
    with runner.session():  # and the runner is free again
        pass


def test_the_busy_line_is_a_gradio_error_of_one_line_in_a_handler():
    from specviz.callbacks import guarded

    runner = Runner("a tune", one_at_a_time=True)

    @guarded
    def handler():
        with runner.session():
            yield "started"

    with runner.session():
        with pytest.raises(gr.Error, match="a tune is running in this app; try again") as err:
            list(handler())
    assert "\n" not in str(err.value)
