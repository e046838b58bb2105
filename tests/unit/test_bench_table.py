"""scripts/bench_table.py: the README's tables from bench-set folders (scripts/readme_bench.sh)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def bench_table(monkeypatch):
    spec = importlib.util.spec_from_file_location("bench_table", ROOT / "scripts/bench_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "_cpu", lambda: "CPU")  # not this machine's model name
    return module


def _speedup(median: float) -> dict:
    return {"min": median - 0.1, "median": median, "max": median + 0.1}


def _folder(path: Path, target: str, tps: dict[str, list[float]],
            device: str = "cpu (1 thread)", ref: dict[str, list[float]] | None = None) -> Path:
    """A bench-set folder: greedy and sd over two prompts x one repeat; tps[case] = the
    tokens/s of each prompt; ref[case]: those of each run's interleaved `generate()` (its
    speedup: tps / ref), none by default."""
    path.mkdir()
    meta = {"max_new_tokens": 48, "temperature": 0.0, "raw": False, "repeats": 1,
            "target": target, "draft": "n-gram (prompt lookup) + feature (EAGLE-style)",
            "device": device, "dtype": "float32", "started": "2026-11-29 05:00 UTC"}
    methods = [{"method": case, "reference": "generate(greedy, width=1)",
                "categories": {"all": {"runs": 2, "tau": 1.0 if case == "greedy" else 1.8,
                                       "speedup": _speedup(1.0 if case == "greedy" else 1.3),
                                       "identical": "2/2"}}}
               for case in tps]
    (path / "summary.json").write_text(json.dumps({"meta": meta, "methods": methods}))
    rows = [{"prompt_id": f"p{i}", "repeat": 0, "case": case,
             "reference": "generate(greedy, width=1)", "tokens_per_s": v}
            | ({"speedup": v / ref[case][i]} if ref else {})
            for case, vals in tps.items() for i, v in enumerate(vals)]
    (path / "results.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_ratio_over_plain_decode_is_per_prompt_and_repeat(bench_table, tmp_path):
    d = _folder(tmp_path / "a", "T", {"greedy": [10.0, 20.0], "sd": [15.0, 20.0]})
    # per prompt: 15 / 10 = 1.5 and 20 / 20 = 1.0 (not the ratio of the means, 35 / 30)
    assert bench_table.against_plain(d) == {"sd": "1.00 / **1.25** / 1.50"}


def test_the_drift_corrected_ratio_divides_each_runs_speedup_over_its_own_generate(
        bench_table, tmp_path):
    # the machine ran 10 % slower while sd ran: its generate() too (10 -> 9 tokens/s), so sd's
    # 9 tokens/s against greedy's 10 is 0.90 raw and 1.00 corrected
    d = _folder(tmp_path / "a", "T", {"greedy": [10.0, 10.0], "sd": [9.0, 9.9]},
                ref={"greedy": [5.0, 5.0], "sd": [4.5, 4.5]})
    assert bench_table.against_plain(d) == {"sd": "0.90 / **0.95** / 0.99 (1.05)"}
    # (per prompt: (9 / 4.5) / (10 / 5) = 1.00 and (9.9 / 4.5) / 2 = 1.10)


def test_one_target_is_named_in_the_header(bench_table, tmp_path):
    d = _folder(tmp_path / "a", "Model A", {"greedy": [10.0, 10.0], "sd": [13.0, 13.0]})
    lines = bench_table.table([d]).splitlines()
    assert "Model A" in lines[0]
    assert lines[2].startswith("| method |") and lines[2].count(" | ") == 8
    assert lines[3] == "|---" * 9 + "|"
    assert lines[5].startswith("| `sd` |") and "1.30 / **1.30** / 1.30" in lines[5]


def test_several_targets_get_a_target_column(bench_table, tmp_path):
    a = _folder(tmp_path / "a", "Model A", {"greedy": [10.0, 10.0], "sd": [13.0, 13.0]})
    b = _folder(tmp_path / "b", "Model B", {"greedy": [10.0, 10.0], "sd": [12.0, 12.0]})
    lines = bench_table.table([a, b]).splitlines()
    assert "Model" not in lines[0]
    assert lines[2].startswith("| target | method |") and lines[2].count(" | ") == 9
    assert lines[3] == "|---" * 10 + "|"
    rows = lines[4:]
    assert [r.split(" | ")[0] for r in rows] == ["| Model A"] * 2 + ["| Model B"] * 2
    assert all(r.count(" | ") == 9 for r in rows)
    assert "1.20 / **1.20** / 1.20" in rows[3]


def test_a_readme_block_is_replaced_and_the_others_kept(bench_table, tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- bench-table -->\nold one\n<!-- /bench-table -->\nmid\n"
                      "<!-- packed-table -->\nold two\n<!-- /packed-table -->\nend\n")
    bench_table.write_block(readme, "packed-table", "new two")
    assert readme.read_text() == ("intro\n<!-- bench-table -->\nold one\n<!-- /bench-table -->"
                                  "\nmid\n<!-- packed-table -->\nnew two\n<!-- /packed-table -->"
                                  "\nend\n")


def test_a_missing_block_is_refused_in_one_line(bench_table, tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("no markers here\n")
    with pytest.raises(SystemExit, match=r"no <!-- packed-table --> \.\.\. "
                                         r"<!-- /packed-table --> block"):
        bench_table.write_block(readme, "packed-table", "text")
    assert readme.read_text() == "no markers here\n"


def test_a_missing_page_is_refused_in_one_line(bench_table, tmp_path):
    with pytest.raises(SystemExit, match="no such file"):
        bench_table.write_block(tmp_path / "nothing.md", "bench-table", "text")


def test_a_target_with_a_bar_stays_in_its_cell(bench_table, tmp_path):
    a = _folder(tmp_path / "a", "Model A", {"greedy": [10.0, 10.0], "sd": [13.0, 13.0]})
    b = _folder(tmp_path / "b", "Model B | 4-bit", {"greedy": [10.0, 10.0]})
    row = bench_table.table([a, b]).splitlines()[-1]
    assert row.startswith("| Model B \\| 4-bit | `greedy` |")


def test_folders_of_different_devices_are_refused(bench_table, tmp_path):
    a = _folder(tmp_path / "a", "Model A", {"greedy": [10.0, 10.0]})
    b = _folder(tmp_path / "b", "Model B", {"greedy": [10.0, 10.0]}, device="cuda")
    with pytest.raises(SystemExit, match="different devices"):
        bench_table.table([a, b])


@pytest.mark.parametrize("text", [
    "<!-- packed-table -->\none\n<!-- /packed-table -->\n"
    "<!-- packed-table -->\ntwo\n<!-- /packed-table -->\n",  # two blocks
    "<!-- packed-table -->\nprose\n<!-- packed-table -->\ntable\n<!-- /packed-table -->\n",
])
def test_a_block_marked_more_than_once_is_refused(bench_table, tmp_path, text):
    readme = tmp_path / "README.md"
    readme.write_text(text)
    with pytest.raises(SystemExit, match="expected one block"):
        bench_table.write_block(readme, "packed-table", "new")
    assert readme.read_text() == text
