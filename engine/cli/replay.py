"""replay: a run replayed in hindsight (engine.analysis.hindsight): every setting of a grid,
the clairvoyant bound and the run's own standing, in one table (or JSON)."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

from engine.analysis.replay import Outcome
from engine.core.errors import ConfigError, TraceError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("trace", help="a RunTrace JSON file (generate --trace, the app's Export)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--costs", default="measured",
                   help="measured (this machine's, for the pair) or a stored profile (h100)")
    p.add_argument("--depth", type=int, default=8,
                   help="fixed lengths 1..DEPTH and the bound's lengths 0..DEPTH (1-16)")
    p.add_argument("--target", dest="replay_target", default=None,
                   help="the pair's target spec (default: the one the trace names)")
    p.add_argument("--draft", dest="replay_draft", default=None,
                   help="the pair's draft spec (default: the drafter the trace names)")
    p.add_argument("--device", default="auto")


def read_trace(path: str):
    """The trace file, refused in one line when it is missing or not a trace."""
    from engine.contract.trace import RunTrace

    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"no such trace file: {path}")
    try:
        return RunTrace.from_json(file.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError, TraceError) as e:
        raise ConfigError(f"not a trace file: {path} ({str(e).splitlines()[0][:160]})") from e


def run(args: argparse.Namespace) -> int:
    from engine.analysis.hindsight import check_replayable, replay
    from engine.analysis.source import pair_of
    from engine.run.api import tune_threads

    trace = read_trace(args.trace)
    check_replayable(trace)
    pair = pair_of(trace, args.replay_target, args.replay_draft, args.device)
    tune_threads(pair)
    report = replay(trace, pair, costs=args.costs, depth=args.depth)
    print(json.dumps(asdict(report)) if args.json else "\n".join(report_lines(report)))
    return 0


def _row(o: Outcome, step_s: float | None, mark: str = "") -> str:
    seconds = f"{o.cost * step_s:8.2f}" if step_s else "       -"
    return (f"{(mark + o.label)[:46]:<46} {o.target_calls:>6} {o.tokens_per_round:>8.2f} "
            f"{o.cost:>9.1f} {seconds} {o.speedup:>7.2f}x")


def _standing(r) -> str:
    if r.standing is None:
        return ""
    if r.standing < 0:
        return f", {r.own.cost / r.best_fixed.cost - 1:.0%} dearer than the best fixed length"
    return (f", at {r.standing:.2f} of the way from the best fixed length (0) to the "
            "bound (1)")


def report_lines(r) -> list[str]:
    """The report as the table the command prints."""
    kind = ("temperature 0: exact" if r.exact else
            f"temperature {r.temperature:g}: expectations" if r.temperature > 0 else
            f"temperature 0, but {r.disagreements} committed tokens are not the target's "
            "greedy ones: approximate")
    lines = [f"Hindsight replay of {r.method} on {r.target}: {r.new_tokens} tokens, {kind}",
             f"drafter: {r.drafter}",
             f"costs: {r.profile}" + (f"; a plain round {r.t_step_s * 1000:.1f} ms"
                                      if r.t_step_s else "") + f"; replay {r.seconds:.1f} s",
             "",
             f"{'setting':<46} {'rounds':>6} {'tok/rnd':>8} {'cost':>9} {'pred. s':>8} "
             f"{'speedup':>8}",
             _row(r.own, r.t_step_s, "* ")]
    lines += [_row(o, r.t_step_s) for o in r.grid]
    if r.bound is not None:
        lines.append(_row(r.bound, r.t_step_s))
        lines.append("")
        lines.append(f"best fixed length: {r.best_fixed.label} ({r.best_fixed.speedup:.2f}x); "
                     f"clairvoyant lengths: {r.bound.speedup:.2f}x; this run: "
                     f"{r.own.speedup:.2f}x" + _standing(r))
    if r.unproposable is not None:
        lines.append("not proposable: " + r.unproposable.note())
    for e in r.expected:
        lines.append(f"expected with {e.length} drafts a round: {e.tokens_per_round:.2f} "
                     f"tokens a round, {e.speedup:.2f}x (an expectation from the trace's "
                     "p and q)")
    lines.append("cost: plain target rounds; speedup: committed tokens / cost")
    return lines

