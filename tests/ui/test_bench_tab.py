"""The Bench tab (specviz.bench_tab): the same numbers as `python -m engine bench-set` for the
same set and seed, one-line refusals of bad input, one run at a time, the host's caps, and a
selected row opening its prompt in the Debugger."""

from __future__ import annotations

import json
from pathlib import Path

import gradio as gr
import pytest

from engine.cli import main as cli_main
from specviz import bench_tab, wiring
from specviz.hosting import HostConfig

pytestmark = [pytest.mark.ui, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

PROMPTS = [{"id": "a", "category": "copy", "prompt": "one two three one two three one two"},
           {"id": "b", "category": "copy", "prompt": "red blue red blue red blue red"},
           {"id": "c", "category": "chat", "prompt": "hello there, how are you today?"}]
DETERMINISTIC = ("runs", "tau", "acceptance_per_position", "drafts_per_position",
                 "accepted_length_histogram", "undrafted_rounds", "identical")


@pytest.fixture
def prompt_set(tmp_path) -> Path:
    path = tmp_path / "set.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in PROMPTS))
    return path


def _tab_run(path: Path, methods=("sd", "mcsd"), categories="", limit=None,
             **kw) -> list[tuple]:
    return list(bench_tab.bench(set_name="", upload=str(path), methods=list(methods),
                                categories=categories, limit=limit, max_new_tokens=6,
                                target="tiny", draft=kw.pop("draft", "ngram"), **kw))


def _numbers(summary: dict) -> dict:
    return {m["method"]: {cat: {k: c[k] for k in DETERMINISTIC}
                          for cat, c in m["categories"].items()}
            for m in summary["methods"]}


def test_the_tab_and_the_cli_give_the_same_numbers_for_the_same_set_and_seed(prompt_set,
                                                                              tmp_path):
    out = tmp_path / "cli"
    assert cli_main(["bench-set", "--set", str(prompt_set), "--methods", "sd,mcsd",
                     "--max-new-tokens", "6", "--target", "tiny", "--draft", "ngram",
                     "--out", str(out)]) == 0
    cli = json.loads((out / "summary.json").read_text())
    last = _tab_run(prompt_set)[-1]
    status, files = last[0], last[6]
    assert status.startswith("done: 6 / 6 runs on 3 prompts")
    tab = json.loads((Path(files[0]).parent / "summary.json").read_text())
    assert _numbers(tab) == _numbers(cli)
    assert {"sd", "mcsd"} == set(_numbers(tab)) and _numbers(tab)["sd"]["all"]["runs"] == 3
    assert Path(files[0]).name == "report.html" and Path(files[1]).name == "results.jsonl"
    assert all(fig is not None for fig in last[2:5])  # acceptance, tau, speedup figures


def test_the_set_is_diagnosed_per_method_and_replayed_when_asked(prompt_set):
    last = _tab_run(prompt_set, replay=True, limit=2)[-1]
    assert last.diagnosis.startswith("**Diagnosis** of sd: ")
    assert "\n\n**Diagnosis** of mcsd: " in last.diagnosis and "*Position*" in last.diagnosis
    for fig in (last.diag_position, last.diag_entropy, last.diag_calibration,
                last.diag_source):
        assert fig is not None
    assert list(last.diag_rejected.columns) == bench_tab.REJECTED_HEADERS
    assert "<h2>Hindsight replay</h2>" in last.replay_table
    assert "not proposable" in last.replay_table and "%" in last.replay_table
    assert _tab_run(prompt_set, methods=("sd",), limit=1)[-1].replay_table == ""  # not asked


def test_rows_stream_in_as_runs_finish(prompt_set):
    updates = _tab_run(prompt_set, methods=("sd",))
    counts = [len(u[1]) for u in updates]
    assert counts[0] < counts[-1] == 3 and counts == sorted(counts)


@pytest.mark.parametrize("kwargs,message", [
    (dict(methods=()), "pick at least one method"),
    (dict(categories="poetry"), "poetry"),
])
def test_bad_choices_become_one_line_errors(prompt_set, kwargs, message):
    with pytest.raises(gr.Error) as err:
        _tab_run(prompt_set, **kwargs)
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("text,message", [
    ("", "empty"), ("{not json\n", "line 1"), ('{"category": "x"}\n', "prompt"),
])
def test_a_bad_upload_becomes_one_line(tmp_path, text, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(text)
    with pytest.raises(gr.Error) as err:
        _tab_run(path)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_an_upload_over_the_cap_is_refused_before_it_is_read(tmp_path, monkeypatch):
    path = tmp_path / "big.jsonl"
    path.write_text(json.dumps({"prompt": "x" * 200}) + "\n")
    monkeypatch.setattr(wiring, "MAX_UPLOAD_BYTES", 100)
    with pytest.raises(gr.Error, match="over"):
        _tab_run(path)


def test_a_set_over_the_hosts_prompt_cap_is_refused(prompt_set, monkeypatch):
    from specviz.hosting import HOST

    monkeypatch.setattr(HOST, "config", HostConfig(bench_max_prompts=2))
    with pytest.raises(gr.Error, match="2"):
        _tab_run(prompt_set)
    assert len(_tab_run(prompt_set, methods=("sd",), limit=2)[-1][1]) == 2  # within the cap


def test_a_second_run_while_one_holds_the_model_thread_is_told_so(prompt_set):
    with bench_tab.BENCH.session():
        with pytest.raises(gr.Error, match="a benchmark is running"):
            _tab_run(prompt_set)
    assert len(_tab_run(prompt_set, methods=("sd",))[-1][1]) == 3  # free once it ended


def test_cancel_keeps_the_rows_done_so_far(prompt_set, monkeypatch):
    real = bench_tab.run_set

    def cancel_after_the_first_row(pair, plan, out_dir, progress, cancelled):
        def progress_then_cancel(done, total, row):
            progress(done, total, row)
            if row is not None:
                assert bench_tab.cancel() == "cancelling after the current run …"
        return real(pair, plan, out_dir, progress=progress_then_cancel, cancelled=cancelled)

    monkeypatch.setattr(bench_tab, "run_set", cancel_after_the_first_row)
    last = _tab_run(prompt_set, methods=("sd",))[-1]
    assert last[0].startswith("cancelled: 1 / 3 runs") and len(last[1]) == 1
    assert bench_tab.cancel() == "no benchmark of yours is running"


def test_the_host_caps_come_from_the_environment():
    cfg = HostConfig.from_env({"SPECVIZ_BENCH_MAX_PROMPTS": "3", "SPECVIZ_BENCH_MAX_SECONDS": "9"})
    assert (cfg.bench_max_prompts, cfg.bench_max_seconds) == (3, 9)
    assert HostConfig.from_env({}).bench_max_prompts == 8
    with pytest.raises(Exception, match="SPECVIZ_BENCH_MAX_SECONDS must be a positive integer"):
        HostConfig.from_env({"SPECVIZ_BENCH_MAX_SECONDS": "0"})


def test_a_selected_row_opens_its_prompt_and_method_in_the_debugger():
    row = ["b", "copy", "mcsd:k_config=2x2", "1.20", "1.50", "3 / 4", "yes"]
    evt = gr.SelectData(None, {"index": [0, 0], "value": "b", "row_value": row})
    prompt, method, tabs = bench_tab.open_row({"b": "red blue red"}, evt)
    assert (prompt, method) == ("red blue red", "mcsd")
    assert tabs.selected == "debugger"
