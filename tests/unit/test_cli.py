"""The CLI rejects bad input with one line on stderr and exit code 2."""

from __future__ import annotations

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
]


def _main(args) -> int:
    from engine.__main__ import main

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


def test_methods_lists_every_method_with_parameters(capsys):
    assert _main(["methods"]) == 0
    out = capsys.readouterr().out
    for name in ("greedy", "sample", "sd", "mcsd", "greedy_drafts"):
        assert f"\n{name}  [" in "\n" + out
    assert "--k-config" in out and "--gamma" in out
