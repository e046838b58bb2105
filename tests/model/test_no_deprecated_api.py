"""No deprecated API: every method, with every kind of drafter, runs on the stock model with
FutureWarning and DeprecationWarning turned into errors (a deprecated keyword such as
transformers' `past_key_values` warns from inside the model's forward, where a per-module
warning filter cannot see whose call it was)."""

from __future__ import annotations

import warnings

import pytest

import engine
from engine import METHODS
from tests.conftest import tiny_pair

DRAFTS = ["early-exit", "ngram", "feature", "ngram+feature"]


def _run_strict(pair, method: str, **params) -> None:
    kw = {"temperature": 0.7} if METHODS[method].sampling_only else {}
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        warnings.simplefilter("error", DeprecationWarning)
        engine.generate(pair, [3, 4, 5, 3, 4], method, max_new_tokens=6, seed=0, **kw, **params)


@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_method_runs_without_a_deprecation_warning(method):
    _run_strict(tiny_pair(), method)


@pytest.mark.parametrize("draft", DRAFTS)
def test_every_drafter_runs_without_a_deprecation_warning(draft):
    target = tiny_pair().target
    pair = engine.load_pair(target=target, draft=draft, device="cpu", early_exit_layers=2)
    _run_strict(pair, "sd")


def test_the_strict_runner_fails_on_the_deprecated_cache_keyword(monkeypatch):
    from engine.execution import cached_model

    monkeypatch.setattr(cached_model, "cache_kwarg",
                        lambda module, cache: {"past_key_values": cache})
    with pytest.raises(FutureWarning, match="past_key_values"):
        _run_strict(tiny_pair(), "greedy")
