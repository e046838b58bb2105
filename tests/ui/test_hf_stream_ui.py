"""A transformers run in the Debugger: its first round shows before generate() returns, and
a cancel stops generate() within a round (the model thread is free at once)."""

from __future__ import annotations

import time

import pytest

from specviz import pairs
from specviz.render import OUTPUTS
from specviz.worker import WORKER
from tests.ui.helpers import TINY

pytestmark = [pytest.mark.ui, pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore:.*(downcasting|copy keyword).*")]

PAUSE_S = 0.03  # each target forward sleeps this long: 128 tokens take seconds


@pytest.fixture
def slow_target():
    pair = pairs.get_pair(TINY, "")
    handle = pair.target.register_forward_hook(lambda *_: time.sleep(PAUSE_S))
    yield
    handle.remove()


def _submit(client):
    return client.submit(prompt="a b a b a b a b c d", method="hf_prompt_lookup", target=TINY,
                         draft="", p_max_new_tokens=128, api_name="/run")


def test_the_first_round_shows_while_generate_runs(client, slow_target):
    job = _submit(client)
    job.result()
    runs = [dict(zip(OUTPUTS, out))["run_md"] for out in job.outputs()]
    assert len(runs) >= 2 and "(running…)" in runs[0] and "running" not in runs[-1]


def test_a_cancel_stops_generate_within_a_round(client, slow_target):
    job = _submit(client)
    while len(job.outputs()) < 2:  # a round has shown
        time.sleep(0.01)
    job.cancel()
    t0 = time.perf_counter()
    WORKER.call(lambda: None)  # the model thread is free once generate() stopped
    assert time.perf_counter() - t0 < 0.5  # a round or two, not the rest of 128 tokens
