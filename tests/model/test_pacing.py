"""The pacing hook between a run's rounds (engine.run.pacing): called after every round of the
runs stepped inside the block and nowhere else, other runs stepped inside it leave a run's
tokens as alone, and neither a run's own time nor the pacing clock counts the hook."""

from __future__ import annotations

import time

import engine
from engine.run import pacing
from tests.conftest import tiny_pair

PROMPT, OTHER = [3, 4, 5], [9, 8, 7, 6]


def test_the_hook_runs_after_every_round_of_the_runs_inside_the_block_only():
    pair = tiny_pair()
    engine.generate(pair, PROMPT, "sd", max_new_tokens=16, gamma=2)  # the plain step the
    # cost model divides by, calibrated once by a run of its own (paced too, inside a block)
    calls: list[int] = []
    run = engine.start(pair, PROMPT, "sd", max_new_tokens=16, gamma=2)
    with pacing.between_rounds(lambda: calls.append(run.rounds)):
        trace = run.to_end()
    assert calls == list(range(1, len(trace.rounds) + 1))  # after each round, the last too
    engine.generate(pair, PROMPT, "sd", max_new_tokens=16, gamma=2)  # outside: no call
    assert len(calls) == len(trace.rounds)


def test_runs_stepped_in_the_hook_leave_the_runs_tokens_as_alone():
    pair = tiny_pair()
    params = dict(max_new_tokens=16, gamma=2, temperature=1.0, seed=5)
    alone = engine.generate(pair, PROMPT, "sd", **params)
    others = []

    def other_work():  # another session's run on the same pair (not paced by the hook)
        others.append(engine.generate(pair, OTHER, "mcsd", max_new_tokens=6, k_config="2x2"))

    with pacing.between_rounds(other_work):
        paced = engine.generate(pair, PROMPT, "sd", **params)
    assert paced.token_ids == alone.token_ids and len(others) == len(paced.rounds)
    assert [r.committed for r in paced.rounds] == [r.committed for r in alone.rounds]


def test_neither_the_runs_time_nor_the_pacing_clock_counts_the_hook():
    pair = tiny_pair()
    engine.generate(pair, PROMPT, "greedy", max_new_tokens=4)  # warm
    nap = 0.05
    with pacing.between_rounds(lambda: time.sleep(nap)) as block:
        t0, own0 = time.perf_counter(), pacing.own_clock()
        trace = engine.generate(pair, PROMPT, "greedy", max_new_tokens=12)
        pacing.pause()  # between runs (a progress report): counted the same way
        wall, own = time.perf_counter() - t0, pacing.own_clock() - own0
    hooks = len(trace.rounds) + 1
    assert block.yielded_s >= hooks * nap
    assert trace.stats.wall_s < wall - block.yielded_s + 1e-6  # the rounds alone
    assert abs(own - (wall - block.yielded_s)) < 1e-3
    assert own < hooks * nap  # what the hook slept is not the calling code's own time


def test_pause_outside_a_block_does_nothing_and_the_clock_is_perf_counter():
    pacing.pause()
    before = time.perf_counter()
    assert before <= pacing.own_clock() <= time.perf_counter()


def test_a_whole_segment_runs_no_hook_and_a_benchmark_pauses_only_between_its_segments():
    """engine.bench.interleaved.measure_run: the method's run and its reference generate()
    are timed whole; the hook runs once, between the two."""
    from engine.bench import interleaved

    pair = tiny_pair()
    calls: list[str] = []
    with pacing.between_rounds(lambda: calls.append("hook")):
        with pacing.whole():
            engine.generate(pair, PROMPT, "sd", max_new_tokens=16, gamma=2)
            pacing.pause()
        assert calls == []
        real = interleaved.run_reference
        try:
            interleaved.run_reference = lambda *a: calls.append("reference") or real(*a)
            interleaved.measure_run(pair, PROMPT, interleaved.Case("sd", "sd", {"gamma": "2"}),
                                    raw=True, common={"max_new_tokens": "16"})
        finally:
            interleaved.run_reference = real
    assert calls == ["hook", "reference"]
