"""Where a round's time goes on the CPU: ms per round per phase (propose, score, verify,
commit, observe), the score phase split into the target's forward (decoder + LM head) and the
bookkeeping around it, the share of a round that is neither the target's forward nor the
drafter's forwards, and what a round verifies (forest nodes per round; of the drafts on the
verified path, the share accepted).

    SPECVIZ_THREADS=1 taskset -c 1 .venv/bin/python scripts/round_overhead.py \\
        [--target embedded-q4] [--prompts 3] [--repeats 2] [--methods greedy,sd,mcsd] \\
        [--prompts-file assets/sets/specbench_mini.jsonl] [--preset] [--warm-all] \\
        [--kv-dtype fp32] [--out overhead.json]

The first --prompts prompts of --prompts-file (default the held-out set,
assets/heldout/heldout.jsonl; pass a tuning set such as specbench_mini to tune on it), chat
template, 48 new tokens. Each method runs with the embedded pair's settings (PARAMS: sd gamma 3
fixed, mcsd 2x2 with the confidence controller, given explicitly), or with --preset the
target's own defaults (its preset row, as a plain run gets them). One warm-up run per method
(--warm-all: on every prompt, so every compiled step shape is built before timing; with
SPECVIZ_KV=compiled), then the runs interleaved per prompt and repeat. The forwards are timed
by wrapping CachedModel._decode and the LM head (engine.execution.cached_model.head_logits) of
every runner: the target's inside the score phase, the drafter's (its runner is a
CachedModel too) inside propose and commit.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import engine  # noqa: E402
from engine.execution import cached_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PHASES = ("propose", "score", "verify", "commit", "observe")
NEW_TOKENS = 48
PARAMS = {  # the embedded preset's settings (assets/presets.json), given on every target
    "greedy": {},
    "sd": {"gamma": 3, "controller": "fixed"},
    "mcsd": {"k_config": "2x2", "controller": "confidence", "confidence": 0.5},
}


class ForwardClock:
    """Seconds spent in model forwards (decoder and LM head), by role (target / draft)."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = defaultdict(float)
        self.role = ""

    def install(self) -> None:
        decode, head = cached_model.CachedModel._decode, cached_model.head_logits
        clock = self

        def timed_decode(runner, inputs, mask, pos):
            role = getattr(runner, "clock_role", "draft")
            t0 = time.perf_counter()
            try:
                clock.role = role
                return decode(runner, inputs, mask, pos)
            finally:
                clock.spent[role] += time.perf_counter() - t0

        def timed_head(module, hidden):
            t0 = time.perf_counter()
            try:
                return head(module, hidden)
            finally:
                clock.spent[clock.role] += time.perf_counter() - t0

        cached_model.CachedModel._decode = timed_decode
        cached_model.head_logits = timed_head
        init = engine.run.loop.Decoder.__init__

        def tracked_init(dec, *a, **k):
            init(dec, *a, **k)
            dec.ctx.target.clock_role = "target"

        engine.run.loop.Decoder.__init__ = tracked_init


def run_once(pair, prompt: str, method: str, params: dict, clock: ForwardClock) -> dict:
    clock.spent.clear()
    t0 = time.perf_counter()
    trace = engine.generate(pair, prompt, method, max_new_tokens=NEW_TOKENS, **params)
    wall = time.perf_counter() - t0
    rounds = trace.rounds
    phases = {p: sum(r.timings.get(p, 0.0) for r in rounds) for p in PHASES}
    return {"tokens": list(trace.token_ids), "wall": wall, "rounds": len(rounds),
            "nodes": sum(len(r.nodes) for r in rounds),
            "drafted": sum(r.drafted for r in rounds), "accepted": sum(r.accepted for r in rounds),
            "phases": phases, "target_fwd": clock.spent["target"],
            "draft_fwd": clock.spent["draft"]}


