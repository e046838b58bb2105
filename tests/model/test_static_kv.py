"""The static KV path (preallocated buffers, in-place commits) and the fixed-shape steps of the
captured path (run eagerly from their static inputs on a CPU: ``padded``) give the dynamic
path's results: forest scores like sequential decoding, greedy and beam runs identical to
generate(), sampled runs identical to the dynamic path's under the same seed."""

from __future__ import annotations

import pytest
import torch

import engine
from engine.contract.trace import RunTrace
from engine.core.errors import ConfigError
from engine.core.forest import PAD, ROOT
from engine.execution import static_kv
from engine.execution.cached_model import CachedModel
from engine.run.api import make_decoder
from engine.run.models import model_from_config, tiny_config
from tests.conftest import tiny_pair
from tests.forests import PROMPTS, TREES, path_tokens
from tests.model import test_beam_methods as beams

PATHS = {"static": "static", "captured": "padded"}  # SPECVIZ_KV -> the path a CPU serves


@pytest.fixture(params=list(PATHS))
def kv(request, monkeypatch):
    monkeypatch.setenv("SPECVIZ_KV", request.param)
    return request.param


def _sequential(model, ids):
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0, -1]  # (V,)


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "mistral"])
def test_forest_nodes_score_like_sequential_decoding_on_the_static_paths(kv, family):
    model = model_from_config(tiny_config(family, vocab_size=50), seed=3)
    prompts, trees = PROMPTS, TREES
    cached = CachedModel(model)
    cached.start(torch.tensor(prompts))
    root = cached.feed()
    tok, par = torch.tensor([t for t, _ in trees]), torch.tensor([p for _, p in trees])
    a, b = cached.feed(tok[:, :3], par[:, :3]), cached.feed(tok[:, 3:], par[:, 3:])
    nodes = torch.cat([a.node_logits, b.node_logits], dim=1)
    for w, (tokens, parents) in enumerate(trees):
        torch.testing.assert_close(root.root_logits[w], _sequential(model, prompts[w]),
                                   atol=1e-4, rtol=0)
        for i, pj in enumerate(parents):
            if pj != PAD:
                ref = _sequential(model, prompts[w] + path_tokens(tokens, parents, i))
                torch.testing.assert_close(nodes[w, i], ref, atol=1e-4, rtol=0)
    assert cached.take_served() == [PATHS[kv]] * 3


def test_a_commit_that_reorders_and_duplicates_rows_keeps_each_parents_prefix_and_path(kv):
    model = model_from_config(tiny_config("llama", vocab_size=50), seed=4)
    prompts = [[5, 7, 9], [3, 4, 8]]
    cached = CachedModel(model)
    cached.start(torch.tensor(prompts))
    cached.feed(torch.tensor([[10, 11], [20, 21]]), torch.tensor([[ROOT, 0], [ROOT, 0]]))
    rows = torch.tensor([1, 1])  # both new rows descend from row 1
    cached.commit(rows, torch.tensor([[0, 1], [0, 1]]), torch.tensor([[20, 21], [20, 21]]),
                  torch.tensor([[30], [31]]))
    out = cached.feed()
    for r, last in enumerate((30, 31)):
        ref = _sequential(model, prompts[1] + [20, 21, last])
        torch.testing.assert_close(out.root_logits[r], ref, atol=1e-4, rtol=0)


def test_a_chains_accepted_drafts_stay_where_they_are_and_a_trees_move(kv, monkeypatch):
    model = model_from_config(tiny_config("llama", vocab_size=50), seed=4)
    prompt = [5, 7, 9]
    cached = CachedModel(model)
    cached.start(torch.tensor([prompt]))
    gathers = []
    real = torch.Tensor.gather
    monkeypatch.setattr(torch.Tensor, "gather",
                        lambda self, *a, **k: gathers.append(1) or real(self, *a, **k))
    cached.feed(torch.tensor([[10, 11]]), torch.tensor([[ROOT, 0]]))  # a chain, both kept
    cached.commit(torch.tensor([0]), torch.tensor([[0, 1]]), torch.tensor([[10, 11]]),
                  torch.tensor([[12]]))
    assert gathers == []  # slots prefix, prefix + 1: nothing to move
    cached.feed(torch.tensor([[20, 21]]), torch.tensor([[ROOT, ROOT]]))  # two siblings, the
    cached.commit(torch.tensor([0]), torch.tensor([[1]]), torch.tensor([[21]]),  # second
                  torch.tensor([[22]]))  # kept: it moves down one slot
    assert gathers
    out = cached.feed()
    ref = _sequential(model, prompt + [10, 11, 12, 21, 22])
    torch.testing.assert_close(out.root_logits[0], ref, atol=1e-4, rtol=0)


