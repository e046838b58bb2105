from __future__ import annotations

import torch

from engine.forest import PAD, ROOT, children, depths, path_to


def test_depths_paths_and_children_follow_parent_pointers():
    par = torch.tensor([[ROOT, ROOT, 0, 2, PAD]])
    assert depths(par)[0].tolist() == [1, 1, 2, 3, 0]
    assert path_to(par, 0, 3) == [0, 2, 3]
    assert children(par, 0, ROOT) == [0, 1]
    assert children(par, 0, 0) == [2]
