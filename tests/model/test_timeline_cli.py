"""`generate --timeline FILE` writes the run's trace-event JSON; a bad path is one line."""

from __future__ import annotations

import json

import engine
from engine.cli import main
from tests.unit.test_timeline import check_trace_event_format

ARGS = ["generate", "--method", "sd", "--gamma", "2", "--target", "tiny", "--raw",
        "--prompt", "hello", "--max-new-tokens", "6", "--temperature", "0"]


def test_generate_writes_a_timeline_of_its_rounds(tmp_path, capsys):
    out, trace = tmp_path / "run.timeline.json", tmp_path / "run.json"
    assert main([*ARGS, "--timeline", str(out), "--trace", str(trace)]) == 0
    events = check_trace_event_format(json.loads(out.read_text()))
    rounds = engine.RunTrace.from_json(trace.read_text()).rounds
    spans = [e for e in events if e["ph"] == "X" and e["cat"] == "round"]
    assert len(spans) == len(rounds) >= 1
    assert [e["args"]["committed"] for e in spans] == [len(r.committed) for r in rounds]


def test_a_timeline_into_a_missing_folder_is_one_line(tmp_path, capsys):
    code = main([*ARGS, "--timeline", str(tmp_path / "nowhere" / "t.json")])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: --timeline: no such folder")
    assert len(err.strip().splitlines()) == 1
