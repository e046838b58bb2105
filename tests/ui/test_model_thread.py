"""Model work in the app: one dedicated thread, no generate() inside a run, and a run that
fails mid-stream leaves the app usable."""

from __future__ import annotations

import threading

import pytest
import torch
from gradio_client.exceptions import AppError
from transformers import GenerationMixin

from engine.kernels import threads
from specviz import pairs, streaming, warmup
from specviz.render import OUTPUTS
from specviz.worker import WORKER
from tests.ui.helpers import TINY

pytestmark = [pytest.mark.ui, pytest.mark.filterwarnings("ignore::DeprecationWarning")]


def _run(client, **kw):
    args = dict(prompt="hello world", method="sd", target=TINY, draft="", p_gamma=3,
                p_max_new_tokens=12)
    args.update(kw)
    return dict(zip(OUTPUTS, client.predict(api_name="/run", **args)))


def test_every_model_call_of_run_and_compare_runs_on_the_one_model_thread(client):
    pair = pairs.get_pair(TINY)
    seen: set[int] = set()
    hooks = [m.register_forward_pre_hook(lambda *_: seen.add(threading.get_ident()))
             for m in (pair.target, pair.target.model)]
    try:
        _run(client, method="eesd")
        _run(client, method="mcsd")
        client.predict("hello world", ["sd"], 6, 0.0, 0, TINY, "", "", api_name="/compare")
    finally:
        for h in hooks:
            h.remove()
    assert seen == {WORKER.thread.ident}
    assert WORKER.threads == (threads.thread_count() or torch.get_num_threads())


def test_an_eesd_run_through_the_ui_never_calls_generate(client, monkeypatch):
    calls = []
    original = GenerationMixin.generate

    def counting(self, *a, **k):
        calls.append(1)
        return original(self, *a, **k)

    monkeypatch.setattr(GenerationMixin, "generate", counting)
    v = _run(client, method="eesd", p_max_new_tokens=16)
    assert v["run_md"].startswith("**eesd**") and "running" not in v["run_md"]
    assert calls == []


def test_a_run_that_fails_mid_stream_keeps_its_rounds_and_the_app_usable(client, monkeypatch):
    real = streaming.start_run

    def failing_start(*a, **k):
        run = real(*a, **k)
        step = type(run).__next__

        class Failing(type(run)):
            def __next__(self):
                if self.rounds >= 2:
                    raise RuntimeError("boom in round 2")
                return step(self)

        run.__class__ = Failing
        return run

    monkeypatch.setattr(streaming, "start_run", failing_start)
    job = client.submit(prompt="hello world", method="sd", target=TINY, draft="", p_gamma=3,
                        p_max_new_tokens=20, api_name="/run")
    with pytest.raises(AppError) as err:
        job.result()
    assert "boom in round 2" in str(err.value) and "\n" not in str(err.value)
    kept = dict(zip(OUTPUTS, job.outputs()[-1]))
    assert "in 2 rounds" in kept["run_md"] and "running" not in kept["run_md"]
    monkeypatch.setattr(streaming, "start_run", real)
    v = _run(client)  # the model thread is free again
    assert "12 tokens in" in v["run_md"]


def test_a_packed_pair_compiles_its_steps_on_a_thread_of_its_own_while_runs_go_on(
        monkeypatch):
    """The app's warm-up (warmup.warm_up): the common step shapes compile on their own
    thread, the model thread serves runs meanwhile (static steps, the same tokens), and the
    status line counts the shapes until the last, then says nothing."""
    import engine
    from engine.execution import cached_model, static_kv
    from engine.kernels.packed4 import quantize_linears
    from specviz import ui
    from tests.conftest import tiny_pair

    monkeypatch.delenv("SPECVIZ_KV", raising=False)
    monkeypatch.setattr(static_kv.POLICY, "packed", True)
    monkeypatch.setattr(cached_model, "WARM_WIDTHS", (1,))  # one row and one verify size
    monkeypatch.setattr(cached_model, "WARM_NODES", (0,))  # here: the prompt's step and the
    # one-token step, a greedy run's two (the others are tests/model/test_compiled_kv.py's:
    # each shape more is seconds of this test)
    pair = tiny_pair(layers=2, early_exit_layers=1, seed=3)
    quantize_linears(pair.target.model, 8)
    prompt = [3, 4, 5, 6, 3, 4, 5]
    want = WORKER.call(engine.generate, pair, prompt, "greedy", max_new_tokens=12)
    thread = warmup.warm_up(pair)
    assert thread is not None and warmup.WARMUP.total == 2 + 2  # the target, its early exit
    assert warmup.WARMUP.note().startswith("compiling step shapes in the background: ")
    assert ui._warm_note().startswith("⏳ compiling step shapes")  # the page's status line
    during = [WORKER.call(engine.generate, pair, prompt, "sd", max_new_tokens=12)
              for _ in range(2)]
    thread.join(timeout=300)
    assert not thread.is_alive() and warmup.WARMUP.done == 4 and warmup.WARMUP.note() == ""
    assert ui._warm_note() == ""  # nothing shown once every shape is made
    after = WORKER.call(engine.generate, pair, prompt, "greedy", max_new_tokens=12)
    assert after.stats.step_paths["target:compiled"] == len(after.rounds)
    for run in (*during, after):
        assert run.token_ids == want.token_ids


