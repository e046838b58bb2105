"""The embedded model fp32 against 4-bit packed ('embedded-q4'): tokens/s of greedy and sd,
where their tokens first differ, and their logit difference ("The embedded model run as shipped"
in docs/benchmarks.md).

    SPECVIZ_THREADS=1 taskset -c 0 .venv/bin/python scripts/bench_embedded_q4.py \\
        [--prompts 4] [--repeats 3] [--methods greedy,sd] [--out q4.json]

The first --prompts held-out prompts (assets/heldout/heldout.jsonl), chat template, 48 new
tokens; both pairs loaded in one process with their default drafter (ngram+feature), each
method with the embedded pair's tuned settings on both; every (target, method) run
interleaved per prompt and repeat (the order reversed every other run), after a warm-up; one
torch thread.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import engine  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TARGETS = ("embedded", "embedded-q4")
NEW_TOKENS = 48


def spread(xs: list[float]) -> dict[str, float]:
    return {"min": round(min(xs), 3), "median": round(statistics.median(xs), 3),
            "max": round(max(xs), 3)}


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first position where two token lists differ (None: identical)."""
    same = min(len(a), len(b))
    return next((j for j in range(same) if a[j] != b[j]), None if len(a) == len(b) else same)


def logit_difference(pairs: dict, prompt: str, tokens: list[int]) -> dict[str, float]:
    """max |logit fp32 - logit q4| over one forward of prompt + tokens (teacher-forced)."""
    ids = engine.encode_prompt(pairs["embedded"], prompt)
    seq = torch.tensor([ids + tokens])  # (1, L + n)
    with torch.no_grad():
        a = pairs["embedded"].target(seq).logits[0, len(ids) - 1: -1]  # (n, V)
        b = pairs["embedded-q4"].target(seq).logits[0, len(ids) - 1: -1]  # (n, V)
    d = (a - b).abs()  # (n, V)
    return {"max": d.max().item(), "median_position_max": d.max(-1).values.median().item(),
            "max_abs_logit": a.abs().max().item()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--methods", default="greedy,sd")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    torch.set_num_threads(1)
    lines = (ROOT / "assets/heldout/heldout.jsonl").read_text().splitlines()
    prompts = [json.loads(line)["prompt"] for line in lines[: args.prompts]]
    methods = args.methods.split(",")
    pairs, load_s = {}, {}
    for name in TARGETS:
        t0 = time.perf_counter()
        pairs[name] = engine.load_pair(name, device="cpu")
        load_s[name] = round(time.perf_counter() - t0, 2)
    params = {m: dict(pairs["embedded"].tuned.get(m, {})) for m in methods}  # same on both

    def run(name: str, method: str, prompt: str):
        t0 = time.perf_counter()
        trace = engine.generate(pairs[name], prompt, method, max_new_tokens=NEW_TOKENS,
                                **params.get(method, {}))
        return list(trace.token_ids), len(trace.token_ids) / (time.perf_counter() - t0), \
            trace.stats

    for name in TARGETS:  # warm-up: thread rule, layout calibration, cost profiles
        for method in methods:
            run(name, method, prompts[0])
    keys = [(name, method) for method in methods for name in TARGETS]
    rates = {k: [] for k in keys}  # tokens/s, prompt-major per repeat
    tokens, stats = {}, {}
    for r in range(args.repeats):
        for i, prompt in enumerate(prompts):
            for k in keys if (r + i) % 2 == 0 else keys[::-1]:
                tokens[k + (i,)], tps, stats[k + (i,)] = run(*k, prompt)
                rates[k].append(tps)
            print(r, i, {"/".join(k): round(rates[k][-1], 2) for k in keys}, flush=True)
    out = {"load_s": load_s, "params": params, "prompts": prompts}
    for k in keys:
        out["/".join(k)] = {
            "tokens_per_s": spread(rates[k]),
            "tau": [stats[k + (i,)].tau for i in range(len(prompts))],
            "acceptance": [stats[k + (i,)].acceptance_rate for i in range(len(prompts))]}
    for method in methods:
        out[f"{method}: q4 / fp32"] = spread([b / a for a, b in zip(
            rates[("embedded", method)], rates[("embedded-q4", method)])])
        out[f"{method}: first difference q4 vs fp32"] = [first_difference(
            tokens[("embedded", method, i)], tokens[("embedded-q4", method, i)])
            for i in range(len(prompts))]
    if "sd" in methods and "greedy" in methods:
        for name in TARGETS:
            out[f"{name}: sd / greedy"] = spread([b / a for a, b in zip(
                rates[(name, "greedy")], rates[(name, "sd")])])
            out[f"{name}: sd first difference from its greedy"] = [first_difference(
                tokens[(name, "greedy", i)], tokens[(name, "sd", i)])
                for i in range(len(prompts))]
    out["logit difference, prompt 0"] = logit_difference(
        pairs, prompts[0], tokens[("embedded", methods[0], 0)])
    print(json.dumps(out, indent=1))
    if args.out:
        out["tokens"] = {"/".join(map(str, k)): v for k, v in tokens.items()}
        Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
