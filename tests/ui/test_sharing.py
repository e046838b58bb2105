"""Sessions share the model thread (specviz.worker.ModelWorker): while session A runs a Bench
set, a tune, a check or a long decode, session B's Run gets its first round in the middle of
A's run in progress (between two of its rounds, not after the run), finishes first, and
streams the same tokens as alone. Every round of every engine run is logged on the model
thread itself, so the tests assert orders, never durations; A is held inside one of its runs
until B's jobs have reached the model thread, so B always arrives while that run is mid-way."""

from __future__ import annotations

import threading

import pytest
from gradio_client import Client

from engine.run.api import Run
from specviz import streaming
from specviz.render import OUTPUTS
from specviz.worker import WORKER
from tests.ui.helpers import TINY

pytestmark = [pytest.mark.ui, pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore:.*(downcasting|copy keyword).*")]
WAIT_S = 60  # a hang guard only
HOLD_S = 10  # a guard too: B's handler queues its decode within milliseconds of its start
B = dict(prompt="session b: tell me about the number 7", method="sd", target=TINY, draft="",
         p_gamma=2, p_temperature=1.0, p_seed=7, p_max_new_tokens=12)
A_TOKENS = 32  # A's runs held mid-way are those of this many new tokens (not warm-ups)


def _generated(out) -> list[str]:
    v = dict(zip(OUTPUTS, out))
    return [s["token"] for s in v["text"] if s["class_or_confidence"] != "prompt"]


class Recorder:
    """What the model thread did, in order: ("round", run) per round of every engine run (B's
    run is "b", another the id of its Run), ("end", "b") when B's run ends. A long job's first
    run of A_TOKENS new tokens is held at its second round until B's first job (its start) is
    queued and at its third until B's decode is, so B's first round can come in the pause
    after that run's third round; a long decode is held at its third round until B's start
    is queued."""

    def __init__(self, monkeypatch, hold: str = "long job") -> None:
        self.log: list[tuple] = []
        self._hold = self._hold_long_job if hold == "long job" else self._hold_decode
        self.held = threading.Event()  # A is held mid-run: submit B now
        self.arrived, self.decoding = threading.Event(), threading.Event()
        self._held_run: int | None = None
        self._b_jobs: set[int] = set()
        step = Run.__next__
        submit, submit_steps, produce = WORKER.submit, WORKER.submit_steps, streaming.produce

        def logged_next(run):
            mine = run.prompt == B["prompt"]
            if not mine:
                self._hold(run)
            r = step(run)  # the round, then the pacing hook: others' rounds come in there
            self.log.append(("round", "b" if mine else id(run)))
            if mine and run.done:
                self.log.append(("end", "b"))
            return r

        def noting_submit(fn, *args, **kwargs):
            job = submit(fn, *args, **kwargs)
            if fn is streaming.start_run and args[2] == B["prompt"]:
                self.arrived.set()
            return job

        def noting_produce(run, out, cancel):
            steps = produce(run, out, cancel)
            if run.prompt == B["prompt"]:
                self._b_jobs.add(id(steps))
            return steps

        def noting_submit_steps(steps):
            job = submit_steps(steps)
            if id(steps) in self._b_jobs:
                self.decoding.set()
            return job

        monkeypatch.setattr(Run, "__next__", logged_next)
        monkeypatch.setattr(WORKER, "submit", noting_submit)
        monkeypatch.setattr(WORKER, "submit_steps", noting_submit_steps)
        monkeypatch.setattr(streaming, "produce", noting_produce)

    def _hold_long_job(self, run) -> None:
        """On the model thread, before one of A's rounds: hold A's first long run at its
        second round until B's start is queued, at its third until B's decode is."""
        if self._held_run is None and run.params.get("max_new_tokens") == A_TOKENS:
            self._held_run = id(run)
        if id(run) != self._held_run:
            return
        if run.rounds == 1:
            self.held.set()
            assert self.arrived.wait(WAIT_S)
        elif run.rounds == 2:  # (a model thread that lets no one in mid-run never gets
            self.decoding.wait(HOLD_S)  # B's start done: then B comes after this run)

    def _hold_decode(self, run) -> None:
        """A long decode steps one round a unit: hold its third round until B's start is
        queued (the rest comes in turns)."""
        if run.rounds == 2 and not self.held.is_set():
            self.held.set()
            assert self.arrived.wait(WAIT_S)

    def assert_b_came_mid_run(self) -> None:
        """B's first round lies between two rounds of A's held run, B ended before A's last
        round, and A's run kept its turns after B's first round."""
        first_b = self.log.index(("round", "b"))
        held = [i for i, e in enumerate(self.log) if e == ("round", self._held_run)]
        assert held and held[0] < first_b < held[-1], self.log
        end_b = self.log.index(("end", "b"))
        last_a = max(i for i, e in enumerate(self.log) if e[0] == "round" and e[1] != "b")
        assert end_b < last_a, self.log


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


@pytest.mark.parametrize("job", [BENCH, TUNE, CHECK], ids=["bench", "tune", "check"])
def test_a_run_made_during_a_long_job_gets_its_first_round_mid_run_with_its_tokens_as_alone(
        app_url, monkeypatch, job):
    a, b = Client(app_url, verbose=False), Client(app_url, verbose=False)
    alone = _generated(b.predict(**B, api_name="/run"))
    rec = Recorder(monkeypatch)
    long_job = a.submit(**job)
    run = _submit_b_when_a_is_held(b, rec)
    assert _generated(run.result(WAIT_S)) == alone
    assert long_job.result(WAIT_S)[0].startswith(DONE[job["api_name"]])
    rec.assert_b_came_mid_run()


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