def summary(runs: list[dict]) -> dict:
    n_rounds = sum(r["rounds"] for r in runs)
    ms = {p: 1000 * sum(r["phases"][p] for r in runs) / n_rounds for p in PHASES}
    target = 1000 * sum(r["target_fwd"] for r in runs) / n_rounds
    draft = 1000 * sum(r["draft_fwd"] for r in runs) / n_rounds
    total = sum(ms.values())
    tokens = sum(len(r["tokens"]) for r in runs)
    return {
        "ms_per_round": {k: round(v, 3) for k, v in ms.items()},
        "round_ms": round(total, 3),
        "score_forward_ms": round(target, 3),
        "score_bookkeeping_ms": round(ms["score"] - target, 3),
        "draft_forward_ms": round(draft, 3),
        "overhead_ms": round(total - target - draft, 3),
        "overhead_share": round((total - target - draft) / total, 3),
        "tokens_per_round": round(tokens / n_rounds, 3),
        "nodes_per_round": round(sum(r["nodes"] for r in runs) / n_rounds, 3),
        "accepted_per_drafted": round(sum(r["accepted"] for r in runs)
                                      / max(sum(r["drafted"] for r in runs), 1), 3),
        "tok_s_median": round(statistics.median(len(r["tokens"]) / r["wall"] for r in runs), 2),
        "tok_s_total": round(tokens / sum(r["wall"] for r in runs), 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="embedded-q4")
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--methods", default="greedy,sd,mcsd")
    ap.add_argument("--prompts-file", default="assets/heldout/heldout.jsonl",
                    help="jsonl of {prompt}: the held-out set by default, a tuning set to tune")
    ap.add_argument("--preset", action="store_true",
                    help="each method with the target's own preset row (engine defaults)")
    ap.add_argument("--warm-all", action="store_true",
                    help="warm up on every prompt, not the first only (compiled steps)")
    ap.add_argument("--profile", default="", help="cProfile one method's runs into this file")
    ap.add_argument("--kv-dtype", choices=("fp16", "fp32"), default="fp16",
                    help="a packed target's static key/value buffers: fp16 (the engine's) or "
                    "fp32 (read rounded to half: the same bits, twice the bytes read and a "
                    "conversion more; not the code before 2026-12-06, whose kernel read fp32)")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.kv_dtype == "fp32":
        from engine.kernels import attention
        attention.kv_dtype = lambda layer, dtype: dtype
    lines = (ROOT / args.prompts_file).read_text().splitlines()
    prompts = [json.loads(line)["prompt"] for line in lines[: args.prompts]]
    methods = args.methods.split(",")
    pair = engine.load_pair(args.target, device="cpu")
    params = {m: ({} if args.preset else dict(PARAMS.get(m, {}))) for m in methods}
    clock = ForwardClock()
    clock.install()
    for m in methods:  # warm-up (--warm-all: every prompt, so every compiled shape is built)
        for prompt in (prompts if args.warm_all else prompts[:1]):
            run_once(pair, prompt, m, params[m], clock)
    runs: dict[str, list[dict]] = {m: [] for m in methods}
    for rep in range(args.repeats):
        for prompt in prompts:
            order = methods if rep % 2 == 0 else methods[::-1]
            for m in order:
                runs[m].append(run_once(pair, prompt, m, params[m], clock))
    if args.profile:
        import cProfile
        import pstats
        m = methods[-1]
        prof = cProfile.Profile()
        prof.enable()
        for prompt in prompts:
            run_once(pair, prompt, m, params[m], clock)
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").dump_stats(args.profile)
    out = {"target": args.target, "cpu": _cpu(), "threads": torch.get_num_threads(),
           "kv_dtype": args.kv_dtype,
           "params": params, "methods": {m: summary(runs[m]) for m in methods},
           "tokens": {m: [r["tokens"] for r in runs[m][: len(prompts)]] for m in methods}}
    for m in methods:
        s = out["methods"][m]
        ph = " ".join(f"{p} {s['ms_per_round'][p]:.2f}" for p in PHASES)
        print(f"{args.target} {m:7s} round {s['round_ms']:.2f} ms ({ph}); score fwd "
              f"{s['score_forward_ms']:.2f} + book {s['score_bookkeeping_ms']:.2f}; draft fwd "
              f"{s['draft_forward_ms']:.2f}; overhead {s['overhead_ms']:.2f} ms "
              f"({100 * s['overhead_share']:.0f} %); {s['tokens_per_round']:.2f} tok/round; "
              f"{s['nodes_per_round']:.2f} nodes/round, {s['accepted_per_drafted']:.2f} of "
              f"the verified path's drafts accepted; "
              f"{s['tok_s_median']:.2f} tok/s median ({s['tok_s_total']:.2f} overall)")
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))


def _cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "?"


if __name__ == "__main__":
    main()
