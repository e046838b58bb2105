"""engine.core.sampling.TorchChooser: categorical draws by inverse CDF follow the given law, never
pick an index of zero mass, replay from the seed, and refuse a vector without mass; the
sampling module's argmax and its two-level first_max pick torch.argmax's index."""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chi2

from engine.core.sampling import (
    BLOCK,
    TWO_LEVEL,
    TorchChooser,
    argmax,
    first_max,
    make_generator,
    top_probs,
)


def _counts(p: torch.Tensor, n: int, seed: int = 0) -> torch.Tensor:
    ch = TorchChooser(make_generator(seed))
    draws = torch.tensor([ch.categorical(p) for _ in range(n)])
    return torch.bincount(draws, minlength=p.numel()).double()


def test_categorical_frequencies_follow_the_law():
    p = torch.tensor([0.5, 0.0, 0.2, 0.25, 0.0, 0.05], dtype=torch.float64)
    n = 20_000
    counts = _counts(p, n)
    assert counts[p == 0].sum() == 0  # zero mass is never drawn
    keep = p > 0
    stat = float(((counts[keep] - n * p[keep]) ** 2 / (n * p[keep])).sum())
    assert stat < chi2.ppf(1 - 1e-6, int(keep.sum()) - 1)


def test_a_wrong_law_fails_the_same_check():
    """Negative control: the counts of p against a law 0.05 away in TV are rejected."""
    p = torch.tensor([0.5, 0.0, 0.2, 0.25, 0.0, 0.05], dtype=torch.float64)
    wrong = torch.tensor([0.45, 0.0, 0.25, 0.25, 0.0, 0.05], dtype=torch.float64)
    n = 20_000
    counts = _counts(p, n)
    keep = wrong > 0
    stat = float(((counts[keep] - n * wrong[keep]) ** 2 / (n * wrong[keep])).sum())
    assert stat > chi2.ppf(1 - 1e-6, int(keep.sum()) - 1)


def test_unnormalised_and_float32_weights_draw_the_same_indices():
    w = torch.tensor([3.0, 0.0, 1.0, 6.0])
    ch1, ch2 = TorchChooser(make_generator(4)), TorchChooser(make_generator(4))
    a = [ch1.categorical(w) for _ in range(200)]
    b = [ch2.categorical((w / w.sum()).double()) for _ in range(200)]
    assert a == b and 1 not in a


def test_the_same_seed_replays_the_same_draws_and_a_large_vocabulary_works():
    p = torch.softmax(torch.randn(196_608, generator=make_generator(1)), 0)
    assert _counts(p, 50, seed=7).tolist() == _counts(p, 50, seed=7).tolist()
    one_hot = torch.zeros(49_152)
    one_hot[49_151] = 1.0
    assert TorchChooser(make_generator(0)).categorical(one_hot) == 49_151


@pytest.mark.parametrize("bad", [torch.zeros(5), torch.tensor([float("nan"), 1.0]),
                                 torch.tensor([float("inf"), 1.0]),
                                 torch.tensor([-1.0, 0.0]), torch.zeros(0)])
def test_a_vector_without_mass_is_refused(bad):
    with pytest.raises(ValueError, match="positive, finite mass"):
        TorchChooser(make_generator(0)).categorical(bad)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_argmax_picks_torch_argmax_index_on_ties_and_nan(dtype):
    """The first maximum, as torch.argmax (and so generate()'s greedy) picks it: many ties
    (few distinct values), a NaN, one row and several; a wrong rule (the last maximum) would
    differ on the ties."""
    gen = torch.Generator().manual_seed(3)
    last_differs = 0
    for trial in range(300):
        size = (int(torch.randint(1, 5000, (), generator=gen)),) if trial % 2 else (3, 777)
        x = torch.randint(-2, 3, size, generator=gen).to(dtype)  # ties everywhere
        if trial % 7 == 0:
            x.view(-1)[int(torch.randint(0, x.numel(), (), generator=gen))] = float("nan")
        assert torch.equal(argmax(x), torch.argmax(x, dim=-1))
        assert torch.equal(argmax(x, keepdim=True), torch.argmax(x, dim=-1, keepdim=True))
        last = x.shape[-1] - 1 - torch.argmax(x.flip(-1), dim=-1)  # the last maximum
        last_differs += not torch.equal(last, argmax(x))
    assert last_differs > 100


