"""Command line: python -m engine {methods, generate, bench, optimal, train-draft}.

Every user error prints one line ``error: ...`` and exits with code 2 (never a traceback).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from engine.errors import SpecvizError


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports bad usage in one line, exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(2)


def _method_flags(parser: argparse.ArgumentParser) -> list[str]:
    """One optional flag per parameter name of any method (validated per method later)."""
    from engine.methods import METHODS

    names: list[str] = []
    for spec in METHODS.values():
        for p in spec.all_params:
            if p.name not in names:
                names.append(p.name)
                parser.add_argument(p.flag, dest=p.name, default=None, help=p.help)
    return names


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default="embedded", help="embedded | hub id | local dir")
    p.add_argument("--draft", default=None, help="hub id | local dir (default: early exit)")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--early-exit-layers", type=int, default=None)


def add_prompt_args(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--prompt")
    g.add_argument("--prompt-file")
    p.add_argument("--raw", action="store_true", help="no chat template")


def read_prompts(args) -> list[str]:
    if getattr(args, "prompt", None) is not None:
        return [args.prompt]
    path = Path(args.prompt_file)
    if not path.is_file():
        raise SpecvizError(f"prompt file not found: {path}")
    prompts = [ln.strip() for ln in path.read_text().splitlines() if ln.strip()]
    if not prompts:
        raise SpecvizError(f"prompt file is empty: {path}")
    return prompts


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="python -m engine", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    sub.add_parser("methods", help="list methods with their parameters").add_argument(
        "--json", action="store_true")
    gen = sub.add_parser("generate", help="run one method on a prompt")
    gen.add_argument("--method", required=True)
    add_prompt_args(gen)
    add_model_args(gen)
    gen.add_argument("--json", action="store_true")
    gen.add_argument("--trace", default=None, help="write the full RunTrace JSON here")
    gen.set_defaults(param_names=_method_flags(gen))
    for name, module in (("bench", "engine.bench"), ("optimal", "engine.optimal_cli"),
                         ("train-draft", "engine.cli.train_draft")):
        try:
            mod = __import__(module, fromlist=["add_arguments"])
        except ImportError:
            continue
        sp = sub.add_parser(name, help=(mod.__doc__ or "").strip().splitlines()[0])
        mod.add_arguments(sp)
        sp.set_defaults(run=mod.run)
    return parser


def cmd_methods(args) -> int:
    from engine.methods import METHODS

    if args.json:
        print(json.dumps([s.describe() for s in METHODS.values()], indent=1))
        return 0
    for spec in METHODS.values():
        print(f"{spec.name}  [{spec.family}]  {spec.summary}")
        print(f"    exactness: {spec.exactness}")
        for p in spec.all_params:
            extra = f" choices={list(p.choices)}" if p.choices else ""
            print(f"    {p.flag} ({p.type.__name__}, default {p.default!r}){extra}: {p.help}")
    return 0


def cmd_generate(args) -> int:
    import engine
    from engine.config import validate_params

    params = {n: getattr(args, n) for n in args.param_names if getattr(args, n) is not None}
    if args.method not in engine.METHODS:
        raise SpecvizError(
            f"unknown method '{args.method}' (known: {', '.join(sorted(engine.METHODS))})")
    validate_params(engine.METHODS[args.method].all_params, params, args.method)
    prompt = read_prompts(args)[0]
    if not prompt.strip():
        raise SpecvizError("prompt is empty")
    pair = engine.load_pair(target=args.target, draft=args.draft, device=args.device,
                            dtype=args.dtype, early_exit_layers=args.early_exit_layers)
    trace = engine.generate(pair, prompt, args.method, raw=args.raw, **params)
    if args.trace:
        Path(args.trace).write_text(trace.to_json())
    if args.json:
        is_beam = engine.METHODS[args.method].reference.startswith("beam")
        beams = [{"token_ids": list(b.token_ids), "score": b.score} for b in trace.beams]
        out = {"text": trace.text, "token_ids": list(trace.token_ids),
               "beams": beams if is_beam else [], "stats": trace.stats,
               "method": trace.method, "device": trace.device}
        print(json.dumps(out))
    else:
        print(trace.text)
        s = trace.stats
        print(f"[{trace.method}] {s['new_tokens']} tokens, {s['target_calls']} target calls, "
              f"{s['wall_s']:.2f}s, acceptance {s['acceptance_rate']}, tau {s['tau']}",
              file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        from engine import threads

        threads.configure()  # the same thread rule as the app (engine/threads.py)
        if args.command == "methods":
            return cmd_methods(args)
        if args.command == "generate":
            return cmd_generate(args)
        return int(args.run(args) or 0)
    except SpecvizError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
