"""The compiled path (``SPECVIZ_KV=compiled``, engine.execution.static_kv): on a CPU the captured
path's fixed-shape steps compiled by inductor. Its runs equal generate() at temperature 0 and
draw the dynamic path's tokens under the same seed on a tiny model; forwards of more tokens
than a compiled step takes run on the static path; a drafter fed embeddings compiles its steps
too, and a warm-up makes its common shapes; a step attends a power-of-two view of its buffer
that grows with the run."""

from __future__ import annotations

import pytest
import torch

import engine
from engine.core.forest import ROOT
from engine.execution import static_kv
from engine.execution.cached_model import RESERVE, CachedModel
from tests.conftest import tiny_pair

pytestmark = pytest.mark.slow  # each step shape compiles (seconds on a tiny model)


@pytest.fixture
def compiled(monkeypatch):
    monkeypatch.setenv("SPECVIZ_KV", "compiled")


def test_compiled_is_asked_for_on_a_cpu_and_on_cuda_where_its_steps_are_captured(compiled):
    assert static_kv.kv_mode(torch.device("cpu")) == "compiled"
    assert static_kv.kv_mode(torch.device("cuda")) == "compiled"  # tests/cuda: captured graphs


@pytest.mark.parametrize("method,params", [("greedy", {}), ("sd", {"gamma": 3}),
                                           ("mcsd", {"k_config": "2x2"})])
def test_greedy_token_methods_equal_generate_on_the_compiled_path(compiled, method, params):
    pair = tiny_pair(draft="feature", layers=2, early_exit_layers=1)  # two layers: quick
    for prompt in ([3, 4, 5, 6, 3, 4, 5], [11, 12, 13, 14, 15] * 4):
        trace = engine.generate(pair, prompt, method, max_new_tokens=20, **params)
        ref = pair.target.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=20)
        assert list(trace.token_ids) == ref[0, len(prompt):].tolist(), (method, prompt)
        paths = trace.stats.step_paths
        long_prompt = len(prompt) > static_kv.COMPILED_MAX_TOKENS  # its forward runs static
        assert paths.get("target:static", 0) == int(long_prompt)
        assert paths.get("target:compiled", 0) == len(trace.rounds) - long_prompt
        if method != "greedy":  # the feature drafter, fed embeddings, compiles its steps too
            assert paths.get("draft:compiled", 0) > 0, (method, paths)


def test_sampled_runs_draw_the_dynamic_paths_tokens_under_the_same_seed(monkeypatch):
    pair = tiny_pair()
    runs = {}
    for mode in ("dynamic", "compiled"):
        monkeypatch.setenv("SPECVIZ_KV", mode)
        runs[mode] = [engine.generate(pair, [3, 4, 5], "sd", temperature=1.0, seed=s,
                                      max_new_tokens=12, gamma=3).token_ids for s in range(4)]
    assert runs["compiled"] == runs["dynamic"]


def test_a_compiled_model_leases_the_static_paths_buffers(compiled):
    pair = tiny_pair()
    cached = CachedModel(pair.target)
    cached.start(torch.tensor([[3, 4, 5]]))
    assert cached.kv.slots == static_kv.slots_for(3 + RESERVE) == static_kv.MIN_SLOTS


def test_a_packed_target_skips_padded_tokens_and_compiles_its_own_steps(compiled, monkeypatch):
    """... with its wrapper in C++ on a CPU (static_kv.CPP_WRAPPER), where the plain model's
    steps keep inductor's Python wrapper."""
    from engine.kernels import qmm
    from engine.kernels.packed4 import quantize_linears

    options = []  # inductor's options of every step compiled (in memory or for the store)
    real_compile = torch.compile

    def compile_spy(*args, **kw):
        options.append(kw.get("options") or {})
        return real_compile(*args, **kw)

    monkeypatch.setattr(torch, "compile", compile_spy)
    plain = tiny_pair(layers=2, early_exit_layers=1, seed=3)  # two layers: quick to compile
    prompt = [3, 4, 5, 6, 3, 4, 5]
    engine.generate(plain, prompt, "sd", max_new_tokens=16, gamma=4, controller="fixed")
    assert options and not any(o.get("cpp_wrapper") for o in options)
    options.clear()
    pair = tiny_pair(layers=2, early_exit_layers=1, seed=3)  # the same shapes, packed below:
    # its steps must not replay the plain model's graphs
    assert quantize_linears(pair.target.model) == 2 * 7  # every linear of its layers
    declared = []  # (period, live) of every step's padding declaration (each kernel of the
    # op honours it: tests/model/test_qmm.py)
    padded_rows = qmm.padded_rows

    def spy(period, live):
        declared.append((period, live))
        return padded_rows(period, live)

    monkeypatch.setattr(qmm, "padded_rows", spy)
    ref = pair.target.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=16)
    trace = engine.generate(pair, prompt, "sd", max_new_tokens=16, gamma=4, controller="fixed")
    assert list(trace.token_ids) == ref[0, len(prompt):].tolist()
    assert (8, 5) in declared  # 1 + 4 fed tokens padded to a step of 8: 3 rows skipped
    assert trace.stats.step_paths.get("target:compiled", 0) == len(trace.rounds)
    assert options and all(o.get("cpp_wrapper") and o.get("cpp_wrapper_build_separate")
                           for o in options)


