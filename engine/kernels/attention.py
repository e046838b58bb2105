"""The attention function of every model the engine runs on a CPU: grouped-query attention
without copying a key/value head per query head.

transformers' ``sdpa`` attention, given a mask and more than one query row (a forest's verify
forward, a prompt), first repeats every key/value head for each of its query heads
(``repeat_kv``; one row takes ``pack_gqa`` instead; transformers 5.24), a copy of the whole
attended K/V per layer and forward. On a CPU, torch's flash kernel takes the grouping itself
(``enable_gqa``) and gives the same bits without the copy: for the embedded target (3
key/value heads for 9 query heads) a layer's attention of 4 rows over 300 slots is 75 against
137 us (docs/benchmarks.md, "Attention without the head copy"). Traced by torch.compile, the
copy became worse: inductor copies the compiled path's fixed-size view of its buffer every
step, about 2.7 of a 15 ms compiled step (docs/benchmarks.md, "Compiled steps: grouped
attention, skipped padding").

:func:`grouped_attention`, registered with transformers' public ``AttentionInterface`` (the
model classes stay stock) as :data:`NAME` and set by :func:`use_engine_attention`, takes three
paths:

- traced by torch.compile on a CPU: :func:`grouped`, the query heads that share a key/value
  head stacked as rows, one batched product per key/value head against the keys, the additive
  mask broadcast over the stacked heads, softmax, one product against the values (equal to
  the eager path up to float rounding, as the compiled path's fused kernels already are);
- eager on a CPU without gradients (the engine's forwards, ``generate()``), a float mask and
  several query rows: torch's ``scaled_dot_product_attention`` with ``enable_gqa``, the same
  forward bits as transformers' ``sdpa`` (tests/model/test_attention.py);
- anything else (one query row, no mask, a GPU, options the paths above lack): transformers'
  own ``sdpa`` function, unchanged.

So an eager forward's bits, ``generate()``'s included, are those of transformers' ``sdpa``.

A packed target (engine.kernels.packed4: every linear product through ``qmm``, whose rows never
depend on each other) takes :data:`ROWS_NAME` instead (:func:`use_engine_attention`): its eager
forwards in fp32 without gradients, one query row or many, with a mask or none, go to
engine/kernels/rowattn.py's kernel, whose every output row depends on its own query and the slots
it may see and on nothing else; its forwards traced by torch.compile (a float 4D mask) call the
same kernel through the op ``specviz::rowattn``, opaque to inductor; the rest as above. Then
every part of such a forward is row-invariant, and a token's logits are the same bits whether it
is fed alone, in a chain or in a draft tree, eager (tests/model/test_rowattn.py) or compiled
(tests/model/test_compiled_kv.py: what inductor fuses around the two kernels is elementwise or
within one token's row). Where no C compiler builds the kernel the packed target keeps
:data:`NAME`.
"""

from __future__ import annotations

import weakref

import torch
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask

from engine.kernels import rowattn
from engine.kernels.packed4 import is_packed

NAME = "specviz_grouped"
ROWS_NAME = "specviz_rows"
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
    """The attention function registered as :data:`NAME` (the three paths of the module
    docstring). The first two need a 4D float mask, no dropout, key/value heads dividing the
    query heads and none of the options in _UNSUPPORTED."""
    plain = (attention_mask is not None and attention_mask.dim() == 4
             and attention_mask.is_floating_point() and not dropout
             and query.shape[1] % key.shape[1] == 0
             and all(kwargs.get(k) is None for k in _UNSUPPORTED))
    if plain and query.device.type == "cpu" and torch.compiler.is_compiling():
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        return grouped(query, key, value, attention_mask, scale), None
    if (plain and query.device.type == "cpu" and query.shape[2] > 1
            and query.shape[1] > key.shape[1] and not torch.is_grad_enabled()):
        out = torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=attention_mask, scale=scaling,
            enable_gqa=True)  # (W, H, q, D), no copy of K/V per query head
        return out.transpose(1, 2).contiguous(), None  # (W, q, H, D)
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                  scaling=scaling, **kwargs)


def _kernel_fits(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 mask: torch.Tensor | None, dropout: float, kwargs: dict) -> bool:
    """What rowattn's kernel takes, eager or traced: an fp32 query and fp32 or fp16 keys and
    values (a packed target's static buffers, :func:`kv_dtype`) on the CPU, no dropout or
    gradients, key/value heads dividing the query heads, a 4D mask or none, no option of
    _UNSUPPORTED."""
    return (query.device.type == "cpu" and query.dtype == torch.float32
            and key.dtype == value.dtype and key.dtype in rowattn.KV_DTYPES
            and not dropout and not torch.is_grad_enabled()
            and query.shape[1] % key.shape[1] == 0 and (mask is None or mask.dim() == 4)
            and all(kwargs.get(k) is None for k in _UNSUPPORTED))


