"""Sessions share the model thread (specviz.worker.ModelWorker): while session A runs a Bench
set, a tune, a check or a long decode, session B's Run gets its first round before A's run
in progress has finished (a check's or a decode's: between two of its rounds; a Bench set's or
a tune's: between the run and its reference generate(), each timed whole), finishes first,
and streams the same tokens as alone. Every round of every engine run is logged on the model
thread itself, so the tests assert orders, never durations; A is held inside one of its runs
until B's decode has reached the model thread, so B always arrives while that run is
mid-way."""

from __future__ import annotations

import threading

import pytest
from gradio_client import Client

from engine.bench import interleaved
from engine.run.api import Run
from specviz import streaming
from specviz.render import OUTPUTS
from specviz.worker import WORKER
from tests.ui.helpers import TINY

pytestmark = [pytest.mark.ui, pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore:.*(downcasting|copy keyword).*")]
WAIT_S = 60  # a hang guard only
B = dict(prompt="session b: tell me about the number 7", method="sd", target=TINY, draft="",
         p_gamma=2, p_temperature=1.0, p_seed=7, p_max_new_tokens=12)
A_TOKENS = 32  # A's runs held mid-way are those of this many new tokens (not warm-ups)


def _generated(out) -> list[str]:
    v = dict(zip(OUTPUTS, out))
    return [s["token"] for s in v["text"] if s["class_or_confidence"] != "prompt"]


class Recorder:
    """What the model thread did, in order: ("round", run) per round of every engine run (B's
    run is "b", another the id of its Run), ("end", "b") when B's run ends, ("reference",)
    when a benchmark's reference generate() starts. A's first run of A_TOKENS new tokens (a
    long decode: its third round) is held until B's decode (its start, then its rounds: one
    job) is queued, so B arrives while that run is mid-way."""

    def __init__(self, monkeypatch, hold: str = "long job") -> None:
        self.log: list[tuple] = []
        self._hold = self._hold_long_job if hold == "long job" else self._hold_decode
        self.held = threading.Event()  # A is held mid-run: submit B now
        self.arrived = threading.Event()  # B's decode is queued for the model thread
        self._held_run: int | None = None
        self._held_ref: Run | None = None
        self._b_jobs: set[int] = set()
        step, reference = Run.__next__, interleaved.run_reference
        submit_steps, produce = WORKER.submit_steps, streaming.produce

        def logged_next(run):
            mine = run.prompt == B["prompt"]
            if not mine:
                self._hold(run)
            r = step(run)  # the round, then the pacing hook: others' rounds come in there
            self.log.append(("round", "b" if mine else id(run)))
            if mine and run.done:
                self.log.append(("end", "b"))
            return r

        def logged_reference(*args):
            self.log.append(("reference",))
            return reference(*args)

        def noting_produce(start, out, cancel):  # (B's is the only decode meanwhile)
            steps = produce(start, out, cancel)
            self._b_jobs.add(id(steps))
            return steps

        def noting_submit_steps(steps):
            job = submit_steps(steps)
            if id(steps) in self._b_jobs:
                self.arrived.set()
            return job

        monkeypatch.setattr(Run, "__next__", logged_next)
        monkeypatch.setattr(interleaved, "run_reference", logged_reference)
        monkeypatch.setattr(WORKER, "submit_steps", noting_submit_steps)
        monkeypatch.setattr(streaming, "produce", noting_produce)

    def _hold_long_job(self, run) -> None:
        """On the model thread, before one of A's rounds: hold A's first long run at its
        second round until B's decode is queued."""
        if self._held_run is None and run.params.get("max_new_tokens") == A_TOKENS:
            self._held_run = id(run)
            self._held_ref = run  # kept alive: a later run must not reuse its id in the log
        if id(run) == self._held_run and run.rounds == 1:
            self.held.set()
            assert self.arrived.wait(WAIT_S)

    def _hold_decode(self, run) -> None:
        """A long decode steps one round a unit: hold its third round until B's decode is
        queued (the rest comes in turns)."""
        if run.rounds == 2 and not self.held.is_set():
            self.held.set()
            assert self.arrived.wait(WAIT_S)

    def _b_ended_before_a(self) -> None:
        end_b = self.log.index(("end", "b"))
        last_a = max(i for i, e in enumerate(self.log) if e[0] == "round" and e[1] != "b")
        assert end_b < last_a, self.log

    def assert_b_came_mid_run(self) -> None:
        """B's first round lies between two rounds of A's held run, and B ended before A's
        last round."""
        first_b = self.log.index(("round", "b"))
        held = [i for i, e in enumerate(self.log) if e == ("round", self._held_run)]
        assert held and held[0] < first_b < held[-1], self.log
        self._b_ended_before_a()

    def assert_b_came_between_the_timed_segments(self) -> None:
        """A benchmark's run and its reference are each timed whole: B's first round lies
        after the held run's last round and before that run's reference generate() starts,
        so before the benchmark's run in progress (the pair) has finished."""
        first_b = self.log.index(("round", "b"))
        held = [i for i, e in enumerate(self.log) if e == ("round", self._held_run)]
        reference = next(i for i, e in enumerate(self.log) if e == ("reference",)
                         and i > held[-1])
        assert held[-1] < first_b < reference, self.log
        self._b_ended_before_a()


def _submit_b_when_a_is_held(client: Client, rec: Recorder):
    assert rec.held.wait(WAIT_S)
    return client.submit(**B, api_name="/run")


BENCH = dict(set_name="specbench_mini.jsonl", upload=None, methods=["sd"], categories="chat",
             limit=2, max_new_tokens=A_TOKENS, target=TINY, draft="", api_name="/bench")
TUNE = dict(set_name="specbench_mini.jsonl", upload=None, tune_methods=["sd"], minutes=0.1,
            max_new_tokens=A_TOKENS, target=TINY, draft="", api_name="/tune")
CHECK = dict(prompt="session a: check me", method="sd", params_text="gamma=2",
             temperature=0.0, top_k=0, top_p=1.0, max_new_tokens=A_TOKENS, target=TINY,
             draft="", max_seconds=60, api_name="/check")
DONE = {"/bench": "done: 2 / 2 runs", "/tune": "done: ", "/check": "✅ **PASS**"}


@pytest.mark.parametrize("job,where", [(BENCH, "between the timed segments"),
                                       (TUNE, "between the timed segments"),
                                       (CHECK, "mid-run")], ids=["bench", "tune", "check"])
def test_a_run_made_during_a_long_job_gets_its_first_round_before_the_run_in_progress_ends(
        app_url, monkeypatch, job, where):
    """A check lets others in between its runs' rounds; a Bench set and a tune between their
    timed segments (a run, its reference generate()), each timed whole."""
    a, b = Client(app_url, verbose=False), Client(app_url, verbose=False)
    alone = _generated(b.predict(**B, api_name="/run"))
    rec = Recorder(monkeypatch)
    long_job = a.submit(**job)
    run = _submit_b_when_a_is_held(b, rec)
    assert _generated(run.result(WAIT_S)) == alone
    assert long_job.result(WAIT_S)[0].startswith(DONE[job["api_name"]])
    if where == "mid-run":
        rec.assert_b_came_mid_run()
    else:
        rec.assert_b_came_between_the_timed_segments()


def test_a_short_run_made_during_a_long_decode_finishes_first_with_its_tokens_as_alone(
        app_url, monkeypatch):
    a, b = Client(app_url, verbose=False), Client(app_url, verbose=False)
    alone = _generated(b.predict(**B, api_name="/run"))
    long_run = dict(prompt="session a: a long greedy run", method="sd", target=TINY, draft="",
                    p_gamma=2, p_temperature=0.0, p_max_new_tokens=200)
    natural = _generated(a.predict(**long_run, api_name="/run"))
    rec = Recorder(monkeypatch, hold="decode")
    first = a.submit(**long_run, api_name="/run")
    run = _submit_b_when_a_is_held(b, rec)
    assert _generated(run.result(WAIT_S)) == alone
    assert _generated(first.result(WAIT_S)) == natural
    a_rounds = [i for i, e in enumerate(rec.log) if e[0] == "round" and e[1] != "b"]
    b_rounds = [i for i, e in enumerate(rec.log) if e == ("round", "b")]
    end_b = rec.log.index(("end", "b"))
    assert len(a_rounds) >= 40 and len(b_rounds) >= 3, rec.log
    assert a_rounds[0] < b_rounds[0] < end_b < a_rounds[-1]  # B came mid-way, ended first
    assert any(b_rounds[0] < i < end_b for i in a_rounds)  # and they took turns
