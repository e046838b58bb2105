"""The train-feature CLI adapter: the recipe's command round trip (an unset path gives no
flag; a start file is named, repository paths relative)."""

from __future__ import annotations

import argparse
import json

from engine.cli.train_feature import add_arguments, build_config, command_of
from engine.core.paths import ASSETS

PREFIX = "python -m engine train-feature "


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


def _round_trip(command: str) -> str:
    assert command.startswith(PREFIX)
    return command_of(build_config(_parse(command[len(PREFIX):].split(" "))))


def test_the_shipped_recipe_command_round_trips():
    command = json.loads((ASSETS / "feature_drafter" / "recipe.json").read_text())["command"]
    assert _round_trip(command) == command


def test_a_run_without_a_start_file_names_none_and_its_command_parses():
    command = command_of(build_config(_parse(["--data", "/data/shards"])))
    assert "--init" not in command and "--data /data/shards" in command
    assert _round_trip(command) == command


def test_a_start_file_is_named_relative_to_the_repository_and_round_trips():
    start = str(ASSETS / "feature_drafter" / "feature.safetensors")
    command = command_of(build_config(_parse(["--init", start, "--lr", "0.0003"])))
    assert "--init assets/feature_drafter/feature.safetensors" in command
    assert _round_trip(command) == command
