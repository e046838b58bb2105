"""Grouped-query attention for compiled steps: the attention function a compiled model uses.

Traced by torch.compile, transformers' ``sdpa`` attention (given a mask, on a CPU) first
repeats every key/value head for each of its query heads (``repeat_kv``): inductor makes that
a copy of the whole attended K/V view per layer and step (the compiled path attends a
fixed-size view of its buffer), then runs torch's CPU flash kernel for a handful of queries.
For the packed embedded target (3 key/value heads for 9 query heads, 256-512 slots attended
then) that was about 2.7 of a 15 ms compiled step (docs/benchmarks.md, "Compiled steps:
grouped attention, skipped padding").

:func:`grouped_attention` computes the same attention without the copy: the query heads that
share a key/value head are stacked as rows, one batched product per key/value head against
the keys, the additive mask broadcast over the stacked heads, softmax, one product against the
values. It is registered with transformers' public ``AttentionInterface`` (the model classes
stay stock) as :data:`NAME`, and :func:`use_grouped` sets it on a model that runs compiled
steps. Only a traced forward (torch.compile) takes the grouped path: an eager forward (the
dynamic and static paths, ``generate()``) calls transformers' own ``sdpa`` function unchanged,
so its bits do not move. A compiled step's results equal the eager path's up to float
rounding, as the compiled path's fused kernels already do.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

NAME = "specviz_grouped"
_UNSUPPORTED = ("softcap", "sliding_window", "s_aux", "sinks", "position_bias")  # kwargs the
# grouped path lacks


def grouped(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
            mask: torch.Tensor, scaling: float) -> torch.Tensor:
    """Attention of H query heads over KV key/value heads (query head h reads key/value head
    h // (H / KV), as ``repeat_kv`` has it).

    Args:
        query: (W, H, q, D); key, value: (W, KV, S, D); mask: (W or 1, 1, q, S) additive.
    Returns:
        (W, q, H, D), as transformers' attention functions return it.
    """
    W, H, q, D = query.shape
    KV, S = key.shape[1], key.shape[2]
    r = H // KV  # query heads per key/value head
    rows = query.reshape(W, KV, r * q, D)  # (W, KV, r q, D): heads h = g r + i stacked
    scores = torch.matmul(rows, key.transpose(-1, -2)) * scaling  # (W, KV, r q, S)
    scores = scores.view(W, KV, r, q, S) + mask[:, :, None]  # (W, KV, r, q, S)
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    out = torch.matmul(probs.view(W, KV, r * q, S), value)  # (W, KV, r q, D)
    return out.view(W, H, q, D).transpose(1, 2).contiguous()  # (W, q, H, D)


def grouped_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                      value: torch.Tensor, attention_mask: torch.Tensor | None,
                      dropout: float = 0.0, scaling: float | None = None,
                      **kwargs) -> tuple[torch.Tensor, None]:
    """The attention function registered as :data:`NAME`: :func:`grouped` where a forward is
    traced by torch.compile and its inputs allow it (a 4D float mask, no dropout, key/value
    heads dividing the query heads, none of the options in _UNSUPPORTED), transformers'
    ``sdpa`` function otherwise."""
    if (torch.compiler.is_compiling() and attention_mask is not None
            and attention_mask.dim() == 4 and attention_mask.is_floating_point()
            and not dropout and query.shape[1] % key.shape[1] == 0
            and all(kwargs.get(k) is None for k in _UNSUPPORTED)):
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        return grouped(query, key, value, attention_mask, scale), None
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                  scaling=scaling, **kwargs)


AttentionInterface.register(NAME, grouped_attention)


def use_grouped(model: torch.nn.Module) -> None:
    """Give a model whose attention is transformers' ``sdpa`` the grouped function (its eager
    forwards still run ``sdpa``; see the module docstring). Other implementations stay."""
    cfg = model.config
    if cfg._attn_implementation == "sdpa":
        cfg._attn_implementation = NAME
