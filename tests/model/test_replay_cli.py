"""`python -m engine replay TRACE`: the grid, the bound and the run's own standing in one
table (or JSON) for a trace file, its pair loaded from the names it records; bad input is
one line."""

from __future__ import annotations

import json

import pytest

from engine.cli import main

GEN = ["generate", "--target", "tiny", "--draft", "ngram", "--raw", "--prompt",
       "a b a b a b a b c d a b", "--max-new-tokens", "24", "--temperature", "0"]


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("replay") / "run.json"
    assert main([*GEN, "--method", "sd", "--gamma", "2", "--controller", "fixed",
                 "--trace", str(path)]) == 0
    return path


def test_replay_prints_the_grid_the_bound_and_the_runs_standing(trace_file, capsys):
    capsys.readouterr()
    assert main(["replay", str(trace_file)]) == 0
    out = capsys.readouterr().out
    assert "temperature 0: exact" in out and "drafter: n-gram" in out
    for label in ("* this run: sd gamma=2", "sd gamma=1 ", "sd gamma=8 ", "sd confidence=0.4",
                  "mcsd k_config=2x2 ", "clairvoyant lengths", "best fixed length: sd gamma="):
        assert label in out, label


def test_replay_json_holds_every_settings_rounds(trace_file, capsys):
    capsys.readouterr()
    assert main(["replay", str(trace_file), "--json", "--costs", "h100"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["exact"] and report["t_step_s"] is None and report["profile"].startswith("h100")
    gamma2 = next(o for o in report["grid"] if o["label"] == "sd gamma=2")
    assert [r["committed"] for r in gamma2["rounds"]] == [
        r["committed"] for r in report["own"]["rounds"]]
    assert sum(r["committed"] for r in report["bound"]["rounds"]) == report["new_tokens"] == 24


@pytest.mark.parametrize("args, message", [
    (["/nonexistent/run.json"], "error: no such trace file"),
    (["{bad}"], "error: no such trace file"),
])
def test_a_missing_trace_is_one_line(args, message, capsys):
    assert main(["replay", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and len(err.strip().splitlines()) == 1


def test_a_file_that_is_not_a_trace_or_a_beam_trace_is_refused(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text('{"hello": 1}')
    assert main(["replay", str(bad)]) == 2
    assert capsys.readouterr().err.startswith("error: not a trace file")
    beam = tmp_path / "beam.json"
    assert main([*GEN, "--method", "beam", "--beams", "2", "--trace", str(beam)]) == 0
    capsys.readouterr()
    assert main(["replay", str(beam)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: beam keeps several beams") and len(err.splitlines()) == 1