def test_where_the_cpp_wrapper_fails_to_build_a_packed_step_compiles_with_the_python_one(
        compiled, monkeypatch, caplog):
    """A host whose compiler builds inductor's kernels but not its C++ wrapper (no Python
    headers, say): the shape compiles with the Python wrapper instead of running static,
    and later shapes skip the C++ one (it fails for the first shape only, that shape's step
    store try and its in-memory one; one warning says so)."""
    from torch._inductor import codecache
    from torch._inductor.exc import CppCompileError

    from engine.kernels.packed4 import quantize_linears

    def no_python_headers(cls, *args, **kw):  # where inductor builds the wrapper's module
        raise CppCompileError(["c++", "wrapper.cpp"], "Python.h: No such file or directory")

    monkeypatch.setattr(codecache.CppWrapperCodeCache, "load_pybinding",
                        classmethod(no_python_headers))
    monkeypatch.setattr(static_kv.POLICY, "cpp_wrapper", True)
    options = []
    real_compile = torch.compile

    def compile_spy(*args, **kw):
        options.append(kw.get("options") or {})
        return real_compile(*args, **kw)

    monkeypatch.setattr(torch, "compile", compile_spy)
    pair = tiny_pair(layers=2, early_exit_layers=1, seed=3)
    quantize_linears(pair.target.model)
    prompt = [3, 4, 5, 6, 3, 4, 5]
    ref = pair.target.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=4)
    with caplog.at_level("WARNING", logger=static_kv.LOG.name):
        trace = engine.generate(pair, prompt, "greedy", max_new_tokens=4)
    assert list(trace.token_ids) == ref[0, len(prompt):].tolist()
    assert trace.stats.step_paths == {"target:compiled": len(trace.rounds)}  # none static
    assert static_kv.POLICY.cpp_wrapper is False
    wrapped = [bool(o.get("cpp_wrapper")) for o in options]
    assert wrapped[:2] == [True, True] and not any(wrapped[2:]) and len(wrapped) >= 4
    # (the first shape: the store's and the in-memory C++ try, then the Python one's two;
    # the second shape: the Python wrapper at once)
    assert sum("C++ step wrapper did not build" in r.message for r in caplog.records) == 1


@pytest.mark.parametrize("bits,rows", [(16, 1), (8, 1), (8, 2)])
def test_a_packed_targets_compiled_step_gives_a_token_the_same_bits_alone_or_in_a_chain(
        compiled, bits, rows):
    """Every linear through qmm's op and attention through rowattn's (both opaque to
    inductor): what inductor fuses is elementwise or a reduction within one token's row, so a
    token's final hidden states are the same bits whether a compiled step feeds it alone or
    in a chain of five, with one beam row or two (with grouped attention traced instead, some
    differ in the last bit)."""
    from engine.kernels.packed4 import quantize_linears

    pair = tiny_pair(layers=2, early_exit_layers=1, seed=3)
    quantize_linears(pair.target.model, bits)
    gen = torch.Generator().manual_seed(0)
    keep = torch.arange(rows)
    none = torch.zeros((rows, 0), dtype=torch.long)
    for trial in range(6):
        prompt = torch.randint(3, 64, (rows, 9 + trial), generator=gen)  # rows differ
        chain = torch.randint(3, 64, (rows, 5), generator=gen)  # the first committed, 4
        alone, cached = [], CachedModel(pair.target)  # drafted, per row
        cached.start(prompt)
        cached.feed()
        for i in range(5):
            cached.commit(keep, none, none, chain[:, i:i + 1])
            alone.append(cached.feed().root_hidden)  # (W, d)
        assert set(cached.take_served()) == {"compiled"}
        cached = CachedModel(pair.target)
        cached.start(prompt)
        cached.feed()
        cached.commit(keep, none, none, chain[:, :1])
        scored = cached.feed(chain[:, 1:], torch.tensor([[ROOT, 0, 1, 2]] * rows))  # one step
        together = [scored.root_hidden] + [scored.node_hidden[:, i] for i in range(4)]
        assert cached.take_served() == ["compiled"] * 2
        for i, (a, b) in enumerate(zip(together, alone)):
            assert torch.equal(a, b), (trial, i, (a - b).abs().max().item())


