"""Trained weight files: where they live, which target they belong to, how they are written.

The early-exit drafter's weights and its Cali-TS predictor each record the target they were
trained for (:func:`target_fingerprint`); a predictor also records the digest of its drafter's
file (:func:`file_digest`). Both :mod:`engine.drafters.early_exit` and
:mod:`engine.control.predictor` use this module, and neither imports the other.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch
from torch import nn

from engine.core.errors import ConfigError
from engine.core.paths import ASSETS

DRAFTER_DIR = ASSETS / "drafter"  # the shipped drafter, its predictor and their recipe
WEIGHTS_FILE = "extra_layer.safetensors"  # Transformer^e (+ norm, shortlist)
PREDICTOR_FILE = "predictor.safetensors"  # the Cali-TS predictor of the drafter beside it
RECIPE_FILE = "recipe.json"  # how both were trained, with held-out measurements


def target_fingerprint(target: nn.Module) -> dict[str, object]:
    """Shape facts + a checksum of the embedding, to match trained weights to their target."""
    cfg = target.config
    emb = target.get_input_embeddings().weight.detach()
    return {
        "model_type": cfg.model_type,
        "num_hidden_layers": int(cfg.num_hidden_layers),
        "hidden_size": int(cfg.hidden_size),
        "vocab_size": int(emb.shape[0]),
        "embed_abs_sum_256": float(emb[:256].double().abs().sum()),
    }


def same_target(a: dict, b: dict, rtol: float = 1e-3) -> bool:
    """Fingerprints agree (shapes exactly, checksum within rtol)."""
    keys = ("model_type", "num_hidden_layers", "hidden_size", "vocab_size")
    if any(a.get(k) != b.get(k) for k in keys):
        return False
    x, y = float(a["embed_abs_sum_256"]), float(b["embed_abs_sum_256"])
    return abs(x - y) <= rtol * max(abs(x), abs(y), 1e-12)


def file_digest(path: Path) -> str:
    """sha1 of a file (which drafter weights a predictor was trained for)."""
    return hashlib.sha1(Path(path).read_bytes()).hexdigest()


def save_tensors(path: Path, tensors: dict[str, torch.Tensor], meta: dict[str, str]) -> Path:
    """Write a safetensors file with string metadata, atomically (a temp file, then rename)."""
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp), metadata=meta)
    tmp.replace(path)
    return path


def load_tensors(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """(tensors, metadata) of a safetensors file, on the CPU."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, dict(f.metadata() or {})


def read_weight_file(path: Path, what: str) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """(tensors, metadata) of a drafter's weight file; ConfigError (one line) when it is
    missing or unreadable. `what` names the drafter in the message."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{what} weights not found: {path}")
    try:
        return load_tensors(path)
    except Exception as e:  # noqa: BLE001 - any unreadable file becomes one line
        raise ConfigError(f"cannot read {what} weights {path}: {e}") from e
