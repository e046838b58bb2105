"""The benchmark harness runs methods against generate() and writes markdown + JSON."""

from __future__ import annotations

import json

import pytest

from engine.bench.interleaved import parse_methods
from engine.core.errors import ConfigError


def test_method_list_parses_parameters():
    cases = parse_methods("greedy, sd:gamma=4:controller=beta_ts,mcsd:k_config=4x2x2")
    assert [c.method for c in cases] == ["greedy", "sd", "mcsd"]
    assert cases[1].params == {"gamma": "4", "controller": "beta_ts"}
    with pytest.raises(ConfigError):
        parse_methods("sd:gamma")


def test_bench_writes_a_table_with_speedups_and_identity(tmp_path, capsys):
    from engine.cli import main

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('"hello there"\n{"prompt": "abc"}\n')
    code = main(["bench", "--methods", "greedy,sd:gamma=2", "--prompts-jsonl", str(prompts),
                 "--target", "tiny", "--repeats", "2", "--max-new-tokens", "8",
                 "--out", str(tmp_path / "out")])
    assert code == 0
    data = json.loads((tmp_path / "out" / "bench.json").read_text())
    assert len(data["runs"]) == 2 * 2 * 2
    assert all(r["identical"] for r in data["runs"])
    for r in data["runs"]:  # the phases of the run, within its wall time
        split = r["time_split_s"]
        assert {"score", "commit"} <= set(split) <= {"propose", "score", "verify", "commit",
                                                     "observe"}, split
        assert 0 < sum(split.values()) <= r["wall_s"] * 1.001
    md = (tmp_path / "out" / "bench.md").read_text()
    assert "| sd:gamma=2 | generate(greedy, width=1) |" in md and "4/4" in md


@pytest.mark.parametrize("kv,runs", [("", [("p0", "8")]),
                                     ("compiled", [("p0", "16"), ("p1", "16")])])
def test_the_warm_up_runs_every_prompt_whole_on_the_compiled_path(monkeypatch, kv, runs):
    # a compiled step shape compiles on first use and a prompt's length picks its attended
    # views: there the warm-up runs every prompt as the timed runs will, elsewhere one short run
    import engine
    from engine.bench import interleaved

    pair = engine.load_pair("tiny", device="cpu")
    seen = []
    monkeypatch.setattr(interleaved, "measure", lambda pair, prompt, c, raw, common:
                        seen.append((prompt, common["max_new_tokens"])))
    monkeypatch.setenv("SPECVIZ_KV", kv)
    interleaved.warm_up(pair, ["p0", "p1"], parse_methods("greedy"), raw=True,
                        common={"max_new_tokens": "16"})
    assert seen == runs
    seen.clear()  # a cancel stops it between runs; the pause point follows every run
    ticks = []
    interleaved.warm_up(pair, ["p0", "p1"], parse_methods("greedy"), raw=True,
                        common={"max_new_tokens": "16"}, stop=lambda: len(seen) == 1,
                        after_each=lambda: ticks.append(len(seen)))
    assert seen == runs[:1] and ticks == [1]
