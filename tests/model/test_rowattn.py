"""engine.kernels.rowattn, the attention of a packed target: it equals a float64 attention, every
code path of rowattn.c gives the same bits, a row's output depends on its own query and the
slots it may see alone, and with it a packed model's logits are the same bits however its
tokens are fed (alone, in one forward, in a draft tree)."""

from __future__ import annotations

import platform

import pytest
import torch

import engine
from engine.kernels import attention, rowattn
from engine.run.models import model_from_config, tiny_config
from tests.gguf_tiny import load_packed, write_gguf

NEG = float("-inf")


def _cpu_flags() -> str:
    try:
        return next(line for line in open("/proc/cpuinfo") if line.startswith("flags"))
    except (OSError, StopIteration):
        return ""


def _inputs(W: int, H: int, KV: int, Q: int, S: int, D: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    query = torch.randn(W, H, Q, D, generator=gen)  # (W, H, Q, D)
    key = torch.randn(W, KV, S, D, generator=gen)  # (W, KV, S, D)
    value = torch.randn(W, KV, S, D, generator=gen)
    return query, key, value


def _tree_mask(W: int, Q: int, S: int) -> torch.Tensor:
    """Q draft nodes after S - Q cached slots, node i's parent (i - 1) // 2 (a binary tree):
    (W, 1, Q, S), 0 where a node may attend, -inf elsewhere."""
    mask = torch.full((W, 1, Q, S), NEG)
    mask[..., : S - Q] = 0.0
    for i in range(Q):
        j = i
        while j >= 0:
            mask[:, 0, i, S - Q + j] = 0.0
            j = (j - 1) // 2 if j else -1
    return mask


@pytest.fixture(scope="module")
def lib():
    out = rowattn.library()
    assert out is not None, "rowattn.c must build here (a C compiler is part of the setup)"
    return out


@pytest.mark.parametrize("W,H,KV,Q,S,D", [
    (1, 9, 3, 5, 61, 64),  # the embedded model's heads, slots not a multiple of 8
    (2, 4, 1, 3, 16, 64),  # one key/value head
    (1, 4, 4, 1, 9, 16),  # one row, as many key/value heads as query heads
    (2, 6, 2, 4, 30, 12),  # a head size that is not a multiple of 8 (the plain loops)
    (1, 8, 1, 3, 21, 64),  # eight query heads a key/value head: batches of 3, 3 and 2
    (1, 6, 3, 3, 19, 72),  # nine vectors a head: a chunk of 4, 4, then 1
    (1, 2, 1, 2, 11, 264),  # a head over 256 wide
])
def test_the_kernel_equals_attention_computed_in_float64(lib, W, H, KV, Q, S, D):
    query, key, value = _inputs(W, H, KV, Q, S, D, seed=0)
    low = _tree_mask(W, Q, S).clamp(min=torch.finfo(torch.float32).min)  # the engine's way
    for mask in (_tree_mask(W, Q, S), rowattn.visible(Q, S, True), _tree_mask(1, Q, S), low):
        out = rowattn.attend(lib, query, key, value, mask, D ** -0.5)  # (W, Q, H, D)
        ref = rowattn.reference(query, key, value, mask, D ** -0.5)  # (W, Q, H, D) fp64
        torch.testing.assert_close(out.double(), ref, rtol=2e-6, atol=2e-6)


def test_the_lowest_float_hides_a_slot_as_minus_infinity_does(lib):
    """The engine's masks (engine/core/forest.py) write torch.finfo(float32).min, not -inf:
    a tree node must still sum its ancestors as a chain."""
    query, key, value = _inputs(1, 9, 3, 7, 83, 64, seed=7)
    mask = _tree_mask(1, 7, 83)
    low = mask.clamp(min=torch.finfo(torch.float32).min)
    assert torch.equal(rowattn.attend(lib, query, key, value, low, 0.125),
                       rowattn.attend(lib, query, key, value, mask, 0.125))


def test_it_equals_torchs_attention_over_half_keys_and_values_to_float_rounding(lib):
    query, key, value = _inputs(1, 9, 3, 5, 70, 64, seed=1)
    mask = _tree_mask(1, 5, 70)
    sdpa = torch.nn.functional.scaled_dot_product_attention(
        query, key.half().float(), value.half().float(), attn_mask=mask,
        enable_gqa=True).transpose(1, 2)  # (W, Q, H, D)
    torch.testing.assert_close(rowattn.attend(lib, query, key, value, mask, 64 ** -0.5), sdpa,
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name,march,defines", [
    ("plain C", "native", ("ROWATTN_PLAIN",)),
    ("AVX2", "x86-64-v3", ()),
])
def test_every_code_path_gives_the_same_bits(lib, tmp_path, name, march, defines):
    if march != "native" and (platform.machine() != "x86_64" or " avx2" not in _cpu_flags()):
        pytest.skip(f"{march} needs an x86 CPU with AVX2")
    other = rowattn.compile_at(tmp_path / "rowattn.so", march=march, defines=defines)
    assert other is not None, name
    for W, H, KV, Q, S, D in ((1, 9, 3, 5, 61, 64), (2, 6, 2, 4, 30, 12)):
        query, _, _ = _inputs(W, H, KV, Q, S, D, seed=2)
        both, value = _halfway_inputs(W, KV, S, D, seed=5)
        for key, val in ((both[0], value), (both[0].half(), value.half())):
            for mask in (_tree_mask(W, Q, S),
                         _tree_mask(1, Q, S).clamp(min=-3.4028234663852886e38)):
                assert torch.equal(rowattn.attend(other, query, key, val, mask, 0.125),
                                   rowattn.attend(lib, query, key, val, mask, 0.125)), (name, D)


