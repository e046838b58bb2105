"""A round's time split by what the cost switch chose: plain rounds and drafted rounds of each
depth, beside greedy's rounds, on the default pair and its default path in a long-lived
process (compiled steps where the machine can build them), tuning prompts only
(docs/benchmarks.md, "On an AVX2-only host").

    SPECVIZ_THREADS=1 taskset -c 1 .venv/bin/python scripts/switch_split.py \\
        [--methods greedy,sd,mcsd] [--repeats 2] [--max-new-tokens 48]

Each method first runs one prompt untimed (every step shape made); then per repeat and
prompt each method in turn. Prints, per method, the median wall milliseconds per token and
per kind of round (the first round, the prefill, left out) its count, tokens a round and the
median milliseconds of each part (propose, score, verify, commit, observe), and the last
round's plan: (depth, cost in plain rounds, expected tokens) per option and the posterior
mean acceptance per depth.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's engine

import engine  # noqa: E402
from engine.execution.static_kv import serving_compiled  # noqa: E402

PROMPTS = ("assets/ngram_tune_prompts.jsonl", "assets/eesd_bench_prompts.jsonl")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", default="greedy,sd,mcsd")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    a = ap.parse_args()
    methods = a.methods.split(",")
    prompts = [json.loads(line) for f in PROMPTS for line in open(f, encoding="utf-8")
               if line.strip()]
    parts: dict[str, dict[str, list[dict]]] = {m: {} for m in methods}
    walls: dict[str, list[float]] = {m: [] for m in methods}
    last = {}
    with serving_compiled():
        pair = engine.load_pair()
        for m in methods:
            engine.generate(pair, prompts[0], m, max_new_tokens=a.max_new_tokens)
        for _ in range(a.repeats):
            for p in prompts:
                for m in methods:
                    t0 = time.perf_counter()
                    trace = engine.generate(pair, p, m, max_new_tokens=a.max_new_tokens)
                    walls[m].append((time.perf_counter() - t0) / max(1, len(trace.token_ids)))
                    for r in trace.rounds[1:]:
                        depth = r.switch.depth if r.switch is not None else int(r.drafted > 0)
                        kind = "plain" if depth == 0 else f"depth {depth}"
                        parts[m].setdefault(kind, []).append(
                            {**r.timings, "tokens": len(r.committed)})
                    last[m] = trace.rounds[-1].switch
    for m in methods:
        print(f"{m}: wall ms a token, median {1e3 * statistics.median(walls[m]):.2f}")
        for kind, rs in sorted(parts[m].items()):
            med = {k: 1e3 * statistics.median(x[k] for x in rs) for k in rs[0] if k != "tokens"}
            print(f"  {kind:8s} n={len(rs):4d} tokens a round "
                  f"{statistics.mean(x['tokens'] for x in rs):.2f} "
                  + " ".join(f"{k} {v:.3f}" for k, v in med.items())
                  + f" sum {sum(med.values()):.3f}")
        plan = last[m]
        if plan is not None:
            print("  last plan:", [(o.depth, round(o.cost, 3), round(o.expected_tokens, 3))
                                   for o in plan.options][:5], "posterior mean",
                  [round(x, 2) for x in (plan.posterior.mean if plan.posterior else ())][:4])


if __name__ == "__main__":
    main()
