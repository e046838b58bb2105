"""Load on the app (tiny model pair, in-process server): 8 concurrent sessions each run and
step through their own trace, the queue tells a waiting client its place, a client that
leaves mid-run frees the model slot, and the server's memory stays flat over repeated runs.
The README's "Bad input and load" figures come from here (run with -s to see them)."""

from __future__ import annotations

import gc
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from gradio_client import Client, handle_file
from gradio_client.utils import Status

from specviz import streaming
from specviz.render import OUTPUTS
from specviz.state import DEMO_TRACE, HELD
from tests.ui.helpers import TINY

pytestmark = [pytest.mark.ui, pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore:.*(downcasting|copy keyword).*")]
SESSIONS = 8


def _views(out) -> dict:
    return dict(zip(OUTPUTS, out))


def _args(i: int, tokens: int = 16) -> dict:
    """Session i's run: its own prompt and seed, sampled, so outputs differ."""
    return dict(prompt=f"session {i}: tell me about the number {i}", method="sd", target=TINY,
                draft="", p_gamma=2, p_temperature=1.0, p_seed=i, p_max_new_tokens=tokens)


def _generated(v: dict) -> list[str]:
    return [s["token"] for s in v["text"] if s["class_or_confidence"] != "prompt"]


def _rounds(v: dict) -> int:
    return int(v["round_md"].split(" of ")[1].split()[0])


def _rss_mb() -> float:
    """Resident memory of this process (the server runs in it), from /proc."""
    with open("/proc/self/status") as f:
        kb = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return kb / 1024


def _clients(url: str, n: int) -> list[Client]:
    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(lambda _: Client(url, verbose=False), range(n)))


def _walk(client: Client, i: int, own: dict) -> None:
    """Step through this session's trace and check it is the session's own."""
    n = _rounds(own)
    assert _views(client.predict(api_name="/reset"))["round_md"].startswith(f"**Round 0** of {n}")
    for k in range(1, min(n, 3)):
        v = _views(client.predict(api_name="/step"))
        assert v["round_md"].startswith(f"**Round {k}** of {n}")
    v = _views(client.predict(n - 1, api_name="/seek"))
    assert _generated(v) == _generated(own) and v["run_md"] == own["run_md"]
    trace = json.loads(open(client.predict(api_name="/export")).read())
    assert trace["prompt"] == _args(i)["prompt"] and trace["params"]["seed"] == i


def test_eight_sessions_run_at_once_see_their_queue_place_and_only_their_own_trace(app_url):
    t0 = time.perf_counter()
    clients = _clients(app_url, SESSIONS)
    jobs = [c.submit(**_args(i), api_name="/run") for i, c in enumerate(clients)]
    seen: list[tuple] = []
    while not all(j.done() for j in jobs):
        seen += [(s.code, s.rank, s.queue_size) for s in (j.status() for j in jobs)]
        time.sleep(0.02)
    runs = [_views(j.result()) for j in jobs]
    ran = time.perf_counter() - t0
    queued = [(rank, size) for code, rank, size in seen if code == Status.IN_QUEUE]
    assert any(rank is not None and rank >= 1 and size >= 2 for rank, size in queued), seen[:20]
    assert all(" tokens in " in v["run_md"] and "running" not in v["run_md"] for v in runs)
    assert len({tuple(_generated(v)) for v in runs}) == SESSIONS  # every session its own text
    with ThreadPoolExecutor(SESSIONS) as pool:  # then all step through at once
        list(pool.map(lambda i: _walk(clients[i], i, runs[i]), range(SESSIONS)))
    print(f"\n[load] {SESSIONS} sessions: runs {ran:.1f} s, steps and exports "
          f"{time.perf_counter() - t0 - ran:.1f} s; max queue rank seen "
          f"{max(r for r, _ in queued if r is not None)}")