def _halfway_inputs(W: int, KV: int, S: int, D: int, seed: int):
    """Keys and values whose roundings to half are the hard cases: ties between two halves
    (to even), values just above and just below a tie, subnormal halves, values just under
    the smallest normal half (some round up to it), just under 65520 (rounds to the largest
    finite half, 65504), zeros of both signs, and plain normal values."""
    gen = torch.Generator().manual_seed(seed)
    h = torch.randint(0, 0x7bff, (2, W, KV, S, D), generator=gen, dtype=torch.int32)
    lo = h.to(torch.int16).view(torch.float16).float()  # (2, W, KV, S, D) exact halves
    hi = (h + 1).to(torch.int16).view(torch.float16).float()
    pick = torch.randint(0, 7, lo.shape, generator=gen)
    mid = (lo + hi) / 2  # a tie (exact in fp32 below 2^15)
    x = torch.where(pick == 0, mid, lo)
    x = torch.where(pick == 1, torch.nextafter(mid, hi), x)  # just above a tie: rounds up
    x = torch.where(pick == 2, torch.nextafter(mid, lo), x)  # just below: rounds down
    x = torch.where(pick == 3, torch.rand(lo.shape, generator=gen) * 6.2e-5, x)  # subnormal
    # halves and the values under 2^-14 (6.1035e-5) that round up to the smallest normal
    x = torch.where(pick == 4, torch.randn(lo.shape, generator=gen), x)
    x = x * torch.where(torch.rand(lo.shape, generator=gen) < 0.5, -1.0, 1.0)
    x[..., 0, 0] = torch.tensor([65504.0, -0.0])[:, None, None].expand(2, W, KV)
    x[1, ..., 1, 0] = 65519.996  # the largest float under 65520: rounds to 65504
    x[1, ..., 1, 1] = 2.0 ** -14 - 2.0 ** -25  # a tie between the largest subnormal half
    x[1, ..., 1, 2] = 2.0 ** -14 - 2.0 ** -26  # and 2^-14 (to even: 2^-14), and above it
    return (x / 1024).contiguous(), x[1].contiguous()  # keys scaled down: finite scores