def _eager_and_compiled_hidden(pair, monkeypatch, rows: int) -> tuple[list, list]:
    """The final hidden states of a prompt's tokens and of a chain fed in one step, eager
    (static path) and compiled, on the same inputs."""
    gen = torch.Generator().manual_seed(1)
    out = {}
    for mode in ("static", "compiled"):
        monkeypatch.setenv("SPECVIZ_KV", mode)
        gen.manual_seed(1)
        states = []
        for trial in range(3):
            prompt = torch.randint(3, 64, (rows, 9 + 7 * trial), generator=gen)  # (W, n)
            chain = torch.randint(3, 64, (rows, 5), generator=gen)  # (W, 5)
            cached = CachedModel(pair.target)
            cached.start(prompt)
            cached.feed()
            cached.commit(torch.arange(rows), torch.zeros((rows, 0), dtype=torch.long),
                          torch.zeros((rows, 0), dtype=torch.long), chain[:, :1])
            scored = cached.feed(chain[:, 1:], torch.tensor([[ROOT, 0, 1, 2]] * rows))
            assert cached.take_served()[-1] == mode
            states += [scored.root_hidden, scored.node_hidden]
        out[mode] = states
    return out["static"], out["compiled"]


@pytest.mark.parametrize("bits,rows", [(16, 1), (8, 2)])
def test_a_packed_targets_compiled_step_gives_every_token_the_eager_steps_bits(
        monkeypatch, bits, rows):
    """RMSNorm and the rotary cos / sin traced as ops (engine.kernels.eager_bits) with the
    stock modules' ATen operations: what inductor still fuses rounds as eager does, so a
    compiled step's hidden states are the eager step's, bit for bit. Negative control:
    with the norms and the rotary traced by inductor, some differ."""
    from engine.execution import cached_model
    from engine.kernels.packed4 import quantize_linears

    pair = tiny_pair(layers=2, early_exit_layers=1, seed=3, hidden_size=128,
                     intermediate_size=256)
    quantize_linears(pair.target.model, bits)
    eager, compiled_ = _eager_and_compiled_hidden(pair, monkeypatch, rows)
    for i, (a, b) in enumerate(zip(eager, compiled_)):
        assert torch.equal(a, b), (i, (a - b).abs().max().item())
    inductors = tiny_pair(layers=2, early_exit_layers=1, seed=3, hidden_size=128,
                          intermediate_size=256)
    quantize_linears(inductors.target.model, bits)
    monkeypatch.setattr(cached_model.eager_bits, "keep_eager_bits", lambda model: 0)
    eager, compiled_ = _eager_and_compiled_hidden(inductors, monkeypatch, rows)
    assert not all(torch.equal(a, b) for a, b in zip(eager, compiled_))


def test_a_target_at_8_bit_activations_runs_its_compiled_steps_and_keeps_its_greedys_tokens(
        compiled):
    """A compiled step has the eager step's bits (engine.kernels.eager_bits), so a compiled run
    equals generate()'s tokens, and a compiled speculative run its greedy's."""
    from engine.kernels.packed4 import quantize_linears

    pair = tiny_pair(layers=2, early_exit_layers=1, seed=3)
    assert quantize_linears(pair.target.model, 8) == 2 * 7
    for prompt in ([3, 4, 5, 6, 3, 4, 5], [9, 8, 7, 9, 8, 7, 9]):
        greedy = engine.generate(pair, prompt, "greedy", max_new_tokens=16)
        ref = pair.target.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=16)
        assert list(greedy.token_ids) == ref[0, len(prompt):].tolist(), prompt
        for method, params in (("sd", {"gamma": 4, "controller": "fixed"}),
                               ("mcsd", {"k_config": "2x2"})):
            trace = engine.generate(pair, prompt, method, max_new_tokens=16, **params)
            assert list(trace.token_ids) == list(greedy.token_ids), (method, prompt)
            assert trace.stats.step_paths.get("target:compiled", 0) == len(trace.rounds)
        assert greedy.stats.step_paths.get("target:compiled", 0) == len(greedy.rounds)


