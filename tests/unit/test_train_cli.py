"""The train-draft CLI adapter: flags -> typed configs (same flags and defaults as before the
move to engine/training/), the recipe's command round trip, and --help."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys

import pytest

from engine.cli.train_draft import FLAGS, add_arguments, build_config, command_of
from engine.core.errors import ConfigError
from engine.core.paths import ASSETS, ROOT
from engine.training.config import (
    DataConfig,
    DrafterTrainConfig,
    PredictorTrainConfig,
    TrainDraftConfig,
)

# the argparse defaults of `python -m engine train-draft`
OLD_DEFAULTS = {
    "target": "embedded", "device": "cpu", "layers": 4, "objective": "ce", "alpha": 0.5,
    "topk": 8, "prompts": str(ASSETS / "train_prompts.txt"), "limit_prompts": 0,
    "heldout_every": 10, "max_new_tokens": 96, "samples": 1.0, "greedy_prefix": 4,
    "sample_temperature": 1.0, "beams": 4, "gen_batch": 16, "epochs": 4, "lr": 3e-4,
    "batch_tokens": 2048, "train_norm": False, "shortlist": 8192, "eval_gamma": 4, "seed": 0,
    "threads": 0, "out": str(ASSETS / "drafter"), "work_dir": "", "no_progress": False,
    "predictor_only": False, "no_predictor": False, "predictor_epochs": 8,
    "predictor_lr": 1e-3, "predictor_weight_decay": 0.1, "predictor_batch": 512,
    "predictor_prompts": str(ASSETS / "predictor_prompts.txt"),
    "predictor_features": "confidence",
    "shards": "", "limit_tokens": 0,  # added since: token shards instead of prompts
}


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


def test_flags_and_defaults_are_the_old_ones():
    got = vars(_parse([]))
    assert got == OLD_DEFAULTS
    assert all(type(got[k]) is type(v) for k, v in OLD_DEFAULTS.items())


def test_default_flags_build_the_default_typed_config():
    cfg = build_config(_parse([]))
    assert cfg == TrainDraftConfig()
    assert isinstance(cfg.data, DataConfig) and isinstance(cfg.drafter, DrafterTrainConfig)
    assert isinstance(cfg.predictor, PredictorTrainConfig)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.seed = 1  # type: ignore[misc]


def test_every_config_field_has_exactly_one_flag():
    paths = [path for _, path, _ in FLAGS]
    sections = {"data": DataConfig, "drafter": DrafterTrainConfig,
                "predictor": PredictorTrainConfig}
    want = [f.name for f in dataclasses.fields(TrainDraftConfig) if f.name not in sections]
    want += [f"{s}.{f.name}" for s, cls in sections.items() for f in dataclasses.fields(cls)]
    assert sorted(paths) == sorted(want)


def test_each_flag_lands_in_its_typed_field():
    cfg = build_config(_parse([
        "--target", "tiny", "--layers", "2", "--objective", "wordkd", "--samples", "3",
        "--lr", "1e-3", "--train-norm", "--predictor-epochs", "3", "--predictor-lr", "0.01",
        "--predictor-prompts", "", "--predictor-features", "paper", "--heldout-every", "3",
        "--seed", "7", "--no-progress", "--work-dir", "w"]))
    assert cfg.target == "tiny" and cfg.seed == 7 and cfg.no_progress and cfg.work_dir == "w"
    assert cfg.drafter == DrafterTrainConfig(layers=2, objective="wordkd", lr=1e-3,
                                             train_norm=True)
    assert cfg.data == DataConfig(samples=3.0, heldout_every=3)
    assert type(cfg.data.samples) is float
    assert cfg.predictor == PredictorTrainConfig(epochs=3, lr=0.01, prompts="",
                                                 features="paper")


def test_the_shipped_recipe_command_round_trips():
    recipe = json.loads((ASSETS / "drafter" / "recipe.json").read_text())
    command = recipe["command"]
    prefix = "python -m engine train-draft "
    assert command.startswith(prefix)
    cfg = build_config(_parse(command[len(prefix):].split(" ")))
    assert command_of(cfg) == command
    assert cfg.drafter.objective == "wordkd" and cfg.data.samples == 3.0
    assert recipe["predictor"]["command"] == command + " --predictor-only"


def test_the_command_leaves_out_where_files_go_and_writes_repository_paths_relative():
    cfg = build_config(_parse(["--out", "/tmp/x", "--work-dir", "/tmp/w", "--no-progress",
                               "--train-norm"]))
    command = command_of(cfg)
    assert "--out" not in command and "--work-dir" not in command
    assert "--no-progress" not in command and "--train-norm" in command
    assert "--prompts assets/train_prompts.txt" in command
    assert command.split(" ")[4:6] == ["--alpha", "0.5"]  # flags sorted


def test_a_shards_command_round_trips_and_names_its_shards():
    cfg = build_config(_parse(["--shards", "/data/shards", "--limit-tokens", "600000"]))
    command = command_of(cfg)
    assert "--shards /data/shards" in command and "--limit-tokens 600000" in command
    prefix = "python -m engine train-draft "
    assert command_of(build_config(_parse(command[len(prefix):].split(" ")))) == command
    assert "--shards" not in command_of(build_config(_parse([])))  # prompts: as before


@pytest.mark.parametrize("argv,message", [
    (["--predictor-only", "--no-predictor"], "exclude each other"),
    (["--limit-tokens", "10"], "give shards too"),
    (["--epochs", "0"], "epochs must be >= 1"),
    (["--predictor-epochs", "0"], "predictor epochs must be >= 1"),
])
def test_bad_settings_are_one_line_config_errors(argv, message):
    with pytest.raises(ConfigError, match=message):
        build_config(_parse(argv))


def test_train_draft_help_exits_zero():
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "engine", "train-draft", "--help"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "--predictor-features" in done.stdout and "--objective" in done.stdout