def test_pairs_loaded_close_together_compile_one_after_another_on_one_thread(monkeypatch):
    """Two warm-ups queued at once share the one warm-up thread (never two compiles at the
    same time) and the status line counts their shapes together."""
    import time as clock

    from specviz import warmup

    busy, overlap, made = [], [], []

    def fake_warming(runner):
        for i in range(runner):
            overlap.append(len(busy))
            busy.append(runner)
            clock.sleep(0.01)
            busy.pop()
            made.append((runner, i))
            yield i + 1

    monkeypatch.setattr(warmup, "warming", fake_warming)
    monkeypatch.setattr(warmup, "warm_shapes", lambda runner: runner)
    status = warmup.Warmup()
    first = status.add("a", [3])
    second = status.add("b", [2, 1])
    assert first is second and status.total == 6
    first.join(timeout=10)
    assert not first.is_alive() and status.done == 6 and status.note() == ""
    assert max(overlap) == 0 and [r for r, _ in made] == [3, 3, 3, 2, 2, 1]
    again = status.add("c", [1])  # idle again: a new thread, counted afresh
    again.join(timeout=10)
    assert again is not first and (status.done, status.total) == (1, 1)


def test_while_it_compiles_the_warm_up_shortens_the_gil_switch_interval_then_restores_it(
        monkeypatch):
    """Runs beside a compile take the GIL back within SWITCH_S, not Python's 5 ms (the
    convoy effect, specviz/warmup.py's docstring); idle, the process's interval is back."""
    import sys

    from specviz import warmup

    seen = []

    def fake_warming(runner):
        seen.append(sys.getswitchinterval())
        yield 1

    monkeypatch.setattr(warmup, "warming", fake_warming)
    monkeypatch.setattr(warmup, "warm_shapes", lambda runner: 1)
    before = sys.getswitchinterval()
    assert before > warmup.SWITCH_S
    status = warmup.Warmup()
    status.add("a", [1]).join(timeout=10)
    assert seen == [pytest.approx(warmup.SWITCH_S)]
    assert sys.getswitchinterval() == before


def test_serving_compiled_steps_leaves_one_core_to_runs(monkeypatch):
    """app.py's serve_compiled: packed targets go compiled, and inductor's compile workers
    take every usable core but one (runs are served beside the warm-up)."""
    import torch._inductor.config as inductor

    from engine.execution import static_kv
    from engine.kernels import qmm, threads
    from specviz import warmup

    monkeypatch.setattr(static_kv.POLICY, "packed", False)
    monkeypatch.setattr(threads, "usable_cores", lambda: 2)
    monkeypatch.setattr(qmm, "library", lambda: object())
    monkeypatch.setenv("CXX", "c++")
    saved = inductor.compile_threads  # not monkeypatch: its undo deletes a config entry,
    inductor.compile_threads = 8  # and every later compile of the process then fails
    try:
        assert warmup.serve_compiled()
        assert static_kv.POLICY.packed and inductor.compile_threads == 1
    finally:
        inductor.compile_threads = saved


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_warm_up_thread_that_dies_still_restores_the_switch_interval(monkeypatch):
    import sys

    from specviz import warmup

    def broken(runner):
        raise RuntimeError("compile failed")
        yield

    calls = []

    def shapes(runner):
        calls.append(runner)
        if len(calls) > 1:  # the count taken back in the except branch fails too
            raise RuntimeError("count failed")
        return 1

    monkeypatch.setattr(warmup, "warming", broken)
    monkeypatch.setattr(warmup, "warm_shapes", shapes)
    before = sys.getswitchinterval()
    warmup.Warmup().add("a", [1]).join(timeout=10)
    assert sys.getswitchinterval() == before


WAIT_S = 30  # a hang guard only: the waits below end as soon as the threads get there


def _until(condition) -> bool:
    """Poll ``condition`` until it holds (True) or WAIT_S pass (False)."""
    import time as clock

    end = clock.monotonic() + WAIT_S
    while not condition():
        if clock.monotonic() > end:
            return False
        clock.sleep(0.005)
    return True


