"""EOS ids of a model's generation config, as ``generate()`` reads them (no engine imports)."""

from __future__ import annotations

from typing import Any


def eos_token_ids(gen_cfg: Any) -> tuple[int, ...]:
    """EOS ids of a GenerationConfig in the order given (as generate() reads them)."""
    eos = getattr(gen_cfg, "eos_token_id", None)
    return (eos,) if isinstance(eos, int) else tuple(eos or ())


def eos_ids(model: Any) -> frozenset[int]:
    """EOS ids of the model's generation config, as a set."""
    return frozenset(eos_token_ids(model.generation_config))