def _hard_vectors(dtype, gen):
    """Vectors where a two-level search can go wrong: lengths with and without a tail past
    the whole blocks, a short one, ties inside a block, across blocks and between a block and
    the tail, a NaN before, inside or after the maximum, all -inf, all equal."""
    out = []
    for n in (TWO_LEVEL - 1, TWO_LEVEL, TWO_LEVEL + 37, 49_152, 49_157):
        for trial in range(30):
            x = torch.randint(-3, 4, (n,), generator=gen).to(dtype)  # ties everywhere
            if trial % 3 == 0:
                x = torch.randn(n, generator=gen).to(dtype)
            top = x.max()
            if trial % 5 == 1:  # the maximum in two blocks, the later one set first
                at = sorted(int(i) for i in torch.randint(0, n, (2,), generator=gen))
                x[at[1]] = x[at[0]] = top + 1
            if trial % 5 == 2 and n % BLOCK:  # the tail ties the first block's maximum
                x[n - 1] = x[3] = top + 1
            if trial % 5 == 3 and n % BLOCK:  # the tail alone holds it
                x[n - 2] = top + 1
            if trial % 7 == 4:
                x[int(torch.randint(0, n, (), generator=gen))] = float("nan")
            out.append(x)
        out += [torch.full((n,), float("-inf"), dtype=dtype), torch.zeros(n, dtype=dtype)]
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_first_max_is_torch_argmax_of_a_vector_on_ties_nan_and_a_tail(dtype):
    """first_max searches blocks, then a block, then the tail: it must still pick
    torch.argmax's first maximum. A rule that took the last block among equal maxima, or the
    tail on a tie, differs on these vectors (checked below)."""
    gen = torch.Generator().manual_seed(11)
    vectors = _hard_vectors(dtype, gen)
    wrong = 0
    for x in vectors:
        assert first_max(x) == int(torch.argmax(x)), (x.shape, dtype)
        blocks = x[: x.shape[0] // BLOCK * BLOCK].reshape(-1, BLOCK).amax(1)
        last_block = blocks.shape[0] - 1 - int(torch.argmax(blocks.flip(0)))
        wrong += last_block != int(torch.argmax(x)) // BLOCK
    assert wrong > 20  # the vectors tell the first maximal block from the last
    strided = torch.randn(2 * TWO_LEVEL, generator=gen)[::2]  # not contiguous
    assert first_max(strided) == int(torch.argmax(strided))
    signed = torch.full((TWO_LEVEL + 5,), -1.0, dtype=dtype)
    signed[700], signed[200] = 0.0, -0.0  # equal maxima: the first, in another block
    assert first_max(signed) == int(torch.argmax(signed)) == 200


def _softmax_top(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    val, ids = torch.topk(torch.softmax(x.float(), dim=-1), k, dim=-1)
    return ids, val


@pytest.mark.parametrize("n", [TWO_LEVEL + 5, 49_152, 49_152 + 77, 10 * BLOCK, 11 * BLOCK + 3])
def test_top_probs_are_the_softmax_top_k_without_sorting_the_vocabulary(n):
    """top_probs reads only the k blocks with the largest maxima and the tail: its ids and
    probabilities are torch.topk(softmax)'s on rows whose largest entries crowd one block,
    sit in the tail, or spread one per block (where it has k blocks; shorter rows take the
    softmax). A rule reading only the k - 1 best blocks misses an entry of the spread rows."""
    gen = torch.Generator().manual_seed(5)
    k = 10
    rows = []
    for trial in range(12):
        x = torch.randn(n, generator=gen) * 3
        if trial % 4 == 1:  # the top entries crowd one block
            x[BLOCK * 3: BLOCK * 3 + 12] = torch.linspace(20, 30, 12)
        if trial % 4 == 2 and n % BLOCK:  # the tail holds the largest
            x[-1] = 40.0
        if trial % 4 == 3 and n >= k * BLOCK:  # one top entry per block, the least in block 0
            x[torch.arange(k) * BLOCK + 7] = 25.0 + torch.arange(k, dtype=torch.float32)
        rows.append(x)
    x = torch.stack(rows)  # (12, n)
    ids, probs = top_probs(x, k)
    want_ids, want = _softmax_top(x, k)
    assert torch.equal(ids, want_ids)
    assert torch.allclose(probs, want, rtol=1e-5, atol=1e-7)
    if n >= k * BLOCK:
        spread = x[3::4, : n // BLOCK * BLOCK].reshape(3, -1, BLOCK)  # (3, B, BLOCK)
        fewer = spread.amax(2).topk(k - 1, dim=1).indices  # the k - 1 best blocks
        assert not bool((fewer == 0).any())  # miss block 0's entry, the k-th largest
        assert bool((ids[3::4] == 7).any(dim=1).all())  # which top_probs lists


def test_top_probs_of_short_odd_or_masked_rows_take_the_softmax():
    """A vocabulary shorter than the two-level search's, fewer blocks than k, a row with a
    NaN, a row of -inf and a half-precision row: the softmax's top-k (NaN where it is NaN)."""
    gen = torch.Generator().manual_seed(6)
    small = torch.randn(2, 50, generator=gen)
    for x, k in [(small, 10), (small, 80), (torch.randn(1, TWO_LEVEL, generator=gen), 10),
                 (torch.randn(3, 5 * BLOCK + 9, generator=gen), 10),
                 (torch.randn(2, 2 * TWO_LEVEL, generator=gen).half(), 10)]:
        ids, probs = top_probs(x, k)
        want_ids, want = _softmax_top(x, min(k, x.shape[-1]))
        assert torch.equal(ids, want_ids) and torch.allclose(probs, want)
        assert probs.dtype == torch.float32
    masked = torch.randn(2, 2 * TWO_LEVEL, generator=gen)
    masked[0, 5] = float("nan")
    masked[1] = float("-inf")
    ids, probs = top_probs(masked, 10)
    assert bool(torch.isnan(probs).all())  # the softmax of either row is NaN everywhere
    masked[1, 1000:] = torch.randn(2 * TWO_LEVEL - 1000, generator=gen)  # -inf in some blocks
    ids, probs = top_probs(masked[1:], 10)
    want_ids, want = _softmax_top(masked[1:], 10)
    assert torch.equal(ids, want_ids) and torch.allclose(probs, want)
