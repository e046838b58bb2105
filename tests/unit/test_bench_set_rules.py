"""The set benchmark without a model: reading and checking a prompt set (one line per bad
input), choosing prompts, and the aggregation of result rows (tau, acceptance per draft
position, accepted length per round, speedup, identity) with literal expected values."""

from __future__ import annotations

import json

import pytest

from engine.bench.set_summary import (
    SUMMARY_HEAD,
    acceptance_per_position,
    accepted_length_histogram,
    group_summary,
    round_record,
    summarize_rows,
    summary_markdown,
    tau,
    undrafted_rounds,
)
from engine.bench.sets import SetPrompt, parse_set, read_set, select_prompts
from engine.contract.trace import CommittedToken, RoundTrace
from engine.core.errors import ConfigError


def _round(i: int, drafted: int, accepted: int, committed: int) -> RoundTrace:
    return RoundTrace(index=i, drafted=drafted, accepted=accepted, target_calls=1,
                      committed=tuple(CommittedToken(5, "x", "accepted")
                                      for _ in range(committed)))


# a run of four rounds: one without a draft, a chain of 3 with 2 accepted (+ 1 resampled),
# a chain of 3 all accepted (+ bonus), a tree of depth 2 whose deepest accepted node is at
# depth 1 (+ 1 resampled)
ROUNDS = [_round(0, 0, 0, 1), _round(1, 3, 2, 3), _round(2, 3, 3, 4), _round(3, 2, 1, 2)]


def _row(rounds, new_tokens, **kw) -> dict:
    return {**round_record(rounds, new_tokens), **kw}


def test_round_record_keeps_each_rounds_drafted_and_accepted_depth():
    assert round_record(ROUNDS, 10) == {"new_tokens": 10, "target_calls": 4,
                                        "drafted_depth": [0, 3, 3, 2],
                                        "accepted_depth": [0, 2, 3, 1]}


def test_acceptance_at_position_j_is_rounds_accepting_j_over_rounds_drafting_j():
    # j=1: 3 rounds drafted it, 3 accepted; j=2: 3 drafted, 2 accepted (the 3-chains);
    # j=3: 2 drafted (the 3-chains), 1 accepted
    assert acceptance_per_position([_row(ROUNDS, 10)]) == [1.0, 2 / 3, 0.5]


def test_acceptance_per_position_pools_rows():
    other = [_round(0, 4, 0, 1)]  # drafted 4, rejected the first
    assert acceptance_per_position([_row(ROUNDS, 10), _row(other, 1)]) == [
        0.75, 2 / 4, 1 / 3, 0.0]


def test_tau_is_new_tokens_over_target_calls_pooled_over_rows():
    assert tau([_row(ROUNDS, 10)]) == 2.5
    assert tau([_row(ROUNDS, 10), _row([_round(0, 0, 0, 1)] * 4, 4)]) == 14 / 8
    assert tau([]) is None


def test_histogram_counts_drafting_rounds_by_accepted_length():
    rows = [_row(ROUNDS, 10), _row([_round(0, 4, 0, 1), _round(1, 2, 2, 3)], 4)]
    assert accepted_length_histogram(rows) == [1, 1, 2, 1]  # 0, 1, 2, 3 accepted
    assert undrafted_rounds(rows) == 1


def test_a_baseline_has_tau_one_and_no_positions():
    rows = [_row([_round(i, 0, 0, 1) for i in range(3)], 3)]
    assert group_summary(rows)["tau"] == 1.0
    assert acceptance_per_position(rows) == [] and accepted_length_histogram(rows) == []
    assert undrafted_rounds(rows) == 3


def _result(prompt: str, cat: str, case: str, speedup, identical, efficiency) -> dict:
    return _row(ROUNDS, 10, prompt_id=prompt, category=cat, case=case, repeat=0,
                reference="generate(greedy, width=1)", speedup=speedup, identical=identical,
                efficiency=efficiency)


RESULTS = [
    _result("a1", "chat", "sd", 1.5, True, 0.9),
    _result("b1", "code", "sd", 0.5, False, 0.7),
    _result("a2", "chat", "sd", 2.5, True, 0.8),
    _result("a1", "chat", "mcsd", 1.0, None, None),
]


