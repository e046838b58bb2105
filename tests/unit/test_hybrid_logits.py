"""engine/drafters/hybrid.py's pure pieces: as_float and hybrid_logits with or without the
n-gram runner's record of which nodes have a law (the same logits either way)."""

from __future__ import annotations

import torch

from engine.core.forest import PAD, ROOT
from engine.drafters.hybrid import as_float, hybrid_logits, lookup_covers
from engine.drafters.ngram import Laws, NGramDrafter

LOW = torch.finfo(torch.float32).min


def _masked(logits: torch.Tensor) -> torch.Tensor:
    """as_float's rule written out: float32, the dtype's minimum (and below) as float32's."""
    low = logits <= torch.finfo(logits.dtype).min
    return logits.float().masked_fill(low, LOW)


def test_as_float_keeps_values_and_raises_the_minimum_and_minus_infinity():
    x = torch.tensor([0.5, LOW, float("-inf"), -3.0, float("nan"), 3e38])
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        y = x.to(dtype)
        y[1] = torch.finfo(dtype).min
        got = as_float(y)
        assert got.dtype == torch.float32
        assert torch.equal(got.nan_to_num(7.0), _masked(y).nan_to_num(7.0))
        assert bool(got[4].isnan())


def test_hybrid_logits_are_the_same_with_the_runners_record_of_its_laws():
    gen = torch.Generator().manual_seed(0)
    feature = torch.randn((2, 3, 10), generator=gen)  # (W, m, V)
    ngram = torch.full((2, 3, 10), LOW)
    ngram[0, 0, 4] = -0.1  # nodes (0, 0) and (1, 2) have a law
    ngram[1, 2, [1, 7]] = torch.tensor([-0.5, -0.9])
    has = (ngram > LOW).any(-1)  # (W, m)
    want = torch.where(has[..., None], ngram, feature)
    assert torch.equal(hybrid_logits(ngram, feature), want)
    assert torch.equal(hybrid_logits(ngram, feature, has), want)
    none = torch.zeros_like(has)
    assert torch.equal(hybrid_logits(torch.full_like(ngram, LOW), feature, none), feature)
    assert torch.equal(hybrid_logits(ngram[:1, :1], feature[:1, :1], has[:1, :1]),
                       ngram[:1, :1])  # every node from the lookup
    blind = torch.full((2, 10), torch.finfo(torch.bfloat16).min, dtype=torch.bfloat16)
    assert torch.equal(hybrid_logits(torch.full((2, 10), LOW), blind,
                                     torch.tensor([False, False])), torch.full((2, 10), LOW))


def test_the_lookup_covers_a_feed_where_every_real_node_and_root_has_a_law():
    r = NGramDrafter(vocab_size=10, min_n=1).runner()
    r.start(torch.tensor([[1, 2, 1, 2]]))
    r.feed()
    assert lookup_covers(r.laws, None)  # "1 2" -> 1
    r.feed(torch.tensor([[1, 0]]), torch.tensor([[ROOT, PAD]]))
    assert lookup_covers(r.laws, torch.tensor([[ROOT, PAD]]))  # the PAD node needs none
    r.feed(torch.tensor([[9]]), torch.tensor([[0]]))
    assert not lookup_covers(r.laws, torch.tensor([[0]]))  # nothing follows "9"
    assert not lookup_covers(Laws(torch.zeros((1, 0), dtype=torch.bool),
                                  torch.tensor([True, False])), None)
