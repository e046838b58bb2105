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
    monkeypatch.setattr(interleaved, "measure", lambda pair, prompt, c, raw, common, retakes:
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


def test_a_timing_across_which_a_step_shape_was_made_is_taken_again(monkeypatch):
    """On the captured path a step shape is captured on its first use (compiled, on a CPU's
    compiled path: up to a minute): the run that made it is run again, with its reference,
    and the row holds the later timings; a run that made none, or a warm-up's, runs once."""
    import engine
    from engine.bench import interleaved
    from engine.bench.interleaved import Case, measure_run
    from engine.execution import static_kv

    monkeypatch.setenv("SPECVIZ_KV", "captured")  # on a CPU: the same fixed-shape steps,
    # captured (here: made) on first use and replayed eagerly
    pair = engine.load_pair(target='tiny:{"vocab_size": 64, "layers": 2, "seed": 11}',
                            draft="")
    calls, made = [], []
    real = engine.generate

    def counted(*a, **k):
        made.append(static_kv.POLICY.made)
        calls.append(real(*a, **k))
        return calls[-1]

    monkeypatch.setattr(engine, "generate", counted)
    case = Case("beam", "beam", {"beams": "3"})  # 3-row shapes: not warmed at load
    common = {"max_new_tokens": "6"}
    row, trace = measure_run(pair, "a fresh prompt", case, raw=True, common=common)
    assert len(calls) == 2 and made[1] > made[0]  # the first run captured its shapes
    assert trace is calls[1] and row["wall_s"] == trace.stats.wall_s
    assert row["identical"]
    calls.clear()
    measure_run(pair, "a fresh prompt", case, raw=True, common=common)
    assert len(calls) == 1  # every shape made: one timing
    calls.clear()
    interleaved.warm_up(pair, ["a fresh prompt"], [Case("beam", "beam", {"beams": "4"})],
                        raw=True, common=common)
    assert len(calls) == 1  # a warm-up run makes its 4-row shapes and is not timed again
    refs = []
    real_ref = interleaved.run_reference

    def ref_making_a_shape(*a, **k):  # (a shape "made" during every reference run)
        refs.append(1)
        static_kv.POLICY.count_made()
        return real_ref(*a, **k)

    monkeypatch.setattr(interleaved, "run_reference", ref_making_a_shape)
    calls.clear()
    row, trace = measure_run(pair, "a fresh prompt", case, raw=True, common=common)
    assert len(calls) == len(refs) == interleaved.RETAKES + 1  # then the last timing stands
    assert trace is calls[-1] and row["wall_s"] == trace.stats.wall_s
