"""generate: run one method on one prompt; text (or JSON) out, optionally the whole trace."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from engine.cli.cost_text import cost_sentence
from engine.cli.flags import (
    add_method_param_flags,
    add_model_flags,
    add_prompt_flags,
    method_params,
    pair_from_flags,
    read_prompt,
)
from engine.core.errors import ConfigError
from engine.core.records import RunSummary


def stats_json(stats: RunSummary) -> dict[str, Any]:
    """The run's statistics as JSON values, its cost model with the sentence the app shows
    (``cost.summary``)."""
    out = asdict(stats)
    if out["cost"] is not None:
        out["cost"]["summary"] = cost_sentence(stats.cost)
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--method", required=True)
    add_prompt_flags(p)
    add_model_flags(p)
    p.add_argument("--json", action="store_true",
                   help="print {text, token_ids, beams, stats, method, device}")
    p.add_argument("--trace", default=None, help="write the full RunTrace JSON here")
    add_method_param_flags(p)


def run(args: argparse.Namespace) -> int:
    import engine
    from engine.core.config import validate_params

    params = method_params(args)
    if args.method not in engine.METHODS:
        raise ConfigError(
            f"unknown method '{args.method}' (known: {', '.join(sorted(engine.METHODS))})")
    spec = engine.METHODS[args.method]
    validate_params(spec.all_params, params, args.method)
    prompt = read_prompt(args)
    if args.trace and not Path(args.trace).resolve().parent.is_dir():
        raise ConfigError(f"--trace: no such folder: {Path(args.trace).parent}")
    trace = engine.generate(pair_from_flags(args), prompt, args.method, raw=args.raw, **params)
    if args.trace:
        try:
            Path(args.trace).write_text(trace.to_json())
        except OSError as e:
            raise ConfigError(f"--trace: cannot write {args.trace}: {e.strerror}") from e
    if args.json:
        beams = [{"token_ids": list(b.token_ids), "score": b.score} for b in trace.beams]
        print(json.dumps({
            "text": trace.text, "token_ids": list(trace.token_ids),
            "beams": beams if spec.reference.startswith("beam") else [],
            "stats": stats_json(trace.stats), "method": trace.method,
            "device": trace.device}))
        return 0
    print(trace.text)
    s = trace.stats
    print(f"[{trace.method}] {s.new_tokens} tokens, {s.target_calls} target calls, "
          f"{s.wall_s:.2f}s, acceptance {s.acceptance_rate}, tau {s.tau}",
          file=sys.stderr)
    return 0
