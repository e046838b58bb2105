"""What a forward of n tokens costs, in plain 1-token steps: stock weights against the
oneDNN-packed copies of engine.kernels.layout ("Verify cost on the CPU" in docs/benchmarks.md).

    OMP_NUM_THREADS=1 .venv/bin/python scripts/verify_cost.py [--context 200] [--reps 15]

The embedded target after a context of random tokens; each n is fed and cropped off again,
stock and packed interleaved, median of --reps; one torch thread.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.execution.cached_model import cache_kwarg  # noqa: E402
from engine.kernels import layout  # noqa: E402
from engine.run.models import load_model  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--context", type=int, default=200)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--tokens", default="1,2,3,4,6,8,12,16,32,64")
    args = ap.parse_args()
    torch.set_num_threads(1)
    model, _, _ = load_model("embedded", torch.device("cpu"), torch.float32)
    layout.prepare(model)
    head = model.get_output_embeddings()
    vocab = head.weight.shape[0]
    gen = torch.Generator().manual_seed(0)
    from transformers import DynamicCache

    cache = DynamicCache()
    with torch.no_grad():
        model.model(input_ids=torch.randint(0, vocab, (1, args.context), generator=gen),
                    **cache_kwarg(model.model, cache), use_cache=True)

    def once(n: int, packed: bool) -> float:
        ids = torch.randint(0, vocab, (1, n), generator=gen)  # (1, n)
        t = time.perf_counter()
        with torch.no_grad(), layout.layout_for(model, n if packed else 1):
            h = model.model(input_ids=ids, **cache_kwarg(model.model, cache),
                            use_cache=True).last_hidden_state  # (1, n, d)
            (layout.head_logits(head, h) if packed else head(h))  # (1, n, V)
        seconds = time.perf_counter() - t
        cache.crop(-n)
        return seconds

    ns = [int(x) for x in args.tokens.split(",")]
    times: dict[tuple[int, bool], list[float]] = {}
    for _ in range(args.reps):
        for n in ns:
            for packed in (False, True):
                times.setdefault((n, packed), []).append(once(n, packed))
    step = statistics.median(times[(1, False)])
    print(f"1-token step {step * 1e3:.1f} ms (context {args.context}, median of {args.reps})")
    print("| tokens fed | " + " | ".join(map(str, ns)) + " |")
    print("|---" * (len(ns) + 1) + "|")
    for packed, name in ((False, "stock weights"), (True, "oneDNN-packed")):
        cells = [f"{statistics.median(times[(n, packed)]) / step:.2f}" for n in ns]
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
