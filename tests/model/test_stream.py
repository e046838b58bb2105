"""The public streaming API: engine.start() -> Run (iterate rounds, trace() at any point)."""

from __future__ import annotations

import pytest

import engine
from engine.cli.cost_text import cost_sentence
from tests.conftest import tiny_pair

CASES = [("greedy", {}), ("sd", {"gamma": 3}), ("mcsd", {"k_config": "2x2"}),
         ("eesd", {}), ("beam", {"beams": 3}), ("atspeed_strict", {"beams": 2}),
         ("dsbd", {"draft_beams": 2, "temperature": 1.0})]


@pytest.mark.parametrize("method,params", CASES)
def test_trace_after_k_rounds_is_the_first_k_rounds_of_the_final_trace(method, params):
    pair = tiny_pair()
    run = engine.start(pair, [3, 4, 5], method, max_new_tokens=12, **params)
    partial = {}
    for k, _ in enumerate(run, start=1):
        partial[k] = run.trace()
        assert run.rounds == k
    final = run.trace()
    assert run.done and len(final.rounds) == len(partial)
    for k, t in partial.items():
        assert t.rounds == final.rounds[:k]
        assert t.stats.rounds == k
    assert partial[len(partial)] == final


def test_a_finished_run_equals_generate_and_carries_its_cost_model_once():
    pair = tiny_pair()
    run = engine.start(pair, [3, 4, 5], "sd", max_new_tokens=10, gamma=2)
    first = next(run)
    assert run.trace().stats.cost is None  # the cost model only at the end
    final = run.to_end()
    again = engine.generate(pair, [3, 4, 5], "sd", max_new_tokens=10, gamma=2)
    assert final.rounds[0].committed == first.committed
    assert final.token_ids == again.token_ids
    cost = final.stats.cost
    assert cost.kind == "chain" and cost.t_step_s > 0
    assert cost.predicted_speedup > 0 and cost.measured_speedup > 0
    said = cost_sentence(cost)
    assert said.startswith("over rounds 1..")  # timings: wording depends on load
    assert ": draft steps cost" in said
    assert ("break-even needs per-token α" in said) == (cost.break_even_acceptance is not None)
    assert list(run) == []  # a finished run yields nothing more


def test_head_without_rounds_has_the_run_so_far():
    pair = tiny_pair()
    run = engine.start(pair, [3, 4, 5], "greedy", max_new_tokens=6)
    next(run), next(run)
    head = run.trace(with_rounds=False)
    assert head.rounds == () and len(head.token_ids) == 2
    assert head.stats.rounds == 2 and head.stats.wall_s == run.wall_s > 0


def test_bad_input_fails_at_start_before_any_round():
    pair = tiny_pair()
    with pytest.raises(engine.ConfigError, match="unknown method"):
        engine.start(pair, [3, 4], "nope")
    with pytest.raises(engine.ConfigError, match="gamma"):
        engine.start(pair, [3, 4], "sd", gamma=0)
