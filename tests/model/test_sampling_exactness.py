"""End to end: sampling methods reproduce the target's law of 3-token continuations.

A tiny random model (vocab 8) gives the exact law p by enumerating all 8^3 continuations; each
speculative method runs N times with seeds 0..N-1 and a chi-square test with a 1e-6
false-alarm probability compares the counts with p (the seeds are fixed, so each test is
deterministic).

N comes from a power calculation (tests/stats.py), not a round number: the smallest N at which
the test rejects, with probability >= 0.99, a rule that ignores p in just enough runs to move
the output law TV = 0.05 away from p, i.e. the law (1 - e) p + e q with q the drafter's law of
continuations. The rule that always ignores p (q's law) is then rejected with power 1. The
chosen N and both powers are printed in the run's summary. Two negative controls run wrong
rules through the engine, each with N from the same calculation against its exact law, and
check that the test rejects them.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

import engine
import engine.methods.token as token_method
import engine.verify.token as token_rules
from tests.conftest import perturbed_exit_layer
from tests.stats import POWER, chi_square, mixture_at_tv, power, sample_size, simulated_power, tv

V, PROMPT, NEW = 8, [3, 4], 3
TV = 0.05  # TV distance from p of the subtle wrong law each test is sized to reject


def tiny_model(layers: int, seed: int):
    """A vocab-8 llama. initializer_range 0.3 makes the laws peaked (entropy ~4 nats of 6.2)
    and two seeds' laws far apart (TV ~0.5 at the first position), so a wrong rule cannot hide
    behind p ~ q ~ uniform."""
    from engine.models import model_from_config, tiny_config

    cfg = tiny_config("llama", vocab_size=V, layers=layers, hidden_size=16,
                      intermediate_size=32, initializer_range=0.3)
    return model_from_config(cfg, seed=seed)


@pytest.fixture(scope="module")
def models():
    """One-layer target and a different one-layer draft model."""
    return tiny_model(1, seed=5), tiny_model(1, seed=6)


@pytest.fixture(scope="module")
def pair(models):
    p = engine.load_pair(target=models[0], draft=models[1], device="cpu")
    p.target.generation_config.eos_token_id = None  # every run yields exactly 3 tokens
    return p


def position_probs(model) -> dict[tuple[int, ...], list[float]]:
    """P(x_i | prompt, x_<i) for every continuation x and position i (temperature 1)."""
    probs = {}
    with torch.no_grad():
        for seq in itertools.product(range(V), repeat=NEW):
            ids = torch.tensor([PROMPT + list(seq)])  # (1, T)
            logp = torch.log_softmax(model(input_ids=ids).logits[0].double(), -1)  # (T, V)
            probs[seq] = [float(logp[len(PROMPT) - 1 + i, seq[i]].exp()) for i in range(NEW)]
    return probs


def exact_law(*models) -> dict[tuple[int, ...], float]:
    """P(x1 x2 x3 | prompt) by enumeration when token i is drawn from models[i] (one model:
    that model's law)."""
    models = models * NEW if len(models) == 1 else models
    tables = {id(m): position_probs(m) for m in models}
    return {seq: float(np.prod([tables[id(m)][seq][i] for i, m in enumerate(models)]))
            for seq in tables[id(models[0])]}


@pytest.fixture(scope="module")
def law(pair):
    return exact_law(pair.target)


@pytest.fixture(scope="module")
def draft_law(models):
    return exact_law(models[1])


def powers(law: dict, wrong: dict, n: int) -> str:
    return (f"power {power(law, wrong, n):.4f} (ncx2) / "
            f"{simulated_power(law, wrong, n):.4f} (simulated)")


def exactness_size(law: dict, q_law: dict) -> tuple[int, str]:
    """N for an exactness test (power >= POWER against the mixture towards q's law at TV) and
    a line stating N and the power against that mixture and against q's law itself."""
    mixture = mixture_at_tv(law, q_law, TV)
    n = sample_size(law, mixture)
    return n, (f"N={n}, {powers(law, mixture, n)} against the TV {TV} mixture, "
               f"{powers(law, q_law, n)} against q's law (TV {tv(law, q_law):.2f})")


def control_size(law: dict, wrong: dict, **kw) -> tuple[int, str]:
    """N for a negative control: power >= POWER against the wrong rule's exact law."""
    n = sample_size(law, wrong, **kw)
    return n, f"N={n}, {powers(law, wrong, n)} against its law (TV {tv(law, wrong):.3f})"


@pytest.fixture(scope="module")
def pair_size(law, draft_law):
    return exactness_size(law, draft_law)


def sample_counts(pair, method, params, seeds) -> dict:
    counts: dict[tuple[int, ...], int] = {}
    for seed in seeds:
        tr = engine.generate(pair, PROMPT, method, max_new_tokens=NEW, temperature=1.0,
                             seed=seed, **params)
        counts[tr.token_ids] = counts.get(tr.token_ids, 0) + 1
    return counts


@pytest.mark.slow
@pytest.mark.parametrize("method,params", [
    ("sd", {"gamma": 2}),
    ("mcsd", {"k_config": "3x2", "verifier": "rrs_wor"}),
    ("mcsd", {"k_config": "3x2", "verifier": "rrs_wr"}),
    ("mcsd", {"k_config": "2x2", "verifier": "kseq"}),
    ("mcsd", {"k_config": "2x2", "verifier": "naive"}),
    ("greedy_drafts", {"k_config": "3x2"}),
    ("mcsd", {"k_config": "2x2x2", "controller": "beta_ts"}),  # depth cut by Beta-TS
])
def test_sampling_method_matches_the_target_law_of_continuations(pair, law, pair_size, method,
                                                                 params, stats_summary):
    n, note = pair_size
    stats_summary.append(f"{method} {params}: {note}")
    stat, threshold = chi_square(sample_counts(pair, method, params, range(n)), law, n)
    assert stat < threshold, (method, params, n, stat, threshold)


def _always_accept(p, q, candidates, rng):
    """A wrong rule: takes the first draft without looking at p."""
    return token_rules.TokenVerdict(0, int(candidates[0]), (), None)


@pytest.fixture(scope="module")
def always_accept_law(models):
    """The exact law of sd (gamma 2) with _always_accept: both drafts from q, then the bonus
    token from p."""
    target, draft = models
    return exact_law(draft, draft, target)


def test_the_check_rejects_a_rule_that_ignores_the_target(pair, law, always_accept_law,
                                                          monkeypatch, stats_summary):
    n, note = control_size(law, always_accept_law, step=10)
    stats_summary.append(f"control, sd always accepting: {note}")
    monkeypatch.setitem(token_rules.RULES, "sd", _always_accept)
    monkeypatch.setitem(token_method.RULES, "sd", _always_accept)
    stat, threshold = chi_square(sample_counts(pair, "sd", {"gamma": 2}, range(n)), law, n)
    assert stat > threshold, (n, stat, threshold)


@pytest.mark.slow
def test_the_check_rejects_a_rule_that_ignores_the_target_in_a_few_runs(
        pair, law, always_accept_law, monkeypatch, stats_summary):
    """Runs that always accept in a fraction e of the seeds (drawn independently), sd
    otherwise: the law (1 - e) p + e always_accept_law at TV distance TV from p."""
    wrong = mixture_at_tv(law, always_accept_law, TV)
    e = TV / tv(law, always_accept_law)
    n, note = control_size(law, wrong)
    stats_summary.append(f"control, sd always accepting in {e:.1%} of runs: {note}")
    bad = np.random.default_rng(12345).random(n) < e  # (n,) which seeds run the wrong rule
    counts = sample_counts(pair, "sd", {"gamma": 2}, np.flatnonzero(~bad).tolist())
    monkeypatch.setitem(token_rules.RULES, "sd", _always_accept)
    monkeypatch.setitem(token_method.RULES, "sd", _always_accept)
    for seq, k in sample_counts(pair, "sd", {"gamma": 2}, np.flatnonzero(bad).tolist()).items():
        counts[seq] = counts.get(seq, 0) + k
    stat, threshold = chi_square(counts, law, n)
    assert stat > threshold, (n, int(bad.sum()), stat, threshold)


@pytest.fixture(scope="module")
def exit_pair():
    """Two-layer vocab-8 target whose early exit (layer 1 + a perturbed copy of layer 2, the
    stand-in for a trained Transformer^e) drafts: eesd's own drafter, KV cache shared."""
    from engine.drafters import EarlyExitDrafter

    p = engine.load_pair(target=tiny_model(2, seed=7), device="cpu", early_exit_layers=1)
    p.drafter = EarlyExitDrafter(p.target, 1, perturbed_exit_layer(p.target, 1, 8, 0.3))
    p.target.generation_config.eos_token_id = None
    return p


@pytest.mark.slow
def test_eesd_with_thompson_sampling_and_a_shared_cache_matches_the_target_law(exit_pair,
                                                                               stats_summary):
    params = {}  # defaults: Beta-TS, share_kv
    law = exact_law(exit_pair.target)
    n, note = exactness_size(law, exact_law(exit_pair.drafter.model))
    stats_summary.append(f"eesd {params}: {note}")
    stat, threshold = chi_square(sample_counts(exit_pair, "eesd", params, range(n)), law, n)
    assert stat < threshold, (n, stat, threshold)


def test_the_power_calculation_is_right_about_a_known_case():
    """Uniform law on 4 cells against a wrong law with the same chi2 distance: the
    noncentral and the simulated power agree, and sample_size reaches POWER by both."""
    law = {i: 0.25 for i in range(4)}
    wrong = {0: 0.30, 1: 0.20, 2: 0.25, 3: 0.25}
    n = sample_size(law, wrong)
    assert power(law, wrong, n) >= POWER and simulated_power(law, wrong, n) >= POWER
    assert abs(power(law, wrong, n) - simulated_power(law, wrong, n)) < 0.01
    assert power(law, law, n) < 1e-5 and simulated_power(law, law, n) == 0.0