@pytest.mark.parametrize("mode", ["dynamic", "static", "captured"])
def test_a_plain_rounds_commit_keeps_the_fed_tail_and_the_new_token_waits(monkeypatch, mode):
    """One row, nothing drafted (CachedModel.commit's plain-round path): the fed tail joins
    the cached prefix, the round's token is the next tail, and the rounds after it (plain,
    then a chain) score as sequential decoding."""
    monkeypatch.setenv("SPECVIZ_KV", mode)
    model = model_from_config(tiny_config("llama", vocab_size=50), seed=4)
    prompt = [5, 7, 9]
    cached = CachedModel(model)
    cached.start(torch.tensor([prompt]))
    empty = torch.zeros((1, 0), dtype=torch.long)
    seq = list(prompt)
    for tok in (12, 13):
        out = cached.feed()
        torch.testing.assert_close(out.root_logits[0], _sequential(model, seq), atol=1e-4, rtol=0)
        cached.commit(torch.tensor([0]), empty, empty, torch.tensor([[tok]]))
        assert cached.base == len(seq) and cached.tail.tolist() == [[tok]]
        seq.append(tok)
    cached.feed(torch.tensor([[20, 21]]), torch.tensor([[ROOT, 0]]))  # a chain, one kept
    cached.commit(torch.tensor([0]), torch.tensor([[0]]), torch.tensor([[20]]),
                  torch.tensor([[22]]))
    out = cached.feed()
    ref = _sequential(model, seq + [20, 22])
    torch.testing.assert_close(out.root_logits[0], ref, atol=1e-4, rtol=0)


def test_beam_rows_sharing_their_prompt_move_only_what_follows_it(kv, monkeypatch):
    """Rows started on one prompt (its prefill copied to every row) hold the same prompt
    slots, so a reorder moves the slots after it only; a reorder into more rows than shared
    it moves whole rows and the new rows share it from then on. Every row then scores as
    sequential decoding of its parent's tokens."""
    model = model_from_config(tiny_config("llama", vocab_size=50), seed=4)
    prompt = [5, 7, 9, 11]
    cached = CachedModel(model)
    cached.start(torch.tensor([prompt, prompt]))
    moved = []
    real = static_kv.gather
    monkeypatch.setattr(static_kv, "gather",
                        lambda *a, **k: moved.append(k.get("same", 0)) or real(*a, **k))
    seqs = [list(prompt), list(prompt)]
    empty = torch.zeros((2, 0), dtype=torch.long)
    cached.feed()
    cached.commit(torch.tensor([0, 0]), empty, empty, torch.tensor([[20], [21]]))
    seqs = [seqs[0] + [20], seqs[0] + [21]]
    for rows, new in (([1, 0, 1], [30, 31, 32]), ([2, 2, 0], [40, 41, 42]),
                      ([1, 0, 2], [45, 46, 47])):
        out = cached.feed()
        for r, seq in enumerate(seqs):
            torch.testing.assert_close(out.root_logits[r], _sequential(model, seq), atol=1e-4,
                                       rtol=0)
        W2 = len(rows)
        cached.commit(torch.tensor(rows), torch.zeros((W2, 0), dtype=torch.long),
                      torch.zeros((W2, 0), dtype=torch.long), torch.tensor([[t] for t in new]))
        seqs = [seqs[p] + [t] for p, t in zip(rows, new)]
    out = cached.feed()
    for r, seq in enumerate(seqs):
        torch.testing.assert_close(out.root_logits[r], _sequential(model, seq), atol=1e-4, rtol=0)
    assert moved == [len(prompt), 0, len(prompt), len(prompt)]


TOKEN_METHODS = [("greedy", {}), ("sd", {"gamma": 3}), ("sd", {"controller": "beta_ts"}),
                 ("mcsd", {"k_config": "4x2x2"}), ("greedy_drafts", {"k_config": "3x2x2"})]


