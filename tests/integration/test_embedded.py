"""The embedded SmolLM2-135M-Instruct: baselines and token methods equal greedy generate()."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import engine

pytestmark = pytest.mark.embedded

PROMPTS = [
    "What is the capital of Italy?",  # stops at EOS well before the limit (France's flips to
    # a runaway answer at a 0.013 logit tie under the fp16 cache: the first token, "The" or "L")
    "Write a haiku about autumn leaves.",
    "List three uses of a paperclip.",
]
N = 40


def _ref(pair, prompt, n=N):
    ids = engine.encode_prompt(pair, prompt)
    out = pair.target.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=n)
    return out[0, len(ids):].tolist()


@pytest.fixture(scope="module")
def refs(embedded_pair):
    return {p: _ref(embedded_pair, p) for p in PROMPTS}


def test_a_prompt_reaches_eos_before_the_limit(embedded_pair, refs):
    ref = refs[PROMPTS[0]]
    assert len(ref) < N and ref[-1] in (embedded_pair.target.generation_config.eos_token_id,)


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_equals_generate(embedded_pair, refs, prompt):
    trace = engine.generate(embedded_pair, prompt, "greedy", max_new_tokens=N)
    assert list(trace.token_ids) == refs[prompt]


@pytest.mark.parametrize("method,params", [
    ("sd", {"gamma": 4}),
    ("sd", {"controller": "beta_ts"}),
    ("mcsd", {"k_config": "4x2x2"}),
    ("mcsd", {"k_config": "4x2x2", "verifier": "kseq"}),
    ("greedy_drafts", {"k_config": "3x2x2"}),
])
def test_token_methods_at_temperature_zero_equal_greedy_generate(embedded_pair, refs, method,
                                                                  params):
    for prompt in PROMPTS[:2]:
        trace = engine.generate(embedded_pair, prompt, method, max_new_tokens=N, **params)
        assert list(trace.token_ids) == refs[prompt], (method, prompt)


def test_mcsd_sampling_reports_acceptance_and_tau(embedded_pair):
    trace = engine.generate(embedded_pair, PROMPTS[1], "mcsd", k_config="4x2x2",
                            temperature=1.0, max_new_tokens=24, seed=3)
    s = trace.stats
    assert 0.0 <= s.acceptance_rate <= 1.0 and s.tau >= 1.0
    assert s.target_calls == len(trace.rounds)


def _cli(*args):
    # one OpenMP thread: two threads on a busy 2-core machine are several times slower
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "engine", *args], capture_output=True,
                          text=True, timeout=300, env=env)


def test_cli_generate_json_matches_generate(refs):
    out = _cli("generate", "--method", "greedy", "--prompt", PROMPTS[0], "--max-new-tokens",
               str(N), "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["token_ids"] == refs[PROMPTS[0]]
    assert {"target_calls", "draft_calls", "new_tokens", "wall_s"} <= set(data["stats"])


def test_cli_mcsd_temperature_zero_matches_generate(refs):
    # switch off: the preset's cost switch may plan no draft at all on a loaded machine, and
    # this test is about drafted rounds giving generate()'s tokens
    out = _cli("generate", "--method", "mcsd", "--k-config", "4x2x2", "--temperature", "0",
               "--switch", "off", "--prompt", PROMPTS[1], "--max-new-tokens", str(N), "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["token_ids"] == refs[PROMPTS[1]]
    assert data["stats"]["acceptance_rate"] is not None


@pytest.mark.parametrize("method", ["beam", "atspeed_strict"])
def test_cli_beam_json_returns_the_beams_of_generate(embedded_pair, method):
    prompt = PROMPTS[0]
    ids = engine.encode_prompt(embedded_pair, prompt)
    ref = embedded_pair.target.generate(
        torch.tensor([ids]), do_sample=False, num_beams=4, num_return_sequences=4,
        max_new_tokens=24, output_scores=True, return_dict_in_generate=True)
    extra = ["--draft-beams", "4", "--gamma", "2"] if method == "atspeed_strict" else []
    out = _cli("generate", "--method", method, "--beams", "4", "--prompt", prompt,
               "--max-new-tokens", "24", "--json", *extra)
    assert out.returncode == 0, out.stderr
    beams = json.loads(out.stdout)["beams"]
    pad = embedded_pair.target.generation_config.pad_token_id
    eos = embedded_pair.target.generation_config.eos_token_id
    for got, row, score in zip(beams, ref.sequences, ref.sequences_scores):
        want = row[len(ids):].tolist()
        if eos in want:
            want = want[: want.index(eos) + 1]
        while want and want[-1] == pad and pad != eos:
            want.pop()
        assert got["token_ids"] == want
        assert abs(got["score"] - float(score)) < 1e-4


@pytest.fixture(scope="module")
def feature_pair(embedded_pair):
    """The embedded target with the shipped, trained feature drafter (same target weights)."""
    from engine.drafters.feature import feature_drafter
    from engine.run.models import ModelPair

    drafter = feature_drafter(embedded_pair.target)
    return ModelPair(embedded_pair.target, drafter, embedded_pair.tokenizer,
                     embedded_pair.device, embedded_pair.target_name, drafter.name)


def test_the_shipped_feature_drafter_is_trained_for_the_embedded_target(feature_pair):
    assert "untrained" not in feature_pair.drafter.name


@pytest.mark.parametrize("method,params", [
    ("sd", {"gamma": 3}),
    ("sd", {"controller": "beta_ts"}),
    ("mcsd", {"k_config": "2x2"}),
])
def test_trained_feature_drafter_keeps_greedy_equal_to_generate_and_accepts(feature_pair, refs,
                                                                          method, params):
    accepted = 0
    for prompt in PROMPTS[1:]:
        trace = engine.generate(feature_pair, prompt, method, max_new_tokens=N, **params)
        assert list(trace.token_ids) == refs[prompt], (method, prompt)
        accepted += sum(r.accepted for r in trace.rounds)
    assert accepted > 0  # the trained drafter's drafts are taken, not only verified away
