"""The embedded model with its Q4_1 weights packed in 4 bits ('embedded-q4'): every linear
packed losslessly, each within the 16-bit activations' bound of the dequantised fp32 layer, its
logits the same bits in every shape of forward, and the engine's methods at temperature 0
token for token the packed model's own generate(); and 'embedded-q4:a8', the same weights
against 8-bit activations: within its coarser bound, and its methods its own generate()'s."""

from __future__ import annotations

import pytest
import torch

import engine
from engine.kernels import layout
from engine.kernels.packed4 import GROUP, Packed4Linear, Packed8Linear
from tests.oracles import qmm_error_bound

pytestmark = pytest.mark.embedded

PROMPTS = [
    "Write a haiku about autumn leaves.",
    "List three uses of a paperclip.",
]
N = 40
# measured on the 210 packed layers, random Gaussian inputs (seed 0): the largest error is
# 3.8e-5 of the largest output of its layer (16-bit activations, a step of max|x| / 32767 in
# each block of 32)
MAX_REL_ERROR = 1e-4
# The packed model's logits do not move with the shape of a forward: each packed product
# depends on its own row alone (qmm) and so does its attention (engine/kernels/rowattn.py), so
# generate()'s one-token steps, one forward over the whole sequence and the engine's verify
# forwards give a token the same bits. (With torch's attention they differ by up to 0.0055:
# the rounding of every packed layer's input to 16 bits turns a float-order difference of the
# attention into a whole step of that rounding.) Eager forwards: the fixture unsets
# SPECVIZ_KV.


@pytest.fixture(scope="module")
def q4_pair():
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("SPECVIZ_KV", raising=False)  # the eager path (the compiled one traces
        # another attention)
        yield engine.load_pair("embedded-q4", draft="early-exit")  # device auto: the CPU


def _ref(pair, prompt, n=N) -> tuple[list[int], torch.Tensor]:
    """generate()'s greedy tokens and its logits at each of them: (n',), (n', V)."""
    ids = engine.encode_prompt(pair, prompt)
    out = pair.target.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=n,
                               output_logits=True, return_dict_in_generate=True)
    return out.sequences[0, len(ids):].tolist(), torch.cat(out.logits)  # (n',), (n', V)


@pytest.fixture(scope="module")
def refs(q4_pair):
    return {p: _ref(q4_pair, p) for p in PROMPTS}


def assert_greedy_exact(pair, prompt, tokens: list[int], ref) -> None:
    """tokens equal generate()'s, and one forward over the prompt and the tokens gives, at
    every position, generate()'s logits bit for bit."""
    ref_tokens, ref_logits = ref  # (n,), (n, V)
    assert tokens == ref_tokens, prompt
    ids = engine.encode_prompt(pair, prompt)
    seq = torch.tensor([ids + tokens])  # (1, L + n)
    with torch.no_grad():
        logits = pair.target(seq).logits[0, len(ids) - 1: -1]  # (n, V)
    assert torch.equal(logits, ref_logits), prompt


def _packed(pair) -> dict[str, Packed4Linear]:
    return {n: m for n, m in pair.target.named_modules() if isinstance(m, Packed4Linear)}


def _bound(m: Packed4Linear, x: torch.Tensor) -> torch.Tensor:
    return qmm_error_bound(m.dequantize().abs(), x, GROUP)  # (R, out)


