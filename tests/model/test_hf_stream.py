"""transformers' runs streamed: an hf_* run hands its rounds over while generate() runs on a
thread of its own, a cancel stops generate() within a round, and an uncancelled run's output
is generate()'s own."""

from __future__ import annotations

import time

import pytest
import torch

import engine
from engine.hf.recorder import record
from tests.conftest import tiny_pair

PROMPT = [3, 4, 5, 6, 3, 4, 5, 6, 3, 4, 5, 7, 8, 3, 4]
PAUSE_S = 0.02  # each target forward sleeps this long: generate() takes seconds


@pytest.fixture(scope="module")
def slow_pair():
    pair = tiny_pair()
    handle = pair.target.register_forward_hook(lambda *_: time.sleep(PAUSE_S))
    yield pair
    handle.remove()


def _run(pair, n=128):
    return engine.start(pair, PROMPT, "hf_prompt_lookup", raw=True, max_new_tokens=n,
                        temperature=0.0)


def test_the_first_round_arrives_before_generate_returns(slow_pair):
    run = _run(slow_pair)
    t0 = time.perf_counter()
    first = next(run)
    waited = time.perf_counter() - t0
    assert first.index == 0 and not run.done and run.wall_s == 0.0  # generate() goes on
    rest = list(run)
    total = time.perf_counter() - t0
    assert run.done and len(rest) >= 10 and waited < total / 5
    assert run.trace().rounds == (first, *rest)


def test_a_cancel_stops_generate_within_one_round(slow_pair):
    full = _run(slow_pair).to_end()
    run = _run(slow_pair)
    next(run)
    t0 = time.perf_counter()
    run.cancel()
    stopped = time.perf_counter() - t0
    trace = run.trace()
    assert run.done and trace.stop_reason == "cancelled" and len(trace.rounds) == 1
    assert stopped < 10 * PAUSE_S < full.stats.wall_s  # one round, not the rest of the run
    assert list(run) == []
    assert trace.token_ids == full.token_ids[:len(trace.token_ids)]


def test_an_uncancelled_streamed_run_is_generates_own_output():
    pair = tiny_pair()
    trace = _run(pair, 48).to_end()
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        plain = pair.target.generate(ids, prompt_lookup_num_tokens=10, do_sample=False,
                                     max_new_tokens=48)
    assert list(trace.token_ids) == plain[0, len(PROMPT):].tolist()
    assert trace.stop_reason in ("max_new_tokens", "eos")


def test_the_recorder_hands_each_round_over_as_it_completes():
    pair = tiny_pair()
    seen = []
    with record(pair.target, on_round=seen.append) as rec, torch.no_grad():
        pair.target.generate(torch.tensor([PROMPT]), prompt_lookup_num_tokens=10,
                             do_sample=False, max_new_tokens=24)
        rec.close(time.perf_counter())
    assert tuple(seen) == rec.trace().rounds and len(seen) >= 2
    assert all("commit" in r.timings for r in seen)


def test_an_engine_run_cancels_after_the_rounds_handed_out():
    run = engine.start(tiny_pair(), PROMPT, "sd", raw=True, gamma=2, max_new_tokens=32,
                       temperature=0.0)
    first = next(run)
    run.cancel()
    trace = run.trace()
    assert run.done and list(run) == [] and trace.rounds == (first,)
    assert trace.stop_reason == "cancelled" and trace.stats.cost is not None
