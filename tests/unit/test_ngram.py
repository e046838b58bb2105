"""The n-gram (prompt lookup) drafter: its draft law on literal contexts, and its runner's
bookkeeping of trees and beams across rounds."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.core.errors import ConfigError
from engine.core.forest import PAD, ROOT
from engine.drafters.ngram import RECENCY, NGramDrafter, ngram_law, ngram_law_numpy, support
from engine.kernels import ngram as kernel
from engine.run.specs import parse_model_spec


def law(ctx, read=ngram_law, **kw):
    tokens, probs = read(np.array(ctx), **kw)
    return dict(zip(tokens.tolist(), probs.tolist()))


def test_the_longest_recurring_suffix_decides_the_law():
    # suffix (5, 6) occurred twice, followed by 7 then 8; suffix (9, 5, 6) never did
    got = law([5, 6, 7, 9, 1, 5, 6, 8, 2, 9, 5, 6])
    assert set(got) == {7, 8}
    # "1 5 6" is longer and was followed by 8 only
    assert law([5, 6, 7, 1, 5, 6, 8, 2, 1, 5, 6]) == {8: 1.0}


def test_followers_weigh_by_count_then_recency():
    got = law([1, 2, 1, 3, 1, 2, 1], max_n=1, min_n=1)  # after 1: 2, 3, 2
    assert got[2] == pytest.approx(2 / 3, abs=1e-3) and got[3] == pytest.approx(1 / 3, abs=1e-3)
    tie = law([1, 2, 1, 3, 1], max_n=1, min_n=1)  # 2 (at 0) and 3 (at 2): 3 is more recent
    assert tie[3] > tie[2]
    assert tie[3] - tie[2] == pytest.approx(RECENCY * 2 / 5 / (2 + RECENCY * 4 / 5), rel=1e-6)


def test_no_recurring_suffix_proposes_nothing():
    assert law([1, 2, 3, 4]) == {}
    assert law([7], min_n=1) == {}
    assert law([], min_n=1) == {}
    assert law([1, 2, 9, 1], min_n=2) == {}  # only a unigram recurs
    assert law([1, 2, 9, 1], min_n=1) == {2: 1.0}


def test_the_suffix_itself_is_never_its_own_match():
    assert law([4, 4], min_n=1) == {4: 1.0}  # the first 4 is followed by 4
    assert law([3, 4], min_n=1) == {}


def _law_by_definition(ctx: np.ndarray, max_n: int, min_n: int):
    """The law read off the definition: every window of the context before its last token
    compared with the suffix, longest n first."""
    L = len(ctx)
    for n in range(min(max_n, L - 1), min_n - 1, -1):
        starts = [i for i in range(L - n) if list(ctx[i:i + n]) == list(ctx[L - n:])]
        if starts:
            weight: dict[int, float] = {}
            for i in starts:
                weight[int(ctx[i + n])] = weight.get(int(ctx[i + n]), 0.0) + 1.0
            for tok in weight:
                weight[tok] += RECENCY * max(i + 1 for i in starts if ctx[i + n] == tok) / L
            total = sum(weight.values())
            return {t: w / total for t, w in weight.items()}
    return {}


@pytest.mark.parametrize("read", [ngram_law, ngram_law_numpy], ids=["kernel", "numpy"])
def test_the_law_equals_its_definition_on_random_contexts(read):
    rng = np.random.default_rng(0)
    for _ in range(3000):
        ctx = rng.integers(0, int(rng.integers(1, 5)), int(rng.integers(0, 40)))
        for max_n, min_n in ((4, 2), (4, 1), (3, 3), (1, 1), (6, 2)):
            got = law(ctx, read, max_n=max_n, min_n=min_n)
            want = _law_by_definition(ctx, max_n, min_n)
            assert got.keys() == want.keys()
            assert all(got[t] == pytest.approx(want[t], rel=1e-12) for t in want)


def test_the_kernels_law_is_numpys_bit_for_bit():
    """ngram.c (built here: a C compiler is part of the set-up) gives the numpy version's
    followers and the same float64 probabilities, on short random contexts, long repetitive
    ones, and ones whose distinct followers number 9 to 300 (numpy's pairwise sum past 8
    and past 128 terms)."""
    assert kernel.library() is not None
    rng = np.random.default_rng(1)
    contexts = [rng.integers(0, int(rng.integers(1, 12)), int(rng.integers(0, 80)))
                for _ in range(4000)]
    contexts += [rng.integers(0, v, n) for v, n in ((3, 600), (2, 1500), (40, 2000), (1, 700))]
    for k in (9, 100, 129, 300):  # 0 f1 0 f2 ... 0 fk 0: k distinct followers of 0
        contexts.append(np.array([t for f in range(1, k + 1) for t in (0, f)] + [0]))
    assert len(kernel.law(contexts[-1], 1, 1, RECENCY)[0]) == 300
    for ctx in contexts:
        ctx = ctx.astype(np.int64)
        for max_n, min_n in ((4, 2), (3, 1), (6, 3), (1, 1)):
            got = kernel.law(ctx, max_n, min_n, RECENCY)
            want = ngram_law_numpy(ctx, max_n, min_n)
            assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1]), (
                ctx.tolist(), max_n, min_n)


def test_support_counts_the_logits_above_the_dtype_minimum():
    low = torch.finfo(torch.float32).min
    assert support(torch.tensor([0.0, low, -3.0])) == 2
    assert support(torch.full((5,), low)) == 0
    assert support(torch.randn(7)) == 7


def test_runner_scores_roots_and_tree_nodes_from_their_own_paths():
    r = NGramDrafter(vocab_size=10, min_n=1).runner()
    r.start(torch.tensor([[1, 2, 3, 1, 2, 4, 1], [5, 6, 5, 6, 5, 6, 5]]))
    root = r.feed()
    assert root.root_logits.shape == (2, 10) and root.node_hidden.shape == (2, 0, 0)
    p0 = root.root_logits[0].softmax(-1)  # after "... 4 1": suffix "4 1" never recurred,
    assert set(torch.nonzero(p0 > 0).flatten().tolist()) == {2}  # "1" was followed by 2, 2
    assert torch.equal(torch.nonzero(root.root_logits[1].softmax(-1) > 0).flatten(),
                       torch.tensor([6]))
    # row 0: two children of the root (2, 9); row 1: a child 6 and a PAD
    fed = r.feed(torch.tensor([[2, 9], [6, 0]]), torch.tensor([[ROOT, ROOT], [ROOT, PAD]]))
    assert fed.node_logits.shape == (2, 2, 10)
    q = fed.node_logits[0, 0].softmax(-1)  # "1 2" was followed by 3, then by 4 (more recent)
    assert torch.nonzero(q > 0).flatten().tolist() == [3, 4] and q[4] > q[3]
    assert support(fed.node_logits[0, 1]) == 0  # "... 1 9": nothing recurs after 9
    assert torch.nonzero(fed.node_logits[1, 0].softmax(-1) > 0).flatten().tolist() == [5]
    assert support(fed.node_logits[1, 1]) == 0  # PAD
    deeper = r.feed(torch.tensor([[3], [5]]), torch.tensor([[0], [0]]))  # 1 2 | 3 ; 6 | 5
    assert torch.nonzero(deeper.node_logits[0, 0].softmax(-1) > 0).flatten().tolist() == [1]
    assert deeper.root_logits is None


def test_runner_laws_say_where_its_logits_propose_without_reading_them():
    r = NGramDrafter(vocab_size=10, min_n=1).runner()
    r.start(torch.tensor([[1, 2, 3, 1, 2, 4, 1], [5, 6, 5, 6, 5, 6, 7]]))
    root = r.feed()
    assert r.laws.root.tolist() == [support(x) > 0 for x in root.root_logits] == [True, False]
    assert r.laws.nodes.shape == (2, 0)
    fed = r.feed(torch.tensor([[2, 9], [6, 0]]), torch.tensor([[ROOT, ROOT], [ROOT, PAD]]))
    want = [[support(x) > 0 for x in row] for row in fed.node_logits]
    assert r.laws.nodes.tolist() == want == [[True, False], [True, False]]  # PAD: none
    deeper = r.feed(torch.tensor([[3], [5]]), torch.tensor([[0], [0]]))
    assert deeper.root_logits is None and r.laws.root is None  # nodes fed before: no root
    assert r.laws.nodes.tolist() == [[support(deeper.node_logits[0, 0]) > 0],
                                     [support(deeper.node_logits[1, 0]) > 0]]


def test_runner_commit_reorders_rows_and_appends_the_kept_tokens():
    r = NGramDrafter(vocab_size=10).runner()
    r.start(torch.tensor([[1, 2], [3, 4]]))
    r.feed()
    r.commit(torch.tensor([1, 1, 0]), torch.tensor([[0], [0], [0]]), torch.tensor([[5], [5], [6]]),
             torch.tensor([[7], [8], [9]]))
    assert r.rows == [[3, 4, 5, 7], [3, 4, 5, 8], [1, 2, 6, 9]]
    assert r.width == 3
    assert r.feed().root_logits.shape == (3, 10)  # a new round scores the roots again


def test_root_has_is_the_root_laws_support_as_rows_grow_reorder_and_fork():
    """root_has (read from each row's index of recurring n-grams, kept across commits) says
    exactly where the law after the committed tokens proposes something (ngram_law's answer
    on the row), over random rounds of growing rows, reorders and forks of one row into
    several, with short rows (no suffix long enough yet) and min_n 1 to 3; the round's first
    feed reports the same roots (laws.root)."""
    rng = np.random.default_rng(7)
    checked = 0
    for max_n, min_n in ((4, 2), (4, 1), (3, 3), (2, 2)):
        for _ in range(40):
            vocab = int(rng.integers(2, 6))
            width = int(rng.integers(1, 4))
            r = NGramDrafter(vocab_size=vocab, max_n=max_n, min_n=min_n).runner()
            r.start(torch.from_numpy(rng.integers(0, vocab, (width, int(rng.integers(0, 4))))))
            for _ in range(12):
                want = [bool(ngram_law(np.array(row, dtype=np.int64), max_n, min_n)[0].size)
                        for row in r.rows]
                assert r.root_has() == want, (r.rows, max_n, min_n)
                r.feed()
                assert r.laws.root.tolist() == want
                checked += sum(want)
                new_width = int(rng.integers(1, 4))
                rows = torch.from_numpy(rng.integers(0, r.width, new_width))  # forks, drops
                k = int(rng.integers(0, 3))
                r.commit(rows, torch.zeros((new_width, k), dtype=torch.long),
                         torch.from_numpy(rng.integers(0, vocab, (new_width, k))),
                         torch.from_numpy(rng.integers(0, vocab, (new_width, 1))))
    assert checked > 500  # most rounds had a recurring suffix somewhere: both answers seen


def test_start_indexes_the_prompt_so_a_rounds_read_adds_only_its_new_tokens():
    """The runner's start reads the prompt into each row's index (so a timed lookup, such as
    HybridDrafter.lookup_call_s, and a run's first round pay no pass over the prompt); a
    round's read then adds the n-grams its commit brought and answers for the new root."""
    r = NGramDrafter(vocab_size=10).runner()
    r.start(torch.tensor([[1, 2, 3, 1, 2, 4, 1, 2]]))
    g = r.grams[0]
    assert g.upto == 7 and g.seen == {(1, 2), (2, 3), (3, 1), (2, 4), (4, 1)}  # ends 1..6
    assert r.root_has() == [True]  # "1 2" ended at 1 and 4
    empty = torch.zeros((1, 0), dtype=torch.long)
    r.commit(torch.tensor([0]), empty, empty, torch.tensor([[5]]))
    assert r.root_has() == [False] and g.upto == 8 and (1, 2) in g.seen  # "2 5" is new
    assert r.grams[0] is g  # one row grows in place: its index goes on


def test_ngram_specs_parse_for_drafts_only():
    assert parse_model_spec("ngram", draft=True).kind == "ngram"
    spec = parse_model_spec("prompt-lookup:3", draft=True)
    assert (spec.kind, spec.layers) == ("ngram", 3)
    with pytest.raises(ConfigError, match="not a target"):
        parse_model_spec("ngram")
    with pytest.raises(ConfigError, match="n-gram length"):
        parse_model_spec("ngram:x", draft=True)
    with pytest.raises(ConfigError):
        NGramDrafter(10, max_n=1, min_n=2)


def test_ngram_logits_land_on_the_drafter_device():
    import torch

    from engine.drafters.ngram import NGramDrafter

    runner = NGramDrafter(16, device="meta").runner()  # any device but the CPU
    runner.start(torch.tensor([[1, 2, 3, 1, 2]]))
    out = runner.feed(torch.tensor([[3]]), torch.tensor([[-1]]))
    assert out.root_logits.device.type == "meta" and out.node_logits.device.type == "meta"