def test_fp32_keys_and_values_give_the_bits_of_their_half_copies(lib):
    """generate()'s cache holds fp32, a compiled step's buffers fp16: the kernel reads the
    former rounded to half (to nearest, ties to even) as torch's conversion rounds, so both
    give the same bits, in the vector loops and the scalar tails alike."""
    for W, H, KV, Q, S, D in ((1, 9, 3, 5, 61, 64), (2, 6, 2, 4, 30, 12), (1, 2, 1, 2, 11, 264)):
        query, _, _ = _inputs(W, H, KV, Q, S, D, seed=3)
        both, value = _halfway_inputs(W, KV, S, D, seed=4)
        key = both[0]
        mask = _tree_mask(W, Q, S)
        fp32 = rowattn.attend(lib, query, key, value, mask, 0.125)
        fp16 = rowattn.attend(lib, query, key.half(), value.half(), mask, 0.125)
        assert torch.isfinite(fp32).all()
        assert torch.equal(fp32, fp16), (W, H, KV, Q, S, D)
        exact = rowattn.attend(lib, query, key.half().float(), value.half().float(), mask, 0.125)
        assert torch.equal(fp32, exact)  # rounding a half again changes nothing


def test_a_row_depends_on_its_query_and_visible_slots_alone(lib):
    """Each row of a tree forward equals the row computed alone over only its visible slots
    (its ancestors and the cache): other rows, hidden slots, their keys and values and where
    the vector loops split the slots change nothing."""
    W, H, KV, Q, S, D = 1, 9, 3, 7, 83, 64
    query, key, value = _inputs(W, H, KV, Q, S, D, seed=3)
    mask = _tree_mask(W, Q, S)
    together = rowattn.attend(lib, query, key, value, mask, 0.125)  # (W, Q, H, D)
    for i in range(Q):
        seen = torch.nonzero(mask[0, 0, i] == 0).flatten()  # (n,)
        alone = rowattn.attend(lib, query[:, :, i:i + 1], key[:, :, seen], value[:, :, seen],
                               rowattn.visible(1, len(seen), False), 0.125)  # (W, 1, H, D)
        assert torch.equal(alone[:, 0], together[:, i]), i
    key2, value2 = key.clone(), value.clone()
    key2[:, :, -1] = float("nan")  # the last node: hidden from every row but its own
    value2[:, :, -1] = float("nan")
    again = rowattn.attend(lib, query, key2, value2, mask, 0.125)
    assert torch.equal(again[:, :-1], together[:, :-1])
    assert torch.isnan(again[:, -1]).all()  # its own row reads them


def test_a_static_buffers_unwritten_slots_change_no_bit_of_a_chain_or_a_tree(lib):
    """A step over a static buffer: the slots after the written ones (NaN here, as unwritten
    memory may be) are hidden by the lowest float, and the rows equal the step over the
    written slots alone, for a chain (visible slots a prefix, whose loops skip the hidden test)
    and a tree: where the loops stop and where the vector loops split change nothing."""
    W, H, KV, Q, S, D, spare = 2, 9, 3, 4, 45, 64, 19
    query, key, value = _inputs(W, H, KV, Q, S, D, seed=10)
    low = torch.finfo(torch.float32).min
    chain = torch.zeros(W, 1, Q, S)
    chain[..., S - Q:] = torch.triu(torch.full((Q, Q), low), 1)
    for mask in (chain, _tree_mask(W, Q, S).clamp(min=low)):
        key_b = torch.cat([key, torch.full((W, KV, spare, D), float("nan"))], 2)
        value_b = torch.cat([value, torch.full((W, KV, spare, D), float("nan"))], 2)
        mask_b = torch.cat([mask, torch.full((W, 1, Q, spare), low)], 3)
        assert torch.equal(rowattn.attend(lib, query, key_b, value_b, mask_b, 0.125),
                           rowattn.attend(lib, query, key, value, mask, 0.125))


def test_a_bool_mask_is_converted_once_per_object_and_again_when_it_changes():
    mask = torch.ones(1, 1, 2, 6, dtype=torch.bool)
    mask[0, 0, 0, 4:] = False
    first = attention.additive(mask)
    assert torch.equal(first, torch.zeros(1, 1, 2, 6).masked_fill_(~mask, NEG))
    assert attention.additive(mask) is first  # every layer of a forward: one conversion
    mask[0, 0, 1, 0] = False  # changed in place: converted afresh
    again = attention.additive(mask)
    assert again[0, 0, 1, 0] == NEG and again[0, 0, 0, 4] == NEG and again[0, 0, 1, 1] == 0
    other = mask.clone()  # equal contents, another object
    assert attention.additive(other) is not again and torch.equal(attention.additive(other), again)
    with torch.inference_mode():  # generate() under inference mode: no version counter
        frozen = mask.clone()
    assert torch.equal(attention.additive(frozen), again)


