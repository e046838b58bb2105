"""The suffix drafter 'suffix' (engine/drafters/suffix.py) on tiny models: temperature 0 is
token-identical to greedy generate() for every token method and a beam method, with the
pair's store of earlier outputs in use (a test asserts it drafts more with it); the CLI and
bench-set take --draft suffix; the trace names the drafter and reads back as its spec."""

from __future__ import annotations

import json

import pytest

import engine
from engine.analysis.source import draft_spec
from tests.conftest import tiny_pair
from tests.model.test_token_methods import _ref

REPEATING = ([3, 4, 5, 6, 3, 4, 5, 7, 3, 4], [11, 12, 11, 12, 13, 11], [9, 8, 7])


def _drafted(pair, method, params, forget: bool) -> int:
    """Drafts over the prompts (each checked against generate()), the store emptied before
    each run (forget) or kept across them."""
    drafted = 0
    for prompt in REPEATING * 2:
        if forget:
            pair.drafter.store.clear()
        trace = engine.generate(pair, prompt, method, max_new_tokens=24, **params)
        assert list(trace.token_ids) == _ref(pair, prompt, 24), (method, params, prompt)
        drafted += sum(r.drafted for r in trace.rounds)
    return drafted


@pytest.mark.parametrize("method,params", [
    ("sd", {"gamma": 3}),
    ("sd", {"controller": "beta_ts"}),
    ("sd", {"controller": "heuristic"}),
    ("mcsd", {"k_config": "4x2x2"}),
    ("mcsd", {"k_config": "3x2", "verifier": "kseq"}),
    ("greedy_drafts", {"k_config": "3x2x2"}),
])
def test_temperature_zero_with_the_suffix_drafter_equals_greedy_generate(method, params):
    pair = tiny_pair(draft="suffix")
    alone = _drafted(pair, method, params, forget=True)
    pair.drafter.store.clear()
    kept = _drafted(pair, method, params, forget=False)
    assert 0 < alone < kept  # earlier outputs of other prompts were drafted from


def test_beam_search_with_the_suffix_drafter_keeps_generates_beams():
    pair = tiny_pair(draft="suffix")
    for prompt in REPEATING:
        trace = engine.generate(pair, prompt, "atspeed_strict", beams=2, draft_beams=3,
                                gamma=2, max_new_tokens=12)
        ref = engine.generate(pair, prompt, "beam", beams=2, max_new_tokens=12)
        assert [b.token_ids for b in trace.beams] == [b.token_ids for b in ref.beams]


def test_the_trace_names_the_drafter_and_reads_back_as_its_spec():
    pair = tiny_pair(draft="suffix:8")
    trace = engine.generate(pair, REPEATING[0], "sd", gamma=3, max_new_tokens=8)
    assert trace.draft == pair.draft_name == "suffix (SuffixDecoding, patterns up to 8 tokens)"
    assert draft_spec(trace.draft) == "suffix:8"


def test_cli_generate_takes_draft_suffix(capsys):
    from engine.cli import main

    assert main(["generate", "--target", "tiny", "--draft", "suffix", "--method", "sd",
                 "--raw", "--prompt", "abc abc abc abc", "--max-new-tokens", "8",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["stats"]["drafted"] > 0  # "abc" recurs: the suffix matches drafted


def test_cli_refuses_a_bad_suffix_spec_in_one_line(capsys):
    from engine.cli import main

    assert main(["generate", "--target", "tiny", "--draft", "suffix:1", "--method", "sd",
                 "--prompt", "abc"]) == 2
    assert capsys.readouterr().err.strip() == "error: suffix length must be at least 2, got '1'"


def test_bench_set_takes_draft_suffix_and_reports_its_acceptance(tmp_path, capsys):
    from engine.cli import main

    path = tmp_path / "set.jsonl"
    rows = [{"id": "k1", "category": "code", "prompt": "abc abc abc abc"},
            {"id": "c1", "category": "chat", "prompt": "one two one two"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    assert main(["bench-set", "--set", str(path), "--methods", "sd:gamma=2",
                 "--max-new-tokens", "6", "--target", "tiny", "--draft", "suffix", "--raw",
                 "--out", str(out)]) == 0
    results = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(results) == 2 and all(r["identical"] for r in results)
    assert all(len(r["accepted_depth"]) == len(r["drafted_depth"]) for r in results)
    assert json.loads((out / "summary.json").read_text())
