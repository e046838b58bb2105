"""python -m engine tune on the tiny pair, with real runs: it tunes in seconds, stores the
winners where the API, the CLI and the app read a pair's tuned settings, a second call on the
same folder measures nothing again, and bad input is one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import engine
from engine.cli import main
from engine.run.tuned import tuned_settings

TARGET = 'tiny:{"vocab_size": 64, "layers": 2, "seed": 3}'


def _set(tmp_path: Path) -> str:
    path = tmp_path / "set.jsonl"
    rows = [{"id": f"{c}-{i}", "category": c, "prompt": f"{c} number {i} {c} number {i}"}
            for c in ("chat", "code") for i in range(3)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return str(path)


@pytest.fixture
def tuned_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECVIZ_TUNED", str(tmp_path / "tuned"))
    return tmp_path / "tuned"


def test_a_tune_of_the_tiny_pair_becomes_its_defaults_everywhere(tmp_path, tuned_dir, capsys):
    args = ["tune", "--target", TARGET, "--set", _set(tmp_path), "--methods", "sd",
            "--minutes", "0.3", "--max-new-tokens", "8", "--dir", str(tmp_path / "run"),
            "--out", str(tmp_path / "sd.json")]
    assert main(args) == 0
    out = capsys.readouterr().out
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    winner = result["methods"]["sd"]["params"]
    assert "| sd |" in out and "stored:" in out
    page = (tmp_path / "run" / "report.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and result["methods"]["sd"]["winner"] in page
    assert json.loads((tmp_path / "sd.json").read_text())["params"]["sd"] == winner
    report = result["methods"]["sd"]["report"]
    assert all(r["all"]["runs"] >= 1 for r in report.values())
    # the API, the CLI and the app read the stored settings
    assert winner.items() <= tuned_settings(TARGET, "")["sd"].items()
    pair = engine.load_pair(TARGET, device="cpu")
    trace = engine.generate(pair, [1, 2, 3], "sd", max_new_tokens=4)
    assert set(winner) <= set(trace.tuned_names)  # (switch=cost also implies its controller)
    from specviz import pairs

    assert pairs.tuned_params(TARGET, "") == tuned_settings(TARGET, "")
    # a second call on the same folder measures nothing again
    trials = (tmp_path / "run" / "trials.jsonl").read_text()
    assert main(args) == 0
    assert (tmp_path / "run" / "trials.jsonl").read_text() == trials


def test_bad_tune_input_is_one_line(tmp_path, tuned_dir, capsys):
    assert main(["tune", "--target", TARGET, "--set", str(tmp_path / "none.jsonl"),
                 "--methods", "sd"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: prompt set not found") and err.count("\n") == 1
    assert main(["tune", "--target", TARGET, "--set", _set(tmp_path), "--methods", "sd",
                 "--minutes", "-1"]) == 2
    assert "minutes must be in" in capsys.readouterr().err
