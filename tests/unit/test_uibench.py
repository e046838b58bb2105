"""Pure helpers of the UI benchmark (specviz.bench): statistics, verdicts, arguments, report.

No app is launched and no timing is asserted.
"""

from __future__ import annotations

import json

import pytest

from specviz import bench


def test_summarize_gives_min_median_max_and_count():
    assert bench.summarize([3.0, 1.0, 2.0, 10.0]) == {"min": 1.0, "median": 2.5, "max": 10.0,
                                                     "n": 4}
    assert bench.summarize([0.5]) == {"min": 0.5, "median": 0.5, "max": 0.5, "n": 1}
    with pytest.raises(ValueError, match="no samples"):
        bench.summarize([])


def test_fmt_scales_and_rounds_min_median_max():
    assert bench.fmt([0.1, 0.2, 0.4], scale=1e3, digits=1) == "100.0 / 200.0 / 400.0"
    assert bench.fmt([1, 2, 3], digits=0) == "1 / 2 / 3"


def _results(app=(1.0, 1.02), cli=(1.0, 1.0), client=1.05, nav_s=0.05) -> dict:
    sample = {"client_s": client, "engine_s": 1.0, "server_s": 1.01, "rounds": 10,
              "tokens": 20}
    return {
        "meta": {"date": "today", "cores": 2, "python": "3.11", "repeats": 2, "quick": False,
                 "nav_calls": 2},
        "parity": {"tokens": 48, "app_s": list(app), "cli_s": list(cli),
                   "same_tokens": [True, True]},
        "runs": [{"label": "greedy, 200 tokens", "method": "greedy", "budget": True,
                  "samples": [sample, sample]},
                 {"label": "sd gamma=3, 40 tokens", "method": "sd", "budget": False,
                  "samples": [dict(sample, client_s=9.0)]}],
        "nav": {"rounds": 500, "import_s": 0.5, "first_s": 0.3,
                "calls": {n: {"client_s": [0.1, 0.2], "server_s": [nav_s, nav_s]}
                          for n in bench.NAV_CALLS}},
    }


def test_budgets_cover_parity_budgeted_runs_and_each_navigation_call():
    rows = bench.budgets(_results())
    names = [r[0] for r in rows]
    assert names[0] == "engine speed app / CLI (greedy 48)"
    assert "client / engine (greedy, 200 tokens)" in names
    assert not any("sd gamma" in n for n in names)  # reported, not budgeted
    assert sum("server time" in n for n in names) == 3
    assert all(ok for *_, ok in rows)


@pytest.mark.parametrize("kw, missed", [
    (dict(app=(1.2, 1.2)), "engine speed"),
    (dict(app=(0.8, 0.8)), "engine speed"),  # faster by more than 5 % is a miss too
    (dict(client=1.2), "client / engine"),
    (dict(nav_s=0.2), "/step server time"),
])
def test_budgets_report_a_miss(kw, missed):
    rows = {name: ok for name, _, _, ok in bench.budgets(_results(**kw))}
    assert [n for n, ok in rows.items() if not ok and n.startswith(missed)]


def test_verdicts_and_report_markdown():
    assert bench.verdict(True) == "**met**" and bench.verdict(False) == "**missed**"
    md = bench.report(_results(nav_s=0.2))
    assert md.startswith("# specviz UI benchmark")
    assert "| app | 1.000 / 1.010 / 1.020 |" in md
    assert "| greedy, 200 tokens | 20 | 10 / 10 / 10 |" in md
    assert "| 1.050 / 1.050 / 1.050 | 5.0 / 5.0 / 5.0 |" in md  # ratio; ms per round
    assert "| /seek | 100.0 / 150.0 / 200.0 | 200.0 / 200.0 / 200.0 |" in md
    assert "| client / engine (greedy, 200 tokens) | 1.050 | <= 1.10 | **met** |" in md
    assert "| /step server time (median, 500-round trace) | 200.0 ms | <= 150 ms | " \
           "**missed** |" in md


def test_parse_args_defaults_and_quick():
    a = bench.parse_args([])
    assert (a.repeats, a.out, a.trace, a.quick, a.port) == (5, "bench-out/ui", None, False, 0)
    assert bench.parse_args(["--quick"]).repeats == 2
    assert bench.parse_args(["--quick", "--repeats", "3", "--port", "8000"]).repeats == 3


@pytest.mark.parametrize("argv, message", [
    (["--repeats", "0"], "--repeats must be >= 1"),
    (["--repeats", "x"], "invalid int value"),
    (["--port", "70000"], "--port must be in 0..65535"),
    (["--trace", "/no/such/trace.json"], "trace file not found"),
    (["--bogus"], "unrecognized arguments"),
])
def test_bad_arguments_are_one_line_errors_with_exit_code_2(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        bench.parse_args(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1


def test_cases_and_run_kwargs_fill_every_parameter_of_the_method():
    full, quick = bench.cases(False), bench.cases(True)
    assert [(c.method, c.tokens) for c in full] == [("greedy", 200), ("mcsd", 64),
                                                     ("eesd", 40), ("sd", 40)]
    assert all(c.tokens <= 16 for c in quick)
    kw = bench.run_kwargs(full[1])
    assert kw["method"] == "mcsd" and kw["p_k_config"] == "4x2x2"
    assert kw["p_max_new_tokens"] == 64 and kw["p_temperature"] == 0.0
    eesd = bench.run_kwargs(full[2])
    controller = [v for k, v in eesd.items() if k.startswith("p_controller__")]
    assert controller == ["beta_ts"]  # its default


def test_timings_reader_returns_only_new_whole_lines(tmp_path):
    path = tmp_path / "t.jsonl"
    t = bench.Timings(path)
    assert t.take() == []
    path.write_text(json.dumps({"handler": "step", "busy_s": 0.1}) + "\n" + '{"hand')
    assert t.take() == [{"handler": "step", "busy_s": 0.1}]
    with open(path, "a") as f:
        f.write('ler": "back", "busy_s": 0.2}\n')
    assert t.wait_for("back") == {"handler": "back", "busy_s": 0.2}
    with pytest.raises(bench.BenchError, match="no timing row for handler 'seek'"):
        t.wait_for("seek", timeout=0.05)
