from __future__ import annotations

import torch

from engine.core.forest import (
    PAD,
    ROOT,
    TreeBuffers,
    ancestors,
    attention_inputs,
    children,
    depths,
    path_to,
)


def test_depths_paths_and_children_follow_parent_pointers():
    par = torch.tensor([[ROOT, ROOT, 0, 2, PAD]])
    assert depths(par)[0].tolist() == [1, 1, 2, 3, 0]
    assert path_to(par, 0, 3) == [0, 2, 3]
    assert children(par, 0, ROOT) == [0, 1]
    assert children(par, 0, 0) == [2]


def test_depths_count_the_ancestors_in_any_node_order():
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):  # random forests, parents first, then shuffled, PAD nodes mixed in
        m = int(torch.randint(1, 12, (), generator=gen))
        par = [ROOT if i == 0 or torch.rand((), generator=gen) < 0.3
               else int(torch.randint(0, i, (), generator=gen)) for i in range(m)]
        order = torch.randperm(m, generator=gen).tolist()
        where = {old: new for new, old in enumerate(order)}
        shuffled = [par[o] if par[o] < 0 else where[par[o]] for o in order]
        for rows in ([par], [shuffled], [par + [PAD], shuffled + [ROOT]]):
            t = torch.tensor(rows)
            want = torch.where(t == PAD, 0, ancestors(t).sum(-1))
            assert torch.equal(depths(t), want)
    below_pad = torch.tensor([[PAD, 0, ROOT, 2]])  # a child of a PAD node (no method makes
    # one) gets the closure's count, which counts the PAD parent
    assert depths(below_pad)[0].tolist() == [0, 2, 1, 2]


def test_ancestors_include_the_node_itself_and_stop_at_the_root():
    par = torch.tensor([[ROOT, ROOT, 0, 2, PAD]])
    assert ancestors(par)[0].int().tolist() == [
        [1, 0, 0, 0, 0],
        [0, 1, 0, 0, 0],
        [1, 0, 1, 0, 0],
        [1, 0, 1, 1, 0],
        [0, 0, 0, 0, 1],
    ]


def _inputs(**kw):
    """(visibility (W, q, kv) as 0/1 lists, position ids as lists); checks the mask values."""
    mask, pos = attention_inputs(dtype=torch.float32, **kw)
    low = torch.finfo(torch.float32).min
    assert bool(((mask == 0) | (mask == low)).all())
    assert mask.shape[1] == 1 and mask.shape[2] == pos.shape[1]
    return (mask[:, 0] == 0).int().tolist(), pos.tolist()


def test_a_chain_after_its_one_token_tail_sees_the_prefix_and_its_ancestors():
    vis, pos = _inputs(cached=3, tail=1, new_tail=1, parents=torch.tensor([[ROOT, 0, 1]]),
                       new_nodes=3)
    assert vis == [[
        [1, 1, 1, 1, 0, 0, 0],  # the tail token (the root), position 3
        [1, 1, 1, 1, 1, 0, 0],
        [1, 1, 1, 1, 1, 1, 0],
        [1, 1, 1, 1, 1, 1, 1],
    ]]
    assert pos == [[3, 4, 5, 6]]


def test_two_branches_do_not_see_each_other_and_share_positions_by_depth():
    vis, pos = _inputs(cached=2, tail=2, new_tail=0,
                       parents=torch.tensor([[ROOT, ROOT, 0, 1]]), new_nodes=4)
    assert vis == [[
        [1, 1, 1, 1, 1, 0, 0, 0],
        [1, 1, 1, 1, 0, 1, 0, 0],
        [1, 1, 1, 1, 1, 0, 1, 0],
        [1, 1, 1, 1, 0, 1, 0, 1],
    ]]
    assert pos == [[4, 4, 5, 5]]


def test_padding_nodes_see_the_prefix_and_themselves_only():
    # node 0 of each row was fed by an earlier call; nodes 1 and 2 are fed now
    vis, pos = _inputs(cached=1, tail=1, new_tail=0,
                       parents=torch.tensor([[ROOT, 0, 1], [ROOT, PAD, PAD]]), new_nodes=2)
    assert vis == [
        [[1, 1, 1, 1, 0],
         [1, 1, 1, 1, 1]],
        [[1, 0, 0, 1, 0],
         [1, 0, 0, 0, 1]],
    ]
    assert pos == [[3, 4], [1, 1]]


def test_a_two_token_tail_is_causal_and_its_child_sees_all_of_it():
    vis, pos = _inputs(cached=2, tail=2, new_tail=2, parents=torch.tensor([[ROOT]]),
                       new_nodes=1)
    assert vis == [[
        [1, 1, 1, 0, 0],
        [1, 1, 1, 1, 0],
        [1, 1, 1, 1, 1],
    ]]
    assert pos == [[2, 3, 4]]