def test_summary_per_method_has_all_first_then_categories_in_order():
    summary = summarize_rows(RESULTS, ["sd", "mcsd"])
    assert [m["method"] for m in summary] == ["sd", "mcsd"]
    assert list(summary[0]["categories"]) == ["all", "chat", "code"]
    assert list(summary[1]["categories"]) == ["all", "chat"]  # no code row for mcsd


def test_summary_speedup_identity_and_efficiency_per_category():
    sd = summarize_rows(RESULTS, ["sd", "mcsd"])[0]["categories"]
    assert sd["all"]["speedup"] == {"min": 0.5, "median": 1.5, "max": 2.5}
    assert sd["all"]["identical"] == "2/3" and sd["chat"]["identical"] == "2/2"
    assert sd["all"]["efficiency_median"] == 0.8
    assert sd["code"]["runs"] == 1 and sd["code"]["tau"] == 2.5
    assert sd["all"]["acceptance_per_position"] == [1.0, 2 / 3, 0.5]
    assert sd["all"]["drafts_per_position"] == [9, 9, 6]
    assert sd["all"]["accepted_length_histogram"] == [0, 3, 3, 3]


def test_a_method_without_identity_claims_says_none():
    mcsd = summarize_rows(RESULTS, ["sd", "mcsd"])[1]["categories"]["all"]
    assert mcsd["identical"] is None and mcsd["efficiency_median"] is None


def test_summary_carries_the_median_h100_projection_per_category_labelled_as_one():
    rows = [{**r, "projected_h100": p} for r, p in zip(RESULTS, (1.2, 1.0, 2.0, None))]
    summary = summarize_rows(rows, ["sd", "mcsd"])
    sd, mcsd = (m["categories"] for m in summary)
    assert sd["all"]["projected_h100_median"] == 1.2
    assert sd["chat"]["projected_h100_median"] == 1.6
    assert sd["code"]["projected_h100_median"] == 1.0
    assert mcsd["all"]["projected_h100_median"] is None
    assert group_summary(RESULTS)["projected_h100_median"] is None  # rows without the field
    assert "H100 (projected" in SUMMARY_HEAD[-1]
    md = summary_markdown(summary, {"set": "s.jsonl"})
    assert "| 2/3 | 0.80 | 1.20 |" in md and "| 2/2 | 0.85 | 1.60 |" in md


def test_summary_markdown_has_one_row_per_method_and_category():
    md = summary_markdown(summarize_rows(RESULTS, ["sd", "mcsd"]), {"set": "s.jsonl"})
    assert md.startswith("set=s.jsonl\n")
    assert ("| sd | all | 3 | 2.50 | 0.50 / 1.50 / 2.50 | 1.00 0.67 0.50 | 0 3 3 3 | 2/3 | "
            "0.80 |") in md
    assert "| mcsd | chat | 1 | 2.50 | 1.00 / 1.00 / 1.00 |" in md and "| n/a | n/a |" in md


# ---------------------------------------------------------------------------- sets

def test_a_set_row_takes_its_id_and_category_or_defaults():
    rows = parse_set('{"prompt": "a", "id": "x", "category": "chat"}\n\n{"prompt": "b"}\n')
    assert rows == [SetPrompt("x", "chat", "a"), SetPrompt("line-3", "uncategorised", "b")]


