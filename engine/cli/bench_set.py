"""bench-set: methods against their plain decode over a JSONL prompt set, resumable
(engine/bench/set_runner.py); writes DIR/results.jsonl, DIR/summary.json, DIR/summary.md and,
with --report, DIR/report.html (engine/bench/report.py)."""

from __future__ import annotations

import argparse

from engine.cli.flags import add_model_flags, pair_from_flags

COMPILED_STEPS = True  # a packed target on a CPU takes compiled steps (engine.cli)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--set", required=True, dest="set_path",
                   help='JSONL: one {"prompt": ..., "id": ..., "category": ...} a line '
                        "(assets/sets/specbench_mini.jsonl)")
    p.add_argument("--methods", required=True, help="e.g. sd,mcsd:k_config=2x2")
    p.add_argument("--categories", default="", help="e.g. chat,code (default: all)")
    p.add_argument("--limit", type=int, default=None,
                   help="prompts at most, taken from the categories in turn")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--seed", type=int, default=0, help="repeat r runs with seed + r")
    p.add_argument("--raw", action="store_true", help="no chat template")
    p.add_argument("--out", default="bench-set-out",
                   help="folder; a restart with the same arguments resumes it")
    p.add_argument("--report", action="store_true",
                   help="also write DIR/report.html (self-contained, plotly figures)")
    p.add_argument("--replay", action="store_true",
                   help="replay each temperature-0 run in hindsight (engine replay): the "
                        "best fixed length and the clairvoyant bound beside the run's own")
    add_model_flags(p)


def run(args: argparse.Namespace) -> int:
    from engine.bench.set_runner import SetSettings, plan_set, run_set, write_summary

    settings = SetSettings(
        set_path=args.set_path, methods=args.methods,
        categories=tuple(c.strip() for c in args.categories.split(",") if c.strip()),
        limit=args.limit, max_new_tokens=args.max_new_tokens, repeats=args.repeats,
        seed=args.seed, temperature=args.temperature, raw=args.raw, replay=args.replay)
    plan = plan_set(settings)  # every set and method error before a model loads
    pair = pair_from_flags(args)
    bar = _ProgressBar()
    try:
        outcome = run_set(pair, plan, args.out, progress=bar)
    finally:
        bar.close()
    summary = write_summary(outcome.out_dir)
    print((outcome.out_dir / "summary.md").read_text())
    if args.report:
        from engine.bench.report import write_report

        print(f"report: {write_report(outcome.out_dir)}")
    print(f"rows: {summary['meta']['rows']} in {outcome.out_dir / 'results.jsonl'}")
    return 0


class _ProgressBar:
    """A tqdm bar fed by run_set's progress callback (made on its first call)."""

    def __init__(self) -> None:
        self.bar = None

    def __call__(self, done: int, total: int, row: dict | None) -> None:
        from tqdm import tqdm

        if self.bar is None:
            self.bar = tqdm(total=total, initial=done, unit="run", desc="bench-set")
        elif row is not None:
            self.bar.update(1)
            self.bar.set_postfix_str(f"{row['prompt_id']} {row['case']} "
                                     f"speedup {row['speedup'] or 0:.2f}")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
