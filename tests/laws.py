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
    from engine.run.models import model_from_config, tiny_config

    cfg = tiny_config("llama", vocab_size=V, layers=layers, hidden_size=16,
                      intermediate_size=32, initializer_range=0.3)
    return model_from_config(cfg, seed=seed)


def position_probs(model, prompt=PROMPT) -> dict[tuple[int, ...], list[float]]:
    """P(x_i | prompt, x_<i) for every continuation x and position i (temperature 1), all
    V^NEW continuations in one batch."""
    seqs = list(itertools.product(range(V), repeat=NEW))
    ids = torch.tensor([list(prompt) + list(seq) for seq in seqs])  # (V^NEW, T)
    with torch.no_grad():
        logits = model(input_ids=ids).logits[:, len(prompt) - 1:-1]  # (V^NEW, NEW, V)
    logp = torch.log_softmax(logits.double(), -1)  # (V^NEW, NEW, V)
    picked = logp.gather(-1, ids[:, len(prompt):, None])[..., 0].exp()  # (V^NEW, NEW)
    return {seq: row for seq, row in zip(seqs, picked.tolist())}


def exact_law(*models, prompt=PROMPT) -> dict[tuple[int, ...], float]:
    """P(x1 x2 x3 | prompt) by enumeration when token i is drawn from models[i] (one model:
    that model's law)."""
    models = models * NEW if len(models) == 1 else models
    tables = {id(m): position_probs(m, prompt) for m in models}
    return {seq: float(np.prod([tables[id(m)][seq][i] for i, m in enumerate(models)]))
            for seq in tables[id(models[0])]}


def sample_counts(pair, method: str, params: dict, seeds, memo: dict | None = None,
                  prompt=PROMPT) -> dict[tuple[int, ...], int]:
    """How often each continuation comes out of one run per seed (temperature 1). memo (seed
    -> continuation) keeps the runs: a seeded run is the same run whichever test asks."""
    memo = {} if memo is None else memo
    counts: dict[tuple[int, ...], int] = {}
    for seed in map(int, seeds):
        if seed not in memo:
            memo[seed] = engine.generate(pair, list(prompt), method, max_new_tokens=NEW,
                                         temperature=1.0, seed=seed, **params).token_ids
        counts[memo[seed]] = counts.get(memo[seed], 0) + 1
    return counts
