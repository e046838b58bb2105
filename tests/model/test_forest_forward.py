"""Forest forward and cache surgery equal sequential decoding (tiny models, fp32)."""

from __future__ import annotations

import pytest
import torch

from engine.core.errors import UnsupportedModelError
from engine.core.forest import PAD, ROOT
from engine.execution.cached_model import CachedModel, _select, check_supported
from engine.run.models import model_from_config, tiny_config
from tests.forests import PROMPTS, TREES, path_tokens

FAMILIES = ["llama", "qwen2", "qwen3", "mistral"]


def _model(family):
    return model_from_config(tiny_config(family, vocab_size=50), seed=3)


def _sequential_logits(model, ids):
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0, -1]


@pytest.mark.parametrize("family", FAMILIES)
def test_every_forest_node_scores_like_sequential_decoding_of_its_path(family):
    model = _model(family)
    prompts, trees = PROMPTS, TREES
    cached = CachedModel(model)
    cached.start(torch.tensor(prompts))
    root = cached.feed()
    tok = torch.tensor([t for t, _ in trees])
    par = torch.tensor([p for _, p in trees])
    # feed in two chunks to exercise incremental ancestor bookkeeping
    a = cached.feed(tok[:, :3], par[:, :3])
    b = cached.feed(tok[:, 3:], par[:, 3:])
    assert a.root_logits is None and b.root_logits is None  # only the tail's call has a root
    assert a.node_hidden.shape == (2, 3, model.config.hidden_size)
    nodes = torch.cat([a.node_logits, b.node_logits], dim=1)
    assert root.node_logits.shape[1] == 0 and root.node_hidden.shape[1] == 0
    assert root.root_hidden.shape == (2, model.config.hidden_size)
    for w, (tokens, parents) in enumerate(trees):
        ref = _sequential_logits(model, prompts[w])
        torch.testing.assert_close(root.root_logits[w], ref, atol=1e-4, rtol=0)
        for i, pj in enumerate(parents):
            if pj == PAD:
                continue
            ids = prompts[w] + path_tokens(tokens, parents, i)
            diff = (nodes[w, i] - _sequential_logits(model, ids)).abs().max()
            assert diff <= 1e-4, (family, w, i, float(diff))


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_commit_compacts_cache_to_kept_paths_and_reorders_rows(family):
    model = _model(family)
    prompts = [[5, 7, 9, 11], [3, 4, 8, 2]]
    cached = CachedModel(model)
    cached.start(torch.tensor(prompts))
    cached.feed()
    tok = torch.tensor([[10, 12, 13, 14], [20, 21, 22, 23]])
    par = torch.tensor([[ROOT, ROOT, 1, 2], [ROOT, 0, 1, 2]])
    cached.feed(tok, par)
    # new rows: row 1 twice (path 0->1, then bonus 30), row 0 (path 1->2, bonus 31)
    rows = torch.tensor([1, 1, 0])
    path_nodes = torch.tensor([[0, 1], [0, 1], [1, 2]])
    path_tokens = torch.tensor([[20, 21], [20, 21], [12, 13]])
    new = torch.tensor([[30], [31], [32]])
    cached.commit(rows, path_nodes, path_tokens, new)
    full = [prompts[1] + [20, 21, 30], prompts[1] + [20, 21, 31], prompts[0] + [12, 13, 32]]
    assert cached.base == 6
    # next round: feed tail + a chain of two nodes
    nxt = torch.tensor([[40, 41], [42, 43], [44, 45]])
    scored = cached.feed(nxt, torch.tensor([[ROOT, 0]] * 3))
    for w in range(3):
        torch.testing.assert_close(
            scored.root_logits[w], _sequential_logits(model, full[w]), atol=1e-4, rtol=0)
        for i in range(2):
            ids = full[w] + nxt[w, : i + 1].tolist()
            diff = (scored.node_logits[w, i] - _sequential_logits(model, ids)).abs().max()
            assert diff <= 1e-4


def test_unfed_path_nodes_go_back_to_the_tail():
    model = _model("llama")
    cached = CachedModel(model)
    cached.start(torch.tensor([[5, 6, 7]]))
    cached.feed(torch.tensor([[10]]), torch.tensor([[ROOT]]))
    # node 1 (token 11) was drafted but never fed: commit keeps it via the tail
    cached.commit(torch.tensor([0]), torch.tensor([[0, 1]]), torch.tensor([[10, 11]]),
                  torch.tensor([[12]]))
    assert cached.base == 4 and cached.tail.tolist() == [[11, 12]]
    scored = cached.feed()
    ref = _sequential_logits(model, [5, 6, 7, 10, 11, 12])
    torch.testing.assert_close(scored.root_logits[0], ref, atol=1e-4, rtol=0)