def test_without_rowattns_kernel_a_target_at_8_bit_activations_runs_static(compiled,
                                                                           monkeypatch):
    """Its compiled step would not be row-invariant (attention traced by inductor), and
    8-bit roundings turn that into token changes: the static path's eager steps instead."""
    from engine.kernels import rowattn
    from engine.kernels.packed4 import quantize_linears, set_activation_bits

    monkeypatch.setattr(rowattn, "library", lambda: None)
    pair = tiny_pair(layers=2, early_exit_layers=1, seed=3)
    quantize_linears(pair.target.model, 8)
    assert CachedModel(pair.target).mode == "static"
    set_activation_bits(pair.target.model, 16)
    assert CachedModel(pair.target).mode == "compiled"


def test_compiled_steps_attend_a_view_that_grows_with_the_run(compiled, monkeypatch):
    monkeypatch.setattr(static_kv, "COMPILED_MIN_VIEW", 16)  # views of 16, 32 and 64 slots
    pair = tiny_pair(layers=2, early_exit_layers=1, seed=5)
    prompt = [3, 4, 5, 6, 7, 8, 9, 10, 11, 12]
    trace = engine.generate(pair, prompt, "sd", max_new_tokens=40, gamma=3, controller="fixed")
    ref = pair.target.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=40)
    assert list(trace.token_ids) == ref[0, len(prompt):].tolist()
    assert trace.stats.step_paths.get("target:compiled", 0) == len(trace.rounds)  # the
    # 10-token prompt too (bucket 16), then 4 fed tokens a round
    keys = {k for s in static_kv.pool_sets(pair.target) for k in s.graphs}
    views = {k[3] for k in keys}
    assert {16, 32, 64} <= views  # the run crossed two view sizes


def test_padded_tokens_written_past_the_view_change_no_later_step(compiled, monkeypatch):
    monkeypatch.setattr(static_kv, "COMPILED_MIN_VIEW", 16)
    pair = tiny_pair(layers=2, early_exit_layers=1, seed=6)
    monkeypatch.setenv("SPECVIZ_KV", "dynamic")
    ref = CachedModel(pair.target)
    monkeypatch.setenv("SPECVIZ_KV", "compiled")
    got = CachedModel(pair.target)
    one = torch.tensor([0])
    none = torch.zeros((1, 0), dtype=torch.long)
    chain = torch.tensor([[ROOT, 0]])  # two drafted nodes, the second the first's child
    outs = {}
    for name, cm in (("ref", ref), ("got", got)):
        cm.start(torch.tensor([list(range(3, 16))]))  # 13 tokens: bucket 16, view 16
        steps = [cm.feed().root_logits]
        cm.commit(one, none, none, torch.tensor([[20]]))
        nodes = cm.feed(torch.tensor([[21, 22]]), chain)  # 3 fed at slots 13-15 in bucket 4:
        steps += [nodes.root_logits, nodes.node_logits[0]]  # its padded token writes slot 16,
        cm.commit(one, torch.tensor([[0, 1]]), torch.tensor([[21, 22]]), torch.tensor([[23]]))
        steps.append(cm.feed().root_logits)  # past view 16; this step reads slot 16 (view 32)
        outs[name] = steps
    assert got.take_served() == ["compiled"] * 3
    for a, b in zip(outs["got"], outs["ref"]):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def test_a_view_holds_the_rows_real_slots_in_a_power_of_two():
    assert static_kv.view_for(1, 512) == static_kv.COMPILED_MIN_VIEW
    assert static_kv.view_for(129, 512) == 256
    assert static_kv.view_for(256, 512) == 256
    assert static_kv.view_for(300, 256) == 256  # never past the buffer


def _packed_pair(bits: int = 8):
    from engine.kernels.packed4 import quantize_linears

    pair = tiny_pair(layers=2, early_exit_layers=1, seed=3)
    quantize_linears(pair.target.model, bits)
    return pair


def test_a_packed_targets_compiled_steps_attend_the_whole_buffer(compiled):
    """rowattn reads a row's visible slots only, so a packed target's compiled step attends
    every slot: one shape per rows and bucket, whatever the run's length."""
    pair = _packed_pair()
    assert CachedModel(pair.target).whole_view
    engine.generate(pair, list(range(3, 43)), "sd", max_new_tokens=12, gamma=3,
                    controller="fixed")
    keys = {k for s in static_kv.pool_sets(pair.target) for k in s.graphs}
    assert keys and {k[3] for k in keys} == {static_kv.MIN_SLOTS}


