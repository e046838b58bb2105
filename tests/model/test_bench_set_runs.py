"""The set benchmark on a tiny model: rows appended one by one, a restart resumes and a
changed argument set is refused, the CLI writes results, summary and a self-contained
report."""

from __future__ import annotations

import json

import pytest

import engine.bench.set_runner as runner
from engine.bench.set_runner import SetSettings, plan_set, run_set
from engine.contract.trace import ACCEPTED
from engine.core.errors import ConfigError
from tests.conftest import tiny_pair

PROMPTS = [{"id": "c1", "category": "chat", "prompt": "hello hello hello"},
           {"id": "k1", "category": "code", "prompt": "abc abc abc abc"},
           {"id": "c2", "category": "chat", "prompt": "one two one two"}]


def _set(tmp_path, rows=PROMPTS):
    path = tmp_path / "set.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def pair():
    return tiny_pair(draft="ngram")


def _settings(path, **kw) -> SetSettings:
    base = {"methods": "sd:gamma=2", "max_new_tokens": 4, "raw": True, "limit": 2}
    return SetSettings(str(path), **{**base, **kw})


def _lines(out) -> list[str]:
    return (out / "results.jsonl").read_text().splitlines()


def test_rows_are_appended_one_by_one_and_progress_reports_each(tmp_path, pair):
    plan = plan_set(_settings(_set(tmp_path), repeats=2))
    calls = []
    outcome = run_set(pair, plan, tmp_path / "out",
                      progress=lambda d, t, r: calls.append((d, t, r and r["prompt_id"])))
    assert outcome.finished and outcome.total == 4 and len(outcome.rows) == 4
    assert calls == [(0, 4, None), (0, 4, None),  # before the runs, after the one warm-up
                     (1, 4, "c1"), (2, 4, "k1"), (3, 4, "c1"), (4, 4, "k1")]
    rows = [json.loads(line) for line in _lines(tmp_path / "out")]
    assert [(r["prompt_id"], r["repeat"], r["seed"]) for r in rows] == [
        ("c1", 0, 0), ("k1", 0, 0), ("c1", 1, 1), ("k1", 1, 1)]
    for r in rows:
        assert r["case"] == "sd:gamma=2" and r["identical"] is True
        assert len(r["drafted_depth"]) == len(r["accepted_depth"]) >= 1
        assert r["new_tokens"] == 4 and r["target_calls"] == len(r["drafted_depth"])
        assert r["projected_h100"] > 0  # the run's projection on the stored H100 costs
        steps = [a for d, a in zip(r["drafted_depth"], r["accepted_depth"]) if d > 0]
        assert r["per_step_accepted"] == steps  # vLLM's per-request stats, per row
        assert sum(r["acceptance_histogram"]) == len(steps)


def test_a_cancelled_run_keeps_its_rows_and_a_restart_runs_only_the_rest(tmp_path, pair,
                                                                         monkeypatch):
    plan = plan_set(_settings(_set(tmp_path), methods="sd:gamma=2,greedy", repeats=2))
    out = tmp_path / "out"
    done = []
    first = run_set(pair, plan, out, progress=lambda d, t, r: done.append(d),
                    cancelled=lambda: done[-1] >= 3)
    assert not first.finished and len(_lines(out)) == 3
    kept = _lines(out)
    measured = []
    real = runner.measure_run

    def counting(pair, prompt, case, **kw):
        measured.append((prompt, case.label, kw["common"]["seed"]))
        return real(pair, prompt, case, **kw)

    monkeypatch.setattr(runner, "measure_run", counting)
    second = run_set(pair, plan, out)
    assert second.finished and len(second.rows) == 8
    assert _lines(out)[:3] == kept  # the finished rows are not run again
    hello, abc = PROMPTS[0]["prompt"], PROMPTS[1]["prompt"]
    assert measured == [(abc, "sd:gamma=2", "0"), (hello, "greedy", "1"),
                        (hello, "sd:gamma=2", "1"), (abc, "sd:gamma=2", "1"), (abc, "greedy", "1")]
    keys = {(r["prompt_id"], r["case"], r["repeat"]) for r in second.rows}
    assert len(keys) == 8


def test_each_case_takes_each_place_in_a_prompts_order_in_turn(tmp_path, pair):
    plan = plan_set(_settings(_set(tmp_path), methods="sd:gamma=2,greedy,sd:gamma=1",
                              limit=3))
    run_set(pair, plan, tmp_path / "out")
    rows = [json.loads(line) for line in _lines(tmp_path / "out")]
    order = [[r["case"] for r in rows if r["prompt_id"] == p] for p in ("c1", "k1", "c2")]
    assert order == [["sd:gamma=2", "greedy", "sd:gamma=1"],
                     ["greedy", "sd:gamma=1", "sd:gamma=2"],
                     ["sd:gamma=1", "sd:gamma=2", "greedy"]]


