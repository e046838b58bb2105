"""Shared fixtures: tiny seeded model pairs on the CPU and the embedded model (loaded once)."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# one thread: tiny models gain nothing from OpenMP and lose a lot when the cores are busy
torch.set_num_threads(1)


def tiny_pair(family="llama", vocab_size=64, layers=4, draft=None, early_exit_layers=2,
              seed=0, **kw):
    """A tiny random target (and drafter) built from a config: fast, deterministic."""
    import engine
    from engine.models import model_from_config, tiny_config

    target = model_from_config(tiny_config(family, vocab_size=vocab_size, layers=layers, **kw),
                               seed=seed)
    return engine.load_pair(target=target, draft=draft, device="cpu",
                            early_exit_layers=early_exit_layers)


@pytest.fixture(scope="session")
def embedded_pair():
    import engine

    return engine.load_pair(device="cpu")
