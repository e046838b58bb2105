"""The set benchmark: every method against its plain decode over a prompt set, resumable.

For each repeat, each prompt and each method, one interleaved pair of runs (the method, then
the matching generate() call: engine/bench/interleaved.py's ``measure``), the methods of a prompt
in the plan's order rotated by the prompt's index and the repeat (``case_order``), after a
warm-up of every method (``warm_up``: one short run; on the compiled CPU path a whole run per
prompt). Each finished (prompt id, method label, repeat) appends one JSON line to
DIR/results.jsonl at once, so a stop (cancel, Ctrl-C, an error) keeps what is done.
DIR/run.json holds the arguments (the settings, a digest of the selected prompts, the models,
device and dtype); a restart with the same arguments skips the rows already there and one
with other arguments is refused. ``write_summary`` aggregates the rows
(engine/bench/set_summary.py) into DIR/summary.json and DIR/summary.md.

A caller (CLI, app) does::

    plan = plan_set(SetSettings(set_path, "sd,mcsd:k_config=2x2"), max_prompts=50)
    outcome = run_set(pair, plan, out_dir, progress=on_row, cancelled=stop_requested)
    summary = write_summary(out_dir)
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from engine.bench.interleaved import Case, compiled_steps, measure_run, parse_methods, warm_up
from engine.bench.set_summary import round_record, summarize_rows, summary_markdown
from engine.bench.sets import (
    MAX_PROMPT_CHARS,
    MAX_PROMPT_TOKENS,
    MAX_PROMPTS,
    SetPrompt,
    check_prompt_tokens,
    read_set,
    select_prompts,
    set_digest,
)
from engine.core.errors import ConfigError

RESULTS, RUN_FILE = "results.jsonl", "run.json"
SUMMARY_JSON, SUMMARY_MD = "summary.json", "summary.md"
Progress = Callable[[int, int, "dict | None"], None]  # (rows done, rows in all, new row)


@dataclass(frozen=True)
class SetSettings:
    """What a set benchmark is asked (the CLI's flags, the app's widgets)."""

    set_path: str
    methods: str  # as bench takes them: "sd,mcsd:k_config=2x2"
    categories: tuple[str, ...] = ()  # () = every category of the set
    limit: int | None = None  # prompts at most, taken from the categories in turn
    max_new_tokens: int = 64
    repeats: int = 1
    seed: int = 0  # repeat r runs the methods with seed + r
    temperature: float = 0.0
    raw: bool = False  # no chat template
    replay: bool = False  # each temperature-0 run of one sequence replayed in hindsight


@dataclass(frozen=True)
class SetPlan:
    """Checked settings: the selected prompts and the methods to run on them."""

    settings: SetSettings
    prompts: tuple[SetPrompt, ...]
    cases: tuple[Case, ...]

    @property
    def total(self) -> int:
        return len(self.prompts) * len(self.cases) * self.settings.repeats


@dataclass(frozen=True)
class SetOutcome:
    """Where a run stopped: every row of results.jsonl (earlier runs' included)."""

    out_dir: Path
    rows: tuple[dict, ...]
    total: int
    finished: bool  # False: cancelled before the last row


def _common(settings: SetSettings, repeat: int) -> dict[str, str]:
    return {"max_new_tokens": str(settings.max_new_tokens),
            "temperature": str(settings.temperature), "seed": str(settings.seed + repeat)}


def plan_set(settings: SetSettings, *, max_prompts: int = MAX_PROMPTS,
             max_chars: int = MAX_PROMPT_CHARS) -> SetPlan:
    """Read and check the set and the methods (nothing is run, no model is needed)."""
    import engine
    from engine.core.config import validate_params

    if settings.repeats < 1:
        raise ConfigError("repeats must be >= 1")
    cases = parse_methods(settings.methods)
    for i, c in enumerate(cases):
        if c.method not in engine.METHODS:
            raise ConfigError(f"unknown method '{c.method}' (known: "
                              f"{', '.join(sorted(engine.METHODS))})")
        if c.label in [d.label for d in cases[:i]]:
            raise ConfigError(f"method '{c.label}' is listed twice")
        spec = engine.METHODS[c.method]
        spec.make(validate_params(spec.all_params, {**_common(settings, 0), **c.params},
                                  c.method))  # a bad value or combination fails here
    rows = read_set(settings.set_path, max_chars=max_chars)
    prompts = select_prompts(rows, settings.categories, settings.limit, max_prompts)
    return SetPlan(settings, tuple(prompts), tuple(cases))


def run_arguments(pair, plan: SetPlan) -> dict[str, Any]:
    """What run.json stores and a restart must match (the set's path is not part of it: the
    selected prompts' digest is)."""
    s = asdict(plan.settings)
    s.pop("set_path")
    if not s["replay"]:
        s.pop("replay")  # a run folder written without the flag resumes as before
    dtype = next(pair.target.parameters()).dtype
    steps = {"steps": "compiled"} if compiled_steps(pair) else {}  # an eager folder resumes
    # as before; compiled and eager timings never share one
    return json.loads(json.dumps({
        **s, "prompts": len(plan.prompts), "prompts_sha256": set_digest(list(plan.prompts)),
        "target": pair.target_name, "draft": pair.draft_name, "device": pair.device_name,
        "dtype": str(dtype).removeprefix("torch."), **steps}))


def open_run_dir(out_dir: str | Path, arguments: dict[str, Any], set_path: str) -> Path:
    """Create DIR with its run.json, or check that an existing one holds these arguments."""
    out = Path(out_dir)
    path = out / RUN_FILE
    if path.is_file():
        try:
            old = json.loads(path.read_text())["arguments"]
        except (ValueError, KeyError, TypeError):
            raise ConfigError(f"{path} is not a run.json of a set benchmark or a tune") from None
        diff = next((k for k in {**old, **arguments} if old.get(k) != arguments.get(k)), None)
        if diff is not None:
            raise ConfigError(f"{out} was made with other arguments ({diff}: "
                              f"{old.get(diff)!r} there, {arguments.get(diff)!r} now); "
                              "choose another output folder or remove it")
        return out
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"{out} is not empty and holds no {RUN_FILE}; choose another "
                          "output folder")
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"arguments": arguments, "set": str(set_path),
                                "started": time.strftime("%Y-%m-%d %H:%M:%S %Z")}, indent=1))
    return out


