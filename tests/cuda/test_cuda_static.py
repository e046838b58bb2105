"""The three KV paths on a CUDA device (dynamic, static, captured: CUDA graphs), fp32 and bf16,
tiny models built from configs: tree attention against sequential decoding, greedy methods and
beam methods against generate(), every captured shape really captured, and a run longer than
its first buffer; the compiled path (inductor's steps captured as CUDA graphs) against
generate(). The rest of tests/cuda runs on the default path (captured on CUDA)."""

from __future__ import annotations

import pytest
import torch

import engine
from engine.core.forest import PAD
from engine.execution import static_kv
from engine.execution.cached_model import CachedModel
from engine.run.models import load_pair
from tests.cuda.test_cuda_exactness import (
    DTYPES,
    SCORE_TOL,
    _sequential,
    assert_same_greedy,
    cuda_model,
)
from tests.forests import PROMPTS, TREES, path_tokens

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(),
                       reason="needs a CUDA device: torch.cuda.is_available() is False"),
]
SERVED = {"dynamic": "dynamic", "static": "static", "captured": "captured"}


@pytest.fixture(params=list(SERVED))
def kv(request, monkeypatch):
    monkeypatch.setenv("SPECVIZ_KV", request.param)
    return request.param


@pytest.mark.parametrize("dtype", DTYPES)
def test_forest_nodes_score_like_sequential_decoding_on_every_path(kv, dtype):
    dt, tol = DTYPES[dtype]
    model = cuda_model("llama", dt, seed=3)
    prompts, trees = PROMPTS, TREES
    cached = CachedModel(model)
    cached.start(torch.tensor(prompts))
    root = cached.feed()
    tok, par = torch.tensor([t for t, _ in trees]), torch.tensor([p for _, p in trees])
    nodes = cached.feed(tok, par).node_logits.float()  # (W, n, V)
    worst = 0.0
    for w, (tokens, parents) in enumerate(trees):
        worst = max(worst, float((root.root_logits[w].float()
                                  - _sequential(model, prompts[w])).abs().max()))
        for i, pj in enumerate(parents):
            if pj != PAD:
                ref = _sequential(model, prompts[w] + path_tokens(tokens, parents, i))
                worst = max(worst, float((nodes[w, i] - ref).abs().max()))
    assert worst <= tol, (kv, dtype, worst)
    assert cached.take_served() == [SERVED[kv]] * 2


def _greedy_runs(target, tol: float):
    """(method, trace) of greedy, sd and mcsd 4x2x2 on two prompts with the target's 2-layer
    early exit as drafter, each run's tokens checked against generate()'s (a first
    difference only at a near-tie within tol)."""
    pair = load_pair(target=target, draft="early-exit:2", device="cuda")
    for prompt in ([3, 4, 5, 6], [40, 2, 17, 9, 33]):
        out = target.generate(torch.tensor([prompt], device="cuda"), do_sample=False,
                              max_new_tokens=24, output_logits=True,
                              return_dict_in_generate=True)
        for method, params in (("greedy", {}), ("sd", {"gamma": 3}),
                               ("mcsd", {"k_config": "4x2x2"})):
            trace = engine.generate(pair, prompt, method, max_new_tokens=24, **params)
            assert_same_greedy(list(trace.token_ids), out, prompt, tol)
            yield method, trace


@pytest.mark.parametrize("dtype", DTYPES)
def test_greedy_methods_equal_generate_on_every_path(kv, dtype):
    dt, tol = DTYPES[dtype]
    for _, trace in _greedy_runs(cuda_model("llama", dt), 0.0 if dt == torch.float32 else tol):
        assert trace.stats.step_paths[f"target:{SERVED[kv]}"] == len(trace.rounds)