@pytest.mark.parametrize("text,message", [
    ("", "prompt set is empty: s.jsonl"),
    ("\n  \n", "prompt set is empty: s.jsonl"),
    ('{"prompt": "a"}\n{"prompt": "b"\n', "s.jsonl:2: not JSON"),
    ('{"prompt": "a"}\n\n["b"]\n', 's.jsonl:3: expected a JSON object'),
    ('{"id": "a", "text": "hi"}\n', 's.jsonl:1: no "prompt" string'),
    ('{"prompt": 3}\n', 's.jsonl:1: no "prompt" string'),
    ('{"prompt": " "}\n', "s.jsonl:1: prompt is empty"),
    ('{"prompt": "a", "id": "x"}\n{"prompt": "b", "id": "x"}\n',
     "s.jsonl:2: id 'x' repeats line 1"),
    ('{"prompt": "a", "category": 7}\n', "s.jsonl:1: category must be a non-empty string"),
    ('{"prompt": "' + "a" * 21 + '"}\n', "s.jsonl:1: prompt has 21 characters; the cap is 20"),
])
def test_a_bad_set_is_one_line_that_names_the_line(text, message):
    with pytest.raises(ConfigError) as e:
        parse_set(text, "s.jsonl", max_chars=20)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_missing_or_non_utf8_set_file_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match="prompt set not found"):
        read_set(tmp_path / "none.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"prompt": "\xff"}\n')
    with pytest.raises(ConfigError, match="not UTF-8"):
        read_set(bad)


SET = [SetPrompt(f"{c}{i}", c, f"p {c}{i}") for c in "abc" for i in range(1, 4)]


def test_a_limit_takes_the_categories_in_turn_and_keeps_file_order():
    assert [r.id for r in select_prompts(SET, limit=4)] == ["a1", "a2", "b1", "c1"]
    assert [r.id for r in select_prompts(SET, ("c", "a"), limit=3)] == ["a1", "a2", "c1"]
    assert len(select_prompts(SET)) == 9


@pytest.mark.parametrize("kw,message", [
    ({"categories": ("a", "poetry")}, "unknown category 'poetry' (the set has: a, b, c)"),
    ({"max_prompts": 8}, "9 prompts selected; the cap is 8"),
    ({"categories": ("a", "b"), "max_prompts": 5}, "6 prompts selected; the cap is 5"),
    ({"limit": 0}, "limit must be >= 1"),
])
def test_a_bad_selection_is_one_line(kw, message):
    with pytest.raises(ConfigError) as e:
        select_prompts(SET, **kw)
    assert message in str(e.value)


def test_the_shipped_set_has_sixty_prompts_in_six_categories():
    from engine.bench.sets import categories_of
    from engine.core.paths import ASSETS

    rows = read_set(ASSETS / "sets" / "specbench_mini.jsonl")
    assert len(rows) == 60 and len(categories_of(rows)) == 6
    assert len(select_prompts(rows, limit=12)) == 12
    assert {r.category for r in select_prompts(rows, limit=6)} == set(categories_of(rows))


# --------------------------------------------------------------- CLI, before a model

def _main(args) -> int:
    from engine.cli import main

    try:
        return main(args)
    except SystemExit as e:
        return int(e.code)


def _write(path, lines):
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


@pytest.mark.parametrize("content,flags,message", [
    ("", [], "prompt set is empty"),
    ('{"prompt": "a"}\n{oops}\n', [], ":2: not JSON"),
    ('{"id": "q"}\n', [], ':1: no "prompt" string'),
    ('{"prompt": "a", "category": "chat"}\n', ["--categories", "code"],
     "unknown category 'code'"),
    ('{"prompt": "a"}\n', ["--methods", "sd,nope"], "unknown method 'nope'"),
    ('{"prompt": "a"}\n', ["--methods", "sd,sd"], "method 'sd' is listed twice"),
    ('{"prompt": "a"}\n', ["--methods", "sd:gama=2"], "unknown parameter 'gama'"),
    ('{"prompt": "a"}\n', ["--methods", "dsbd"], "needs temperature > 0"),
    ('{"prompt": "a"}\n', ["--repeats", "0"], "repeats must be >= 1"),
    ('{"prompt": "a"}\n', ["--max-new-tokens", "0"], "max_new_tokens must be >= 1"),
    ("".join(f'{{"prompt": "p{i}"}}\n' for i in range(501)), [],
     "501 prompts selected; the cap is 500"),
    ('{"prompt": "' + "x" * 8001 + '"}\n', [], ":1: prompt has 8001 characters; the cap is 8000"),
])
def test_bench_set_refuses_bad_input_in_one_line_before_loading_a_model(
        tmp_path, capsys, monkeypatch, content, flags, message):
    import engine.cli.bench_set as cli

    monkeypatch.setattr(cli, "pair_from_flags", lambda a: pytest.fail("loaded a model"))
    path = tmp_path / "s.jsonl"
    path.write_text(content)
    methods = [] if "--methods" in flags else ["--methods", "sd"]
    code = _main(["bench-set", "--set", str(path), *methods, *flags, "--target", "tiny",
                  "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
    assert message in lines[0], err
    assert not (tmp_path / "out").exists()