def read_results(out_dir: str | Path) -> list[dict]:
    """The rows of DIR/results.jsonl; a last line cut short by a stop is dropped from the
    file (its row is run again)."""
    path = Path(out_dir) / RESULTS
    if not path.is_file():
        return []
    text = path.read_text(encoding="utf-8")
    if text and not text.endswith("\n"):
        text = text[:text.rfind("\n") + 1]
        path.write_text(text, encoding="utf-8")
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        try:
            rows.append(json.loads(line))
        except ValueError:
            raise ConfigError(f"{path}:{n}: not JSON") from None
    return rows


def row_key(row: dict) -> tuple[str, str, int]:
    return row["prompt_id"], row["case"], row["repeat"]


def run_set(pair, plan: SetPlan, out_dir: str | Path, *, progress: Progress | None = None,
            cancelled: Callable[[], bool] | None = None,
            max_tokens: int = MAX_PROMPT_TOKENS) -> SetOutcome:
    """Run what DIR does not hold yet (see module docstring).

    Args:
        pair: the loaded ModelPair.
        plan: from :func:`plan_set`.
        out_dir: DIR; created, or resumed when its run.json holds the same arguments.
        progress: called as ``progress(done, total, row)`` once before the first run (row
            None), after each warm-up run (row None: a pause point) and after each appended
            row.
        cancelled: polled before each run; True stops after the row in progress.
        max_tokens: cap on an encoded prompt's tokens.
    """
    s = plan.settings
    check_prompt_tokens(pair, list(plan.prompts), raw=s.raw, max_new_tokens=s.max_new_tokens,
                        max_tokens=max_tokens)
    out = open_run_dir(out_dir, run_arguments(pair, plan), s.set_path)
    rows = read_results(out)
    done = {row_key(r) for r in rows}
    todo = [(rep, p, c) for rep in range(s.repeats) for i, p in enumerate(plan.prompts)
            for c in case_order(plan.cases, i + rep) if (p.id, c.label, rep) not in done]
    stop = cancelled or (lambda: False)
    if progress:
        progress(len(rows), plan.total, None)
    if todo and not stop():  # a pause point after each warm-up run, as after each row
        warm_up(pair, list(dict.fromkeys(p.prompt for _, p, _ in todo)), list(plan.cases),
                raw=s.raw, common=_common(s, todo[0][0]), stop=stop,
                after_each=lambda: progress and progress(len(rows), plan.total, None))
    for rep, p, case in todo:
        if stop():
            return SetOutcome(out, tuple(rows), plan.total, False)
        common = _common(s, rep)
        measured, trace = measure_run(pair, p.prompt, case, raw=s.raw, common=common)
        cost = trace.stats.cost
        projected = None if cost is None or cost.projected is None else cost.projected.speedup
        row = {"prompt_id": p.id, "category": p.category, "repeat": rep,
               "seed": int(common["seed"]), **measured,
               "projected_h100": projected,  # a projection (engine.run.costs)
               **round_record(trace.rounds, trace.stats.new_tokens),
               # vLLM's per-request speculative stats (engine.contract.trace.RunStats)
               "acceptance_histogram": list(trace.stats.acceptance_histogram),
               "per_step_accepted": list(trace.stats.per_step_accepted),
               # its tested drafts by position, entropy, q, token and source, pooled over the
               # set by write_summary (engine.analysis.diagnosis; a small record, no trace)
               "diagnosis": diagnosis_record(trace)}
        if s.replay:
            row["replay"] = replay_record(pair, trace)
        with (out / RESULTS).open("a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
        rows.append(row)
        if progress:
            progress(len(rows), plan.total, row)
    return SetOutcome(out, tuple(rows), plan.total, True)


def case_order(cases: tuple[Case, ...], turn: int) -> tuple[Case, ...]:
    """The cases of one prompt in the order they run: the plan's order rotated by ``turn``
    (the prompt's index plus the repeat), so that each case takes each place in turn. Two
    arms running the same code differed by 3-5 % by their place in a fixed order (an A/A
    check, docs/benchmarks.md); rotated, that bias spreads over every case alike."""
    k = turn % len(cases) if cases else 0
    return cases[k:] + cases[:k]


def diagnosis_record(trace) -> dict:
    """A row's diagnosis (engine.analysis.diagnosis) as JSON, its most rejected tokens kept
    for pooling."""
    from engine.analysis.diagnosis import RECORD_REJECTED, diagnose, to_record

    return to_record(diagnose(trace, rejected_top=RECORD_REJECTED))


def replay_record(pair, trace) -> dict | None:
    """A row's hindsight replay (engine.analysis.hindsight) in numbers: the best fixed length
    and its speedup, the clairvoyant bound's, the run's own, its standing; None where replay
    does not apply exactly (above temperature 0, beam methods)."""
    from engine.analysis.hindsight import replay
    from engine.methods import METHODS

    spec = METHODS[trace.method]
    if float(trace.params.get("temperature", 0.0)) > 0 or spec.reference != "greedy":
        return None
    r = replay(trace, pair)
    u = r.unproposable
    return {"best_fixed": r.best_fixed.label, "best_fixed_speedup": r.best_fixed.speedup,
            "bound_speedup": r.bound.speedup, "own_speedup": r.own.speedup,
            "standing": r.standing, "exact": r.exact,
            # the target tokens the drafter's first draft missed (engine.analysis.replay)
            "positions": u.positions, "not_first": u.not_first, "not_top": u.not_top,
            "no_law": u.no_law, "top": u.top}


def load_run(out_dir: str | Path) -> tuple[dict[str, Any], list[dict]]:
    """DIR's run.json and result rows."""
    path = Path(out_dir) / RUN_FILE
    if not path.is_file():
        raise ConfigError(f"no {RUN_FILE} in {out_dir}: not a set benchmark's folder")
    return json.loads(path.read_text()), read_results(out_dir)


def write_summary(out_dir: str | Path) -> dict[str, Any]:
    """Aggregate DIR's rows into DIR/summary.json and DIR/summary.md; returns the JSON."""
    run, rows = load_run(out_dir)
    args = run["arguments"]
    labels = [c.label for c in parse_methods(args["methods"])]
    total = args["prompts"] * len(labels) * args["repeats"]
    meta = {"set": run["set"], **{k: v for k, v in args.items() if k != "prompts_sha256"},
            "rows": f"{len(rows)}/{total}", "started": run["started"],
            "written": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    summary = {"meta": meta, "methods": summarize_rows(rows, labels)}
    out = Path(out_dir)
    (out / SUMMARY_JSON).write_text(json.dumps(summary, indent=1))
    (out / SUMMARY_MD).write_text(summary_markdown(summary["methods"], meta))
    return summary