def test_a_line_cut_short_by_a_stop_is_dropped_and_run_again(tmp_path, pair):
    plan = plan_set(_settings(_set(tmp_path)))
    out = tmp_path / "out"
    run_set(pair, plan, out)
    lines = _lines(out)
    (out / "results.jsonl").write_text(lines[0] + "\n" + lines[1][:30])
    again = run_set(pair, plan, out)
    assert len(again.rows) == 2 and len(_lines(out)) == 2
    assert [json.loads(x)["prompt_id"] for x in _lines(out)] == ["c1", "k1"]


@pytest.mark.parametrize("change,key", [
    ({"max_new_tokens": 5}, "max_new_tokens"), ({"methods": "greedy"}, "methods"),
    ({"limit": 3}, "limit"), ({"seed": 1}, "seed"), ({"categories": ("chat",)}, "categories"),
])
def test_a_restart_with_other_arguments_is_refused_in_one_line(tmp_path, pair, change, key):
    path = _set(tmp_path)
    run_set(pair, plan_set(_settings(path)), tmp_path / "out")
    with pytest.raises(ConfigError) as e:
        run_set(pair, plan_set(_settings(path, **change)), tmp_path / "out")
    msg = str(e.value)
    assert f"was made with other arguments ({key}:" in msg and "\n" not in msg
    assert len(_lines(tmp_path / "out")) == 2


def test_an_eager_run_folder_does_not_resume_on_compiled_steps(tmp_path, pair, monkeypatch):
    """bench-set compiles a packed target's steps by default now: a folder of eager rows
    refuses compiled ones (and keeps resuming eagerly)."""
    from engine.bench import set_runner

    path = _set(tmp_path)
    run_set(pair, plan_set(_settings(path)), tmp_path / "out")
    monkeypatch.setattr(set_runner, "compiled_steps", lambda p: True)
    with pytest.raises(ConfigError, match=r"other arguments \(steps: None there, 'compiled'"):
        run_set(pair, plan_set(_settings(path)), tmp_path / "out")
    assert len(_lines(tmp_path / "out")) == 2


def test_the_same_prompts_from_another_path_resume(tmp_path, pair):
    run_set(pair, plan_set(_settings(_set(tmp_path))), tmp_path / "out")
    other = tmp_path / "copy"
    other.mkdir()
    again = run_set(pair, plan_set(_settings(_set(other))), tmp_path / "out")
    assert again.finished and len(again.rows) == 2


def test_a_folder_with_other_files_and_no_run_json_is_refused(tmp_path, pair):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="is not empty and holds no run.json"):
        run_set(pair, plan_set(_settings(_set(tmp_path))), tmp_path / "out")


def test_a_prompt_over_the_token_cap_is_refused_before_any_run(tmp_path, pair):
    plan = plan_set(_settings(_set(tmp_path, [{"id": "long", "prompt": "ab" * 20}])))
    with pytest.raises(ConfigError, match="prompt 'long' has 40 tokens; the cap is 30"):
        run_set(pair, plan, tmp_path / "out", max_tokens=30)
    assert not (tmp_path / "out").exists()


def test_a_tree_rounds_accepted_depth_is_its_deepest_accepted_node():
    import engine

    trace = engine.generate(tiny_pair(), "hello hello hello hello", "mcsd", raw=True,
                            max_new_tokens=12, k_config="2x2")
    assert any(r.accepted for r in trace.rounds)
    for r in trace.rounds:
        deepest = max((n.depth for n in r.nodes if n.status == ACCEPTED), default=0)
        assert r.accepted == deepest
        assert r.drafted == max((n.depth for n in r.nodes if n.q is not None), default=0)