def test_a_deferring_thread_runs_a_shape_not_made_yet_static_until_a_warm_up_makes_it(
        monkeypatch):
    """The app's model thread never compiles (static_kv.POLICY.deferred): a step whose
    shape is not made runs static, with the same bits; warming (another thread in the app)
    makes the common shapes in its own buffers, one row's and the beam methods' four rows',
    which later runs then take."""
    from engine.execution.cached_model import warm_shapes, warming

    monkeypatch.delenv("SPECVIZ_KV", raising=False)
    monkeypatch.setattr(static_kv.POLICY, "packed", True)  # as the app sets it
    pair = _packed_pair()
    assert static_kv.kv_mode(pair.device, pair.target) == "compiled"
    prompt = [3, 4, 5, 6, 3, 4, 5]
    ref = pair.target.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=16)
    monkeypatch.setattr(static_kv.POLICY, "deferred", True)
    cold = engine.generate(pair, prompt, "sd", max_new_tokens=16, gamma=3, controller="fixed")
    assert not any("compiled" in k for k in cold.stats.step_paths), cold.stats.step_paths
    assert any(s.wanted for s in static_kv.pool_sets(pair.target))
    runner = CachedModel(pair.target)
    assert list(warming(runner)) == list(range(1, warm_shapes(runner) + 1)) == \
        list(range(1, 11))  # 5 shapes at 1 row, 5 at 4
    warm = engine.generate(pair, prompt, "sd", max_new_tokens=16, gamma=3, controller="fixed")
    assert warm.stats.step_paths["target:compiled"] == len(warm.rounds)
    assert "target:static" not in warm.stats.step_paths
    assert list(cold.token_ids) == list(warm.token_ids) == ref[0, len(prompt):].tolist()
    beams = engine.generate(pair, prompt, "beam", max_new_tokens=8)  # 4 rows after the
    # prompt, which prefills one row (a shape not warmed: it runs static)
    assert [r.step_paths for r in beams.rounds[1:]] == [("target:compiled",)] * 7


def test_a_warm_up_makes_the_feature_drafters_shapes_which_a_deferring_thread_then_takes(
        compiled, monkeypatch):
    """The feature drafter's runner (fed embeddings) warms its common shapes: the prompt's
    tail (bucket 8) and 1, 2 and 4 nodes a row, at one row and four. A thread that defers
    compiles then drafts on compiled steps from the first fed round on, with the same
    tokens as before the warm-up."""
    from engine.drafters.feature import FeatureRunner
    from engine.execution.cached_model import warm_shapes, warming

    pair = tiny_pair(draft="feature")
    prompt = [3, 4, 5, 6, 3, 4, 5]
    monkeypatch.setattr(static_kv.POLICY, "deferred", True)
    cold = engine.generate(pair, prompt, "sd", max_new_tokens=16, gamma=3, controller="fixed")
    assert "draft:compiled" not in cold.stats.step_paths
    runner = pair.drafter.warm_runner()
    assert isinstance(runner, FeatureRunner) and runner.mode == "compiled"
    assert list(warming(runner)) == list(range(1, warm_shapes(runner) + 1)) == \
        list(range(1, 9))  # 4 shapes at 1 row, 4 at 4
    keys = {k for s in static_kv.pool_sets(pair.drafter.model) for k in s.graphs}
    assert {(k[0], k[1], k[2]) for k in keys} == {
        (w, b, "inputs_embeds") for w in (1, 4) for b in (1, 2, 4, 8)}
    warm = engine.generate(pair, prompt, "sd", max_new_tokens=16, gamma=3, controller="fixed")
    paths = warm.stats.step_paths
    assert paths.get("draft:compiled", 0) > 0 and "draft:static" not in paths, paths
    assert list(warm.token_ids) == list(cold.token_ids)


def test_without_the_processs_ask_a_packed_model_runs_eagerly(monkeypatch):
    monkeypatch.delenv("SPECVIZ_KV", raising=False)
    pair = _packed_pair()
    assert static_kv.kv_mode(pair.device, pair.target) == "dynamic"  # generate's
    # and check's default (bench, bench-set and tune turn POLICY.packed on)
    monkeypatch.setattr(static_kv.POLICY, "packed", True)
    assert static_kv.kv_mode(pair.device, pair.target) == "compiled"
    assert static_kv.kv_mode(pair.device, tiny_pair().target) == "dynamic"  # not packed
    monkeypatch.setenv("SPECVIZ_KV", "dynamic")  # the variable decides
    assert static_kv.kv_mode(pair.device, pair.target) == "dynamic"
