"""The drafter registry (engine/drafters/registry.py): every spec string reads as before it
existed (the parsed spec and its identity, under which tuned settings are filed), help texts
list every kind, a trace's drafter name reads back as its spec, and every capability a caller
asks of a drafter is declared with a default."""

from __future__ import annotations

import pytest
import torch

from engine.core.errors import ConfigError
from engine.drafters.base import DrafterBase, DrafterKind, TargetNeeds
from engine.drafters.registry import DRAFTERS, draft_help, kind_of, spec_of_name
from engine.run.specs import parse_model_spec, spec_key

# spec -> (kind, early_exit, layers, weights), as parse_model_spec read them before the
# registry (the spec keys below were printed by that code)
FORMS = {
    None: ("early-exit", "early-exit", None, ""),
    "": ("early-exit", "early-exit", None, ""),
    "early-exit": ("early-exit", "early-exit", None, ""),
    "early-exit:3": ("early-exit", "early-exit", 3, ""),
    "early_exit:2": ("early-exit", "early_exit", 2, ""),
    "self:1": ("early-exit", "self", 1, ""),
    "early-exit-untrained:2": ("early-exit", "early-exit-untrained", 2, ""),
    "Early-Exit-Trained": ("early-exit", "early-exit-trained", None, ""),
    "early-exit-trained:4": ("early-exit", "early-exit-trained", 4, ""),
    "early_exit_trained:/tmp/x.safetensors": ("early-exit", "early_exit_trained", None,
                                              "/tmp/x.safetensors"),
    "ngram": ("ngram", "", None, ""),
    "ngram:3": ("ngram", "", 3, ""),
    "prompt-lookup:3": ("ngram", "", 3, ""),
    "NGram:2": ("ngram", "", 2, ""),
    "feature": ("feature", "", None, ""),
    "eagle": ("feature", "", None, ""),
    "feature:/tmp/w.safetensors": ("feature", "", None, "/tmp/w.safetensors"),
    "ngram+feature": ("ngram+feature", "", None, ""),
    "ngram+feature:3": ("ngram+feature", "", 3, ""),
    "ngram+eagle:2": ("ngram+feature", "", 2, ""),
    "tiny": ("tiny", "", None, ""),
    "HuggingFaceTB/SmolLM2-360M": ("hub", "", None, ""),
}


@pytest.mark.parametrize("text", list(FORMS))
def test_every_existing_draft_spec_parses_to_the_same_spec_and_identity(text):
    spec = parse_model_spec(text, draft=True)
    kind, early_exit, layers, weights = FORMS[text]
    assert (spec.kind, spec.early_exit, spec.layers, spec.weights) == FORMS[text]
    named = kind in ("local", "hub")
    assert spec_key(spec) == (kind, spec.text if named else "", "{}", early_exit, layers,
                              weights)


def test_the_empty_draft_is_spelled_as_before():
    assert parse_model_spec(None, draft=True).text == "early-exit"


@pytest.mark.parametrize("text,message", [
    ("feature:", "feature drafter weights: give a file after 'feature:'"),
    ("ngram:x", "n-gram length must be a positive integer, got 'x'"),
    ("ngram:0", "n-gram length must be a positive integer, got '0'"),
    ("ngram+feature:x", "n-gram length must be a positive integer, got 'x'"),
    ("early-exit:", "early-exit layers must be a positive integer, got ''"),
    ("early-exit-trained:", "early-exit layers (or a weight file) must be a positive integer"),
    ("self:-1", "early-exit layers must be a positive integer, got '-1'"),
])
def test_a_bad_draft_spec_is_refused_in_its_kinds_words(text, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_model_spec(text, draft=True)


@pytest.mark.parametrize("text", ["ngram", "feature:x", "early-exit:2", "ngram+feature"])
def test_a_drafter_spec_is_not_a_target(text):
    with pytest.raises(ConfigError, match="is a drafter, not a target"):
        parse_model_spec(text)


def test_every_kind_is_registered_under_its_name_with_unique_heads():
    heads = [h for k in DRAFTERS.values() for h in k.heads]
    assert len(heads) == len(set(heads)) and all(h == h.lower() for h in heads)
    for name, kind in DRAFTERS.items():
        assert isinstance(kind, DrafterKind) and kind.name == name
        assert kind_of(name.upper()) is kind  # the canonical spelling, any case


def test_help_texts_list_every_kind_from_the_registry():
    from engine.cli.flags import DRAFT_HELP

    for kind in DRAFTERS.values():
        assert f"{kind.syntax} = {kind.summary}" in draft_help()
        assert kind.syntax in DRAFT_HELP


@pytest.mark.parametrize("name,spec", [
    ("n-gram (prompt lookup, n = 4..2)", "ngram"),
    ("n-gram (prompt lookup, n = 4..2) + feature (EAGLE-style, 1 layer, trained, "
     "8192-token head)", "ngram+feature"),
    ("feature (EAGLE-style, 1 layer, untrained)", "feature"),
    ("early-exit (first 4/30 layers, trained, 8192-token head)", "early-exit:4"),
    ("tiny", None),  # a separate model: named by its spec, no kind reads it
])
def test_a_trace_drafter_name_reads_back_as_its_spec(name, spec):
    from engine.analysis.source import draft_spec

    assert spec_of_name(name) == spec
    assert draft_spec(name) == (spec or name)
    assert sum(k.spec_of(name) is not None for k in DRAFTERS.values()) == (spec is not None)


def test_a_drafter_declares_nothing_unless_it_says_so():
    base = DrafterBase()
    assert base.needs == TargetNeeds() and base.model is None
    assert base.context_logits(torch.tensor([[1, 2]])) is None and base.assistant() is None


def test_ngram_context_law_is_the_lookup_after_every_prefix():
    from engine.drafters.ngram import NGramDrafter, ngram_law, support

    ids = torch.tensor([[3, 4, 5, 3, 4, 6, 3, 4]])  # (1, 8)
    out = NGramDrafter(8).context_logits(ids)  # (1, 8, 8)
    for t in range(ids.shape[1]):
        tokens, probs = ngram_law(ids[0, : t + 1].numpy())
        assert support(out[0, t]) == tokens.size
        if tokens.size:
            torch.testing.assert_close(out[0, t, torch.from_numpy(tokens)].exp().double(),
                                       torch.from_numpy(probs))


def test_every_draft_runner_declares_whether_its_laws_mix_a_lookup_with_a_model():
    """The token methods read a runner's ``lookup_laws`` (each drafted node's source) without
    probing: every runner class declares it, None unless it mixes sources."""
    from engine.drafters.hybrid import HybridRunner
    from engine.drafters.ngram import NGramRunner
    from engine.drafters.shared import SharedSide
    from engine.drafters.suffix import SuffixRunner
    from engine.execution.cached_model import CachedModel

    for cls in (CachedModel, NGramRunner, SuffixRunner, SharedSide):
        assert cls.lookup_laws is None, cls
    assert isinstance(HybridRunner.lookup_laws, property)
