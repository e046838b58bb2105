"""engine.kernels.eager_bits: the ops a compiled step traces in place of RMSNorm and the rotary
embedding compute the stock modules' bits (Python and C++ kernels alike), for every supported
family; swapped modules run their stock forward eagerly."""

from __future__ import annotations

import pytest
import torch

from engine.kernels import eager_bits, qmm
from engine.run.models import model_from_config, tiny_config

FAMILIES = ("llama", "qwen2", "qwen3", "mistral")


def _model(family: str):
    return model_from_config(tiny_config(family, hidden_size=96, intermediate_size=192,
                                         num_attention_heads=4, num_key_value_heads=2,
                                         head_dim=24), seed=2)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_ops_give_the_stock_modules_bits(family):
    model = _model(family)
    gen = torch.Generator().manual_seed(0)
    norms = [m for m in model.modules() if eager_bits.is_rmsnorm(m)]
    rotary = model.model.rotary_emb
    assert norms and eager_bits.is_default_rotary(rotary)
    with torch.no_grad():
        for norm in norms:
            x = torch.randn(3, 5, norm.weight.shape[0], generator=gen) * 4  # (W, q, d)
            norm.weight.copy_(torch.randn(norm.weight.shape, generator=gen))
            want = norm(x)
            assert torch.equal(torch.ops.specviz.rmsnorm(x, norm.weight,
                                                         norm.variance_epsilon), want)
            assert torch.equal(eager_bits.rmsnorm(x, norm.weight, norm.variance_epsilon), want)
        pos = torch.randint(0, 4000, (2, 7), generator=gen)  # (W, q)
        x = torch.zeros(2, 7, 96)
        want = rotary(x, pos)
        for got in (torch.ops.specviz.rotary(pos, rotary.inv_freq, rotary.attention_scaling, x),
                    eager_bits.rotary(pos, rotary.inv_freq, rotary.attention_scaling, x)):
            assert all(torch.equal(a, b) for a, b in zip(got, want))


@pytest.mark.parametrize("shape", [(1, 1, 576), (1, 4, 576), (3, 2, 576), (2, 5, 96)])
def test_the_rmsnorm_ops_one_loop_gives_the_stock_bits_at_every_scale(shape):
    """The C++ kernel's fp32 loop (ATen's mean of squares, then one rounding an operation):
    rows from 1e-30 to 1e30 in size, a row of zeros, odd weights, an epsilon that is not an
    fp32 number; a transposed input (the general path) too."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    assert qmm.native_op() is not None, "the ops' C++ kernels did not build here"
    qmm.load_op()  # the C++ kernels answer from here on (the Python ones are ATen's own ops)
    gen = torch.Generator().manual_seed(1)
    d = shape[-1]
    for eps in (1e-5, 1e-6, 0.1):
        norm = LlamaRMSNorm(d, eps=eps)
        with torch.no_grad():
            norm.weight.copy_(torch.randn(d, generator=gen) * 3)
            for scale in (1e-30, 1e-6, 1.0, 37.0, 1e15, 1e30):
                x = torch.randn(shape, generator=gen) * scale  # (W, q, d)
                x[0, 0, : d // 2] *= 1e-3  # a row with two magnitudes
                if shape[1] > 1:
                    x[0, 1] = 0.0  # a row of zeros: rsqrt(eps)
                got = torch.ops.specviz.rmsnorm(x, norm.weight, norm.variance_epsilon)
                assert torch.equal(got, norm(x)), (eps, scale)
            xt = torch.randn(d, shape[1], generator=gen).T.unsqueeze(0)  # non-contiguous
            assert torch.equal(torch.ops.specviz.rmsnorm(xt, norm.weight, norm.variance_epsilon),
                               norm(xt))


@pytest.mark.parametrize("d", [8, 96, 100, 576, 2048, 16384, 40000])
def test_the_rmsnorm_kernel_sums_in_atens_order_itself_at_every_width(d):
    """The C++ kernel's own mean of squares (ATen's cascade order, lane by lane) is the one in
    use, not ATen's ops behind it (its self-check picked a lane count), and gives the stock
    bits: widths whose rows leave a scalar tail (100), fill one cascade level (576) or several
    (16384: 2048 vectors in rows of 4, levels of 16; 40000)."""
    import ctypes

    lib = qmm.native_op()
    assert lib is not None, "the ops' C++ kernels did not build here"
    qmm.load_op()
    lanes = lib.specviz_sum_lanes
    lanes.argtypes, lanes.restype = [ctypes.c_int64], ctypes.c_int
    assert lanes(d) in (8, 16)
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    gen = torch.Generator().manual_seed(3)
    norm = LlamaRMSNorm(d, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(d, generator=gen))
        for scale in (1e-3, 1.0, 300.0):
            x = torch.randn(2, 3, d, generator=gen) * scale  # (W, q, d)
            x[..., ::7] *= 1e3  # a spread of magnitudes within each row
            assert torch.equal(torch.ops.specviz.rmsnorm(x, norm.weight, norm.variance_epsilon),
                               norm(x)), scale


def test_the_cpp_kernels_are_the_ones_called_once_loaded():
    if qmm.native_op() is None:
        pytest.fail("the ops' C++ kernels did not build here (a C++ compiler is part of "
                    "the set-up)")
    assert torch._C._dispatch_has_kernel_for_dispatch_key("specviz::rmsnorm", "CPU")
    assert torch._C._dispatch_has_kernel_for_dispatch_key("specviz::rotary", "CPU")


def test_swapped_modules_keep_their_eager_forward_and_class_name():
    model = _model("llama")
    ids = torch.tensor([[3, 9, 4, 1, 7]])
    with torch.no_grad():
        before = model(ids).logits
        assert eager_bits.keep_eager_bits(model) == 2 * 2 + 1 + 1
        assert eager_bits.keep_eager_bits(model) == 6  # idempotent: no subclass of a subclass
        after = model(ids).logits
    assert torch.equal(before, after)
    norm = model.model.norm
    assert type(norm).__name__ == "LlamaRMSNorm" and type(norm).__mro__[2].__name__ == \
        "LlamaRMSNorm"
