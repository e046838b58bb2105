"""CPU matrix products for the few-token forwards of speculative decoding.

A verify pass feeds a handful of tokens (a draft chain, a tree, K beams), and on this CPU build
(MKL, fp32, one thread) ``F.linear`` over a row-major weight re-reads the weight for every
three input rows until 16: the 49,152 x 576 LM head costs 13 ms for 1-3 rows, 25 ms for 4-6,
40 ms for 7-9, 55 ms for 10-12, 64 ms for 13-15 and 33 ms for 16 (measured, single thread).
Two remedies, neither touching a modeling file or a value:

- :func:`column_major_linears` stores every decoder linear weight column-major (the same
  values, transposed strides): ``F.linear`` then runs one streaming GEMM, e.g. the 576 -> 1536
  up projection takes 0.27 ms for 9 rows instead of 0.49 (0.16 vs 0.17 for one row). The
  model is the stock module tree; the tied embedding / LM head keeps its layout (row lookups).
- :func:`head_logits` computes the LM head as ``(W @ h^T)^T`` from 4 rows on (22-28 ms for
  4-16 rows), as ``F.linear`` below (13 ms).

Both change only the order of floating-point sums, as any change of batch shape does; the
exactness tests run with them.
"""

from __future__ import annotations

import torch
from torch import nn

HEAD_GEMM_ROWS = 4  # from this many rows on, the head runs as (W @ h^T)^T


def column_major_linears(model: nn.Module) -> nn.Module:
    """Store the weight of every nn.Linear (except one tied to the input embedding) in
    column-major order, in place; CPU models only. Returns the model."""
    embed = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    tied = embed.weight if embed is not None else None
    for mod in model.modules():
        w = getattr(mod, "weight", None)
        if not isinstance(mod, nn.Linear) or w is None or w is tied or w.device.type != "cpu":
            continue
        if w.dim() == 2 and w.stride(0) == 1:  # already column-major
            continue
        w.data = w.data.t().contiguous().t()  # (out, in), strides (1, out)
    return model


def head_logits(head: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """The LM head on (..., d) hidden states -> (..., V) logits, as one streaming GEMM for
    HEAD_GEMM_ROWS rows or more on a CPU nn.Linear head without bias; else head(hidden)."""
    rows = hidden.numel() // hidden.shape[-1]
    if (type(head) is not nn.Linear or head.bias is not None or rows < HEAD_GEMM_ROWS
            or hidden.device.type != "cpu"):
        return head(hidden)
    flat = hidden.reshape(rows, hidden.shape[-1])  # (R, d)
    out = torch.mm(head.weight, flat.t()).t()  # (R, V)
    return out.reshape(*hidden.shape[:-1], out.shape[-1])  # (..., V)