def row_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                  value: torch.Tensor, attention_mask: torch.Tensor | None,
                  dropout: float = 0.0, scaling: float | None = None,
                  **kwargs) -> tuple[torch.Tensor, None]:
    """The attention function registered as :data:`ROWS_NAME` (a packed target's): rowattn's
    kernel for an eager fp32 CPU forward without gradients or dropout, a 4D mask (float or
    bool) of one head that broadcasts to the rows, or none (sdpa's rule then: causal from the
    first slot for several rows, every slot for one), key/value heads dividing the query heads
    and none of the options in _UNSUPPORTED; traced by torch.compile, the same kernel through
    the op ``specviz::rowattn`` for an fp32 CPU forward without gradients or dropout, a float
    4D mask of one head and the same conditions; else :func:`grouped_attention` (over the
    keys and values rounded to half where the query is fp32, as the kernel reads them)."""
    mask = attention_mask
    fits = _kernel_fits(query, key, value, mask, dropout, kwargs)
    if torch.compiler.is_compiling():  # first: a traced forward never reaches the library
        # (its lookup would break the graph); ROWS_NAME is set only where it builds
        if fits and mask is not None and mask.shape[1] == 1 and mask.is_floating_point():
            scale = scaling if scaling is not None else query.shape[-1] ** -0.5
            return torch.ops.specviz.rowattn(query, key, value, mask, scale), None
        key, value = _as_read(query, key, value)
        return grouped_attention(module, query, key, value, attention_mask, dropout=dropout,
                                 scaling=scaling, **kwargs)
    lib = rowattn.library()
    if lib is not None and fits:
        Q, S = query.shape[2], key.shape[2]
        if mask is None:  # what sdpa does without one: is_causal for several rows
            causal = kwargs.get("is_causal")
            mask = rowattn.visible(Q, S, getattr(module, "is_causal", True)
                                   if causal is None else bool(causal))
        elif mask.dtype == torch.bool:  # True: may attend
            mask = additive(mask)  # (W, 1, q, S)
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        try:
            return rowattn.attend(lib, query, key, value, mask, scale), None  # (W, q, H, D)
        except RuntimeError:  # a mask of another shape (per head, say): torch's attention
            pass
    key, value = _as_read(query, key, value)
    return grouped_attention(module, query, key, value, attention_mask, dropout=dropout,
                             scaling=scaling, **kwargs)


def _as_read(query: torch.Tensor, key: torch.Tensor,
             value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values as rowattn reads them, for torch's attention where the kernel does not
    fit: rounded to half, in the query's fp32 (fp16 buffers included); other dtypes as
    they are."""
    if query.dtype == torch.float32 and key.dtype in rowattn.KV_DTYPES:
        return key.half().float(), value.half().float()
    return key, value


def kv_dtype(layer: torch.nn.Module, dtype: torch.dtype) -> torch.dtype:
    """The dtype of a decoder layer's preallocated keys and values (engine.execution.static_kv)
    for a model of parameters in ``dtype``: fp16 where the layer attends by :data:`ROWS_NAME`
    (rowattn reads its keys and values as half anyway: the same bits, half the bytes a step
    reads), else ``dtype``."""
    cfg = getattr(getattr(layer, "self_attn", None), "config", None)
    rows = getattr(cfg, "_attn_implementation", None) == ROWS_NAME
    return torch.float16 if rows and dtype == torch.float32 else dtype


_LAST_BOOL: tuple = (None, -1, None)  # (weakref to a bool mask, its version, additive form)


def additive(mask: torch.Tensor) -> torch.Tensor:
    """A bool mask (True: may attend) as the kernel's additive fp32 one (-inf: hidden). Every
    layer of a forward is handed the same mask object (``generate()``'s), so the last
    conversion is kept and reused while that object lives unchanged (its version counter; a
    mask made in inference mode has none and is converted every time)."""
    global _LAST_BOOL
    out = None
    keep = not mask.is_inference()  # an inference-mode tensor has no version counter
    if keep:
        ref, version, out = _LAST_BOOL  # one read: another thread may replace it
        if ref is not None and ref() is mask and version == mask._version:
            return out
    out = torch.zeros(mask.shape, dtype=torch.float32,
                      device="cpu").masked_fill_(~mask, float("-inf"))  # (W, 1, q, S)
    if keep:
        _LAST_BOOL = (weakref.ref(mask), mask._version, out)
    return out


AttentionInterface.register(NAME, grouped_attention)
AttentionInterface.register(ROWS_NAME, row_attention)
# transformers builds the masks of a registered attention by its name; with none registered it
# passes no mask at all, and a multi-token forward over a cache (prompt lookup in generate())
# would attend causally from slot 0. NAME takes sdpa's masks: its eager paths run sdpa's kernel.
AttentionMaskInterface.register(NAME, sdpa_mask)
AttentionMaskInterface.register(ROWS_NAME, sdpa_mask)


def use_engine_attention(model: torch.nn.Module) -> None:
    """Give a CPU model whose attention is transformers' ``sdpa`` (or :data:`NAME`) the
    engine's: :data:`ROWS_NAME` for packed layers where rowattn's kernel builds, else
    :data:`NAME` (see the module docstring). Other implementations stay. The model's config
    takes the model's choice; a decoder layer whose attention holds a config of its own (a
    layer copied from the target: a feature drafter's, an early exit's extra one) takes its
    layer's, as its attention reads it (left on sdpa, a compiled drafter step attended all
    1,024 slots of its buffer: 1.04 ms a step against 0.28, Intel Xeon). A layer shared with
    the target holds the target's config and takes the target's choice; no other module's
    config is touched (a drafter's rotary embedding, shared, holds the target's)."""
    _choose(model.config, model)
    for layer in getattr(getattr(model, "model", None), "layers", ()):
        cfg = getattr(getattr(layer, "self_attn", None), "config", None)
        if cfg is not None and cfg is not model.config:
            _choose(cfg, layer)


def _choose(cfg, module: torch.nn.Module) -> None:
    """Set ``cfg``'s attention to the engine's for ``module``'s layers (chosen afresh: a
    drafter's copy of a packed target's config may hold unpacked layers)."""
    if cfg._attn_implementation in ("sdpa", NAME, ROWS_NAME):
        rows = is_packed(module) and rowattn.library() is not None
        cfg._attn_implementation = ROWS_NAME if rows else NAME