@pytest.mark.parametrize("method,params", TOKEN_METHODS)
@pytest.mark.parametrize("draft", [None, "feature", "ngram+feature"])
def test_greedy_token_methods_equal_generate_on_the_static_paths(kv, method, params, draft):
    pair = tiny_pair(draft=draft)
    for prompt in ([3, 4, 5, 6, 3, 4, 5], [11, 12]):
        trace = engine.generate(pair, prompt, method, max_new_tokens=20, **params)
        ref = pair.target.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=20)
        assert list(trace.token_ids) == ref[0, len(prompt):].tolist(), (method, prompt)
        assert trace.stats.step_paths.get(f"target:{PATHS[kv]}", 0) == len(trace.rounds)


@pytest.mark.parametrize("draft", ["same", "ngram+feature"])
def test_beam_methods_equal_generate_num_beams_on_the_static_paths(kv, draft):
    target = beams.tiny(0)
    pair = beams.pair_of(target, target if draft == "same" else draft)
    beams.set_generation(target)
    for s in range(2):
        ids = beams.prompt(s)
        hf = beams.hf_beams(target, ids, 3, 10)
        for method, kw in (("beam", {}), ("atspeed_strict", {"draft_beams": 6, "gamma": 3})):
            trace = engine.generate(pair, ids, method, beams=3, max_new_tokens=10, **kw)
            beams.assert_same_beams(trace, hf, None)


@pytest.mark.parametrize("method,params", [("sample", {}), ("sd", {"gamma": 3}),
                                           ("mcsd", {"k_config": "2x2"}),
                                           ("dsbd", {"draft_beams": 2})])
def test_sampled_runs_draw_the_dynamic_paths_tokens_under_the_same_seed(monkeypatch, method,
                                                                        params):
    """Same logits up to float rounding, so the same draws: each sampling law is the dynamic
    path's (which the chi-square and enumeration tests check)."""
    pair = tiny_pair()
    runs = {}
    for mode in ("dynamic", "static", "captured"):
        monkeypatch.setenv("SPECVIZ_KV", mode)
        runs[mode] = [engine.generate(pair, [3, 4, 5], method, temperature=1.0, seed=s,
                                      max_new_tokens=12, **params).token_ids for s in range(6)]
    assert runs["static"] == runs["dynamic"] and runs["captured"] == runs["dynamic"]


def test_buffers_are_pooled_across_runs_and_a_model_drafting_for_itself_holds_two(kv):
    target = model_from_config(tiny_config("llama", vocab_size=64, layers=2), seed=5)
    pair = engine.load_pair(target=target, draft=target, device="cpu")
    dec, _, _ = make_decoder(pair, [3, 4, 5], "sd", gamma=2, max_new_tokens=8)
    rounds = dec.rounds()
    next(rounds), next(rounds)  # the target and the drafter have fed
    ctx = dec.ctx
    draft = ctx.draft_if_started
    assert ctx.target.kv is not draft.kv and ctx.target.kv.busy and draft.kv.busy
    held = (ctx.target.kv, draft.kv)
    list(rounds)  # the run ends: both sets go back to the pool
    assert not any(s.busy for s in held)
    engine.generate(pair, [6, 7], "sd", gamma=2, max_new_tokens=8)  # (+ the cost model's
    sets = static_kv.pool_sets(target)  # calibration runner, alive beside the run's two)
    engine.generate(pair, [8, 9], "sd", gamma=2, max_new_tokens=8)
    assert static_kv.pool_sets(target) == sets and not any(s.busy for s in sets)  # reused


def test_a_larger_free_set_supersedes_the_smaller_ones_of_its_rows(kv):
    model = model_from_config(tiny_config("llama", vocab_size=64, layers=2), seed=5)
    small = static_kv.lease(model, 1, 10, owner := CachedModel(model))
    static_kv.release(small)
    big = static_kv.lease(model, 1, 3000, owner)
    assert static_kv.pool_sets(model) == [big] and big.slots == 4096


def test_two_threads_never_lease_one_kv_set(monkeypatch):
    """The app's warm-up thread leases buffers beside the model thread (and may pause inside
    a lease while a Run goes on): a set one thread has picked is never handed to another."""
    import threading

    model = model_from_config(tiny_config("llama", vocab_size=64, layers=2), seed=5)
    owner = CachedModel(model)
    static_kv.release(static_kv.lease(model, 1, 10, owner))  # one free set in the pool
    picking, go = threading.Event(), threading.Event()
    warm = threading.Thread(name="warm-up")

    def slow_min(*args, **kw):  # the warm-up thread pauses after finding the free set
        if threading.current_thread() is warm:
            picking.set()
            go.wait(10)
        return min(*args, **kw)

    monkeypatch.setattr(static_kv, "min", slow_min, raising=False)
    got = {}
    warm.run = lambda: got.setdefault("warm", static_kv.lease(model, 1, 10, owner))
    warm.start()
    assert picking.wait(10)
    threading.Timer(0.3, go.set).start()  # the paused thread goes on a moment later
    mine = static_kv.lease(model, 1, 10, owner)  # meanwhile: the model thread's lease
    warm.join(10)
    assert got["warm"] is not mine and got["warm"].busy and mine.busy