def test_the_op_a_compiled_step_calls_gives_the_kernels_bits_and_declares_its_shape(lib):
    """specviz::rowattn, opaque to inductor (the compiled path's attention of a packed
    target): the kernel's output, and a fake of the (W, Q, H, D) shape for tracing."""
    query, key, value = _inputs(2, 9, 3, 5, 40, 64, seed=3)
    mask = _tree_mask(2, 5, 40)
    out = torch.ops.specviz.rowattn(query, key, value, mask, 0.125)
    assert torch.equal(out, rowattn.attend(lib, query, key, value, mask, 0.125))
    traced = torch.compile(lambda q, k, v, m: torch.ops.specviz.rowattn(q, k, v, m, 0.125) * 2,
                           backend="eager", fullgraph=True)(query, key, value, mask)
    assert traced.shape == (2, 5, 9, 64) and torch.equal(traced, out * 2)


def test_the_ops_cpp_kernel_gives_the_python_kernels_bits_for_every_input_form(lib):
    """The op's C++ kernel (engine/kernels/ops.cpp, loaded by qmm.native_op) against attend,
    the Python kernel: strided query, key and value views, a mask cut to the slots, one that
    broadcasts over rows and queries, a double mask made fp32, a non-contiguous one;
    and one clear error for a misfit. A wrong stride or a mask read past its slots would
    differ."""
    from engine.kernels import qmm

    assert qmm.native_op() is not None
    assert torch._C._dispatch_has_kernel_for_dispatch_key("specviz::rowattn", "CPU")  # C++
    op = torch.ops.specviz.rowattn.default
    query, key, value = _inputs(2, 9, 3, 5, 40, 64, seed=21)
    tree = _tree_mask(2, 5, 48)  # 8 slots longer than the keys: cut to S
    big_k, big_v = _inputs(2, 9, 6, 5, 40, 64, seed=22)[1:]
    cases = [
        (query, key, value, tree),
        (query.transpose(1, 2).contiguous().transpose(1, 2), big_k[:, ::2], big_v[:, 1::2],
         tree[..., :40]),  # strided views of larger buffers
        (query, key, value, torch.zeros(1, 1, 1, 40)),  # broadcast over rows and queries
        (query, key, value, tree.double()),  # made fp32
        (query, key, value, tree.transpose(-1, -2).contiguous().transpose(-1, -2)),
        (query[..., :1, :], key, value, tree[..., -1:, :]),  # one query row
    ]
    for q, k, v, m in cases:
        assert torch.equal(op(q, k, v, m, 0.125), rowattn.attend(lib, q, k, v, m, 0.125))
    with pytest.raises(RuntimeError, match="rowattn: query"):
        op(query, key[:, :2], value[:, :2], tree, 0.125)  # 9 heads over 2 key/value heads
    with pytest.raises(RuntimeError, match="rowattn: a mask"):
        op(query, key, value, tree[..., :30], 0.125)  # fewer mask slots than keys


def test_a_head_whose_scores_overflow_gives_zero_beside_heads_that_do_not(lib):
    """Three query heads share a key/value head and are taken together: one whose every score
    is -inf (its query overflows against the keys) gives 0, and the other two the bits they
    get with an ordinary query in its place."""
    query, key, value = _inputs(1, 3, 1, 2, 20, 64, seed=5)
    mask = _tree_mask(1, 2, 20)
    big = query.clone()
    big[0, 1] = -1e38 * key[0, 0, :1].sign()  # (2, 64): the dot with slot 0 overflows ...
    key = key.clone()
    key[0, 0] = key[0, 0, :1]  # ... and with every slot (all keys alike)
    plain = rowattn.attend(lib, query, key, value, mask, 0.125)  # (1, 2, 3, 64)
    got = rowattn.attend(lib, big, key, value, mask, 0.125)
    assert torch.equal(got[:, :, 1], torch.zeros_like(got[:, :, 1]))
    assert torch.equal(got[:, :, 0], plain[:, :, 0]) and torch.equal(got[:, :, 2], plain[:, :, 2])


