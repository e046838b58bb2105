"""The suffix drafter's law (engine/drafters/suffix.py), no model: the most frequent follower
of the longest match in the context and the store, the store's rules (one output per prompt,
the oldest dropped, a run's own prompt skipped, held outputs indexed when a run starts), the
runner's budget and probability floor, and its spec."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.core.errors import ConfigError
from engine.core.forest import ROOT
from engine.drafters.ngram import support
from engine.drafters.suffix import (
    MIN_TOKEN_PROB,
    SuffixDrafter,
    SuffixStore,
    suffix_law,
)
from engine.run.specs import pair_key, parse_model_spec

NONE = np.zeros(0, dtype=np.int64)


def law(context, store=None, skip=NONE, max_pattern=24):
    tokens, probs, m = suffix_law(np.asarray(context), store or SuffixStore(), skip,
                                  max_pattern)
    return dict(zip(tokens.tolist(), probs.tolist())), m


def test_the_law_counts_the_followers_of_the_longest_match():
    # "1 2 3" recurs twice (-> 9, 8); "2 3" three times (-> 9, 8, 7): the longer match wins
    assert law([1, 2, 3, 9, 1, 2, 3, 8, 5, 2, 3, 7, 1, 2, 3]) == ({8: 0.5, 9: 0.5}, 3)
    # most frequent first: "4 5" -> 6, 6, 7
    assert law([4, 5, 6, 4, 5, 6, 4, 5, 7, 4, 5]) == ({6: 2 / 3, 7: 1 / 3}, 2)


def test_a_match_shorter_than_two_tokens_or_none_proposes_nothing():
    assert law([1, 2, 3, 1]) == ({}, 0)  # "1" recurs, "3 1" does not
    assert law([5]) == ({}, 0)


def test_max_pattern_caps_the_match_length():
    ctx = [1, 2, 3, 9, 1, 2, 3, 8, 5, 2, 3, 7, 1, 2, 3]
    assert law(ctx, max_pattern=2) == ({7: 1 / 3, 8: 1 / 3, 9: 1 / 3}, 2)


def test_a_longer_match_in_the_store_wins_and_an_equal_one_pools_the_counts():
    store = SuffixStore()
    store.add((100,), (7, 1, 2, 3, 4))  # "7 1 2 3" -> 4: a four-token match
    assert law([7, 1, 2, 3, 5, 0, 7, 1, 2, 3], store) == ({4: 0.5, 5: 0.5}, 4)
    assert law([8, 1, 2, 3, 5, 0, 9, 1, 2, 3], store) == ({4: 0.5, 5: 0.5}, 3)  # pooled
    store.add((101,), (0, 1, 2, 3, 6))
    assert law([6, 1, 2, 3, 5, 8, 0, 1, 2, 3], store) == ({6: 1.0}, 4)  # only the store's


def test_the_store_keeps_one_output_per_prompt_and_drops_the_oldest():
    store = SuffixStore(capacity=2)
    store.add((1,), (5, 6, 7))
    store.add((2,), (5, 6, 8))
    store.add((1,), (5, 6, 9))  # replaces prompt (1,)'s output and becomes the newest
    assert [out for _, out in store.entries.values()] == [(5, 6, 8), (5, 6, 9)]
    store.add((3,), (5, 6, 4))  # over capacity: (2,)'s, the oldest, goes
    assert [p for p in store.entries] == [(1,), (3,)]
    assert law([0, 5, 6], store) == ({4: 0.5, 9: 0.5}, 2)
    version = store.version
    store.add((3,), (5, 6, 4))  # an equal output changes nothing
    assert store.version == version


def test_a_run_skips_the_outputs_of_its_own_prompt_and_of_prompts_it_begins_with():
    store = SuffixStore()
    store.add((1, 2), (5, 6, 7))
    store.add((1, 2, 3), (5, 6, 8))
    store.add((4,), (5, 6, 9))
    skip = store.skipped([1, 2, 3, 0, 5, 6])
    assert sorted(store.entries[p][0] for p in [(1, 2), (1, 2, 3)]) == sorted(skip.tolist())
    assert law([1, 2, 3, 0, 5, 6], store, skip) == ({9: 1.0}, 2)


def _runner(prompt, drafter=None):
    drafter = drafter or SuffixDrafter(16)
    runner = drafter.runner()
    runner.start(torch.tensor([prompt]))
    return drafter, runner


def _commit(runner, tokens):
    empty = torch.zeros((1, 0), dtype=torch.long)
    runner.commit(torch.tensor([0]), empty, empty, torch.tensor([tokens]))


def test_a_node_deeper_than_the_roots_match_length_proposes_nothing():
    # root context ends "2 3", matched 2 tokens (m0 = 2): depths 1 and 2 may propose, not 3
    _, runner = _runner([2, 3, 4, 5, 6, 7, 2, 3])
    root = runner.feed()
    assert support(root.root_logits[0]) == 1  # -> 4
    a = runner.feed(torch.tensor([[4]]), torch.tensor([[ROOT]]))
    b = runner.feed(torch.tensor([[5]]), torch.tensor([[0]]))
    assert support(a.node_logits[0, 0]) == 1 and support(b.node_logits[0, 0]) == 0
    assert runner.laws[0][1][0] == {6: 1.0}  # the law is there; the budget withholds it


def test_a_follower_below_the_probability_floor_is_cut_and_the_rest_renormalised():
    drafter = SuffixDrafter(16)
    outputs = ([[0, 7, 8, 3, 1, 2]] * 7 + [[0, 7, 8, 3, 1, 5]] + [[0, 7, 8, 3, 4, 0]] * 2
               + [[0, 7, 8, 9, 0, 0]] * 2)
    for i, out in enumerate(outputs):
        drafter.store.add((100 + i,), tuple(out))
    _, runner = _runner([0, 7, 8], drafter)  # the root matches "0 7 8": m0 = 3
    root = runner.feed().root_logits[0]  # 3 x10, 9 x2: both above the floor at P = 1
    torch.testing.assert_close(root[[3, 9]].exp(), torch.tensor([10 / 12, 2 / 12]))
    a = runner.feed(torch.tensor([[3]]), torch.tensor([[ROOT]])).node_logits[0, 0]
    torch.testing.assert_close(a[[1, 4]].exp(), torch.tensor([0.8, 0.2]))  # P 5/6: both kept
    b = runner.feed(torch.tensor([[1]]), torch.tensor([[0]])).node_logits[0, 0]
    assert runner.laws[0][1][0] == pytest.approx({2: 7 / 8, 5: 1 / 8})  # q_full after "3 1"
    assert (10 / 12) * 0.8 * (1 / 8) < MIN_TOKEN_PROB  # 5's path probability: cut
    assert support(b) == 1 and float(b[2]) == 0.0  # 2 alone, renormalised to 1


def test_outputs_are_held_at_commit_and_indexed_when_a_run_starts():
    drafter, runner = _runner([1, 2, 3, 4])
    _commit(runner, [5, 6, 7])
    assert drafter.store.held == {(1, 2, 3, 4): (5, 6, 7)} and not drafter.store.entries
    _, other = _runner([9, 5, 6], drafter)  # another run starts: the output is indexed
    assert drafter.store.entries[(1, 2, 3, 4)][1] == (5, 6, 7)
    assert support(other.feed().root_logits[0]) == 1  # "5 6" -> 7 from the store
    _, same = _runner([1, 2, 3, 4, 5, 6], drafter)  # a run on that prompt skips it
    assert support(same.feed().root_logits[0]) == 0


def test_the_context_law_is_the_runners_root_law_after_every_prefix():
    drafter = SuffixDrafter(16)
    drafter.store.add((0,), (3, 4, 7, 3, 4, 5))
    ids = [3, 4, 5, 1, 3, 4, 6, 2, 3, 4]
    out = drafter.context_logits(torch.tensor([ids]))  # (1, 10, 16)
    for t in range(2, len(ids)):
        _, runner = _runner(ids[:t + 1], drafter)
        torch.testing.assert_close(out[0, t], runner.feed().root_logits[0])


@pytest.mark.parametrize("text,layers", [("suffix", None), ("suffix:8", 8),
                                         ("Suffix-Decoding:3", 3), ("suffix_decoding", None)])
def test_suffix_specs_are_drafters_with_an_optional_pattern_length(text, layers):
    spec = parse_model_spec(text, draft=True)
    assert (spec.kind, spec.layers, spec.early_exit, spec.weights) == ("suffix", layers, "", "")
    assert pair_key("tiny", text)[1] == ("suffix", "", "{}", "", layers, "")


@pytest.mark.parametrize("text,message", [
    ("suffix:x", "suffix length must be a positive integer, got 'x'"),
    ("suffix:1", "suffix length must be at least 2, got '1'"),
    ("suffix:", "suffix length must be a positive integer, got ''"),
])
def test_a_bad_suffix_spec_is_one_error_line(text, message):
    with pytest.raises(ConfigError, match=message):
        parse_model_spec(text, draft=True)
    with pytest.raises(ConfigError, match="is a drafter, not a target"):
        parse_model_spec("suffix")


@pytest.mark.parametrize("max_pattern,spec", [(24, "suffix"), (8, "suffix:8")])
def test_the_drafter_name_reads_back_as_its_spec(max_pattern, spec):
    from engine.drafters.registry import spec_of_name

    assert spec_of_name(SuffixDrafter(16, max_pattern).name) == spec