def test_bad_input_in_one_session_leaves_another_sessions_trace_alone(app_url, tmp_path):
    mine, other = _clients(app_url, 2)
    own = _views(mine.predict(**_args(0, tokens=8), api_name="/run"))
    bad = tmp_path / "bad.json"
    bad.write_text('{"rounds": "nope"}')
    for call in (lambda: other.predict(**{**_args(1), "p_gamma": 0}, api_name="/run"),
                 lambda: other.predict(handle_file(str(bad)), api_name="/import")):
        with pytest.raises(Exception):
            call()
    v = _views(mine.predict(api_name="/step"))
    assert v["run_md"] == own["run_md"] and _generated(v) == _generated(own)


def test_a_client_that_leaves_mid_run_frees_the_model_slot(app_url, monkeypatch):
    rounds: list[float] = []
    real = streaming.start_run

    def slow_start(*a, **k):
        run = real(*a, **k)
        step = type(run).__next__

        class Slow(type(run)):
            def __next__(self):
                time.sleep(0.1)  # the whole run would take natural x 0.1 s
                rounds.append(time.monotonic())
                return step(self)

        run.__class__ = Slow
        return run

    leaver, waiter = _clients(app_url, 2)
    long_run = {**_args(0, tokens=200), "p_temperature": 0.0}
    natural = _rounds(_views(leaver.predict(**long_run, api_name="/run")))
    assert natural >= 40  # unpatched, this run goes on long enough to be left mid-way
    monkeypatch.setattr(streaming, "start_run", slow_start)
    job = leaver.submit(**long_run, api_name="/run")
    while len(rounds) < 5:
        time.sleep(0.05)
    monkeypatch.setattr(streaming, "start_run", real)
    t0 = time.perf_counter()
    job.cancel()
    v = _views(waiter.predict(**_args(1, tokens=8), api_name="/run"))
    waited = time.perf_counter() - t0
    time.sleep(0.5)
    stopped = len(rounds)
    time.sleep(0.5)
    assert "8 tokens in" in v["run_md"]  # the slot was free for the next session
    assert len(rounds) == stopped < natural  # the left run stopped: no more rounds come
    print(f"\n[load] a run left after 5 of {natural} slow rounds stopped after {stopped}; "
          f"the next session's run finished {waited:.2f} s after the leave")


def test_memory_stays_flat_over_repeated_runs_imports_and_steps(app_url):
    clients = _clients(app_url, 4)

    def cycles(i: int, n: int) -> None:
        """Session i's n cycles, one after another: a session is one user, who waits for each
        answer (two threads on one Client race its event stream's close: gradio_client cancels
        an event submitted while the server closes the stream of the one before)."""
        c = clients[i]
        for k in range(i, i + n * len(clients), len(clients)):
            c.predict(**_args(k, tokens=24), api_name="/run")
            for _ in range(3):
                c.predict(api_name="/step")
            c.predict(api_name="/export")
            c.predict(handle_file(str(DEMO_TRACE)), api_name="/import")

    def soak(n: int) -> None:
        """n cycles of each of the 4 sessions, the sessions at once."""
        with ThreadPoolExecutor(len(clients)) as pool:
            list(pool.map(lambda i: cycles(i, n), range(len(clients))))

    soak(1)  # warm: every session holds a trace, caches and code paths are warm
    rss, t0 = [_rss_mb()], time.perf_counter()
    for _ in range(2):
        soak(2)
        gc.collect()
        rss.append(_rss_mb())
    soaked = time.perf_counter() - t0
    print(f"\n[load] soak: 2 x 8 cycles (run 24 tokens, 3 steps, export, import) in "
          f"{soaked:.1f} s; RSS {rss[0]:.0f} MB after warm-up, {rss[1]:.0f} MB, {rss[2]:.0f} MB; "
          f"{threading.active_count()} threads; trace budget {HELD.total:,} records")
    assert rss[2] - rss[0] < 40 and rss[2] - rss[1] < 20