def test_the_warm_up_compiles_only_while_the_model_thread_has_no_work(monkeypatch):
    """specviz.warmup: at any Python call made while the model thread has a unit running or
    ready, the warm-up waits (a run never shares the GIL with the compiler); it goes on once
    the model thread is idle, and the status line says it is paused meanwhile."""
    from specviz.worker import ModelWorker

    made = []

    def fake_warming(runner):
        for i in range(runner):
            made.append(i)
            yield i + 1

    monkeypatch.setattr(warmup, "warming", fake_warming)
    monkeypatch.setattr(warmup, "warm_shapes", lambda runner: runner)
    monkeypatch.setattr(warmup.qmm, "native_op", lambda: None)
    monkeypatch.setattr(warmup, "STALLED", -1.0)  # never "the others stall" (its own
    # test below; 0 is not enough: the two clock reads jitter by microseconds): the pause
    # does not depend on how the machine schedules this unit
    worker = ModelWorker()
    release, held = threading.Event(), threading.Event()
    worker.submit(lambda: (held.set(), release.wait(WAIT_S)))
    assert held.wait(WAIT_S) and worker.busy
    status = warmup.Warmup(worker)
    thread = status.add("a", [3])
    assert _until(lambda: status.pausing)
    import time as clock

    clock.sleep(4 * warmup.POLL_S)  # several of the pause's looks at the others' CPU
    assert made == [] and status.pausing and "paused while a run goes on" in status.note()
    release.set()
    thread.join(WAIT_S)
    assert made == [0, 1, 2] and not status.pausing and status.paused_s > 0
    assert not worker.busy


def test_a_warm_up_paused_while_holding_a_lock_the_app_waits_for_goes_on(monkeypatch):
    """The warm-up pauses at any Python call, so it may hold a lock a busy thread needs (an
    import's module lock, dynamo's compile lock): where the rest of the process then uses
    (almost) no CPU, the warm-up goes on for RESUME_S at a time. Here the model thread's
    unit waits for the warm-up (an event it sets, then a lock it holds while it makes its
    shapes): without the rule neither would ever end (both guarded by WAIT_S)."""
    from specviz.worker import ModelWorker

    lock, taken = threading.Lock(), threading.Event()
    worker = ModelWorker()
    release, held = threading.Event(), threading.Event()

    def fake_warming(runner):
        with lock:
            taken.set()
            release.set()  # the model thread's unit now waits for the lock ...
            for i in range(runner):
                held.wait(WAIT_S)  # ... and has tried to take it: a pause point
                yield i + 1

    def unit():
        held.set()
        release.wait(WAIT_S)
        return lock.acquire(timeout=WAIT_S)

    monkeypatch.setattr(warmup, "warming", fake_warming)
    monkeypatch.setattr(warmup, "warm_shapes", lambda runner: runner)
    monkeypatch.setattr(warmup.qmm, "native_op", lambda: None)
    status = warmup.Warmup(worker)
    got = worker.submit(unit)
    assert held.wait(WAIT_S)
    thread = status.add("a", [3])
    thread.join(WAIT_S)
    assert not thread.is_alive() and status.done == 3
    assert got.result(WAIT_S) is True


def test_while_the_warm_up_runs_the_model_thread_leaves_the_compiler_a_core(monkeypatch):
    """An OpenMP team as large as the machine beside the compiler waits at every barrier for
    the core the compiler holds: during the warm-up the model thread's units run on at most
    usable cores - 1 torch threads, and the count before is back after it."""
    from specviz.worker import ModelWorker

    caps = []

    def fake_warming(runner):
        caps.append(worker.thread_cap)
        yield 1

    monkeypatch.setattr(warmup, "warming", fake_warming)
    monkeypatch.setattr(warmup, "warm_shapes", lambda runner: 1)
    monkeypatch.setattr(warmup.qmm, "native_op", lambda: None)
    monkeypatch.setattr(threads, "usable_cores", lambda: 3)
    worker = ModelWorker()
    warmup.Warmup(worker).add("a", [1]).join(WAIT_S)
    assert caps == [2] and worker.thread_cap is None


def test_a_thread_cap_lowers_the_units_torch_threads_and_lifting_it_restores_them():
    from specviz.worker import ModelWorker

    worker = ModelWorker()
    worker.call(torch.set_num_threads, 2)
    worker.thread_cap = 1
    assert worker.call(torch.get_num_threads) == 1
    worker.thread_cap = None
    assert worker.call(torch.get_num_threads) == 2


def test_the_model_thread_never_builds_the_steps_cpp_kernels(monkeypatch):
    """A compiled step's ops load their C++ kernels at their Python kernel's first call,
    building them first (about 12 s of compiler): not on a thread that defers compiles (the
    model thread, whose Run would wait), which keeps the Python kernels (the same bits);
    within ``compiling()`` (the warm-up's steps) and elsewhere it builds."""
    from engine.execution import static_kv
    from engine.kernels import qmm

    built = []
    monkeypatch.setattr(qmm, "native_op", lambda: built.append(threading.current_thread()))
    seen = {}

    def on_a_thread(deferred: bool) -> None:
        static_kv.POLICY.deferred = deferred
        qmm.load_op()
        seen["deferring"] = len(built)
        with static_kv.compiling():
            qmm.load_op()
        seen["compiling"] = len(built)

    for deferred in (True, False):
        t = threading.Thread(target=on_a_thread, args=(deferred,))
        t.start()
        t.join(WAIT_S)
        seen[deferred] = dict(seen)
        built.clear()
    assert seen[True]["deferring"] == 0 and seen[True]["compiling"] == 1
    assert seen[False]["deferring"] == 1 and seen[False]["compiling"] == 2