def test_a_row_that_sees_no_slot_gives_zero(lib):
    query, key, value = _inputs(1, 2, 1, 2, 8, 16, seed=4)
    mask = torch.zeros(1, 1, 2, 8)
    mask[0, 0, 1] = NEG
    out = rowattn.attend(lib, query, key, value, mask, 0.25)
    assert torch.equal(out[0, 1], torch.zeros(2, 16)) and out[0, 0].abs().sum() > 0


def _packed_tiny(tmp_path):
    cfg = tiny_config("llama", vocab_size=64, layers=2, hidden_size=64, intermediate_size=128,
                      num_attention_heads=4, num_key_value_heads=2)
    model = model_from_config(cfg, seed=0)  # its linears and head 4-bit, as embedded-q4's
    return load_packed(model, tmp_path / "tiny.gguf",
                       write_gguf(tmp_path / "tiny.gguf", model, head=True))


def _fed_three_ways(model, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Logits of `ids` from one forward, from one-token steps over a cache, and of its last two
    tokens as two sibling branches of a draft tree (each from the prefix before them)."""
    from transformers import DynamicCache
    x = torch.tensor([ids])  # (1, L)
    L = len(ids)
    with torch.no_grad():
        whole = model(x).logits[0]  # (L, V)
        cache = DynamicCache(config=model.config)
        steps = torch.cat([model(x[:, t:t + 1], past_key_values=cache).logits[0]
                           for t in range(L)])  # (L, V)
        cache = DynamicCache(config=model.config)
        model(x[:, : L - 2], past_key_values=cache)  # the prefix
        # two siblings after the prefix: ids[L - 2] and ids[L - 1] both at position L - 2
        mask = torch.zeros(1, 1, 2, L)  # (1, 1, 2, L): prefix, then the two nodes
        mask[0, 0, 0, L - 1] = NEG
        mask[0, 0, 1, L - 2] = NEG
        tree = model(x[:, L - 2:], past_key_values=cache, attention_mask=mask,
                     position_ids=torch.tensor([[L - 2, L - 2]])).logits[0]  # (2, V)
        cache = DynamicCache(config=model.config)
        model(x[:, : L - 2], past_key_values=cache)
        sibling = model(x[:, L - 1:], past_key_values=cache,
                        position_ids=torch.tensor([[L - 2]])).logits[0]  # (1, V)
    return whole, steps, torch.stack([tree[0], whole[L - 2], tree[1], sibling[0]])


def test_a_packed_models_logits_are_the_same_bits_however_its_tokens_are_fed(tmp_path):
    model = _packed_tiny(tmp_path)
    engine.load_pair(target=model, draft="", device="cpu")  # the engine's attention
    assert model.config._attn_implementation == attention.ROWS_NAME
    whole, steps, tree = _fed_three_ways(model, [3, 17, 5, 9, 41, 2, 33, 8, 60, 11])
    assert torch.equal(whole, steps)
    assert torch.equal(tree[0], tree[1]) and torch.equal(tree[2], tree[3])


def test_with_torchs_attention_the_same_packed_model_moves_between_forward_shapes(tmp_path):
    """The control: the property above is the kernel's, not the tiny model's."""
    model = _packed_tiny(tmp_path)
    model.config._attn_implementation = "sdpa"
    whole, steps, _ = _fed_three_ways(model, [3, 17, 5, 9, 41, 2, 33, 8, 60, 11])
    torch.testing.assert_close(whole, steps, rtol=1e-4, atol=1e-4)
    assert not torch.equal(whole, steps)


def test_only_a_packed_target_is_given_the_row_attention(tmp_path):
    model = _packed_tiny(tmp_path)
    attention.use_engine_attention(model)
    assert model.config._attn_implementation == attention.ROWS_NAME
    stock = model_from_config(tiny_config("llama", vocab_size=64, layers=1), seed=0)
    attention.use_engine_attention(stock)
    assert stock.config._attn_implementation == attention.NAME


@pytest.mark.parametrize("kv", ["static", "captured", "dynamic"])  # captured on a CPU: the
def test_a_packed_targets_static_buffers_hold_half_and_its_run_keeps_generates_tokens(  # steps

        tmp_path, monkeypatch, kv):
    """A packed target's static keys and values are fp16 (rowattn reads them as half anyway),
    a stock model's keep its dtype; the run's tokens are generate()'s, whose cache holds fp32."""
    from engine.execution import static_kv

    monkeypatch.setenv("SPECVIZ_KV", kv)
    model = _packed_tiny(tmp_path)
    pair = engine.load_pair(target=model, draft="", device="cpu")
    prompt = [3, 17, 5, 9, 41, 2]
    with torch.no_grad():
        ref = model.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False,
                             min_new_tokens=12)[0, len(prompt):].tolist()
    assert list(engine.generate(pair, prompt, "greedy", max_new_tokens=12).token_ids) == ref
    sets = static_kv.pool_sets(model)
    if kv != "dynamic":
        assert sets and {layer.keys.dtype for s in sets for layer in s.cache.layers} == {
            torch.float16}
        # the fixed-shape steps' masks stay fp32: an fp16 mask's lowest value (-65504) is no
        # hidden slot to rowattn, which would attend the whole view (the same bits, 4x the time)
        masks = [g.inputs["attention_mask"] for s in sets for g in s.graphs.values() if g]
        assert {m.dtype for m in masks} == ({torch.float32} if kv == "captured" else set())
        stock = model_from_config(tiny_config("llama", vocab_size=64, layers=2), seed=0)
        stock_pair = engine.load_pair(target=stock, draft="", device="cpu")
        engine.generate(stock_pair, prompt, "greedy", max_new_tokens=4)
        assert {layer.values.dtype for s in static_kv.pool_sets(stock)
                for layer in s.cache.layers} == {torch.float32}
    else:
        assert not sets  # the eager runner's own cache: fp32, read as half