def test_cli_writes_results_summary_and_a_self_contained_report(tmp_path, capsys):
    from engine.cli import main

    path = _set(tmp_path)
    out = tmp_path / "out"
    args = ["bench-set", "--set", str(path), "--methods", "sd:gamma=2,mcsd:k_config=2x2",
            "--max-new-tokens", "6", "--target", "tiny", "--draft", "ngram", "--raw",
            "--out", str(out), "--report"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "| sd:gamma=2 | all | 3 |" in printed and "| mcsd:k_config=2x2 | code | 1 |" in printed
    assert len(_lines(out)) == 6
    summary = json.loads((out / "summary.json").read_text())
    assert [m["method"] for m in summary["methods"]] == ["sd:gamma=2", "mcsd:k_config=2x2"]
    assert list(summary["methods"][0]["categories"]) == ["all", "chat", "code"]
    assert summary["methods"][0]["categories"]["all"]["identical"] == "3/3"
    assert summary["meta"]["rows"] == "6/6" and summary["meta"]["max_new_tokens"] == 6
    assert summary["methods"][0]["categories"]["code"]["projected_h100_median"] > 0
    html = (out / "report.html").read_text()
    assert html.count('class="plotly-graph-div"') == 8  # four, then the diagnosis' four
    assert html.count("plotly.js v") == 1  # the library inlined once, no CDN
    assert "<script src=" not in html
    for text in ("Acceptance per draft position", "tau by category",
                 "Speedup over the plain decode", "Accepted length per round",
                 "max_new_tokens", "set.jsonl", "Device: cpu", "results.jsonl",
                 "H100 (projected) ×, median", "A projection, not a measurement.",
                 "Diagnosis over the set", "Diagnosis</b> of sd:gamma=2: ",
                 "Acceptance by position", "Calibration", "One source of drafts"):
        assert text in html, text
    assert "| sd:gamma=2 | all |" in (out / "summary.md").read_text()
    assert main(args) == 0  # a restart with everything done runs nothing
    assert len(_lines(out)) == 6


def test_a_restart_over_edited_prompts_is_refused(tmp_path, pair):
    path = _set(tmp_path)
    run_set(pair, plan_set(_settings(path)), tmp_path / "out")
    _set(tmp_path, [{**PROMPTS[0], "prompt": "edited"}, *PROMPTS[1:]])
    with pytest.raises(ConfigError, match=r"other arguments \(prompts_sha256:"):
        run_set(pair, plan_set(_settings(path)), tmp_path / "out")


def test_replay_puts_the_best_fixed_length_and_the_bound_beside_each_run(tmp_path, pair):
    plan = plan_set(_settings(_set(tmp_path), replay=True, max_new_tokens=12))
    outcome = run_set(pair, plan, tmp_path / "out")
    for row in outcome.rows:
        r = row["replay"]
        assert r["exact"] and r["best_fixed"].startswith("sd gamma=")
        assert r["bound_speedup"] >= r["best_fixed_speedup"] - 1e-9
        assert r["bound_speedup"] >= r["own_speedup"] - 1e-9
        assert r["positions"] == 12 and 0 <= r["not_top"] <= r["not_first"] <= 12
    summary = runner.write_summary(tmp_path / "out")
    replayed = summary["methods"][0]["categories"]["all"]["replay"]
    assert replayed["runs"] == len(outcome.rows) == 2
    assert 0 <= replayed["not_first_share"] <= 1 and replayed["top"] == 4
    text = (tmp_path / "out" / "summary.md").read_text()
    assert "Hindsight replay (medians" in text and "clairvoyant bound" in text
    from engine.bench.report import write_report
    assert "<h2>Hindsight replay</h2>" in write_report(tmp_path / "out").read_text()


def test_a_run_without_replay_keeps_its_arguments_and_tables(tmp_path, pair):
    plan = plan_set(_settings(_set(tmp_path)))
    run_set(pair, plan, tmp_path / "out")
    args = json.loads((tmp_path / "out" / "run.json").read_text())
    assert "replay" not in args["arguments"]  # a folder written before the flag resumes
    runner.write_summary(tmp_path / "out")
    assert "Hindsight replay" not in (tmp_path / "out" / "summary.md").read_text()


def test_a_folder_whose_older_rows_carry_no_diagnosis_resumes_and_says_so(tmp_path, pair):
    """Rows written before rows kept a diagnosis: the folder resumes, the new rows are
    pooled, and a folder of old rows alone says it has no data for the views."""
    from engine.bench.report import NO_DIAGNOSIS, write_report

    path = _set(tmp_path)
    out = tmp_path / "out"
    run_set(pair, plan_set(_settings(path, limit=1)), out)
    old = [json.loads(line) for line in _lines(out)]
    for row in old:
        row.pop("diagnosis")
    (out / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in old))
    assert NO_DIAGNOSIS in write_report(out).read_text()
    other = tmp_path / "out2"
    other.mkdir()
    (other / "results.jsonl").write_text((out / "results.jsonl").read_text())
    plan = plan_set(_settings(path))  # two prompts: the first row is there, without one
    (other / "run.json").write_text(json.dumps({
        **json.loads((out / "run.json").read_text()),
        "arguments": runner.run_arguments(pair, plan)}))
    outcome = run_set(pair, plan, other)
    assert len(outcome.rows) == 2 and "diagnosis" in outcome.rows[1]
    d = runner.write_summary(other)["methods"][0]["categories"]["all"]["diagnosis"]
    assert d["runs"] == 1
    assert "over 1 runs" in write_report(other).read_text()