def _head_bound(head: Packed8Linear, x: torch.Tensor) -> torch.Tensor:
    """qmm_error_bound over the head's two 4-bit halves' magnitudes."""
    b = head.blocks()
    n, k = b.q.shape
    q = b.q.view(n, k // GROUP, GROUP).float()  # (V, d / G, G)
    hi = torch.div(q, 16, rounding_mode="floor")  # (V, d / G, G)
    halves = ((16 * hi).abs() + (q - 16 * hi).abs()) * b.d.float().abs()[..., None]
    return qmm_error_bound(halves.view(n, k), x, GROUP)  # (R, V)


def test_every_decoder_linear_and_the_head_are_packed(q4_pair):
    assert len(_packed(q4_pair)) == 30 * 7
    head = q4_pair.target.lm_head
    assert isinstance(head, Packed8Linear)
    assert head.weight is q4_pair.target.model.embed_tokens.weight  # still tied, not copied
    assert head.qw.numel() == head.out_features * head.in_features  # Q8_0: a byte a weight
    assert "4-bit" in q4_pair.target_name
    for layer in q4_pair.target.model.layers:  # q / k / v and gate / up: one product each
        attn, mlp = layer.self_attn, layer.mlp
        assert attn.q_proj.siblings is attn.k_proj.siblings is attn.v_proj.siblings is not None
        assert mlp.gate_proj.siblings is mlp.up_proj.siblings is not None
        assert attn.o_proj.siblings is None and mlp.down_proj.siblings is None


def test_packed_head_dequantises_to_the_fp32_head_and_stays_within_its_bound(
        q4_pair, fp32_pair):
    head, w = q4_pair.target.lm_head, fp32_pair.target.lm_head.weight  # (V, d)
    assert torch.equal(head.dequantize(), w)
    ids = torch.tensor([engine.encode_prompt(fp32_pair, PROMPTS[0])])
    with torch.no_grad():
        h = fp32_pair.target.model(ids).last_hidden_state[0]  # (L, d) real states
    x = h  # (L, d)
    y, ref = head(x), x @ w.T  # (L, V)
    assert ((y - ref).abs() <= _head_bound(head, x)).all()
    assert (y - ref).abs().max() <= MAX_REL_ERROR * ref.abs().max()


def test_packed_weights_dequantise_to_the_fp32_embedded_weights(q4_pair, fp32_pair):
    for name, m in _packed(q4_pair).items():
        assert torch.equal(m.dequantize(), fp32_pair.target.get_submodule(name).weight), name


def test_each_packed_layer_is_within_its_bound_of_the_fp32_layer(q4_pair, fp32_pair):
    gen = torch.Generator().manual_seed(0)
    for name, m in _packed(q4_pair).items():
        w = fp32_pair.target.get_submodule(name).weight  # (out, in)
        x = torch.randn(4, m.in_features, generator=gen)  # (4, in)
        y, ref = m(x), x @ w.T  # (4, out)
        err = (y - ref).abs()
        assert (err <= _bound(m, x)).all(), name
        assert err.max() <= MAX_REL_ERROR * ref.abs().max(), name


def test_layout_packs_nothing_of_a_packed_model(q4_pair):
    mods = list(_packed(q4_pair).values())
    assert layout._packed_weight(q4_pair.target.lm_head) is None
    with layout.layout_for(q4_pair.target, 4):
        assert not any(layout.packed_active(m) for m in mods)


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_equals_generate_and_one_forward_bit_for_bit(q4_pair, refs, prompt):
    trace = engine.generate(q4_pair, prompt, "greedy", max_new_tokens=N)
    assert_greedy_exact(q4_pair, prompt, list(trace.token_ids), refs[prompt])


@pytest.mark.parametrize("method,params", [
    ("sd", {"gamma": 4}),
    ("mcsd", {"k_config": "4x2x2"}),
])
def test_token_methods_at_temperature_zero_equal_generate_token_for_token(
        q4_pair, refs, method, params):
    for prompt in PROMPTS:
        trace = engine.generate(q4_pair, prompt, method, max_new_tokens=N, **params)
        assert_greedy_exact(q4_pair, prompt, list(trace.token_ids), refs[prompt])


# 'embedded-q4:a8': the same packed weights against activations quantised to 8 bits
# (llama.cpp's numerics for this file): another target, row-invariant as well.
MAX_REL_ERROR_A8 = 2e-2  # measured 1.3e-2 on the 210 layers, Gaussian inputs (seed 0): a step
# of max|x| / 127 in each block of 32, 258 times the 16-bit one


@pytest.fixture(scope="module")
def a8_pair():
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("SPECVIZ_KV", raising=False)
        yield engine.load_pair("embedded-q4:a8", draft="early-exit")


def test_a8_runs_every_packed_layer_at_8_bits_within_its_bound(a8_pair, fp32_pair):
    packed = _packed(a8_pair)
    assert len(packed) == 30 * 7 and "8-bit activations" in a8_pair.target_name
    assert {m.bits for m in packed.values()} == {8} and a8_pair.target.lm_head.bits == 8
    gen = torch.Generator().manual_seed(0)
    for name in list(packed)[::23]:  # every 23rd layer: all seven kinds, several depths
        m, w = packed[name], fp32_pair.target.get_submodule(name).weight  # (out, in)
        x = torch.randn(4, m.in_features, generator=gen)  # (4, in)
        err = (m(x) - x @ w.T).abs()  # (4, out)
        assert (err <= qmm_error_bound(m.dequantize().abs(), x, GROUP, levels=127)).all(), name
        assert err.max() <= MAX_REL_ERROR_A8 * (x @ w.T).abs().max(), name


def test_a8_methods_at_temperature_zero_equal_its_own_generate_bit_for_bit(a8_pair, refs):
    prompt = PROMPTS[0]
    ref = _ref(a8_pair, prompt)
    assert not torch.equal(ref[1], refs[prompt][1])  # its logits are not the 16-bit target's
    for method, params in (("greedy", {}), ("sd", {"gamma": 4}), ("mcsd", {"k_config": "4x2x2"})):
        trace = engine.generate(a8_pair, prompt, method, max_new_tokens=N, **params)
        assert_greedy_exact(a8_pair, prompt, list(trace.token_ids), ref)


def test_a_second_load_takes_the_packed_layers_from_the_cache_not_the_gguf(q4_pair,
                                                                          monkeypatch):
    from engine.kernels import packed4
    from engine.run.models import embedded_model_dir, packed_cache_file

    assert packed_cache_file(embedded_model_dir()).exists()  # written by the fixture's load

    def no_gguf(*_):
        raise AssertionError("read the GGUF again")

    monkeypatch.setattr(packed4, "pack_linears", no_gguf)
    monkeypatch.setattr(packed4, "pack_head", no_gguf)
    again = engine.load_pair("embedded-q4", draft="ngram")
    ours = _packed(q4_pair)
    theirs = _packed(again)
    assert theirs.keys() == ours.keys()
    for name, m in theirs.items():
        for b in packed4.BUFFERS[type(m).__name__]:
            assert torch.equal(getattr(m, b), getattr(ours[name], b)), (name, b)


def test_every_load_is_in_eval_mode_and_keys_its_stored_steps_alike(q4_pair):
    """Packing swaps in new layers after the model's eval(): left in training mode, two loads
    (from the GGUF or the cache, with a drafter or none) keyed one step differently in the
    step store (engine.execution.step_store.model_key reads every module's settings)."""
    from engine.execution.step_store import model_key

    again = engine.load_pair("embedded-q4", draft="")
    for pair in (q4_pair, again):
        assert [n for n, m in pair.target.named_modules() if m.training] == []
    assert model_key(again.target.model) == model_key(q4_pair.target.model)