def test_a_tail_without_a_forest_is_a_plain_causal_block():
    vis, pos = _inputs(cached=0, tail=3, new_tail=3,
                       parents=torch.zeros((1, 0), dtype=torch.long), new_nodes=0)
    assert vis == [[[1, 0, 0], [1, 1, 0], [1, 1, 1]]]
    assert pos == [[0, 1, 2]]


SHAPES = [  # (tail, new_tail, parents, new_nodes): a plain step, chains, trees, padding
    (1, 1, [[]], 0),
    (3, 3, [[]], 0),
    (1, 1, [[ROOT, 0, 1]], 3),
    (2, 2, [[ROOT]], 1),
    (2, 0, [[ROOT, ROOT, 0, 1]], 4),
    (1, 1, [[ROOT, ROOT, 0, 0, 1, 1]], 6),
    (1, 0, [[ROOT, ROOT, 0, 0, 1, 1]], 4),
    (1, 0, [[ROOT, 0, 1], [ROOT, PAD, PAD]], 2),
    (4, 2, [[ROOT, 0], [ROOT, ROOT]], 2),
]


def test_tree_buffers_give_what_a_fresh_attention_inputs_builds():
    buffers = TreeBuffers()
    for rnd in range(3):  # the first pass builds every shape, the later ones reuse them
        for cached in (0, 1, 5, 37):
            for tail, new_tail, par, new_nodes in SHAPES:
                parents = torch.tensor(par, dtype=torch.long).reshape(len(par), -1)
                for dtype in (torch.float32, torch.bfloat16):
                    kw = dict(cached=cached, tail=tail, new_tail=new_tail, parents=parents,
                              new_nodes=new_nodes, dtype=dtype)
                    mask, pos = buffers.inputs(**kw)
                    fresh_mask, fresh_pos = attention_inputs(**kw)
                    assert mask.dtype == fresh_mask.dtype and pos.dtype == fresh_pos.dtype
                    assert mask.shape == fresh_mask.shape and torch.equal(mask, fresh_mask)
                    assert torch.equal(pos, fresh_pos)
    assert buffers.built == len(SHAPES) * 2  # one build per shape and dtype, whatever cached
    assert buffers.hits == 3 * 4 * len(SHAPES) * 2 - buffers.built


def test_tree_buffers_hand_out_fresh_positions_and_keep_their_own_intact():
    buffers = TreeBuffers()
    kw = dict(tail=1, new_tail=1, parents=torch.tensor([[ROOT, 0, 1]]), new_nodes=3,
              dtype=torch.float32)
    mask, pos = buffers.inputs(cached=4, **kw)
    mask.fill_(0.0)  # a caller writing into its mask or positions changes no later round
    pos.fill_(99)
    again_mask, again_pos = buffers.inputs(cached=4, **kw)
    fresh_mask, fresh_pos = attention_inputs(cached=4, **kw)
    assert torch.equal(again_mask, fresh_mask) and torch.equal(again_pos, fresh_pos)


def test_tree_buffers_keep_few_shapes_and_no_prefill():
    buffers = TreeBuffers(size=2, max_query=4)
    empty = torch.zeros((1, 0), dtype=torch.long)
    for tail in (1, 2, 3):
        buffers.inputs(cached=0, tail=tail, new_tail=tail, parents=empty, new_nodes=0,
                       dtype=torch.float32)
    assert len(buffers) == 2  # the oldest shape dropped
    mask, pos = buffers.inputs(cached=2, tail=5, new_tail=5, parents=empty, new_nodes=0,
                               dtype=torch.float32)  # 5 fed tokens > max_query: not kept
    assert len(buffers) == 2 and buffers.built == 3
    buffers.inputs(cached=0, tail=6, new_tail=0, parents=torch.tensor([[ROOT]]), new_nodes=1,
                   dtype=torch.float32)  # one node after a 6-token tail (a first round's)
    assert len(buffers) == 2 and buffers.built == 3  # not kept either
    buffers.inputs(cached=0, tail=2, new_tail=2, parents=empty, new_nodes=0,
                   dtype=torch.float32)  # a hit makes its shape the newest
    buffers.inputs(cached=0, tail=4, new_tail=4, parents=empty, new_nodes=0,
                   dtype=torch.float32)
    buffers.inputs(cached=0, tail=2, new_tail=2, parents=empty, new_nodes=0,
                   dtype=torch.float32)
    assert buffers.built == 4  # tail 2 was kept over tail 3
    fresh = attention_inputs(cached=2, tail=5, new_tail=5, parents=empty, new_nodes=0,
                             dtype=torch.float32)
    assert torch.equal(mask, fresh[0]) and torch.equal(pos, fresh[1])