def test_fp16_buffers_and_an_fp32_cache_give_a_packed_target_the_same_logits(tmp_path,
                                                                               monkeypatch):
    """The fixed-shape steps over fp16 buffers (captured: on a CPU run eagerly) and the eager
    runner over its fp32 cache give every token's logits the same bits."""
    from engine.core.forest import ROOT
    from engine.execution.cached_model import CachedModel

    model = _packed_tiny(tmp_path)
    engine.load_pair(target=model, draft="", device="cpu")
    prompt = torch.tensor([[3, 17, 5, 9, 41, 2, 33, 12]])
    got = {}
    for kv in ("dynamic", "captured"):
        monkeypatch.setenv("SPECVIZ_KV", kv)
        runner = CachedModel(model)
        runner.start(prompt)
        got[kv] = [runner.feed(torch.tensor([[7, 19, 23]]), torch.tensor([[ROOT, 0, 1]]))]
        runner.commit(torch.arange(1), torch.tensor([[0, 1]]), torch.tensor([[7, 19]]),
                      torch.tensor([[4]]))
        got[kv].append(runner.feed(torch.tensor([[5, 6]]), torch.tensor([[ROOT, ROOT]])))
        assert runner.served[-1] == ("padded" if kv == "captured" else "dynamic")
    for a, b in zip(got["dynamic"], got["captured"]):
        assert torch.equal(a.root_logits, b.root_logits)
        assert torch.equal(a.node_logits, b.node_logits)


def test_gradients_and_other_dtypes_leave_the_kernel_for_torchs_attention(lib):
    query, key, value = _inputs(1, 4, 2, 3, 16, 16, seed=5)
    mask = _tree_mask(1, 3, 16)
    module = torch.nn.Module()  # what transformers' sdpa function reads of a layer
    module.num_key_value_groups, module.is_causal = 2, True
    with torch.no_grad():
        ours = attention.row_attention(module, query, key, value, mask, scaling=0.25)[0]
        assert torch.equal(ours, rowattn.attend(lib, query, key, value, mask, 0.25))
        bf = attention.row_attention(module, query.bfloat16(), key.bfloat16(),
                                     value.bfloat16(), mask.bfloat16(), scaling=0.25)[0]
        assert bf.dtype == torch.bfloat16
    q = query.clone().requires_grad_()
    out = attention.row_attention(module, q, key, value, mask, scaling=0.25)[0]
    out.sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()


class _Layer(torch.nn.Module):
    """What transformers' sdpa function reads of an attention layer."""

    def __init__(self, groups: int):
        super().__init__()
        self.num_key_value_groups, self.is_causal, self.training = groups, True, False


