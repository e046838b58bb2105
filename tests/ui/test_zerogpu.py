"""ZeroGPU rules, with a stand-in ``spaces`` package (tests/zerogpu_stub) whose GPU decorator
runs the decorated function in a forked child process and pickles its arguments, every
yielded value, its result and its errors: the app loads each model once at start in the main
process, streams a run from the child, computes only there, and never loads weights again."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError

import engine
from specviz import hosting, pairs, zerogpu
from specviz.hosting import HostConfig
from specviz.render import OUTPUTS
from tests.ui.helpers import TINY, free_port

pytestmark = [pytest.mark.ui, pytest.mark.filterwarnings("ignore::DeprecationWarning")]
STUB = Path(__file__).resolve().parent.parent / "zerogpu_stub"
ENV = {"SPACES_ZERO_GPU": "true", "SPECVIZ_TARGET": TINY, "SPECVIZ_PRESETS": "tiny",
       "SPECVIZ_DEVICE": "cpu", "SPECVIZ_DTYPE": "float32"}


@pytest.fixture(scope="module")
def zero(tmp_path_factory):
    """(client, spaces stub, loads log, forwards log) of an app served as on ZeroGPU."""
    import specviz

    logs = tmp_path_factory.mktemp("zerogpu")
    loads, forwards = logs / "loads", logs / "forwards"
    mp = pytest.MonkeyPatch()
    mp.syspath_prepend(str(STUB))
    real_load = engine.load_pair

    def counting_load(*a, **k):
        with open(loads, "a") as f:
            f.write(f"{os.getpid()}\n")
        return real_load(*a, **k)

    mp.setattr(engine, "load_pair", counting_load)
    pairs._PAIRS.clear()  # a model cached by other tests must load here, at start
    host = HostConfig.from_env(ENV).check()
    hosting.configure(host)
    import spaces

    zerogpu.install()
    zerogpu.preload_all()
    pair = pairs._PAIRS[(TINY, "")]

    def record_forward(*_):
        with open(forwards, "a") as f:  # closed at once: a child ends with os._exit
            f.write(f"{os.getpid()}\n")

    hooks = [m.register_forward_pre_hook(record_forward) for m in (pair.target, pair.target.model)]
    demo = specviz.build_demo(host.target, host.draft)
    demo.queue()
    _, url, _ = demo.launch(prevent_thread_lock=True, server_name="127.0.0.1",
                            server_port=free_port(), quiet=True, **specviz.launch_options())
    try:
        yield Client(url, verbose=False), spaces, loads, forwards
    finally:
        demo.close()
        for h in hooks:
            h.remove()
        hosting.configure(HostConfig())
        pairs._PAIRS.clear()
        mp.undo()
        sys.modules.pop("spaces", None)


def _pids(path: Path) -> list[int]:
    return [int(x) for x in path.read_text().split()] if path.exists() else []


def test_a_run_streams_from_the_gpu_process_and_weights_load_once(zero):
    client, spaces, loads, forwards = zero
    assert _pids(loads) == [os.getpid()]  # loaded at start, in the main process
    for gamma in (2, 3):
        job = client.submit(prompt="hello world", method="sd", target=TINY, draft="",
                            p_gamma=gamma, p_max_new_tokens=16, api_name="/run")
        job.result()
        runs = [dict(zip(OUTPUTS, o))["run_md"] for o in job.outputs()]
        assert len(runs) >= 2 and "(running…)" in runs[0]
        assert "16 tokens in" in runs[-1] and "running" not in runs[-1]
    assert _pids(loads) == [os.getpid()]  # no call loaded weights again
    children = spaces.CALLS[-2:]
    assert len(set(children)) == 2 and os.getpid() not in children
    assert set(_pids(forwards)) <= set(spaces.CALLS)  # every forward ran in a GPU call
    assert os.getpid() not in _pids(forwards) and _pids(forwards)
    assert spaces.PICKLED["yields"] >= 2 and spaces.PICKLED["args"] >= 2


def test_compare_runs_each_method_in_a_gpu_call(zero):
    client, spaces, loads, _ = zero
    before = len(spaces.CALLS)
    table, _, _, note = client.predict("hello world", ["greedy", "sd"], 8, 0.0, 0, TINY, "", "",
                                       api_name="/compare")
    assert len(table["data"]) >= 2 and len(spaces.CALLS) > before
    assert spaces.PICKLED["results"] >= 2
    assert _pids(loads) == [os.getpid()]


def test_a_model_not_loaded_at_start_is_refused_in_one_line(zero):
    client, spaces, loads, _ = zero
    with pytest.raises(AppError, match="runs only its preset models") as err:
        client.predict(prompt="hello world", method="sd", target="tiny", draft="",
                       p_max_new_tokens=4, api_name="/run")
    assert "\n" not in str(err.value)
    assert _pids(loads) == [os.getpid()]
