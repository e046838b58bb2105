"""The packed target's kernel (engine/kernels/qmm.py) against torch's CPU int4 kernel on the linear
layers of SmolLM2-135M: ms for one pass over all 210 of them, and over the head, per number
of rows (docs/benchmarks.md, "The 4-bit x 8-bit kernel").

    taskset -c 1 .venv/bin/python scripts/qmm_bench.py [--reps 15]

Random Q4_1 blocks of the model's shapes (30 layers of q / k / v / o / gate / up / down: 576
and 1536 wide, 192-row k and v), 66 MB of 4-bit weights, more than the last-level cache: each
pass streams its weights from memory, as a decode step does. The head is 49152 x 576 Q8_0 run
as qmm runs it (its Q8_0 product, `qmm.pack8`) and, for torch, as two int4 halves.
torch's kernel takes bf16 activations (its fast path); qmm takes fp32. One torch thread; the
four products run in turn every repeat; medians of --reps.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.kernels import qmm  # noqa: E402

LAYER = [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)]
LAYERS = 30
HEAD = (49152, 576)
ROWS = (1, 2, 3, 4, 5, 6, 8, 12, 16)


def weight(n: int, k: int, gen: torch.Generator) -> dict:
    """One random Q4_1 weight in both kernels' layouts."""
    q = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)  # (N, K)
    d = (torch.rand(n, k // 32, generator=gen) * 0.02).half()  # (N, K / 32)
    m = (torch.rand(n, k // 32, generator=gen) * -0.1).half()  # (N, K / 32)
    qw, dw, mw = qmm.pack(q, d, m)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), 1)
    sz = torch.stack([d.float(), m.float() + 8 * d.float()], -1)  # (N, K / 32, 2)
    sz = sz.transpose(0, 1).to(torch.bfloat16).contiguous()  # (K / 32, N, 2)
    return {"n": n, "k": k, "qw": qw, "dw": dw, "mw": mw, "int4": packed, "sz": sz}


def interleaved_ms(fns: list, reps: int) -> list[float]:
    """Median ms of each of `fns`, run in turn each repeat (after one warm-up each)."""
    times: list[list[float]] = [[] for _ in fns]
    for fn in fns:
        fn()
    for _ in range(reps):
        for fn, spent in zip(fns, times):
            t0 = time.perf_counter()
            fn()
            spent.append(time.perf_counter() - t0)
    return [statistics.median(t) * 1e3 for t in times]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=15)
    args = ap.parse_args()
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    layers = [weight(n, k, gen) for _ in range(LAYERS) for n, k in LAYER]
    q8 = torch.randint(-128, 128, HEAD, generator=gen, dtype=torch.int8)  # (V, d)
    d8 = (torch.rand(HEAD[0], HEAD[1] // 32, generator=gen) * 0.02).half()  # (V, d / 32)
    qw8, dw8 = qmm.pack8(q8, d8)
    head_q8 = {"n": HEAD[0], "k": HEAD[1], "qw": qw8, "dw": dw8, "mw": None}  # qmm's Q8_0
    head_halves = [weight(*HEAD, gen) for _ in range(2)]  # torch's: two int4 products
    print(f"qmm path: {qmm.path()}; {LAYERS * len(LAYER)} linears, one thread, "
          f"{time.strftime('%Y-%m-%d')}")
    print("| rows | linears: qmm ms | torch int4 ms | head: qmm ms | torch int4 ms |")
    print("|---|---|---|---|---|")
    for r in ROWS:
        x = {k: torch.randn(r, k, generator=gen) for k in (576, 1536)}
        xb = {k: v.bfloat16() for k, v in x.items()}

        def ours(ws):
            for w in ws:
                qmm.matmul(x[w["k"]], w["qw"], w["dw"], w["mw"], w["n"])

        def theirs(ws):
            for w in ws:
                torch.ops.aten._weight_int4pack_mm_for_cpu(xb[w["k"]], w["int4"], 32, w["sz"])

        cells = interleaved_ms([lambda: ours(layers), lambda: theirs(layers),
                                lambda: ours([head_q8]), lambda: theirs(head_halves)],
                               args.reps)
        print(f"| {r} | " + " | ".join(f"{c:.2f}" for c in cells) + " |")


if __name__ == "__main__":
    main()
