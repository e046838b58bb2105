"""Tiny vocab-8 models, their exact laws of 3-token continuations by enumeration, and the
counts a method's sampled runs give: the material of the chi-square end-to-end tests."""

from __future__ import annotations

import itertools

import numpy as np
import torch

import engine

V, PROMPT, NEW = 8, [3, 4], 3


def tiny_model(layers: int, seed: int):
    """A vocab-8 llama. initializer_range 0.3 makes the laws peaked (entropy ~4 nats of 6.2)
    and two seeds' laws far apart (TV ~0.5 at the first position), so a wrong rule cannot hide
    behind p ~ q ~ uniform."""
    from engine.models import model_from_config, tiny_config

    cfg = tiny_config("llama", vocab_size=V, layers=layers, hidden_size=16,
                      intermediate_size=32, initializer_range=0.3)
    return model_from_config(cfg, seed=seed)


def position_probs(model) -> dict[tuple[int, ...], list[float]]:
    """P(x_i | prompt, x_<i) for every continuation x and position i (temperature 1)."""
    probs = {}
    with torch.no_grad():
        for seq in itertools.product(range(V), repeat=NEW):
            ids = torch.tensor([PROMPT + list(seq)])  # (1, T)
            logp = torch.log_softmax(model(input_ids=ids).logits[0].double(), -1)  # (T, V)
            probs[seq] = [float(logp[len(PROMPT) - 1 + i, seq[i]].exp()) for i in range(NEW)]
    return probs


def exact_law(*models) -> dict[tuple[int, ...], float]:
    """P(x1 x2 x3 | prompt) by enumeration when token i is drawn from models[i] (one model:
    that model's law)."""
    models = models * NEW if len(models) == 1 else models
    tables = {id(m): position_probs(m) for m in models}
    return {seq: float(np.prod([tables[id(m)][seq][i] for i, m in enumerate(models)]))
            for seq in tables[id(models[0])]}


def sample_counts(pair, method: str, params: dict, seeds) -> dict[tuple[int, ...], int]:
    """How often each continuation comes out of one run per seed (temperature 1)."""
    counts: dict[tuple[int, ...], int] = {}
    for seed in seeds:
        tr = engine.generate(pair, PROMPT, method, max_new_tokens=NEW, temperature=1.0,
                             seed=int(seed), **params)
        counts[tr.token_ids] = counts.get(tr.token_ids, 0) + 1
    return counts
