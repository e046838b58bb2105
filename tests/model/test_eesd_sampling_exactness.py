"""End to end: eesd (Beta-TS draft length, shared KV cache) reproduces the target's law of
3-token continuations: the chi-square test of test_sampling_exactness.py, with N from the same
power calculation (tests/stats.py), on eesd's own early-exit drafter. A file of its own so that
scripts/test.sh can run it beside the other chi-square tests."""

from __future__ import annotations

import pytest

import engine
from tests.conftest import perturbed_exit_layer
from tests.laws import exact_law, sample_counts, tiny_model
from tests.profiles import MIXED
from tests.stats import chi_square, exactness_size


@pytest.fixture(scope="module")
def exit_pair():
    """Two-layer vocab-8 target whose early exit (layer 1 + a perturbed copy of layer 2, the
    stand-in for a trained Transformer^e) drafts: eesd's own drafter, KV cache shared."""
    from engine.drafters.early_exit import EarlyExitDrafter

    p = engine.load_pair(target=tiny_model(2, seed=7), device="cpu", early_exit_layers=1)
    p.drafter = EarlyExitDrafter(p.target, 1, perturbed_exit_layer(p.target, 1, 8, 0.3))
    p.target.generation_config.eos_token_id = None  # every run yields exactly 3 tokens
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


@pytest.mark.slow
def test_eesd_with_the_cost_switch_matches_the_target_law(exit_pair, stats_summary):
    """The cost switch (Thompson plan at costs where plain and drafted rounds both win) over
    the shared cache: planned plain rounds leave the three caches to catch up at the next
    drafted round, and the law stays the target's."""
    params = {"switch": "cost", "costs": MIXED.name, "plan": "thompson", "confidence": 0.0}
    law = exact_law(exit_pair.target)
    n, note = exactness_size(law, exact_law(exit_pair.drafter.model))
    stats_summary.append(f"eesd {params}: {note}")
    stat, threshold = chi_square(sample_counts(exit_pair, "eesd", params, range(n)), law, n)
    assert stat < threshold, (n, stat, threshold)
