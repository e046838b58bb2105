"""End to end on a packed target: sampling methods reproduce the law of 3-token continuations
of a vocab-8 llama whose linears are Q4_1 blocks run by the 4-bit kernel (engine.kernels.qmm).

The packed model is its own target: its law p is enumerated through its own forward
(tests/laws.py), and the chi-square test and its size N (a power calculation, tests/stats.py)
are those of test_sampling_exactness.py. The negative control runs sd with a rule that keeps
the first draft without looking at p, in just enough seeds to move the law TV 0.05 from p,
and checks that the test rejects it.
"""

from __future__ import annotations

import numpy as np
import pytest

import engine
import engine.methods.token as token_method
import engine.verify.token as token_rules
from engine.kernels.packed4 import Packed4Linear
from engine.run.models import model_from_config, tiny_config
from tests.gguf_tiny import load_packed, write_gguf
from tests.laws import V, exact_law, sample_counts, tiny_model
from tests.stats import TV, chi_square, control_size, exactness_size, mixture_at_tv, tv

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A one-layer vocab-8 target packed from its Q4_1 GGUF (the smallest widths the 4-bit
    kernel takes: 32 inputs, 16 outputs), and a one-layer stock draft model."""
    cfg = tiny_config("llama", vocab_size=V, layers=1, hidden_size=32, intermediate_size=64,
                      num_attention_heads=4, num_key_value_heads=2, initializer_range=0.3)
    target = model_from_config(cfg, seed=5)
    path = tmp_path_factory.mktemp("gguf") / "target.gguf"
    load_packed(target, path, write_gguf(path, target))
    assert sum(isinstance(m, Packed4Linear) for m in target.modules()) == 7
    return target, tiny_model(1, seed=6)


@pytest.fixture(scope="module")
def pair(models):
    p = engine.load_pair(target=models[0], draft=models[1], device="cpu")
    p.target.generation_config.eos_token_id = None  # every run yields exactly 3 tokens
    return p


@pytest.fixture(scope="module")
def law(pair):
    return exact_law(pair.target)


@pytest.fixture(scope="module")
def runs() -> dict:
    return {}


@pytest.mark.parametrize("method,params", [
    ("sd", {"gamma": 2}),
    ("mcsd", {"k_config": "3x2", "verifier": "rrs_wor"}),
])
def test_sampling_on_a_packed_target_matches_its_law_of_continuations(
        pair, law, models, runs, method, params, stats_summary):
    n, note = exactness_size(law, exact_law(models[1]))
    stats_summary.append(f"packed target, {method} {params}: {note}")
    memo = runs.setdefault((method, repr(params)), {})
    stat, threshold = chi_square(sample_counts(pair, method, params, range(n), memo), law, n)
    assert stat < threshold, (method, params, n, stat, threshold)


def _always_accept(p, q, candidates, rng):
    """A wrong rule: takes the first draft without looking at p."""
    return token_rules.TokenVerdict(0, int(candidates[0]), (), None)


def test_the_check_rejects_a_wrong_rule_on_the_packed_target_in_a_few_runs(
        pair, law, models, runs, monkeypatch, stats_summary):
    target, draft = models
    wrong_law = exact_law(draft, draft, target)  # sd (gamma 2) always accepting
    mixture = mixture_at_tv(law, wrong_law, TV)
    n, note = control_size(law, mixture)
    e = TV / tv(law, wrong_law)
    stats_summary.append(f"packed target, control in {e:.1%} of runs: {note}")
    bad = np.random.default_rng(54321).random(n) < e  # (n,) which seeds run the wrong rule
    sd = {"gamma": 2}
    counts = sample_counts(pair, "sd", sd, np.flatnonzero(~bad),
                           runs.setdefault(("sd", repr(sd)), {}))
    monkeypatch.setitem(token_rules.RULES, "sd", _always_accept)
    monkeypatch.setitem(token_method.RULES, "sd", _always_accept)
    for seq, k in sample_counts(pair, "sd", sd, np.flatnonzero(bad)).items():
        counts[seq] = counts.get(seq, 0) + k
    stat, threshold = chi_square(counts, law, n)
    assert stat > threshold, (n, int(bad.sum()), stat, threshold)
