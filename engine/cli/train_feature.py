"""train-feature: train the feature (EAGLE-style) drafter on a directory of token shards.

One flag per field of :class:`~engine.training.config.FeatureTrainConfig` (its default is the
field's default); :func:`command_of` turns a config back into the command stored in the
recipe.
"""

from __future__ import annotations

import argparse
import dataclasses

from engine.core.paths import ASSETS
from engine.training.config import WEIGHT_DTYPES, FeatureTrainConfig

HELP = {
    "data": "directory of *.jsonl token shards ({ids, start, kind} per line)",
    "target": "model spec: embedded | local dir | hub id | tiny",
    "threads": "torch threads (0 = leave as configured)",
    "limit_tokens": "use shards (name order) up to about this many tokens (0 = all)",
    "heldout_every": "every n-th prompt is held out with all its sequences",
    "w_cls": "weight of the token cross-entropy (EAGLE: 0.1)",
    "noise": "uniform noise on input features, in units of the features' RMS",
    "batch_tokens": "padded tokens per optimiser step",
    "shortlist": "head tokens (0 = the full vocabulary)",
    "eval_steps": "draft steps ahead in the held-out evaluation (= replay gamma)",
    "eval_sequences": "held-out sequences evaluated (0 = all)",
    "out": "where feature.safetensors and recipe.json go",
    "work_dir": "feature cache and checkpoints ('' = the model cache)",
    "fresh": "ignore a checkpoint of the same run",
    "init": "a feature.safetensors to train further (its fc, layer and shortlist; '' = the "
            "seeded start)",
}
CHOICES = {"weight_dtype": WEIGHT_DTYPES}
# where files go, threads and the progress bar do not change the result: not in the command
NOT_IN_COMMAND = ("out", "work_dir", "no_progress", "fresh")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of `python -m engine train-feature` (defaults: FeatureTrainConfig's)."""
    for f in dataclasses.fields(FeatureTrainConfig):
        default = f.default
        kw = {"help": HELP.get(f.name)}
        if isinstance(default, bool):
            p.add_argument(_flag(f.name), action="store_true", **kw)
            continue
        if not isinstance(default, str):
            kw["type"] = type(default)
        if f.name in CHOICES:
            kw["choices"] = CHOICES[f.name]
        p.add_argument(_flag(f.name), default=default, **kw)


def build_config(args: argparse.Namespace) -> FeatureTrainConfig:
    """The typed run config of parsed flags (raises ConfigError on bad values)."""
    return FeatureTrainConfig(**{f.name: getattr(args, f.name)
                                 for f in dataclasses.fields(FeatureTrainConfig)})


def command_of(cfg: FeatureTrainConfig) -> str:
    """The command line that reproduces a run: every setting explicit, flags sorted,
    repository paths relative."""
    parts = ["python -m engine train-feature"]
    for f in sorted(dataclasses.fields(cfg), key=lambda f: f.name):
        if f.name in NOT_IN_COMMAND:
            continue
        value = getattr(cfg, f.name)
        if isinstance(value, str) and value.startswith(str(ASSETS.parent) + "/"):
            value = value[len(str(ASSETS.parent)) + 1:]
        if isinstance(value, bool):
            parts += [_flag(f.name)] if value else []
        elif value == "":  # an unset path (the default): no flag
            continue
        else:
            parts += [_flag(f.name), str(value)]
    return " ".join(parts)


def run(args: argparse.Namespace) -> int:
    """Build the config from the flags and train (engine.training.feature.train_feature)."""
    from engine.training.feature import train_feature

    cfg = build_config(args)
    train_feature(cfg, command=command_of(cfg), progress=not cfg.no_progress)
    return 0
