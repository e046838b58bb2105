"""A compiled step with the eager step's bits: RMSNorm and the rotary embedding as ops.

Inductor fuses a stock decoder's small operations and rounds some of them its own way: the
mean of squares inside every RMSNorm (its reduction order) and the rotary embedding's cos /
sin (its own vectorised functions, not ATen's). Elementwise products and sums round alike
either way. At 8-bit activations those last-bit differences move a quantisation level now
and then, so a compiled greedy run of ``embedded-q4:a8`` left the eager one's tokens on 9 of
the 18 held-out prompts (docs/benchmarks.md, "Compiled steps with the eager bits").

:func:`keep_eager_bits` gives a model's RMSNorm modules and its rotary embedding a forward
that, only while torch.compile traces it, calls the op ``specviz::rmsnorm`` /
``specviz::rotary``: opaque to inductor, each computes the stock module's formula in the same
order with the same roundings (their C++ kernels in engine/kernels/ops.cpp, loaded with
qmm.native_op: the RMSNorm's mean of squares summed in ATen's own order, lane by lane, where
a check at the first call of each width finds it gives ATen's bits (else by ATen's ops, about
10 us each for a 576-wide row, 61 norms a step), and the rest in one fp32 loop, each of whose
operations rounds once as ATen's does; their Python kernels below are the same ATen
operations). Eagerly the modules run their stock forward unchanged. With qmm's products and
rowattn's attention (opaque already), a compiled step of a packed target then gives every token
the eager step's bits, so a compiled run's tokens equal ``generate()``'s
(tests/model/test_compiled_kv.py).

Applied by :class:`~engine.execution.cached_model.CachedModel` to a packed model on the compiled
path; the classes are swapped in place (a subclass of each stock class, made once per class),
as packed4 swaps the linear layers.
"""

from __future__ import annotations

import torch

from engine.kernels import qmm


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The stock RMSNorm (transformers' Llama / Qwen2 / Qwen3 / Mistral): x (..., d) ->
    (..., d), the same operations in the same order as the module's forward."""
    h = x.to(torch.float32)
    variance = h.pow(2).mean(-1, keepdim=True)  # (..., 1)
    h = h * torch.rsqrt(variance + eps)
    return weight * h.to(x.dtype)


def rotary(position_ids: torch.Tensor, inv_freq: torch.Tensor, scaling: float,
           like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The stock default rotary embedding: position_ids (W, q) -> cos, sin (W, q, head dim)
    in ``like``'s dtype, the same operations as the module's forward."""
    freqs = position_ids[..., None].float() * inv_freq.to(device=like.device,
                                                          dtype=torch.float)  # (W, q, d/2)
    emb = torch.cat((freqs, freqs), dim=-1)  # (W, q, d)
    cos = emb.cos() * scaling
    sin = emb.sin() * scaling
    return cos.to(dtype=like.dtype), sin.to(dtype=like.dtype)


def _rmsnorm_python(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The op's Python kernel: loads the ops' C++ kernels (later CPU calls go there)."""
    qmm.load_op()
    return rmsnorm(x, weight, eps)


def _rotary_python(position_ids: torch.Tensor, inv_freq: torch.Tensor, scaling: float,
                   like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The op's Python kernel: loads the ops' C++ kernels (later CPU calls go there)."""
    qmm.load_op()
    return rotary(position_ids, inv_freq, scaling, like)


# The ops torch.compile sees (opaque to inductor, as qmm's and rowattn's). Python kernels for
# every backend; the C++ ones (engine/kernels/ops.cpp), once loaded, for CPU, taken first.
_LIB = torch.library.Library("specviz", "FRAGMENT")
_LIB.define("rmsnorm(Tensor x, Tensor weight, float eps) -> Tensor")
_LIB.define("rotary(Tensor position_ids, Tensor inv_freq, float scaling, Tensor like) "
            "-> (Tensor, Tensor)")
_LIB.impl("rmsnorm", _rmsnorm_python, "CompositeExplicitAutograd")
_LIB.impl("rotary", _rotary_python, "CompositeExplicitAutograd")


@torch.library.register_fake("specviz::rmsnorm")
def _(x, weight, eps):
    return torch.empty_like(x)


@torch.library.register_fake("specviz::rotary")
def _(position_ids, inv_freq, scaling, like):
    shape = (*position_ids.shape, 2 * inv_freq.shape[0])  # (W, q, head dim)
    return like.new_empty(shape), like.new_empty(shape)


class _OpNorm:
    """Mixed into a stock RMSNorm class: traced by torch.compile, the op."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():
            return torch.ops.specviz.rmsnorm(hidden_states, self.weight,
                                             float(self.variance_epsilon))
        return super().forward(hidden_states)


class _OpRotary:
    """Mixed into a stock rotary embedding class (default rope): traced, the op."""

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor):
        if torch.compiler.is_compiling():
            return torch.ops.specviz.rotary(position_ids, self.inv_freq,
                                            float(self.attention_scaling), x)
        return super().forward(x, position_ids)


_SWAPPED: dict[tuple[type, type], type] = {}  # (mixin, stock class) -> their subclass


def _swap(module: torch.nn.Module, mixin: type) -> None:
    cls = type(module)
    if issubclass(cls, mixin):
        return
    key = (mixin, cls)
    if key not in _SWAPPED:
        _SWAPPED[key] = type(cls.__name__, (mixin, cls), {"__module__": cls.__module__})
    module.__class__ = _SWAPPED[key]


def is_rmsnorm(module: torch.nn.Module) -> bool:
    """A stock RMSNorm: its class is named so and it holds a weight and an epsilon."""
    return type(module).__name__.endswith("RMSNorm") and hasattr(module, "variance_epsilon") \
        and isinstance(getattr(module, "weight", None), torch.Tensor)


def is_default_rotary(module: torch.nn.Module) -> bool:
    """A stock rotary embedding of the default rope type (positions times inv_freq)."""
    return type(module).__name__.endswith("RotaryEmbedding") \
        and getattr(module, "rope_type", None) == "default" and hasattr(module, "inv_freq")


def keep_eager_bits(model: torch.nn.Module) -> int:
    """Swap the model's RMSNorm modules and default rotary embeddings in place for their
    op-tracing subclasses (idempotent); the number of modules swapped. Eager forwards are
    unchanged."""
    n = 0
    for module in model.modules():
        if is_rmsnorm(module):
            _swap(module, _OpNorm)
            n += 1
        elif is_default_rotary(module):
            _swap(module, _OpRotary)
            n += 1
    return n