@pytest.mark.parametrize("dtype", DTYPES)
def test_beam_methods_equal_generate_num_beams_on_every_path(kv, dtype):
    target = cuda_model("llama", DTYPES[dtype][0], layers=2)
    gc = target.generation_config
    gc.eos_token_id, gc.pad_token_id, gc.early_stopping, gc.length_penalty = None, None, False, 1.0
    pair = load_pair(target=target, draft=cuda_model("llama", DTYPES[dtype][0], seed=1,
                                                     layers=2), device="cuda")
    for prompt in ([3, 4, 5, 6], [11, 12]):
        out = target.generate(torch.tensor([prompt], device="cuda"), num_beams=4,
                              num_return_sequences=4, do_sample=False, max_new_tokens=10,
                              output_scores=True, return_dict_in_generate=True)
        rows, scores = out.sequences[:, len(prompt):].tolist(), out.sequences_scores.tolist()
        for method, kw in (("beam", {}), ("atspeed_strict", {"draft_beams": 8, "gamma": 3})):
            trace = engine.generate(pair, prompt, method, beams=4, max_new_tokens=10, **kw)
            assert [list(b.token_ids) for b in trace.beams] == rows, (kv, method, dtype)
            for beam, score in zip(trace.beams, scores):
                assert abs(beam.score - score) <= SCORE_TOL[dtype], (kv, method, dtype)


def test_every_captured_shape_is_a_cuda_graph_and_a_long_run_grows_its_buffer(monkeypatch):
    monkeypatch.setenv("SPECVIZ_KV", "captured")
    monkeypatch.setattr(static_kv, "MIN_SLOTS", 64)
    monkeypatch.setattr("engine.execution.cached_model.RESERVE", 0)
    target = cuda_model("llama", torch.float32)
    pair = load_pair(target=target, draft="early-exit:2", device="cuda")
    prompt = [3, 4, 5, 6]
    trace = engine.generate(pair, prompt, "sd", gamma=3, max_new_tokens=120)
    ref = target.generate(torch.tensor([prompt], device="cuda"), do_sample=False,
                          max_new_tokens=120)
    assert list(trace.token_ids) == ref[0, len(prompt):].tolist()
    sets = static_kv.pool_sets(target) + static_kv.pool_sets(pair.drafter.model)
    assert max(s.slots for s in sets) > 128  # the run moved past the warmed 128-slot set
    graphs = [g for s in sets for g in s.graphs.values()]
    failed = [k for s in sets for k, g in s.graphs.items() if g is None]
    assert graphs and not failed, failed  # None: that shape's capture failed (ran eager)
    assert all(isinstance(g.graph, torch.cuda.CUDAGraph) for g in graphs)


def test_loading_a_pair_captures_the_common_step_shapes_as_cuda_graphs(monkeypatch):
    monkeypatch.delenv("SPECVIZ_KV", raising=False)
    target = cuda_model("llama", torch.bfloat16, seed=9)
    pair = load_pair(target=target, draft="early-exit:2", device="cuda")
    for model in (target, pair.drafter.model):
        graphs = {k: g for s in static_kv.pool_sets(model) for k, g in s.graphs.items()}
        assert {(1, b, "input_ids") for b in (1, 2, 4, 8, 16)} <= set(graphs)
        assert all(isinstance(g.graph, torch.cuda.CUDAGraph) for g in graphs.values())


@pytest.mark.parametrize("dtype", DTYPES)
def test_compiled_steps_are_cuda_graphs_and_greedy_methods_equal_generate(monkeypatch, dtype):
    """SPECVIZ_KV=compiled on CUDA: every step shape of up to COMPILED_MAX_TOKENS fed tokens a
    row is compiled by inductor and captured as a CUDA graph; longer forwards (an mcsd tree)
    run static. Tokens as generate()'s (a near-tie within the dtype's tolerance aside: fused
    kernels sum in another order)."""
    monkeypatch.setenv("SPECVIZ_KV", "compiled")
    dt, tol = DTYPES[dtype]
    target = cuda_model("llama", dt)
    for method, trace in _greedy_runs(target, tol):  # fp32 too: fused kernels sum in
        paths = trace.stats.step_paths  # another order than generate()'s
        if method == "mcsd":  # 1 + 28 tree tokens a round: past the compiled shapes
            assert paths.get("target:static", 0) >= 1, paths
        else:
            assert paths["target:compiled"] == len(trace.rounds), paths
    graphs = {k: g for s in static_kv.pool_sets(target) for k, g in s.graphs.items()}
    assert graphs and all(g is not None for g in graphs.values()), graphs
    assert all(isinstance(g.graph, torch.cuda.CUDAGraph) for g in graphs.values())
    assert {k[1] for k in graphs} >= {1, 4}  # the plain step and sd's 1 + 3 tokens
