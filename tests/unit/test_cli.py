"""The CLI: bad input gets one line on stderr and exit code 2; prompts and model specs are
read as written; every subcommand module is imported or the CLI fails."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

BAD = [
    (["generate", "--method", "greedy", "--prompt", ""], "prompt is empty"),
    (["generate", "--method", "greedy", "--prompt", "hi", "--max-new-tokens", "0"],
     "max_new_tokens must be >= 1"),
    (["generate", "--method", "sd", "--prompt", "hi", "--temperature", "-1"],
     "temperature must be >= 0"),
    (["generate", "--method", "sd", "--prompt", "hi", "--top-p", "1.5"], "top_p must be <= 1"),
    (["generate", "--method", "nope", "--prompt", "hi"], "unknown method 'nope'"),
    (["generate", "--method", "greedy", "--prompt", "hi", "--gamma", "2"],
     "unknown parameter 'gamma'"),
    (["generate", "--method", "greedy", "--prompt", "hi", "--bogus", "2"],
     "unrecognized arguments"),
    (["generate", "--method", "greedy", "--prompt", "hi", "--target", "/no/such/dir"],
     "cannot load model '/no/such/dir'"),
    (["generate", "--method", "sd", "--prompt", "hi", "--target", "tiny",
      "--draft", 'tiny:{"vocab_size": 32}'], "target vocab size 64, draft 32"),
    (["generate", "--method", "greedy", "--prompt-file", "/no/such/file"],
     "prompt file not found"),
    (["generate", "--method", "greedy"], "--prompt"),
    (["generate", "--method", "greedy", "--prompt", "hi", "--prompts-jsonl", "p.jsonl"],
     "unrecognized arguments: --prompts-jsonl"),
    (["generate", "--method", "sd", "--prompt", "hi", "--target", "tiny",
      "--draft", "early-exit:0"], "early-exit layers must be a positive integer"),
    (["generate", "--method", "greedy", "--prompt", "hi", "--target", "tiny:{oops"],
     "bad tiny model spec"),
    (["bench", "--methods", "greedy", "--prompts-jsonl", "/no/such/file"],
     "prompts file not found"),
    (["generate", "--method", "greedy", "--prompt", "hi", "--target", "tiny", "--device", "tpu"],
     "unknown device 'tpu'"),
    (["generate", "--method", "greedy", "--prompt", "hi", "--target", "tiny", "--dtype", "fp8"],
     "unknown dtype 'fp8'"),
    (["generate", "--method", "sd", "--prompt", "hi", "--target", "tiny", "--seed", "-1"],
     "seed must be >= 0"),
    (["generate", "--method", "sd", "--prompt", "hi", "--target", "tiny", "--max-new-tokens",
      "abc"], "max_new_tokens: expected int"),
    (["generate", "--method", "mcsd", "--prompt", "hi", "--target", "tiny", "--k-config",
      "9x9x9"], "k_config '9x9x9' makes 819 nodes"),
    (["generate", "--method", "greedy", "--prompt", "hi", "--target", "tiny", "--trace",
      "/no/such/dir/t.json"], "--trace: no such folder: /no/such/dir"),
    (["generate", "--method", "greedy", "--prompt", "hi", "--target", "tiny",
      "--draft", "gpt2-nonexistent-xyz", "--device", "cpu"], "cannot load model"),
    (["generate", "--method", "greedy", "--prompt", "hi", "--target",
      'tiny:{"hidden_size": 8192, "layers": 64}'], "tiny models are toys of at most 50M"),
    (["generate", "--method", "greedy", "--prompt", "hi", "--target", 'tiny:{"vocab_size": -5}'],
     "sizes must be positive integers"),
    (["methods", "--target", "tiny:{oops"], "bad tiny model spec"),
]


def _main(args) -> int:
    from engine.cli import main

    try:
        return main(args)
    except SystemExit as e:  # argparse errors
        return int(e.code)


@pytest.mark.parametrize("args,message", BAD)
def test_bad_input_gets_one_line_and_exit_code_2(args, message, capsys):
    code = _main(args)
    err = capsys.readouterr().err
    assert code == 2, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert message in lines[0]


def test_a_real_process_exits_with_code_2_and_no_traceback():
    out = subprocess.run([sys.executable, "-m", "engine", "generate", "--method", "nope",
                          "--prompt", "hi"], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == ["error: unknown method 'nope' (known: "
                                               + out.stderr.split("(known: ")[1].strip()]
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize("argv, message", [
    (["--device", "tpu"], "argument --device: invalid choice: 'tpu'"),
    (["--port", "abc"], "argument --port: invalid int value: 'abc'"),
    (["--target", "tiny:{oops"], "bad tiny model spec"),
    (["--draft", "early-exit:0"], "early-exit layers must be a positive integer"),
    (["--presets", "gpt5"], "SPECVIZ_PRESETS: unknown preset 'gpt5'"),
])
def test_the_app_refuses_bad_flags_in_one_line_before_it_serves(argv, message, capsys,
                                                                 monkeypatch):
    import app

    monkeypatch.setattr(app.specviz, "build_demo", lambda *a, **k: pytest.fail("served"))
    with pytest.raises(SystemExit) as exit_:
        app.main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(err) == 1 and err[0].startswith("error: ")
    assert message in err[0]


def test_methods_lists_every_method_with_parameters(capsys):
    assert _main(["methods"]) == 0
    out = capsys.readouterr().out
    for name in ("greedy", "sample", "sd", "mcsd", "greedy_drafts"):
        assert f"\n{name}  [" in "\n" + out
    assert "--k-config" in out and "--gamma" in out


def _section(out: str, method: str) -> str:
    """The lines `methods` prints for one method."""
    lines = out.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith(f"{method}  ["))
    end = next((i for i in range(start + 1, len(lines)) if not lines[i].startswith(" ")),
               len(lines))
    return "\n".join(lines[start:end])


def test_methods_shows_each_parameters_default_and_the_pairs_tuned_value(capsys):
    assert _main(["methods"]) == 0  # the default target (on a CPU: the GGUF as shipped)
    assert capsys.readouterr().out.startswith("pair: target 'embedded-q4:a8', draft "
                                              "'ngram+feature'; 'tuned' = ")
    assert _main(["methods", "--target", "embedded"]) == 0  # the fp32 model, its drafter
    out = capsys.readouterr().out
    assert "    --gamma (int, default 4): " in _section(out, "sd")  # not tuned
    assert "    --controller (str, default 'fixed', tuned 'fixed') " in _section(out, "sd")
    assert "    --switch (str, default 'off', tuned 'cost') " in _section(out, "sd")
    assert "    --switch (str, default 'off', tuned 'cost') " in _section(out, "eesd")
    assert "    --k-config (str, default '4x2x2', tuned '2x2'): " in _section(out, "mcsd")
    assert "    --top-p (float, default 1.0): " in _section(out, "sd")  # not tuned
    assert "tuned" not in _section(out, "greedy")
    assert _main(["methods", "--draft", "early-exit"]) == 0  # a pair with no preset
    out = capsys.readouterr().out
    assert "    --gamma (int, default 4): " in _section(out, "sd")
    assert "no tuned values" in out.splitlines()[0]


def test_methods_json_gives_the_tuned_value_beside_the_default(capsys):
    def switch_of_sd(argv):
        assert _main(argv) == 0
        sd = next(m for m in json.loads(capsys.readouterr().out) if m["name"] == "sd")
        row = next(p for p in sd["params"] if p["name"] == "switch")
        return row["default"], row["tuned"]

    assert switch_of_sd(["methods", "--json", "--target", "embedded"]) == ("off", "cost")
    assert switch_of_sd(["methods", "--json", "--target", "smollm2-135m-instruct",
                         "--draft", "n-gram+feature"]) == ("off", "cost")
    assert switch_of_sd(["methods", "--json", "--target", "tiny"]) == ("off", None)


# ----------------------------------------------------------------- CLI input checks

CODE_PROMPT = b'def add(a, b):\r\n    """Sum of a and b."""\n\n    return a + b\n  \n'


def test_prompt_file_is_one_whole_prompt_byte_for_byte(tmp_path):
    path = tmp_path / "prompt.py"
    path.write_bytes(CODE_PROMPT)
    trace = tmp_path / "run.json"
    code = _main(["generate", "--method", "greedy", "--target", "tiny", "--raw",
                  "--prompt-file", str(path), "--max-new-tokens", "2", "--trace", str(trace)])
    assert code == 0
    run = json.loads(trace.read_text())
    assert run["prompt"] == CODE_PROMPT.decode("utf-8")
    assert len(run["prompt_ids"]) == len(CODE_PROMPT.decode("utf-8"))  # one id per character


def test_bench_takes_a_jsonl_batch_of_multi_line_prompts(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps("first\n    indented") + "\n"
                       + json.dumps({"prompt": "second"}) + "\n")
    out = tmp_path / "out"
    code = _main(["bench", "--methods", "greedy", "--prompts-jsonl", str(prompts), "--raw",
                  "--target", "tiny", "--repeats", "1", "--max-new-tokens", "2",
                  "--out", str(out)])
    assert code == 0
    data = json.loads((out / "bench.json").read_text())
    assert data["meta"]["prompts"] == 2 and len(data["runs"]) == 2


@pytest.mark.parametrize("spec", ["tiny-model", "tinyllama/TinyLlama-1.1B", "tiny:"])
def test_a_spec_that_only_starts_with_tiny_is_not_a_toy_model(spec, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code = _main(["generate", "--method", "greedy", "--prompt", "hi", "--target", spec])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1


def test_a_local_folder_named_tiny_something_is_loaded_as_a_folder(tmp_path, capsys,
                                                                    monkeypatch):
    (tmp_path / "tiny-local").mkdir()  # an empty folder: no model in it
    monkeypatch.chdir(tmp_path)
    code = _main(["generate", "--method", "greedy", "--prompt", "hi", "--target", "tiny-local"])
    err = capsys.readouterr().err
    assert code == 2 and "cannot load model 'tiny-local'" in err, err


def test_draft_early_exit_n_picks_the_targets_first_n_layers(tmp_path):
    trace = tmp_path / "run.json"
    code = _main(["generate", "--method", "sd", "--gamma", "2", "--prompt", "hello", "--raw",
                  "--target", 'tiny:{"layers": 4}', "--draft", "early-exit:3",
                  "--max-new-tokens", "4", "--trace", str(trace)])
    assert code == 0
    assert json.loads(trace.read_text())["draft"].startswith("early-exit (first 3/4 layers")


def test_a_prompt_file_that_is_not_utf8_is_one_line_error(tmp_path, capsys):
    path = tmp_path / "latin1.txt"
    path.write_bytes("caf\xe9".encode("latin-1"))
    assert _main(["generate", "--method", "greedy", "--prompt-file", str(path)]) == 2
    assert capsys.readouterr().err.startswith("error: prompt file is not UTF-8")


@pytest.mark.parametrize("line,message", [
    ("not json", ":2: not JSON"), ("[1, 2]", ':2: expected a JSON string or {"prompt"'),
    ('{"text": "x"}', ":2: expected a JSON string"), ('"  "', ":2: prompt is empty"),
])
def test_a_bad_jsonl_line_is_named_by_its_number(tmp_path, capsys, line, message):
    path = tmp_path / "p.jsonl"
    path.write_text('"fine"\n' + line + "\n")
    code = _main(["bench", "--methods", "greedy", "--prompts-jsonl", str(path),
                  "--target", "tiny"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and message in err, err


def test_the_shipped_bench_prompts_are_jsonl():
    from engine.cli.flags import read_prompts_jsonl
    from engine.core.paths import ASSETS

    assert len(read_prompts_jsonl(ASSETS / "bench_prompts.jsonl")) == 3
    assert len(read_prompts_jsonl(ASSETS / "eesd_bench_prompts.jsonl")) == 6


def test_a_subcommand_module_that_fails_to_import_is_an_error(monkeypatch):
    import importlib

    monkeypatch.delitem(sys.modules, "engine.cli")
    monkeypatch.setitem(sys.modules, "engine.cli.train_draft", None)  # import raises
    with pytest.raises(ImportError, match="engine.cli.train_draft"):
        importlib.import_module("engine.cli")


@pytest.mark.parametrize("argv, compiled", [
    (["bench", "--methods", "greedy", "--prompt", "x"], True),
    (["bench-set", "--set", "s.jsonl", "--methods", "sd"], True),
    (["tune", "--set", "s.jsonl"], True),
    (["generate", "--method", "greedy", "--prompt", "x"], False),
    (["check", "--method", "sd", "--prompt", "x"], False),
])
def test_long_lived_commands_serve_compiled_steps_and_a_one_shot_run_does_not(
        argv, compiled, monkeypatch):
    """bench, bench-set and tune run a packed target's compiled steps on a CPU (their
    warm-up runs make the shapes); generate and check keep eager steps; the process's
    policy is restored after the command."""
    import engine.cli as cli
    from engine.execution import static_kv

    seen = []
    module = next(m for name, _, m in cli.COMMANDS if name == argv[0])
    monkeypatch.setattr(module, "run", lambda args: seen.append(static_kv.POLICY.packed))
    monkeypatch.setattr(static_kv, "can_compile", lambda: True)
    monkeypatch.setattr(static_kv.POLICY, "packed", False)
    assert cli.main(argv) == 0
    assert seen == [compiled] and static_kv.POLICY.packed is False


def test_without_a_compiler_a_long_lived_command_keeps_eager_steps(monkeypatch, caplog):
    import engine.cli as cli
    from engine.execution import static_kv

    seen = []
    monkeypatch.setattr(cli.bench, "run", lambda args: seen.append(static_kv.POLICY.packed))
    monkeypatch.setattr(static_kv, "can_compile", lambda: False)
    monkeypatch.setattr(static_kv.POLICY, "packed", False)
    assert cli.main(["bench", "--methods", "greedy", "--prompt", "x"]) == 0
    assert seen == [False] and "no C++ compiler" in caplog.text


def test_the_thread_rule_is_measured_on_eager_steps(monkeypatch):
    """A compiled step keeps the thread count it was compiled at, so the thread rule's
    calibration (inside a long-lived command's compiled path) must not compile one."""
    import argparse

    from engine.cli.flags import pair_from_flags
    from engine.execution import static_kv
    from engine.run import api

    seen = []
    monkeypatch.setattr(api, "tune_threads", lambda pair: seen.append(static_kv.POLICY.deferred))
    args = argparse.Namespace(target="tiny", draft="", device="cpu", dtype="float32",
                              device_map=None, early_exit_layers=None)
    pair_from_flags(args)
    assert seen == [True] and static_kv.POLICY.deferred is False
