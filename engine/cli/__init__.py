"""Command line: python -m engine {methods, generate, check, bench, bench-set, tune, optimal,
replay, train-draft, train-feature}.

Every user error prints one line ``error: ...`` and exits with code 2 (never a traceback).
Each subcommand is a module with ``add_arguments(parser)`` and ``run(args) -> int`` (the
hyphenated ones: bench_set, train_draft, train_feature), listed in COMMANDS; a module that
fails to import is an error, never a missing subcommand. A module with ``COMPILED_STEPS =
True`` (bench, bench-set, tune: long-lived, their warm-up runs make the step shapes) runs in
``static_kv.serving_compiled``: a packed target on a CPU takes compiled steps, as in the app;
the others (a one-shot generate) keep eager steps. The subcommands share their flags
(flags) and a cost model's sentence (cost_text, which the app shows too).
"""

from __future__ import annotations

import argparse
import sys
from types import ModuleType

from engine.cli import (
    bench,
    bench_set,
    check,
    generate,
    methods,
    optimal,
    replay,
    train_draft,
    train_feature,
    tune,
)
from engine.cli.flags import OneLineParser, resolve_target
from engine.core.errors import SpecvizError

COMMANDS: tuple[tuple[str, str, ModuleType], ...] = (  # (name, help, module)
    ("methods", "list methods with their parameters", methods),
    ("generate", "run one method on a prompt", generate),
    ("check", "check a method's exactness on a prompt (0 pass, 1 fail)", check),
    ("bench", "time methods against generate() (markdown + JSON)", bench),
    ("bench-set", "methods against generate() over a JSONL prompt set, resumable; summary "
     "per category, --report for an HTML page", bench_set),
    ("tune", "each method's best exact setting on the pair over a prompt set, within a "
     "budget; stored as the pair's tuned settings", tune),
    ("optimal", "alpha* per position vs what RRS, K-SEQ and greedy drafts achieve", optimal),
    ("replay", "a run replayed in hindsight: other settings, the clairvoyant bound, the "
     "run's own standing", replay),
    ("train-draft", "train the EESD early-exit drafter and its Cali-TS predictor", train_draft),
    ("train-feature", "train the feature (EAGLE-style) drafter on token shards", train_feature),
)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="python -m engine", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    for name, help_text, module in COMMANDS:
        p = sub.add_parser(name, help=help_text, description=help_text)
        module.add_arguments(p)
        p.set_defaults(run=module.run,
                       compiled_steps=getattr(module, "COMPILED_STEPS", False))
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse argv, apply the thread rule (engine/kernels/threads.py), run the subcommand."""
    args = build_parser().parse_args(argv)
    try:
        from engine.kernels import threads

        threads.configure()  # the same thread rule as the app
        resolve_target(args)  # no --target: the device's default
        if not args.compiled_steps:
            return int(args.run(args) or 0)
        from engine.execution import static_kv

        with static_kv.serving_compiled():
            return int(args.run(args) or 0)
    except SpecvizError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