def test_unsupported_architecture_is_refused_with_a_clear_message():
    from transformers import GPT2Config

    model = model_from_config(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=40))
    with pytest.raises(UnsupportedModelError, match="'gpt2' is not supported"):
        check_supported(model)


def _row_counts(model):
    """Record the batch rows of every decoder forward and the positions the LM head sees."""
    seen = {"decoder": [], "head": []}
    model.model.register_forward_pre_hook(
        lambda m, a, kw: seen["decoder"].append(tuple(kw["input_ids"].shape)), with_kwargs=True)
    model.get_output_embeddings().register_forward_hook(
        lambda m, a, out: seen["head"].append(tuple(a[0].shape[:-1])))
    return seen


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_rows_holding_one_prompt_prefill_once_and_score_like_separate_rows(family):
    model = _model(family)
    prompt = [5, 7, 9, 11, 13]
    seen = _row_counts(model)
    cached = CachedModel(model)
    cached.start(torch.tensor([prompt] * 3))
    tok = torch.tensor([[10, 12], [20, 21], [30, 31]])
    par = torch.tensor([[ROOT, 0], [ROOT, 0], [ROOT, ROOT]])
    out = cached.feed(tok, par)
    assert seen["decoder"] == [(1, 5), (3, 2)]  # the prompt once, then the nodes of every row
    ref = _sequential_logits(model, prompt)
    for w in range(3):
        torch.testing.assert_close(out.root_logits[w], ref, atol=1e-4, rtol=0)
    for w, (tokens, parents) in enumerate(zip(tok.tolist(), par.tolist())):
        for i in range(2):
            ids = prompt + path_tokens(tokens, parents, i)
            torch.testing.assert_close(out.node_logits[w, i], _sequential_logits(model, ids),
                                       atol=1e-4, rtol=0)
    # every row owns its cache: commit different paths, then score a token per row
    cached.commit(torch.tensor([2, 0, 1]), torch.tensor([[0], [0], [0]]),
                  torch.tensor([[30], [10], [20]]), torch.tensor([[40], [41], [42]]))
    nxt = cached.feed()
    for w, path in enumerate([[30, 40], [10, 41], [20, 42]]):
        torch.testing.assert_close(nxt.root_logits[w], _sequential_logits(model, prompt + path),
                                   atol=1e-4, rtol=0)


def test_rows_with_different_prompts_prefill_together():
    model = _model("llama")
    seen = _row_counts(model)
    cached = CachedModel(model)
    cached.start(torch.tensor([[5, 7, 9], [5, 7, 8]]))
    cached.feed()
    assert seen["decoder"] == [(2, 3)]


def test_lm_head_runs_only_on_the_newest_tail_token_and_the_nodes():
    model = _model("llama")
    seen = _row_counts(model)
    cached = CachedModel(model)
    cached.start(torch.tensor([[5, 7, 9, 11, 13, 2, 4]]))
    out = cached.feed(torch.tensor([[10, 12]]), torch.tensor([[ROOT, 0]]))
    assert seen["head"] == [(1, 3)]  # not the 6 older prompt tokens
    assert out.node_logits.shape[:2] == (1, 2) and out.root_logits.shape[0] == 1


def test_cache_select_takes_each_new_rows_parent_and_slots_in_one_copy():
    x = torch.randn(3, 2, 7, 4)  # (W, H, S, D)
    rows = torch.tensor([2, 2, 0, 1])  # a duplicated row, a reorder and one row more
    idx = torch.tensor([[0, 1, 5], [0, 1, 6], [0, 1, 2], [0, 1, 4]])  # (W', S')
    out = _select(x, rows, idx)
    assert out.shape == (4, 2, 3, 4)
    for r in range(4):
        for s in range(3):
            assert torch.equal(out[r, :, s], x[rows[r], :, idx[r, s]])
    # a non-contiguous cache view selects the same
    view = torch.randn(3, 2, 9, 4)[:, :, :7]
    assert torch.equal(_select(view, rows, idx), _select(view.contiguous(), rows, idx))


