"""generate: run one method on one prompt; text (or JSON) out, optionally the whole trace."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from engine.analysis.timeline import write_timeline
from engine.cli.cost_text import cost_sentence
from engine.cli.flags import (
    add_method_param_flags,
    add_model_flags,
    add_prompt_flags,
    method_params,
    pair_from_flags,
    read_prompt,
)
from engine.contract.records import RunSummary
from engine.core.errors import ConfigError


def stats_json(stats: RunSummary) -> dict[str, Any]:
    """The run's statistics as JSON values, its cost model with the sentence the app shows
    (``cost.summary``)."""
    out = asdict(stats)
    if out["cost"] is not None:
        out["cost"]["summary"] = cost_sentence(stats.cost)
    return out


def _write(flag: str, path: str | None, write) -> None:
    """write(path) when the flag was given; an OSError is one line."""
    if not path:
        return
    try:
        write(path)
    except OSError as e:
        raise ConfigError(f"{flag}: cannot write {path}: {e.strerror}") from e


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--method", required=True)
    add_prompt_flags(p)
    add_model_flags(p)
    p.add_argument("--json", action="store_true",
                   help="print {text, token_ids, beams, stats, method, device}")
    p.add_argument("--trace", default=None, help="write the full RunTrace JSON here")
    p.add_argument("--timeline", default=None,
                   help="write the rounds as Chrome trace-event JSON here (Perfetto's UI "
                        "opens it)")
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
    for flag, path in (("--trace", args.trace), ("--timeline", args.timeline)):
        if path and not Path(path).resolve().parent.is_dir():
            raise ConfigError(f"{flag}: no such folder: {Path(path).parent}")
    trace = engine.generate(pair_from_flags(args), prompt, args.method, raw=args.raw, **params)
    _write("--trace", args.trace, lambda path: Path(path).write_text(trace.to_json()))
    _write("--timeline", args.timeline, lambda path: write_timeline(trace, path))
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