def _sdpa(query, key, value, mask, **kw):
    """transformers' sdpa over the keys and values rounded to half (as rowattn reads them)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    return sdpa_attention_forward(_Layer(query.shape[1] // key.shape[1]), query,
                                  key.half().float(), value.half().float(), mask, scaling=0.25,
                                  **kw)[0]


def _spy(monkeypatch) -> list:
    calls = []
    real = rowattn.attend
    monkeypatch.setattr(rowattn, "attend", lambda *a: calls.append(a[4].shape) or real(*a))
    return calls


@pytest.mark.parametrize("Q,S", [(1, 12), (4, 4), (4, 32)])  # (4, 32): a prefill into an
def test_without_a_mask_it_follows_sdpas_rule(lib, Q, S, monkeypatch):  # empty static cache
    query, key, value = _inputs(1, 4, 2, Q, S, 16, seed=8)
    calls = _spy(monkeypatch)
    with torch.no_grad():
        ours = attention.row_attention(_Layer(2), query, key, value, None, scaling=0.25)[0]
        torch.testing.assert_close(ours, _sdpa(query, key, value, None), rtol=1e-5, atol=1e-5)
        flat = attention.row_attention(_Layer(2), query, key, value, None, scaling=0.25,
                                       is_causal=False)[0]
        torch.testing.assert_close(flat, _sdpa(query, key, value, None, is_causal=False),
                                   rtol=1e-5, atol=1e-5)
    assert len(calls) == 2  # both by the kernel


def test_masks_of_other_shapes_broadcast_or_go_to_torchs_attention(lib, monkeypatch):
    query, key, value = _inputs(2, 4, 2, 3, 20, 16, seed=9)
    calls = _spy(monkeypatch)
    one_row = torch.zeros(1, 1, 1, 24)  # one mask row for every query row, longer than S
    one_row[..., 5] = NEG
    per_head = torch.zeros(2, 4, 3, 20)
    per_head[:, 1, :, :4] = NEG
    with torch.no_grad():
        for mask in (one_row, per_head):
            ours = attention.row_attention(_Layer(2), query, key, value, mask, scaling=0.25)[0]
            torch.testing.assert_close(ours, _sdpa(query, key, value, mask[..., :20]),
                                       rtol=1e-5, atol=1e-5)
    assert calls == [one_row.shape, per_head.shape]  # the kernel takes one, refuses the other
    with pytest.raises(RuntimeError):
        rowattn.attend(lib, query, key, value, per_head, 0.25)


@pytest.mark.parametrize("kv", ["dynamic", "static"])  # fp32 cache / fp16 buffers
def test_a_draft_trees_nodes_get_the_bits_of_the_chains_they_stand_for(tmp_path, monkeypatch,
                                                                       kv):
    """Through the engine's runner and its masks: siblings and a grandchild fed as one forest
    equal the same tokens fed as chains (a node's hidden siblings sit before it: its visible
    slots are no prefix), on the eager path and on the static one's fixed-shape steps."""
    from engine.core.forest import ROOT
    from engine.execution.cached_model import CachedModel

    monkeypatch.setenv("SPECVIZ_KV", kv)
    model = _packed_tiny(tmp_path)
    engine.load_pair(target=model, draft="", device="cpu")
    prompt = torch.tensor([[3, 17, 5, 9, 41, 2]])
    tree = CachedModel(model)
    tree.start(prompt)
    kids = [7, 19, 23, 37, 50, 11, 29, 44]  # 8 children of the root, then a child of the last
    got = tree.feed(torch.tensor([kids + [8]]), torch.tensor([[ROOT] * 8 + [7]]))
    for n, kid in enumerate(kids):
        chain = CachedModel(model)
        chain.start(prompt)
        ids, par = ([kid, 8], [ROOT, 0]) if n == 7 else ([kid], [ROOT])
        one = chain.feed(torch.tensor([ids]), torch.tensor([par]))
        assert torch.equal(got.root_logits, one.root_logits)
        assert torch.equal(got.node_logits[0, n], one.node_logits[0, 0]), n
    assert torch.equal(got.node_logits[0, 8], one.node_logits[0, 1])
    assert tree.served[-1] == kv
