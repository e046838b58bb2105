"""A probe, not the engine: how fast `embedded-q4` decodes greedily when its whole stock
transformers forward (packed layers and head included) is compiled by torch's inductor over
transformers' own StaticCache, against the same forward eager, in one process, one thread.

    SPECVIZ_THREADS=1 taskset -c 0 .venv/bin/python scripts/compile_probe.py --prompts 4

Each prompt (the first N held-out prompts, chat template): a prefill, then N one-token steps
of `model(token, past_key_values=StaticCache, cache_position=...)`, eager and compiled
(``torch.compile(dynamic=False)``: one shape, compiled at the first step; inductor keeps its
work on disk for later processes), interleaved; prints tokens/s min / median / max of each
and whether the two greedy token sequences are equal. With ``--profile`` it also prints the
compiled step's top operators (torch profiler). docs/benchmarks.md, "Compiled steps on the CPU".
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--slots", type=int, default=256, help="StaticCache length")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()

    import torch
    from transformers import StaticCache

    import engine

    torch.set_num_threads(1)
    pair = engine.load_pair("embedded-q4", device="cpu")
    model = pair.target
    rows = [json.loads(ln) for ln in (ROOT / "assets/heldout/heldout.jsonl").read_text()
            .splitlines() if ln.strip()][:args.prompts]

    def step(tok, cache, pos):
        return model(tok, past_key_values=cache, use_cache=True, cache_position=pos).logits

    compiled = torch.compile(step, dynamic=False)

    def decode(fn, ids: list[int]) -> tuple[float, list[int]]:
        cache = StaticCache(config=model.config, max_cache_len=args.slots)
        x = torch.tensor([ids])  # (1, L)
        with torch.no_grad():
            logits = model(x, past_key_values=cache, use_cache=True,
                           cache_position=torch.arange(len(ids))).logits  # (1, L, V)
            tok = logits[:, -1:].argmax(-1)  # (1, 1)
            out = []
            t0 = time.perf_counter()
            for i in range(args.max_new_tokens):
                tok = fn(tok, cache, torch.tensor([len(ids) + i]))[:, -1:].argmax(-1)
                out.append(int(tok))
            return args.max_new_tokens / (time.perf_counter() - t0), out

    t0 = time.perf_counter()
    decode(compiled, engine.encode_prompt(pair, rows[0]["prompt"]))
    print(f"first compiled decode (compile included): {time.perf_counter() - t0:.1f} s")
    got: dict[str, list[float]] = {"eager": [], "compiled": []}
    same = []
    for _ in range(args.repeats):
        for row in rows:
            ids = engine.encode_prompt(pair, row["prompt"])
            tps_e, toks_e = decode(step, ids)
            tps_c, toks_c = decode(compiled, ids)
            got["eager"].append(tps_e)
            got["compiled"].append(tps_c)
            same.append(toks_e == toks_c)
    for name, vals in got.items():
        print(f"{name}: {min(vals):.1f} / {statistics.median(vals):.1f} / {max(vals):.1f} "
              "tokens/s")
    print(f"greedy tokens equal (eager vs compiled): {sum(same)} of {len(same)} runs")
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            decode(compiled, engine.encode_prompt(pair, rows[0]["prompt"]))
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
