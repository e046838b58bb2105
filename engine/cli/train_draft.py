"""train-draft: train the EESD early-exit drafter and its Cali-TS predictor.

Each flag sets one field of :class:`~engine.training.config.TrainDraftConfig` (its default is
the field's default); :func:`build_config` turns parsed flags into that typed config and
:func:`command_of` turns a config back into the command line stored in the recipe.
"""

from __future__ import annotations

import argparse

from engine.core.paths import ASSETS
from engine.training.config import (
    FEATURES,
    OBJECTIVES,
    DataConfig,
    DrafterTrainConfig,
    PredictorTrainConfig,
    TrainDraftConfig,
)

# (flag, config field: "name" of the run or "section.name", help); in --help order
FLAGS: tuple[tuple[str, str, str], ...] = (
    ("--target", "target", "model spec: embedded | local dir | hub id"),
    ("--device", "device", ""),
    ("--layers", "drafter.layers", "N shared first layers"),
    ("--objective", "drafter.objective", ""),
    ("--alpha", "drafter.alpha", "weight of the alignment term"),
    ("--topk", "drafter.topk", "K of the AtSpeed losses and metrics"),
    ("--prompts", "data.prompts", ""),
    ("--limit-prompts", "data.limit_prompts", "use the first n (0 = all)"),
    ("--heldout-every", "data.heldout_every", "every n-th prompt is held out"),
    ("--max-new-tokens", "data.max_new_tokens", ""),
    ("--samples", "data.samples",
     "sampled continuations per training prompt (0.5: for the first half)"),
    ("--greedy-prefix", "data.greedy_prefix", ""),
    ("--sample-temperature", "data.sample_temperature", ""),
    ("--beams", "data.beams", "top-K beams (beam objectives)"),
    ("--gen-batch", "data.gen_batch", ""),
    ("--shards", "data.shards",
     "a directory of token shards (selfgen / train-feature format) instead of --prompts"),
    ("--limit-tokens", "data.limit_tokens", "with --shards: about this many tokens (0 = all)"),
    ("--epochs", "drafter.epochs", ""),
    ("--lr", "drafter.lr", ""),
    ("--batch-tokens", "drafter.batch_tokens", ""),
    ("--train-norm", "drafter.train_norm", ""),
    ("--shortlist", "drafter.shortlist", "head tokens (0 = full vocab)"),
    ("--eval-gamma", "drafter.eval_gamma", ""),
    ("--seed", "seed", ""),
    ("--threads", "threads", "torch threads (0 = default)"),
    ("--out", "out", ""),
    ("--work-dir", "work_dir", "checkpoints and the token cache"),
    ("--no-progress", "no_progress", ""),
    ("--predictor-only", "predictor_only",
     "train only the Cali-TS predictor for the drafter already in --out"),
    ("--no-predictor", "no_predictor", "skip the Cali-TS predictor"),
    ("--predictor-epochs", "predictor.epochs", ""),
    ("--predictor-lr", "predictor.lr", ""),
    ("--predictor-weight-decay", "predictor.weight_decay", ""),
    ("--predictor-batch", "predictor.batch", ""),
    ("--predictor-prompts", "predictor.prompts",
     "prompts for the predictor's training rows, unseen by the drafter "
     "('' = the drafter's training sequences)"),
    ("--predictor-features", "predictor.features",
     "paper: hidden states only (EESD Eq. 5); confidence: + the draft's confidence in its token"),
)
CHOICES = {"drafter.objective": OBJECTIVES, "predictor.features": FEATURES}
SECTIONS = {"data": DataConfig, "drafter": DrafterTrainConfig, "predictor": PredictorTrainConfig}
# where files go and the progress bar do not change the result: not in the recipe's command
NOT_IN_COMMAND = ("no_progress", "out", "work_dir", "predictor_only", "no_predictor")
SHARD_FLAGS = ("data.shards", "data.limit_tokens")  # in the command only when shards are used


def _dest(flag: str) -> str:
    return flag[2:].replace("-", "_")


def _get(cfg: TrainDraftConfig, path: str):
    """The value of a field path ("seed", "data.prompts") in a config."""
    obj = cfg
    for name in path.split("."):
        obj = getattr(obj, name)
    return obj


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of `python -m engine train-draft` (defaults: TrainDraftConfig's)."""
    defaults = TrainDraftConfig()
    for flag, path, help_text in FLAGS:
        default = _get(defaults, path)
        kw = {"help": help_text or None}
        if isinstance(default, bool):
            p.add_argument(flag, action="store_true", **kw)
            continue
        if not isinstance(default, str):
            kw["type"] = type(default)
        if path in CHOICES:
            kw["choices"] = CHOICES[path]
        p.add_argument(flag, default=default, **kw)


def build_config(args: argparse.Namespace) -> TrainDraftConfig:
    """The typed run config of parsed flags (raises ConfigError on a bad combination)."""
    top: dict = {}
    parts: dict[str, dict] = {name: {} for name in SECTIONS}
    for flag, path, _ in FLAGS:
        section, _, name = path.rpartition(".")
        (parts[section] if section else top)[name] = getattr(args, _dest(flag))
    return TrainDraftConfig(**top, **{s: cls(**parts[s]) for s, cls in SECTIONS.items()})


def command_of(cfg: TrainDraftConfig) -> str:
    """The command line that reproduces a run: every setting explicit, flags sorted,
    repository paths relative."""
    parts = ["python -m engine train-draft"]
    for flag, path, _ in sorted(FLAGS, key=lambda row: _dest(row[0])):
        if _dest(flag) in NOT_IN_COMMAND:
            continue
        if path in SHARD_FLAGS and not cfg.data.shards:
            continue  # data from prompts: the command stays as it was before shards
        value = _get(cfg, path)
        if isinstance(value, str) and value.startswith(str(ASSETS.parent) + "/"):
            value = value[len(str(ASSETS.parent)) + 1:]  # repository-relative path
        if isinstance(value, bool):
            parts += [flag] if value else []
        else:
            parts += [flag, str(value)]
    return " ".join(parts)


def run(args: argparse.Namespace) -> int:
    """Build the config from the flags and train (engine.training.run.train_draft)."""
    from engine.training.run import train_draft

    cfg = build_config(args)
    train_draft(cfg, command=command_of(cfg))
    return 0