def test_a_shape_that_fails_to_capture_runs_eager_and_says_why(monkeypatch, caplog):
    monkeypatch.setenv("SPECVIZ_KV", "captured")

    def refuse(*args, **kwargs):
        raise RuntimeError("operation not permitted when stream is capturing")
    monkeypatch.setattr(static_kv, "_EagerReplay", refuse)
    pair = tiny_pair()
    prompt = [3, 4, 5, 6]
    trace = engine.generate(pair, prompt, "sd", gamma=3, max_new_tokens=12)
    ref = pair.target.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=12)
    assert list(trace.token_ids) == ref[0, len(prompt):].tolist()
    assert trace.stats.step_paths.get("target:static", 0) == len(trace.rounds)
    failed = {k: v for s in static_kv.pool_sets(pair.target) for k, v in s.failed.items()}
    assert failed and all(v.startswith("RuntimeError: operation not permitted") for v in
                          failed.values())
    assert "runs eager" in caplog.text


def test_a_run_longer_than_its_buffer_moves_to_a_larger_one(kv, monkeypatch):
    monkeypatch.setattr(static_kv, "MIN_SLOTS", 16)
    monkeypatch.setattr(static_kv, "SPARE_SLOTS", 4)
    monkeypatch.setattr("engine.execution.cached_model.RESERVE", 0)
    pair = tiny_pair(draft="early-exit")
    prompt = [3, 4, 5, 6]
    trace = engine.generate(pair, prompt, "sd", gamma=3, max_new_tokens=40)
    ref = pair.target.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=40)
    assert list(trace.token_ids) == ref[0, len(prompt):].tolist()
    assert max(s.slots for s in static_kv.pool_sets(pair.target)) >= 44


def test_every_round_records_the_path_of_each_forward_and_the_trace_round_trips(kv):
    trace = engine.generate(tiny_pair(), [3, 4, 5], "sd", gamma=2, max_new_tokens=8)
    assert all(r.step_paths[0] == f"target:{PATHS[kv]}" for r in trace.rounds)
    assert any(p.startswith("draft:") for r in trace.rounds for p in r.step_paths)
    back = RunTrace.from_json(trace.to_json())
    assert back.rounds[1].step_paths == trace.rounds[1].step_paths
    old = trace.to_dict()
    for r in old["rounds"]:
        del r["step_paths"]  # a trace written before the field existed
    assert RunTrace.from_dict(old).rounds[0].step_paths == ()


def test_the_dynamic_path_is_the_cpu_default_and_a_bad_path_is_one_clear_error(monkeypatch):
    monkeypatch.delenv("SPECVIZ_KV", raising=False)
    assert static_kv.kv_mode(torch.device("cpu")) == "dynamic"
    assert static_kv.kv_mode(torch.device("cuda")) == "captured"
    monkeypatch.setenv("SPECVIZ_KV", "fast")
    with pytest.raises(ConfigError, match="SPECVIZ_KV='fast': expected one of"):
        static_kv.kv_mode(torch.device("cpu"))


def test_buckets_and_buffer_sizes():
    assert [static_kv.bucket(q) for q in (1, 2, 3, 5, 17, 64, 65)] == [1, 2, 4, 8, 32, 64, None]
    assert static_kv.slots_for(10) == static_kv.MIN_SLOTS
    assert static_kv.slots_for(2000) == 4096


def test_dsbd_output_law_equals_beam_sampling_on_the_padded_path(monkeypatch):
    """Two copies of one beam scored at different columns of a padded step differ by float
    rounding; DSBD reads one law per sequence, so a top-k warp over the tied copies breaks
    the tie as beam sampling does (exact enumeration, K = W_S = 2)."""
    monkeypatch.setenv("SPECVIZ_KV", "captured")
    pair = beams.law_pair()
    ref, _ = beams.engine_law(pair, "beam_sample", beams=2)
    law, outcomes = beams.engine_law(pair, "dsbd", draft_beams=2, min_width=2, gamma=1)
    assert outcomes["accepted"] > 0.1 and outcomes["corrected"] > 0.1
    assert beams.gap(law, ref) < 1e-5, beams.gap(law, ref)