@pytest.mark.parametrize("kept", [[0, 1], [0, 1, 2], [1], [1, 3]])
def test_a_commit_keeps_the_prefix_and_the_kept_slots_whether_they_move_or_not(kept):
    """[0, 1] and [0, 1, 2] of the chain already follow the prefix (the cache is cut there);
    [1] and [1, 3] of the tree move: either way the cache equals a fresh gather of them."""
    model = _model("llama")
    cached = CachedModel(model)
    cached.start(torch.tensor([[5, 6, 7, 8]]))
    chain = kept[0] == 0
    parents = [[ROOT, 0, 1]] if chain else [[ROOT, ROOT, 0, 1]]
    tokens = torch.tensor([[9, 10, 11]]) if chain else torch.tensor([[9, 12, 10, 13]])
    cached.feed(tokens, torch.tensor(parents))
    before = [(layer.keys.clone(), layer.values.clone()) for layer in cached.cache.layers]
    prefix = cached.base + cached.tail_fed
    cached.commit(torch.tensor([0]), torch.tensor([kept]), tokens[:, kept],
                  torch.tensor([[14]]))
    slots = list(range(prefix)) + [prefix + n for n in kept]
    for (keys, values), layer in zip(before, cached.cache.layers):
        assert torch.equal(layer.keys, keys[:, :, slots])
        assert torch.equal(layer.values, values[:, :, slots])
    assert cached.base == prefix + len(kept) and cached.tail.tolist() == [[14]]
    seq = [5, 6, 7, 8] + tokens[0, kept].tolist() + [14]
    torch.testing.assert_close(cached.feed().root_logits[0], _sequential_logits(model, seq),
                               atol=1e-5, rtol=1e-5)


def test_a_second_run_of_one_forest_shape_reuses_the_first_runs_masks():
    # masks and positions depend on the forest's shape alone: every CachedModel of the
    # process shares them, so a later run (another model too) builds none of its shapes
    tok = torch.tensor([[t for t, _ in TREES[0:1]][0]])
    par = torch.tensor([[p for _, p in TREES[0:1]][0]])
    scored = []
    for model in (_model("llama"), _model("qwen2")):
        cached = CachedModel(model)
        cached.start(torch.tensor(PROMPTS[:1]))
        cached.feed()
        built = cached.buffers.built
        scored.append(cached.feed(tok, par))
        if len(scored) == 2:
            assert cached.buffers.built == built  # the first model's run built this shape
    for model, got in zip((_model("llama"), _model("qwen2")), scored):  # and it scores right
        for i, pj in enumerate(TREES[0][1]):
            if pj != PAD:
                ids = PROMPTS[0] + path_tokens(TREES[0][0], TREES[0][1], i)
                assert (got.node_logits[0, i] - _sequential_logits(model, ids)).abs().max() <= 1e-4


@pytest.mark.parametrize("kv", ["dynamic", "static"])
def test_commits_that_fed_nothing_move_no_kv_and_the_next_feed_scores_the_reordered_rows(
        monkeypatch, kv):
    """A drafter in plain rounds: commits with no feed record their row reorders (composed,
    widths changing) and leave the cache alone; the next feed sees each row's own sequence."""
    monkeypatch.setenv("SPECVIZ_KV", kv)
    model = _model("llama")
    seqs = [[5, 7, 9, 11], [3, 4, 8, 2], [6, 1, 1, 9]]
    cached = CachedModel(model)
    cached.start(torch.tensor(seqs))
    cached.feed()
    cached.commit(torch.arange(3), torch.zeros((3, 0), dtype=torch.long),
                  torch.zeros((3, 0), dtype=torch.long), torch.tensor([[12], [13], [14]]))
    seqs = [s + [t] for s, t in zip(seqs, [12, 13, 14])]
    before = [layer.keys.clone() for layer in cached.cache.layers]
    for rows, new in (([2, 0, 0, 1], [[15], [16], [17], [18]]), ([3, 0], [[19], [20]]),
                      ([1, 1, 0], [[21], [22], [23]])):
        cached.commit(torch.tensor(rows), torch.zeros((len(rows), 0), dtype=torch.long),
                      torch.zeros((len(rows), 0), dtype=torch.long), torch.tensor(new))
        seqs = [seqs[r] + t for r, t in zip(rows, new)]
        assert all(torch.equal(layer.keys, b) for layer, b in zip(cached.cache.layers, before))
    assert cached.base == 4 and cached.tail.tolist() == [s[4:] for s in seqs]
    root = cached.feed().root_logits  # (3, V)
    for w, ids in enumerate(seqs):
        torch.testing.assert_close(root[w], _sequential_logits(model, ids), atol=1e-5, rtol=1e-5)
