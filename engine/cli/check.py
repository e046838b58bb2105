"""check: is a method exact on this prompt and pair? (engine/check/run.py). Exit code 0 pass (or
a measured distance for an approximate method), 1 fail, 2 bad input."""

from __future__ import annotations

import argparse
import json
import sys

from engine.cli.flags import (
    add_method_param_flags,
    add_model_flags,
    add_prompt_flags,
    method_params,
    pair_from_flags,
    read_prompt,
)
from engine.core.errors import ConfigError


def add_arguments(p: argparse.ArgumentParser) -> None:
    from engine.check.stats import ALPHA, MAX_RUNS, MIN_RUNS

    p.add_argument("--method", required=True)
    add_prompt_flags(p)
    add_model_flags(p)
    p.add_argument("--runs", type=int, default=None,
                   help="temperature > 0: a fixed number of runs (default: by power)")
    p.add_argument("--alpha", type=float, default=ALPHA, help="false-alarm rate of the test")
    p.add_argument("--min-runs", type=int, default=MIN_RUNS)
    p.add_argument("--max-runs", type=int, default=MAX_RUNS)
    p.add_argument("--max-seconds", type=float, default=None,
                   help="cap the runs to fit this estimate (the power at the cap is stated)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    add_method_param_flags(p)


def _progress(done: int, total: int, message: str) -> None:
    print(f"[check] {message}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    import engine
    from engine.check.result import CheckConfig
    from engine.check.run import run_check
    from engine.core.config import validate_params

    if args.method not in engine.METHODS:
        raise ConfigError(
            f"unknown method '{args.method}' (known: {', '.join(sorted(engine.METHODS))})")
    params = method_params(args)
    validate_params(engine.METHODS[args.method].all_params, params, args.method)
    if not 2 <= args.min_runs <= args.max_runs:
        raise ConfigError("need 2 <= --min-runs <= --max-runs")
    cfg = CheckConfig(alpha=args.alpha, min_runs=args.min_runs, max_runs=args.max_runs,
                      runs=args.runs, max_seconds=args.max_seconds)
    prompt = read_prompt(args)
    result = run_check(pair_from_flags(args), prompt, args.method, raw=args.raw, config=cfg,
                       progress=_progress, **params)
    if args.json:
        print(json.dumps({"method": result.method, "mode": result.mode,
                          "verdict": result.verdict, "runs": result.runs,
                          "lines": list(result.lines), "stats": result.stats,
                          "plot": [list(r) for r in result.plot]}))
    else:
        print(result.text())
    return result.exit_code
