"""bench: engine methods interleaved with transformers' generate()
(engine/bench/interleaved.py); writes bench.md and bench.json."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from functools import partial
from pathlib import Path

from engine.cli.flags import add_model_flags, add_prompt_flags, pair_from_flags, read_prompts
from engine.core.errors import ConfigError

COMPILED_STEPS = True  # a packed target on a CPU takes compiled steps (engine.cli)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--methods", required=True, help="e.g. greedy,sd:gamma=4,mcsd:k_config=4x2x2")
    add_prompt_flags(p, batch=True)
    p.add_argument("--max-new-tokens", default="64")
    p.add_argument("--temperature", default="0")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default="bench-out")
    p.add_argument("--optimal", action="store_true", help="also time engine.verify.optimal")
    add_model_flags(p)


def run(args: argparse.Namespace) -> int:
    import engine
    from engine.bench.interleaved import (
        case_summaries,
        interleaved_runs,
        markdown_table,
        parse_methods,
    )

    cases = parse_methods(args.methods)
    for c in cases:
        if c.method not in engine.METHODS:
            raise ConfigError(f"unknown method '{c.method}'")
    if args.repeats < 1:
        raise ConfigError("--repeats must be >= 1")
    prompts = read_prompts(args)
    pair = pair_from_flags(args)
    common = {"max_new_tokens": args.max_new_tokens, "temperature": args.temperature}
    rows = interleaved_runs(pair, prompts, cases, raw=args.raw, common=common,
                            repeats=args.repeats, log=partial(print, flush=True))
    meta = {"target": pair.target_name, "draft": pair.draft_name, "prompts": len(prompts),
            "repeats": args.repeats, "max_new_tokens": args.max_new_tokens,
            "temperature": args.temperature}
    summary = case_summaries(rows, cases)
    extra = {}
    if args.optimal:
        from engine.bench.optimal import bench_optimal

        extra["optimal_ms"] = bench_optimal()
    md = markdown_table(summary, pair.device_name, meta)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.md").write_text(md)
    (out / "bench.json").write_text(json.dumps(
        {"device": pair.device_name, "meta": meta, "summary": summary, "runs": rows,
         "cases": [asdict(c) for c in cases], **extra}, indent=1))
    print(md)
    if extra:
        print("optimal (ms per call):", json.dumps(extra["optimal_ms"]))
    return 0
