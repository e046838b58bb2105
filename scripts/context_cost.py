"""What a step of the default target costs as its context grows: the target alone (its
``CachedModel``, no drafter) fed one row with 0, 1 and 3 drafted nodes after a context of L
tokens, each forward timed, its nodes then dropped (a plain round's commit), the node counts
interleaved; medians over --repeats, ms. With --kv-dtype fp32 the packed target's static
key/value buffers are fp32, rowattn rounding them to half as it reads them (the same bits; not
the code before 2026-12-06, whose kernel read fp32 as it was: run this script on that code
for the comparison).

    SPECVIZ_THREADS=1 taskset -c 1 .venv/bin/python scripts/context_cost.py \\
        [--lengths 32,128,256,512,768] [--repeats 24] [--kv-dtype fp32] [--out cost.json]

The compiled path (SPECVIZ_KV=compiled unless set): every shape is compiled (or loaded from
the step store) in a first pass before anything is timed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("SPECVIZ_KV", "compiled")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import engine  # noqa: E402
from engine.core.forest import ROOT  # noqa: E402
from engine.execution.cached_model import CachedModel  # noqa: E402

NODES = (0, 1, 3)


@torch.no_grad()
def times_at(target: torch.nn.Module, vocab: int, length: int, repeats: int) -> dict[int, float]:
    """n -> median seconds of a forward with n drafted nodes after `length` tokens."""
    model = CachedModel(target)
    ids = torch.tensor([[1 + (i * 7) % (vocab - 1) for i in range(length)]])  # (1, L)
    model.start(ids)
    model.feed()
    keep = torch.arange(1)
    nothing = torch.zeros((1, 0), dtype=torch.long)
    one = torch.ones((1, 1), dtype=torch.long)
    model.commit(keep, nothing, nothing, one)
    times: dict[int, list[float]] = {n: [] for n in NODES}
    for rep in range(repeats + 1):  # the first pass warms up
        for i in range(len(NODES)):
            n = NODES[(i + rep) % len(NODES)]
            tokens = torch.full((1, n), 2, dtype=torch.long)  # (1, n) a chain
            parents = torch.tensor([[ROOT] + list(range(n - 1))])[:, :n]  # (1, n)
            t0 = time.perf_counter()
            model.feed(tokens, parents)
            times[n].append(time.perf_counter() - t0)
            model.commit(keep, nothing, nothing, one)
    model.close()
    return {n: statistics.median(ts[1:]) for n, ts in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="32,128,256,512,768")
    ap.add_argument("--repeats", type=int, default=24)
    ap.add_argument("--kv-dtype", choices=("fp16", "fp32"), default="fp16")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.kv_dtype == "fp32":
        from engine.kernels import attention
        attention.kv_dtype = lambda layer, dtype: dtype
    pair = engine.load_pair(device="cpu")
    lengths = [int(x) for x in args.lengths.split(",")]
    for length in lengths:  # compile (or load) every shape first
        times_at(pair.target, pair.vocab_size, length, 1)
    rows = {}
    for length in lengths:
        t = times_at(pair.target, pair.vocab_size, length, args.repeats)
        rows[length] = {n: round(s * 1e3, 3) for n, s in t.items()}
        print(f"{args.kv_dtype} L={length}: plain {rows[length][0]:.2f} ms, one node "
              f"{t[1] / t[0]:.3f}x, three nodes {t[3] / t[0]:.3f}x", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"kv_dtype": args.kv_dtype, "ms": rows}, indent=1))


if __name__ == "__main__":
    main()
