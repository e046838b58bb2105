"""Flags shared by the subcommands (models, prompts, method parameters) and the parser that
reports bad usage in one line."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from engine.core.errors import ConfigError
from engine.drafters.registry import EMPTY_DRAFT, draft_help


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports bad usage in one line ``error: ...``, exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(2)


# ------------------------------------------------------------------------------ models

TARGET_HELP = ("default (when none is given: the device's default, embedded-q4:a8 on a CPU, "
               "the GGUF as shipped; embedded on CUDA) | embedded (fp32) | embedded-q4 | "
               "embedded-q4:a8 | tiny | tiny:{json} | local dir | hub id")
DRAFT_HELP = (draft_help(" | ") + " | tiny | tiny:{json} | local dir | hub id (a separate "
              "draft model) (default: the target's default drafter, ngram+feature for "
              f"embedded, else {EMPTY_DRAFT}; {EMPTY_DRAFT} when --early-exit-layers is given)")


def resolve_target(args: argparse.Namespace) -> None:
    """args.target, when no --target was given, set to the default target of args.device
    (engine.run.models.default_target; a device map: the fp32 model, as load_pair)."""
    if getattr(args, "target", "") is not None:
        return
    from engine.execution.placement import requested_map
    from engine.run.models import default_target

    placed = requested_map(getattr(args, "device_map", None)) is not None
    args.target = default_target("cuda" if placed else getattr(args, "device", "auto"))


def add_model_flags(p: argparse.ArgumentParser) -> None:
    """--target / --draft specs (engine.run.specs.parse_model_spec), device, device map,
    dtype, layers."""
    p.add_argument("--target", default=None, help=TARGET_HELP)
    p.add_argument("--draft", default=None, help=DRAFT_HELP)
    p.add_argument("--device", default="auto")
    p.add_argument("--device-map", default=None,
                   help="place the target over devices with accelerate: auto | balanced | "
                        "balanced_low_0 | sequential | JSON {\"module\": \"device\"} "
                        "(cpu, disk, cuda:N); --device is then not used "
                        "(default: $SPECVIZ_DEVICE_MAP, else none)")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--early-exit-layers", type=int, default=None,
                   help="N first layers of the early-exit drafter (same as early-exit:N)")


def pair_from_flags(args: argparse.Namespace):
    """The ModelPair the model flags name (with its tuned settings, which runs start from),
    with the thread rule applied for it."""
    import engine
    from engine.run.api import tune_threads

    pair = engine.load_pair(target=args.target, draft=args.draft, device=args.device,
                            dtype=args.dtype, device_map=args.device_map,
                            early_exit_layers=args.early_exit_layers)
    from engine.execution import static_kv

    with static_kv.deferring():  # measured on eager steps: a step compiled before the count
        tune_threads(pair)  # is chosen would keep the wrong one (SPECVIZ_THREADS, else this)
    return pair


# ----------------------------------------------------------------------------- prompts

def add_prompt_flags(p: argparse.ArgumentParser, *, batch: bool = False) -> None:
    """--prompt TEXT | --prompt-file PATH (one whole prompt, byte for byte) and, for a
    batch, --prompts-jsonl PATH (one prompt per line); --raw."""
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--prompt", help="the prompt")
    g.add_argument("--prompt-file", help="a file that is one whole prompt, byte for byte")
    if batch:
        g.add_argument("--prompts-jsonl",
                       help='one prompt per line: a JSON string or {"prompt": "..."}')
    p.add_argument("--raw", action="store_true", help="no chat template")


def read_prompt_file(path: str | Path) -> str:
    """The whole file as one prompt: UTF-8, nothing stripped, newlines as written."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"prompt file not found: {path}")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"prompt file is not UTF-8: {path} ({e.reason})") from e
    if not text.strip():
        raise ConfigError(f"prompt file is empty: {path}")
    return text


def read_prompts_jsonl(path: str | Path) -> list[str]:
    """One prompt per non-blank line: a JSON string or an object with a string "prompt"."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"prompts file not found: {path}")
    prompts = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except ValueError as e:
            raise ConfigError(f"{path}:{n}: not JSON ({e})") from e
        prompt = item.get("prompt") if isinstance(item, dict) else item
        if not isinstance(prompt, str):
            raise ConfigError(f'{path}:{n}: expected a JSON string or {{"prompt": "..."}}')
        if not prompt.strip():
            raise ConfigError(f"{path}:{n}: prompt is empty")
        prompts.append(prompt)
    if not prompts:
        raise ConfigError(f"prompts file is empty: {path}")
    return prompts


def read_prompt(args: argparse.Namespace) -> str:
    """The one prompt of --prompt or --prompt-file."""
    prompt = args.prompt if args.prompt is not None else read_prompt_file(args.prompt_file)
    if not prompt.strip():
        raise ConfigError("prompt is empty")
    return prompt


def read_prompts(args: argparse.Namespace) -> list[str]:
    """The prompts of a batch: --prompts-jsonl, or the one of --prompt / --prompt-file."""
    if getattr(args, "prompts_jsonl", None) is not None:
        return read_prompts_jsonl(args.prompts_jsonl)
    return [read_prompt(args)]


# ------------------------------------------------------------------- method parameters

def add_method_param_flags(p: argparse.ArgumentParser) -> None:
    """One optional flag per parameter name of any method (checked per method later)."""
    from engine.methods import METHODS

    names: list[str] = []
    for spec in METHODS.values():
        for param in spec.all_params:
            if param.name not in names:
                names.append(param.name)
                p.add_argument(param.flag, dest=param.name, default=None, help=param.help)
    p.set_defaults(param_names=tuple(names))


def method_params(args: argparse.Namespace) -> dict[str, str]:
    """The method parameters given on the command line (as typed, not yet validated)."""
    return {n: getattr(args, n) for n in args.param_names if getattr(args, n) is not None}
