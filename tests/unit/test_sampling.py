"""engine.core.sampling.TorchChooser: categorical draws by inverse CDF follow the given law, never
pick an index of zero mass, replay from the seed, and refuse a vector without mass; the
sampling module's argmax picks torch.argmax's index."""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chi2

from engine.core.sampling import (
    TorchChooser,
    argmax,
    make_generator,
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
