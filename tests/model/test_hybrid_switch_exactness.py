"""sd with the hybrid drafter and the cost switch keeps the target's law at temperature 1: the
switch plans each round in its root's context (the lookup's or the feature drafter's: a
function of the committed tokens, engine.control.cost), so its plans never read the round's
target scores. Chi-square end to end against the exact law, sized as the other exactness
tests (tests/stats.py); beside tests/model/test_hybrid_drafter.py (its law and pair), in the
other pytest process of scripts/test.sh."""

from __future__ import annotations

import pytest

import engine
from tests.laws import NEW, exact_law
from tests.model.test_hybrid_drafter import PROMPT, accept_all_law
from tests.model.test_hybrid_drafter import pair as pair  # noqa: F401 (the module's fixture)
from tests.profiles import MIXED
from tests.stats import chi_square, exactness_size


@pytest.mark.slow
def test_sd_with_the_hybrid_drafter_and_its_switch_keeps_the_target_law(pair, stats_summary):  # noqa: F811
    law = exact_law(pair.target, prompt=PROMPT)
    n, note = exactness_size(law, accept_all_law(pair))
    stats_summary.append(f"sd gamma 2, switch cost ({MIXED.name}), ngram+feature: {note}")
    params = {"gamma": 2, "switch": "cost", "costs": MIXED.name}  # both plain and drafted
    contexts, counts = set(), {}
    for seed in range(n):
        trace = engine.generate(pair, list(PROMPT), "sd", max_new_tokens=NEW,
                                temperature=1.0, seed=seed, **params)
        counts[trace.token_ids] = counts.get(trace.token_ids, 0) + 1
        contexts |= {r.switch.context for r in trace.rounds if r.switch and r.drafted}
    assert contexts == {"lookup", "feature"}  # both contexts drafted
    stat, threshold = chi_square(counts, law, n)
    assert stat < threshold, (n, stat, threshold)
