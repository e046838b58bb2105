"""`python -m engine generate` runs every registered method on a tiny model and prints JSON."""

from __future__ import annotations

import json

import pytest

import engine
from engine.cli import main

# run at temperature 1: sampling methods (beam_sample, dsbd, atspeed_relaxed refuse 0)
SAMPLING_ONLY = {"sample", "beam_sample", "dsbd", "atspeed_relaxed"}
SMALL = {"beams": "2", "draft_beams": "2", "gamma": "2", "k_config": "2x2"}


def _args(method: str) -> list[str]:
    names = {p.name for p in engine.METHODS[method].all_params}
    args = ["--temperature", "1" if method in SAMPLING_ONLY else "0"]
    for name, value in SMALL.items():
        if name in names:
            args += ["--" + name.replace("_", "-"), value]
    return args


@pytest.mark.parametrize("method", sorted(engine.METHODS))
def test_generate_runs_every_method_and_prints_json(method, capsys):
    code = main(["generate", "--method", method, "--target", 'tiny:{"layers": 4}', "--raw",
                 "--prompt", "hello", "--max-new-tokens", "3", "--json", *_args(method)])
    out, err = capsys.readouterr()
    assert code == 0, err
    result = json.loads(out)
    assert result["method"] == method
    assert 1 <= len(result["token_ids"]) <= 3 and isinstance(result["text"], str)
    assert result["stats"]["new_tokens"] == len(result["token_ids"])

