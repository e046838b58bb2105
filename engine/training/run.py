"""One training run: target data, Transformer^e, then the Cali-TS predictor, then the recipe.

The recipe (``recipe.json`` beside the weights) records the command that reproduces the run,
the data sizes, the losses and the held-out measurements of both parts.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from engine.core.eos import eos_ids
from engine.core.weights import RECIPE_FILE
from engine.execution.cached_model import check_supported
from engine.run.models import (
    ModelPair,
    _quiet_transformers,
    cache_root,
    load_model,
    resolve_device,
)
from engine.training.config import TrainDraftConfig
from engine.training.data import Progress, build_data
from engine.training.drafter import train_drafter
from engine.training.predictor import train_for_drafter


def progress_bars(enabled: bool) -> Progress:
    """A factory of tqdm bars (disabled ones when not `enabled`)."""
    from tqdm import tqdm

    return lambda total, desc: tqdm(total=total, desc=desc, disable=not enabled,
                                    dynamic_ncols=True)


def load_frozen_target(cfg: TrainDraftConfig) -> ModelPair:
    """The target in fp32 with every parameter frozen (only Transformer^e and a norm copy
    train), as a pair without a drafter."""
    dev = resolve_device(cfg.device)
    target, tok, name = load_model(cfg.target, dev, torch.float32)
    check_supported(target)
    for p in target.parameters():
        p.requires_grad_(False)
    return ModelPair(target, None, tok, dev, name, "")


def train_draft(cfg: TrainDraftConfig, *, command: str = "") -> dict:
    """Generate target data, cache H^N, train Transformer^e, evaluate, save weights + recipe;
    then train the Cali-TS predictor for that drafter (unless `cfg.no_predictor`).

    Args:
        cfg: the run. `command` is the command line that reproduces it, stored in the recipe
            (the predictor's entry gets the same one with ``--predictor-only``).
    Returns:
        the recipe, as written to `cfg.out`/recipe.json (hand-added fields kept).
    """
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    t0 = time.perf_counter()
    _quiet_transformers()
    pair = load_frozen_target(cfg)
    eos = eos_ids(pair.target)
    pad = pair.target.generation_config.pad_token_id
    pad = pad if pad is not None else min(eos)
    progress = progress_bars(not cfg.no_progress)
    work = Path(cfg.work_dir) if cfg.work_dir else cache_root() / "train-draft"
    out = Path(cfg.out)
    data = build_data(pair, cfg.data, cfg.drafter, seed=cfg.seed, eos=eos, pad=pad,
                      progress=progress, work=work)
    recipe = {} if cfg.predictor_only else train_drafter(
        pair, data, cfg.drafter, seed=cfg.seed, eos=eos, out=out, work=work,
        progress=progress, command=command, t0=t0)
    if not cfg.no_predictor:
        fit = train_for_drafter(pair, data, cfg.predictor, cfg.data, seed=cfg.seed, eos=eos,
                                pad=pad, out=out, work=work, progress=progress)
        recipe["predictor"] = {"command": f"{command} --predictor-only", **fit}
        print(json.dumps({k: fit[k] for k in ("heldout", "best_epoch")}, indent=1))
    old = out / RECIPE_FILE
    if old.is_file():  # keep measurements added by hand (e.g. end-to-end speed)
        recipe = {**json.loads(old.read_text()), **recipe}
    out.mkdir(parents=True, exist_ok=True)
    old.write_text(json.dumps(recipe, indent=1) + "\n")
    return recipe
