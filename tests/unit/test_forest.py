from __future__ import annotations

import torch

from engine.forest import PAD, ROOT, ancestor_matrix, depths, descendants, kconfig_parents, path_to


def test_kconfig_tree_has_the_papers_node_count():
    assert len(kconfig_parents((4, 2, 2))) == 28
    assert kconfig_parents((2, 1)) == [ROOT, ROOT, 0, 1]


def test_ancestors_depths_and_paths_follow_parent_pointers():
    par = torch.tensor([[ROOT, ROOT, 0, 2, PAD]])
    anc = ancestor_matrix(par)[0]
    assert anc[3].tolist() == [True, False, True, True, False]
    assert anc[4].tolist() == [False, False, False, False, True]
    assert depths(par)[0].tolist() == [1, 1, 2, 3, 0]
    assert path_to(par, 0, 3) == [0, 2, 3]
    assert descendants(par, 0, 0) == [2, 3]
