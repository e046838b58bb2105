"""How far atspeed_relaxed's output law is from beam sampling's: a two-sample comparison on
the user's pair, at drafted layers (speed and distance side by side).

    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python scripts/relaxed_distance.py \
        --prompts-jsonl F [--lines 1,2] [--raw] [--draft ngram+feature] [--runs 300] \
        [--max-new-tokens 3] [--settings draft_beams=4:gamma=1,draft_beams=8:gamma=2]

Per prompt: 2M seeded beam_sample runs (seeds 0..2M-1) and M seeded runs of each relaxed
setting (seeds 0..M-1), K = --beams, temperature 1, --max-new-tokens tokens. A run's outcome
is its best beam's tokens (one i.i.d. draw per run). Reported per setting: the total variation
distance between relaxed's empirical law and beam sampling's first half, the noise floor (the
TV between beam sampling's two halves: what two exact samplers show at this M), and the
p-value of a chi-square homogeneity test of relaxed against all 2M beam-sampling runs (cells
with fewer than 10 outcomes in all merged into one). ``engine check`` compares one beam layer
with beam sampling's exact law, and with a drafter that drafts nothing before the target's
first pass that layer is undrafted; here the law covers the drafted layers of rounds >= 1.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch
from scipy.stats import chi2

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.run.api import encode_prompt, generate  # noqa: E402
from engine.run.models import load_pair  # noqa: E402

MERGE_BELOW = 10  # cells with fewer outcomes (both samples together) are merged


def tv(a: Counter, b: Counter) -> float:
    na, nb = sum(a.values()), sum(b.values())
    return 0.5 * sum(abs(a.get(c, 0) / na - b.get(c, 0) / nb) for c in set(a) | set(b))


def homogeneity_p(a: Counter, b: Counter) -> tuple[float, int]:
    """(p-value, dof) of Pearson's chi-square test that a and b are draws of one law."""
    cells = set(a) | set(b)
    big = [c for c in cells if a.get(c, 0) + b.get(c, 0) >= MERGE_BELOW]
    rest = [c for c in cells if c not in big]
    table = [[a.get(c, 0) for c in big], [b.get(c, 0) for c in big]]
    if rest:
        table[0].append(sum(a.get(c, 0) for c in rest))
        table[1].append(sum(b.get(c, 0) for c in rest))
    t = np.array(table, dtype=float)  # (2, C)
    t = t[:, t.sum(0) > 0]
    if t.shape[1] < 2:
        return 1.0, 0
    expected = t.sum(1, keepdims=True) * t.sum(0, keepdims=True) / t.sum()  # (2, C)
    stat = float(((t - expected) ** 2 / expected).sum())
    dof = t.shape[1] - 1
    return float(chi2.sf(stat, dof)), dof


def outcomes(pair, ids, method, params, seeds) -> tuple[list[tuple], dict]:
    out, calls, t0 = [], [], time.perf_counter()
    for s in seeds:
        trace = generate(pair, ids, method, **params, seed=s)
        out.append(tuple(trace.beams[0].token_ids))
        calls.append(trace.stats.target_calls)
    return out, {"seconds_per_run": (time.perf_counter() - t0) / len(seeds),
                 "target_calls": float(np.mean(calls))}


def parse_setting(text: str) -> dict:
    return {k: int(v) for k, v in (kv.split("=") for kv in text.split(":") if kv)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts-jsonl", required=True)
    ap.add_argument("--lines", default="", help="1-based line numbers to use (default: all)")
    ap.add_argument("--raw", action="store_true")
    ap.add_argument("--draft", default="ngram+feature")
    ap.add_argument("--beams", type=int, default=4)
    ap.add_argument("--runs", type=int, default=300, help="M")
    ap.add_argument("--max-new-tokens", type=int, default=3)
    ap.add_argument("--settings", default="draft_beams=4:gamma=1,draft_beams=8:gamma=2")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    torch.set_num_threads(1)
    lines = [ln for ln in Path(args.prompts_jsonl).read_text().splitlines() if ln.strip()]
    keep = [int(i) for i in args.lines.split(",") if i] or range(1, len(lines) + 1)
    prompts = [json.loads(lines[i - 1]) for i in keep]
    prompts = [p["prompt"] if isinstance(p, dict) else p for p in prompts]
    pair = load_pair(draft=args.draft, device="cpu")
    common = {"beams": args.beams, "temperature": 1.0, "max_new_tokens": args.max_new_tokens}
    M, rows = args.runs, []
    print("| prompt | setting | TV to beam sampling | noise floor | homogeneity p (dof) | "
          "target calls | s per run |\n|---|---|---|---|---|---|---|", flush=True)
    for i, prompt in zip(keep, prompts):
        ids = encode_prompt(pair, prompt, raw=args.raw)
        bs, bs_info = outcomes(pair, ids, "beam_sample", common, range(2 * M))
        half_a, half_b = Counter(bs[:M]), Counter(bs[M:])
        floor = tv(half_a, half_b)
        p_ctrl, dof_ctrl = homogeneity_p(half_a, half_b)
        rows.append({"prompt": i, "setting": "beam_sample (control: half vs half)", "tv": floor,
                     "p": p_ctrl, "dof": dof_ctrl, "cells": len(set(bs)), **bs_info})
        print(f"| {i} | beam_sample, half vs half | {floor:.3f} | {floor:.3f} | {p_ctrl:.3g} "
              f"({dof_ctrl}) | {bs_info['target_calls']:.1f} | "
              f"{bs_info['seconds_per_run']:.3f} |", flush=True)
        for text in args.settings.split(","):
            rel, info = outcomes(pair, ids, "atspeed_relaxed", {**common, **parse_setting(text)},
                                 range(M))
            rc = Counter(rel)
            d = tv(rc, half_a)
            p, dof = homogeneity_p(rc, Counter(bs))
            rows.append({"prompt": i, "setting": text, "tv": d, "floor": floor, "p": p,
                         "dof": dof, "cells": len(rc), **info})
            print(f"| {i} | relaxed {text} | {d:.3f} | {floor:.3f} | {p:.3g} ({dof}) | "
                  f"{info['target_calls']:.1f} | {info['seconds_per_run']:.3f} |", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
