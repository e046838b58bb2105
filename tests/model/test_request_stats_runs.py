"""A real run's per-request stats (vLLM's shape) agree with its rounds, through
``generate --json`` and the Python API."""

from __future__ import annotations

import json

import engine
from engine.cli import main
from tests.conftest import tiny_pair


def test_generate_json_stats_follow_the_traces_drafting_rounds(tmp_path, capsys):
    trace_file = tmp_path / "run.json"
    code = main(["generate", "--method", "sd", "--gamma", "3", "--target", "tiny",
                 "--draft", "ngram", "--raw", "--prompt", "a b a b a b a b a b",
                 "--max-new-tokens", "24", "--temperature", "0", "--json",
                 "--trace", str(trace_file)])
    out, err = capsys.readouterr()
    assert code == 0, err
    stats = json.loads(out)["stats"]
    rounds = engine.RunTrace.from_json(trace_file.read_text()).rounds
    drafting = [r for r in rounds if r.drafted > 0]
    assert 0 < len(drafting) < len(rounds)  # lookup rounds and plain rounds both occur
    assert stats["per_step_accepted"] == [r.accepted for r in drafting]
    assert stats["per_step_drafted"] == [r.drafted for r in drafting]
    expected = [0] * (max(r.drafted for r in drafting) + 1)
    for r in drafting:
        expected[r.accepted] += 1
    assert stats["acceptance_histogram"] == expected


def test_the_python_api_gives_the_same_stats_as_a_recount_of_its_rounds():
    pair = tiny_pair(draft="ngram")
    trace = engine.generate(pair, [3, 4, 5, 3, 4, 5, 3, 4, 5], "sd", gamma=4,
                            max_new_tokens=20, temperature=0.0)
    s = trace.stats
    assert s.per_step_accepted == tuple(r.accepted for r in trace.rounds if r.drafted)
    assert sum(s.acceptance_histogram) == len(s.per_step_accepted) > 0
    assert sum(j * n for j, n in enumerate(s.acceptance_histogram)) == s.accepted
