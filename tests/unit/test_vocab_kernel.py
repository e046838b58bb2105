"""engine.kernels.vocab, the round's vocabulary reads in one call: the first maximum is
torch.argmax's index, the top-k slice is the softmax's top-k (probabilities within 5e-7 of a
float64 softmax), and whatever the kernel does not take (another dtype, a strided row, a
non-finite row, no compiler) gets the torch versions' answer."""

from __future__ import annotations

import pytest
import torch

from engine.core import sampling
from engine.kernels import qmm, vocab

NAN, NEG = float("nan"), float("-inf")


def TIED(n: int) -> list[int]:
    return [1, n // 2, n // 2 + 1, n - 2]


@pytest.fixture(scope="module")
def lib():
    built = vocab.library()
    assert built is not None, "vocab.c did not build (the machine's C compiler)"
    return built


def _rows(n: int, seed: int) -> torch.Tensor:
    """Twelve rows of n logits: plain, the top entries crowded in one chunk, the largest in
    the last entry, ties at the top (equal values at several indices)."""
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for trial in range(12):
        x = torch.randn(n, generator=gen) * (1 + trial % 5)
        if trial % 4 == 1:
            x[n // 3: n // 3 + 6] = torch.linspace(20, 30, 6)
        if trial % 4 == 2:
            x[-1] = 40.0
        if trial % 4 == 3:
            x[TIED(n)] = 25.0  # a four-way tie for the maximum
        rows.append(x)
    return torch.stack(rows)  # (12, n)


@pytest.mark.parametrize("n", [8, 100, 2_048, 49_152, 49_152 + 77])
def test_the_first_maximum_is_torch_argmaxs_index(lib, n):
    x = _rows(n, seed=n)
    for row in x:
        assert vocab.first_max(row) == int(torch.argmax(row))
    row = x[3].clone()
    row[[n // 2, n - 1]] = NAN  # the first NaN counts as the maximum
    assert vocab.first_max(row) == n // 2 == int(torch.argmax(row))
    assert vocab.first_max(torch.full((n,), NEG)) == 0 == int(torch.argmax(torch.full((n,), NEG)))
    with pytest.raises(IndexError):  # an empty vector has no maximum, as in torch.argmax
        vocab.first_max(torch.zeros(0))


@pytest.mark.parametrize("n,k", [(8, 8), (100, 10), (2_048, 10), (49_152, 10), (49_152 + 77, 5),
                                 (49_152, 64)])
def test_the_top_slice_is_the_softmax_top_k_in_one_call(lib, n, k):
    """Ids: the k largest, largest first, the lower index first among equal ones (the tied
    rows' values equal the softmax top-k's); probabilities within 5e-7 relative of a float64
    softmax (torch's float32 softmax: up to 2e-6)."""
    x = _rows(n, seed=k + n)
    ids, probs = vocab.top_probs(x, k)
    assert ids.dtype == torch.long and probs.dtype == torch.float32 and ids.shape == (12, k)
    want, want_ids = torch.topk(torch.softmax(x.double(), -1), k)
    for r in range(12):
        if r % 4 == 3:  # a tie: the same values, in index order among equals
            assert torch.equal(x[r, ids[r]], x[r, want_ids[r]])
            assert ids[r, :4].tolist() == TIED(n)
        else:
            assert torch.equal(ids[r], want_ids[r]), r
    assert float(((probs.double() - want) / want).abs().max()) < 5e-7


def test_a_slice_of_rows_in_a_wider_tensor_is_read_at_its_stride(lib):
    """Logits rows picked out of a (W, m, V) forward keep the stride of V; a row strided
    along V (not contiguous) takes the torch version."""
    x = _rows(3_000, seed=1).reshape(3, 4, 3_000)
    rows = x[1, 1:3]  # (2, V), row stride 3000, contiguous along V
    ids, probs = vocab.top_probs(rows, 10)
    want_ids, want = sampling.top_probs(rows.contiguous(), 10)
    assert torch.equal(ids, want_ids) and torch.allclose(probs, want, rtol=2e-6, atol=0)
    strided = x[:, 0, ::2]  # (3, 1500), stride 2 along V
    assert torch.equal(vocab.top_probs(strided, 10)[0], sampling.top_probs(strided, 10)[0])
    assert vocab.first_max(x[0, 2]) == int(torch.argmax(x[0, 2]))
    assert vocab.first_max(x[0, :, 5]) == int(torch.argmax(x[0, :, 5]))  # strided: torch's


def test_what_the_kernel_does_not_take_gets_the_torch_answer(lib, monkeypatch):
    """A NaN row, an all -inf row, a half-precision row, k past 64: the torch version's
    answer, exactly; and with no library at all every call is the torch version's."""
    x = _rows(4_096, seed=2)
    x[0, 5] = NAN
    x[1] = NEG
    for rows, k in [(x[:2], 10), (x[2:4].half(), 10), (x[4:6], 65)]:
        ids, probs = vocab.top_probs(rows, k)
        want_ids, want = sampling.top_probs(rows, k)
        assert torch.equal(ids, want_ids)
        assert torch.equal(probs, want) or bool(torch.isnan(probs).all() & torch.isnan(want).all())
    monkeypatch.setattr(vocab, "library", lambda: None)
    ids, probs = vocab.top_probs(x[4:8], 10)
    want_ids, want = sampling.top_probs(x[4:8], 10)
    assert torch.equal(ids, want_ids) and torch.equal(probs, want)
    assert vocab.first_max(x[6]) == sampling.first_max(x[6])


def _terms(lib, x: torch.Tensor, top: float) -> torch.Tensor:
    out = torch.empty_like(x)
    lib.vocab_exp_terms(x.data_ptr(), x.shape[0], top, out.data_ptr())
    return out


@pytest.mark.skipif("avx2" not in qmm._cpu_flags().split(),
                    reason="no AVX2 here: the native build is the plain C path")
def test_the_avx2_path_takes_each_exp_term_bit_for_bit_as_the_plain_c_path(lib, tmp_path,
                                                                             monkeypatch):
    """vocab.c built without its AVX2 path (VOCAB_PLAIN, as on a machine without AVX2): each
    term exp(x_i - max) of z is the same float, bit for bit (no operation fused, the same
    order), over the whole range the terms take and rows whose lengths leave a scalar tail;
    the top-k slices have the same ids and probabilities within 1e-7 relative (z summed in
    double in another order), both within 5e-7 of a float64 softmax."""
    plain = vocab.build(tmp_path / "vocab_plain.so", defines=("VOCAB_PLAIN",))
    assert plain is not None, "vocab.c did not build with VOCAB_PLAIN"
    sweep = -torch.logspace(-8, 2.2, 200_003)  # (n,) 0 down to -158, past the -87 clamp
    sweep[::7] = 0.0
    for top in (0.0, 3.5, -20.0):
        native = _terms(lib, sweep + top, top)
        assert torch.equal(native, _terms(plain, sweep + top, top)), top
        assert float(native.max()) <= 1.0 and float(native.min()) > 0.0
    for n in (13, 100, 49_152 + 77):
        x = _rows(n, seed=3 + n)
        k = min(10, n)
        ids, probs = vocab.top_probs(x, k)
        with monkeypatch.context() as m:
            m.setattr(vocab, "library", lambda: plain)
            plain_ids, plain_probs = vocab.top_probs(x, k)
        assert torch.equal(ids, plain_ids)
        assert float(((probs.double() - plain_probs.double()) / plain_probs).abs().max()) < 1e-7
        want = torch.topk(torch.softmax(x.double(), -1), k).values
        assert float(((plain_probs.double() - want) / want).abs().max()) < 5e-7