def test_equal_beams_read_one_law_when_their_sequences_are_given():
    from engine.methods.beam_forest import target_logprobs

    p_root = torch.tensor([[0.0, 1.0, 2.0]])  # (W, V)
    p_nodes = torch.tensor([[[1.0, 1.0, 1.0], [1.0, 1.0, 1.0 + 1e-6]]])  # (W, 2, V)
    pos = [(0, 0), (0, 1), (0, ROOT)]
    loose = target_logprobs(p_root, p_nodes, pos)
    assert not torch.equal(loose[0], loose[1])
    tied = target_logprobs(p_root, p_nodes, pos, [(5, 6), (5, 6), (5,)])
    assert torch.equal(tied[0], tied[1]) and torch.equal(tied[2], loose[2])


def test_a_model_placed_by_a_device_map_keeps_the_dynamic_path(monkeypatch):
    """accelerate's hooks move weights at every forward: no fixed-address step."""
    from accelerate.hooks import ModelHook, add_hook_to_module

    monkeypatch.setenv("SPECVIZ_KV", "captured")
    model = model_from_config(tiny_config("llama", vocab_size=50), seed=3)
    assert CachedModel(model).mode == "captured"
    add_hook_to_module(model.model.layers[0], ModelHook())
    assert CachedModel(model).mode == "dynamic"


def test_loading_a_pair_on_the_captured_path_captures_the_common_step_shapes(monkeypatch):
    monkeypatch.setenv("SPECVIZ_KV", "captured")
    target = model_from_config(tiny_config("llama", vocab_size=64, layers=4), seed=7)
    pair = engine.load_pair(target=target, draft="early-exit:2", device="cpu")
    for model in (target, pair.drafter.model):
        shapes = {k for s in static_kv.pool_sets(model) for k in s.graphs}
        assert {(1, b, "input_ids") for b in (1, 2, 4, 8, 16)} <= shapes
    trace = engine.generate(pair, [3, 4, 5], "sd", gamma=3, max_new_tokens=12)
    ref = target.generate(torch.tensor([[3, 4, 5]]), do_sample=False, max_new_tokens=12)
    assert list(trace.token_ids) == ref[0, 3:].tolist()


@pytest.mark.parametrize("method", ["sd", "mcsd"])
def test_the_cost_switchs_calibration_leaves_the_pooled_steps_usable_by_later_runs(kv, method):
    """The cost switch measures the target's verify forwards (engine.run.profile) on this
    path's pooled buffers and steps; the runs after it (and the calibration's own decode)
    write into those buffers in place, so they must not be inference tensors. Each run keeps
    generate()'s tokens and the switch plans from the measured profile."""
    pair = tiny_pair(draft="ngram+feature")
    prompt = [3, 4, 5, 6, 3, 4, 5]
    ref = pair.target.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=12)
    for _ in range(2):
        trace = engine.generate(pair, prompt, method, max_new_tokens=12, switch="cost")
        assert list(trace.token_ids) == ref[0, len(prompt):].tolist()
        assert any(r.switch is not None for r in trace.rounds)
    plain = engine.generate(pair, prompt, method, max_new_tokens=12)
    assert list(plain.token_ids) == list(trace.token_ids)


@pytest.mark.parametrize("how", ["generate", "cancel"])
def test_a_finished_or_cancelled_run_gives_its_buffers_back_at_once(kv, how):
    """The round loop's KV sets go back to the pool when its Run ends, not when the cyclic
    collector frees the runners: a run started right after leases the same set (with its
    compiled or captured steps) instead of a fresh one."""
    import gc

    pair = tiny_pair(draft="feature")
    gc.disable()  # nothing collected behind the test's back
    try:
        for _ in range(2):
            if how == "generate":
                engine.generate(pair, [3, 4, 5, 6], "sd", max_new_tokens=12, gamma=2)
            else:
                run = engine.start(pair, [3, 4, 5, 6], "sd", max_new_tokens=12, gamma=2)
                next(run)
                run.cancel()
            sets = static_kv.pool_sets(pair.target)
            assert len(sets) == 1 and not sets[0].busy
    finally:
        gc.enable()
