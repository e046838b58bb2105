"""EESD on the embedded SmolLM2-135M with the shipped trained early exit (assets/drafter/)."""

from __future__ import annotations

import json

import pytest
import torch

import engine
from engine.core.weights import DRAFTER_DIR, WEIGHTS_FILE

pytestmark = pytest.mark.embedded

PROMPTS = ["What is the capital of France?", "Write a haiku about autumn leaves."]
N = 32


def _ref(pair, prompt, n=N):
    ids = engine.encode_prompt(pair, prompt)
    out = pair.target.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=n)
    return out[0, len(ids):].tolist()


def test_the_early_exit_spec_loads_the_shipped_trained_drafter(embedded_pair):
    drafter = embedded_pair.drafter
    assert drafter.trained, "assets/drafter/ weights missing or not made for this target"
    assert "trained" in embedded_pair.draft_name
    assert (DRAFTER_DIR / WEIGHTS_FILE).stat().st_size <= 16 * 2**20
    recipe = json.loads((DRAFTER_DIR / "recipe.json").read_text())
    assert recipe["command"].startswith("python -m engine train-draft")
    assert recipe["n_layers"] == drafter.n_layers
    ev = recipe["eval_heldout"]
    assert ev["trained"]["greedy_acceptance"] > ev["untrained_no_extra_layer"]["greedy_acceptance"]


@pytest.mark.parametrize("prompt", PROMPTS)
def test_eesd_with_the_shipped_drafter_equals_greedy_generate(embedded_pair, prompt):
    trace = engine.generate(embedded_pair, prompt, "eesd", max_new_tokens=N)
    assert list(trace.token_ids) == _ref(embedded_pair, prompt)
    assert all(r.controller is not None for r in trace.rounds)
    assert trace.stats.accepted > 0


def test_trained_acceptance_is_above_the_untrained_early_exit(embedded_pair):
    kw = dict(controller="fixed", gamma=3, max_new_tokens=24)
    prompt = PROMPTS[1]
    trained = engine.generate(embedded_pair, prompt, "eesd", **kw)
    untrained = engine.generate(embedded_pair, prompt, "eesd", exit_drafter="untrained", **kw)
    assert list(trained.token_ids) == list(untrained.token_ids)
    print(f"acceptance trained {trained.stats.acceptance_rate:.3f} vs untrained "
          f"{untrained.stats.acceptance_rate:.3f}")
    assert trained.stats.acceptance_rate > untrained.stats.acceptance_rate
