"""tune: each method's best exact setting on a model pair over a prompt set, within a time
budget (engine.tune.search); the winners become the pair's tuned settings, which runs of the
pair start from (engine.run.tuned). Resumable: the same --dir picks up where a stop left."""

from __future__ import annotations

import argparse
import json

from engine.cli.flags import add_model_flags, pair_from_flags

COMPILED_STEPS = True  # a packed target on a CPU takes compiled steps (engine.cli)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--set", required=True, dest="set_path",
                   help="JSONL prompt set (assets/sets/specbench_mini.jsonl); split per "
                        "category into tune and report prompts")
    p.add_argument("--methods", default="",
                   help="comma-separated (default: sd,mcsd,eesd,atspeed_strict,dsbd)")
    p.add_argument("--minutes", type=float, default=30.0,
                   help="search budget, all methods together (the report runs after it)")
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--temperature", type=float, default=None,
                   help="default: each method's own (0, or 1 for beam sampling)")
    p.add_argument("--seed", type=int, default=0, help="the split's hash and every run's seed")
    p.add_argument("--raw", action="store_true", help="no chat template")
    p.add_argument("--report-fraction", type=float, default=0.5,
                   help="share of each category held out for the report")
    p.add_argument("--report-limit", type=int, default=12, help="report prompts at most")
    p.add_argument("--approximate", action="store_true",
                   help="allow approximate methods (atspeed_relaxed)")
    p.add_argument("--dir", default="tune-out",
                   help="working folder (trials, report, result); the same arguments resume it")
    p.add_argument("--out", default=None,
                   help="also write the pair's tuned settings to this file (they are always "
                        "stored where runs of the pair read them: $SPECVIZ_TUNED, else "
                        "$SPECVIZ_CACHE/tuned)")
    p.add_argument("--no-store", action="store_true",
                   help="do not store the winners as the pair's settings (report only)")
    add_model_flags(p)


def run(args: argparse.Namespace) -> int:
    from engine.run.specs import default_draft
    from engine.run.tuned import save_tuned, tuned_settings
    from engine.tune.search import TuneSettings, plan_tune, run_tune, started_from

    draft = args.draft if args.draft is not None else default_draft(args.target)
    settings = TuneSettings(
        set_path=args.set_path,
        methods=tuple(m.strip() for m in args.methods.split(",") if m.strip()),
        minutes=args.minutes, seed=args.seed, max_new_tokens=args.max_new_tokens,
        temperature=args.temperature, raw=args.raw, report_fraction=args.report_fraction,
        report_limit=args.report_limit, approximate=args.approximate)
    current = started_from(args.dir)  # a resumed tune: the settings it started from
    if current is None:
        current = tuned_settings(args.target, draft)
    plan = plan_tune(settings, current)  # every error before a model loads
    pair = pair_from_flags(args)
    bar = _Bar(plan)
    try:
        outcome = run_tune(pair, plan, args.dir, progress=bar)
    finally:
        bar.close()
    print(result_markdown(outcome))
    if outcome.finished:
        params = {r.method: r.winner.values for r in outcome.results}
        about = {"set": args.set_path, "minutes": args.minutes, "dir": str(outcome.out_dir),
                 "winners": {r.method: r.winner.label for r in outcome.results}}
        if not args.no_store:
            print(f"stored: {save_tuned(args.target, draft, params, about)}")
        if args.out:
            print(f"written: {save_tuned(args.target, draft, params, about, args.out)}")
    if outcome.finished:
        from engine.tune.report import write_report

        print(f"report: {write_report(outcome.out_dir)}")
    print(f"result: {outcome.out_dir / 'result.json'}")
    return 0


def result_markdown(outcome) -> str:
    """Per method: the winner, its tune score against the current setting's, and the report's
    median speedups (winner, current) over the held-out prompts."""
    lines = ["| method | winner | tune score (current) | report median speedup: winner "
             "(current) | stopped |", "|---|---|---|---|---|"]
    for r in outcome.results:
        rep = outcome.report.get(r.method, {})
        win = (rep.get(r.winner.label) or {}).get("all") or {}
        cur = (rep.get("current") or {}).get("all") or {}
        shown = f"{win.get('median', 0):.2f}" + (f" ({cur['median']:.2f})" if cur else "")
        params = json.dumps(r.winner.values) if r.winner.values else "defaults"
        lines.append(f"| {r.method} | {r.winner.label} {params} | {_num(r.score)} "
                     f"({_num(r.current_score)}) | {shown} | {r.stopped} |")
    return "\n".join(lines)


def _num(v) -> str:
    return "n/a" if v is None else f"{v:.2f}"


class _Bar:
    """A tqdm bar over trials and report runs (its total grows as rungs are planned)."""

    def __init__(self, plan) -> None:
        from tqdm import tqdm

        self.bar = tqdm(unit="run", desc="tune")

    def __call__(self, phase: str, row: dict) -> None:
        self.bar.update(1)
        self.bar.set_postfix_str(f"{phase} {row['label']} {row['prompt_id']} "
                                 f"speedup {row.get('speedup') or 0:.2f}")

    def close(self) -> None:
        self.bar.close()
