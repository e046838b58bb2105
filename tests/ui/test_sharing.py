"""Sessions share the model thread (specviz.worker.ModelWorker): while session A runs a Bench
set or a long decode, session B's Run starts, finishes first, and streams the same tokens as
alone. The order of events is logged on the model thread itself, so the tests assert orders,
never durations; A is held at one of its pause points until B's request has reached the
server, so B always arrives while A is mid-way."""

from __future__ import annotations

import threading
import time

import pytest
from gradio_client import Client
from gradio_client.client import Job

from specviz import bench_tab, streaming
from specviz.render import OUTPUTS
from specviz.worker import WORKER
from tests.ui.helpers import TINY

pytestmark = [pytest.mark.ui, pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore:.*(downcasting|copy keyword).*")]
WAIT_S = 60  # a hang guard only
B = dict(prompt="session b: tell me about the number 7", method="sd", target=TINY, draft="",
         p_gamma=2, p_temperature=1.0, p_seed=7, p_max_new_tokens=12)


def _generated(out) -> list[str]:
    v = dict(zip(OUTPUTS, out))
    return [s["token"] for s in v["text"] if s["class_or_confidence"] != "prompt"]


class Recorder:
    """What the model thread did, in order: ("round", prompt) per decoded round, ("end",
    prompt) when a decode ends, ("row", n) per Bench row; ``arrived`` is set once B's Run
    has queued its first job for the model thread (its handler's, off the model thread)."""

    def __init__(self, monkeypatch) -> None:
        self.log: list[tuple] = []
        self.arrived = threading.Event()
        self.prompts: dict[int, str] = {}
        start, updates, submit = streaming.start_run, streaming.updates, WORKER.submit

        def tagged_start(target, draft, prompt, *a, **k):
            run = start(target, draft, prompt, *a, **k)
            self.prompts[id(run)] = prompt
            return run

        def logged_updates(run, cancel=None):
            prompt = self.prompts.get(id(run))
            for update in updates(run, cancel):
                self.log += [("round", prompt)] * len(update.rounds)
                yield update
            self.log.append(("end", prompt))

        def noting_submit(fn, *args, **kwargs):
            job = submit(fn, *args, **kwargs)
            if fn is tagged_start and args[2] == B["prompt"]:
                self.arrived.set()
            return job

        monkeypatch.setattr(streaming, "start_run", tagged_start)
        monkeypatch.setattr(streaming, "updates", logged_updates)
        monkeypatch.setattr(WORKER, "submit", noting_submit)

    def wait_for_b(self) -> None:
        """On the model thread, inside a unit of A: hold A until B's first job is queued."""
        assert self.arrived.wait(WAIT_S)

    def index(self, entry: tuple) -> int:
        return self.log.index(entry)


def _submit_b_when_a_is_mid_way(client: Client, a_started) -> Job:
    while not a_started():
        time.sleep(0.01)
    return client.submit(**B, api_name="/run")


def test_a_run_made_during_a_bench_set_finishes_first_with_its_tokens_as_alone(app_url,
                                                                               monkeypatch):
    a, b = Client(app_url, verbose=False), Client(app_url, verbose=False)
    alone = _generated(b.predict(**B, api_name="/run"))
    rec = Recorder(monkeypatch)
    real_run_set = bench_tab.run_set

    def logged_run_set(pair, plan, out_dir, progress=None, cancelled=None):
        def report(done, total, row):
            if row is not None:
                rec.log.append(("row", done))
                if done == 1:
                    rec.wait_for_b()
            progress(done, total, row)  # the tab's: its rows, then the pause point

        return real_run_set(pair, plan, out_dir, progress=report, cancelled=cancelled)

    monkeypatch.setattr(bench_tab, "run_set", logged_run_set)
    bench = a.submit(set_name="specbench_mini.jsonl", upload=None, methods=["sd"],
                     categories="chat", limit=6, max_new_tokens=32, target=TINY, draft="",
                     api_name="/bench")
    run = _submit_b_when_a_is_mid_way(b, lambda: ("row", 1) in rec.log)
    assert _generated(run.result(WAIT_S)) == alone
    assert bench.result(WAIT_S)[0].startswith("done: 6 / 6 runs")
    rows = [i for i, e in enumerate(rec.log) if e[0] == "row"]
    end_b = rec.index(("end", B["prompt"]))
    assert rows[0] < rec.index(("round", B["prompt"])) < end_b < rows[-1], rec.log


def test_a_short_run_made_during_a_long_decode_finishes_first_with_its_tokens_as_alone(
        app_url, monkeypatch):
    a, b = Client(app_url, verbose=False), Client(app_url, verbose=False)
    alone = _generated(b.predict(**B, api_name="/run"))
    long_run = dict(prompt="session a: a long greedy run", method="sd", target=TINY, draft="",
                    p_gamma=2, p_temperature=0.0, p_max_new_tokens=200)
    natural = _generated(a.predict(**long_run, api_name="/run"))
    rec = Recorder(monkeypatch)
    real_updates = streaming.updates

    def held_updates(run, cancel=None):  # A waits for B at its third round
        for k, update in enumerate(real_updates(run, cancel)):
            if k == 2 and rec.prompts.get(id(run)) == long_run["prompt"]:
                rec.wait_for_b()
            yield update

    monkeypatch.setattr(streaming, "updates", held_updates)
    first = a.submit(**long_run, api_name="/run")
    run = _submit_b_when_a_is_mid_way(b, lambda: ("round", long_run["prompt"]) in rec.log)
    assert _generated(run.result(WAIT_S)) == alone
    assert _generated(first.result(WAIT_S)) == natural
    a_rounds = [i for i, e in enumerate(rec.log) if e == ("round", long_run["prompt"])]
    b_rounds = [i for i, e in enumerate(rec.log) if e == ("round", B["prompt"])]
    end_b, end_a = rec.index(("end", B["prompt"])), rec.index(("end", long_run["prompt"]))
    assert len(a_rounds) >= 40 and len(b_rounds) >= 3, rec.log
    assert a_rounds[0] < b_rounds[0] < end_b < end_a  # B started mid-way through A, ended first
    assert any(b_rounds[0] < i < end_b for i in a_rounds)  # and they took turns
