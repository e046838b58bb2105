"""The suffix drafter over the default target (on a CPU the embedded GGUF as shipped): token
methods at temperature 0 equal greedy generate(), the pair's store of earlier outputs drafts
for a later prompt whose answer repeats an earlier one, and `python -m engine generate
--draft suffix` runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import engine
from engine.drafters.suffix import SuffixDrafter
from engine.run.models import ModelPair

pytestmark = pytest.mark.embedded

EDIT = ("Fix the spelling and repeat the sentence: The quick brwn fox jumps ovr the lazy dog "
        "near the rivr bank.")
N = 32


def _ref(pair, prompt, n=N):
    ids = engine.encode_prompt(pair, prompt)
    out = pair.target.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=n)
    return out[0, len(ids):].tolist()


@pytest.fixture(scope="module")
def suffix_pair(embedded_pair):
    """The default target with a suffix drafter (its store empty)."""
    head = embedded_pair.target.get_output_embeddings().weight
    drafter = SuffixDrafter(int(head.shape[0]), device=head.device)
    return ModelPair(embedded_pair.target, drafter, embedded_pair.tokenizer,
                     embedded_pair.device, embedded_pair.target_name, drafter.name)


@pytest.mark.parametrize("method,params", [("sd", {"gamma": 4}), ("mcsd", {"k_config": "2x2"})])
def test_temperature_zero_with_the_suffix_drafter_equals_greedy_generate(suffix_pair, method,
                                                                          params):
    suffix_pair.drafter.store.clear()
    trace = engine.generate(suffix_pair, EDIT, method, max_new_tokens=N, **params)
    assert list(trace.token_ids) == _ref(suffix_pair, EDIT), method
    assert sum(r.accepted for r in trace.rounds) > 0  # the edit copies the prompt


def test_a_later_prompt_drafts_from_an_earlier_output(suffix_pair):
    earlier = "Write a Python function that returns the sum of a list of numbers."
    later = "Write a Python function that returns the sum of a list of integers."
    accepted = {}
    for kept in (False, True):
        suffix_pair.drafter.store.clear()
        if kept:
            engine.generate(suffix_pair, earlier, "sd", gamma=4, max_new_tokens=N)
        trace = engine.generate(suffix_pair, later, "sd", gamma=4, max_new_tokens=N)
        assert list(trace.token_ids) == _ref(suffix_pair, later), kept
        accepted[kept] = sum(r.accepted for r in trace.rounds)
    assert accepted[True] > accepted[False]  # the earlier answer's code, drafted again


def test_cli_generate_takes_draft_suffix():
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-m", "engine", "generate", "--draft", "suffix",
                          "--method", "sd", "--prompt", EDIT, "--max-new-tokens", "16",
                          "--json"], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["stats"]["drafted"] > 0
