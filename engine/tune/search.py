"""The tuner: each method's best exact setting on a model pair, found by successive halving
over prompts within a time budget, reported on prompts it never tuned on.

**Split.** The set's prompts are split per category by a seeded hash of their ids: a
``report_fraction`` of each category is held out for the report (at most ``report_limit``
prompts, taken from the categories in turn), the rest is tuned on. The two never meet.

**Search** (per method, ``minutes / methods`` of the budget each). Every candidate of
engine.tune.space runs on the first ``first_prompts`` tune prompts; a *trial* is one
interleaved pair of runs, the setting and its plain ``generate()`` call
(engine.bench.interleaved.measure_run), scored by the speedup. A candidate's score on a rung
is the geometric mean of its speedups there. After each rung the best 1/eta of the
challengers go on, to eta times as many prompts; the current setting (the pair's tuned
values, else the defaults) runs on every rung, so the last rung is a duel of the best
challenger and the current setting on the most prompts, or every tune prompt is used. After
the first rung the cost model prunes settings that cannot pay: a challenger whose runs' cost
model predicts a speedup below 1 at every prompt (a round's costs exceed what its acceptance
returns, even with no overhead) is dropped whatever its rank. The winner is the best
challenger of the last complete rung if it beats the current setting there by ``margin``
(2 %), else the current setting: a tune never swaps the defaults on noise. The budget is spent
trial by trial (each trial's seconds, stored): when a method's share is spent its search
stops at its last complete rung.

**Resume.** Every trial appends one JSON line to DIR/trials.jsonl at once and every
decision is a function of the plan and those rows only (scores, pruning and the budget's
spent seconds all come from stored rows), so a tune stopped and restarted with the same
arguments takes the same decisions as one run straight through, reusing the stored trials.
DIR/run.json holds the arguments; other arguments in the same folder are refused.

**Report.** Each method's winner and its current setting (the pair's tuned values, else the
defaults) run on the report prompts (DIR/report.jsonl, resumable too): speedup min / median /
max per category. DIR/result.json holds winners, rungs and report; the winners are written as
the pair's tuned settings (engine.run.tuned.save_tuned). A report may get its own budget
(``report_budget_s``, spent like the search's by the stored runs' seconds): once spent, the
report keeps the runs it made and says so (``report_complete``), and the winners stand.
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from engine.bench.set_runner import open_run_dir
from engine.bench.sets import SetPrompt, check_prompt_tokens, read_set, set_digest
from engine.core.errors import ConfigError
from engine.run.pacing import own_clock
from engine.tune.space import CURRENT, Candidate, candidates, default_methods

TRIALS, REPORT, RUN_FILE, RESULT = "trials.jsonl", "report.jsonl", "run.json", "result.json"
MAX_MINUTES = 24 * 60


@dataclass(frozen=True)
class TuneSettings:
    """What a tune is asked (the CLI's flags, the app's widgets)."""

    set_path: str
    methods: tuple[str, ...] = ()  # () = engine.tune.space.default_methods()
    minutes: float = 30.0  # the search's budget, all methods together (the report is extra)
    seed: int = 0  # the split's hash and every run's seed
    max_new_tokens: int = 48
    temperature: float | None = None  # None: each method's default (0, or 1 for sampling)
    raw: bool = False  # no chat template
    report_fraction: float = 0.5  # of each category, held out for the report
    report_limit: int | None = 12  # report prompts at most
    first_prompts: int = 2  # tune prompts per candidate on the first rung
    eta: int = 3  # 1/eta of the candidates go on, to eta times the prompts
    margin: float = 0.02  # a challenger replaces the current setting only if this much faster
    approximate: bool = False  # allow approximate methods (their label says so)


@dataclass(frozen=True)
class TunePlan:
    """Checked settings: the split and every method's candidates (no model needed)."""

    settings: TuneSettings
    tune: tuple[SetPrompt, ...]
    report: tuple[SetPrompt, ...]
    spaces: dict[str, tuple[Candidate, ...]] = field(default_factory=dict)

    @property
    def budget_s(self) -> float:
        """Seconds of search per method."""
        return 60.0 * self.settings.minutes / max(len(self.spaces), 1)


@dataclass(frozen=True)
class MethodResult:
    """One method's search: its winner, the rungs it ran and why it stopped."""

    method: str
    winner: Candidate
    score: float | None  # the winner's score on the last complete rung
    current_score: float | None  # the current setting's score on the same (last) rung
    rungs: tuple[dict[str, Any], ...]  # per rung: prompts and candidates with their scores
    stopped: str  # "done" | "budget" | "cancelled"
    pruned: tuple[str, ...] = ()  # labels the cost model dropped


def _order(seed: int, text: str) -> str:
    return hashlib.sha256(f"{seed}:{text}".encode()).hexdigest()


def _interleave(groups: dict[str, list[SetPrompt]]) -> list[SetPrompt]:
    """The categories' prompts in turn (so a rung's first prompts cover the categories)."""
    out, k = [], 0
    while any(k < len(g) for g in groups.values()):
        out += [g[k] for g in groups.values() if k < len(g)]
        k += 1
    return out


def split(rows: list[SetPrompt], fraction: float, seed: int,
          limit: int | None) -> tuple[list[SetPrompt], list[SetPrompt]]:
    """(tune, report): per category, the report takes round(fraction x n) prompts (at least
    one of a category with two or more, never all) in seeded-hash order; each list goes
    through the categories in turn; the report is cut at ``limit``."""
    if not 0 < fraction < 1:
        raise ConfigError(f"report fraction must be in (0, 1), got {fraction}")
    tune: dict[str, list[SetPrompt]] = {}
    report: dict[str, list[SetPrompt]] = {}
    for cat in dict.fromkeys(r.category for r in rows):
        group = sorted((r for r in rows if r.category == cat), key=lambda r: _order(seed, r.id))
        k = min(max(round(fraction * len(group)), 1 if len(group) > 1 else 0), len(group) - 1)
        report[cat], tune[cat] = group[:k], group[k:]
    held = _interleave(report)
    return _interleave(tune), held[:limit] if limit is not None else held


def plan_tune(settings: TuneSettings, current: dict[str, dict[str, Any]]) -> TunePlan:
    """Read the set, split it and list every method's candidates (``current``: method -> the
    pair's tuned values). Every bad setting is one ConfigError line."""
    s = settings
    if not 0 < s.minutes <= MAX_MINUTES:
        raise ConfigError(f"minutes must be in (0, {MAX_MINUTES}], got {s.minutes:g}")
    if s.eta < 2:
        raise ConfigError(f"eta must be >= 2, got {s.eta}")
    if s.first_prompts < 1:
        raise ConfigError(f"first_prompts must be >= 1, got {s.first_prompts}")
    if s.report_limit is not None and s.report_limit < 1:
        raise ConfigError(f"report limit must be >= 1, got {s.report_limit}")
    methods = s.methods or default_methods()
    if len(set(methods)) != len(methods):
        raise ConfigError("a method is listed twice")
    spaces = {m: tuple(candidates(m, current.get(m, {}), common(s, m),
                                  approximate=s.approximate)) for m in methods}
    rows = read_set(s.set_path)
    tune, report = split(rows, s.report_fraction, s.seed, s.report_limit)
    if not tune or not report:
        raise ConfigError(f"{s.set_path}: {len(rows)} prompts are too few to tune on some "
                          "and report on others (give at least two per category)")
    return TunePlan(s, tuple(tune), tuple(report), spaces)


def common(s: TuneSettings, method: str) -> dict[str, Any]:
    """The run settings every trial of the method shares (its default temperature unless
    the tune sets one)."""
    out: dict[str, Any] = {"max_new_tokens": s.max_new_tokens, "seed": s.seed}
    if s.temperature is not None:
        out["temperature"] = s.temperature
    return out


# ------------------------------------------------------------------ trials

Measure = Callable[[Any, SetPrompt, Candidate, dict[str, Any], bool], dict[str, Any]]


def measure_trial(pair, prompt: SetPrompt, cand: Candidate, shared: dict[str, Any],
                  raw: bool) -> dict[str, Any]:
    """One trial: the candidate and its plain generate() call, interleaved; the speedup, the
    cost model's predicted speedup and the trial's own seconds (less any time a caller's
    pacing hook let other work run: engine.run.pacing)."""
    from engine.bench.interleaved import Case, measure_run

    t0 = own_clock()
    row, trace = measure_run(pair, prompt.prompt, Case(cand.label, cand.method,
                                                       {k: str(v) for k, v in cand.params}),
                             raw=raw, common={k: str(v) for k, v in shared.items()},
                             over_tuned=False)  # a candidate is a whole setting
    cost = trace.stats.cost
    return {"speedup": row["speedup"], "identical": row["identical"], "tau": row["tau"],
            "predicted": None if cost is None else cost.predicted_speedup,
            "seconds": own_clock() - t0}


def trial_key(method: str, label: str, prompt_id: str) -> tuple[str, str, str]:
    return method, label, prompt_id


def read_rows(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    text = path.read_text(encoding="utf-8")
    if text and not text.endswith("\n"):  # a line cut short by a stop: run it again
        text = text[:text.rfind("\n") + 1]
        path.write_text(text, encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def run_arguments(pair_names: dict[str, str], plan: TunePlan) -> dict[str, Any]:
    s = asdict(plan.settings)
    s.pop("set_path")
    return json.loads(json.dumps({
        **s, "methods": list(plan.spaces),
        "current": {m: c[0].values for m, c in plan.spaces.items()},
        "tune_sha256": set_digest(list(plan.tune)),
        "report_sha256": set_digest(list(plan.report)), **pair_names}))


def started_from(out_dir: str | Path) -> dict[str, dict[str, Any]] | None:
    """The current settings a tune in DIR started from (None: no tune there yet): a resumed
    tune plans with these, not with the settings its own first run may have stored since."""
    path = Path(out_dir) / RUN_FILE
    try:
        return json.loads(path.read_text())["arguments"]["current"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


class _Trials:
    """The stored trials of a tune (DIR/trials.jsonl) and the one way new ones are made."""

    def __init__(self, out: Path, pair, plan: TunePlan, measure: Measure,
                 progress: Callable[[dict], None], stop: Callable[[], bool]) -> None:
        self.path = out / TRIALS
        self.rows = {trial_key(r["method"], r["label"], r["prompt_id"]): r
                     for r in read_rows(self.path)}
        self.pair, self.plan, self.measure = pair, plan, measure
        self.progress, self.stop = progress, stop
        self.warm: set[str] = set()

    def spent(self, method: str) -> float:
        return sum(r["seconds"] for r in self.rows.values() if r["method"] == method)

    def get(self, cand: Candidate, prompt: SetPrompt) -> dict | None:
        """The trial's row: stored, or measured now; None when the budget or a stop says no
        more trials."""
        key = trial_key(cand.method, cand.label, prompt.id)
        if key in self.rows:
            return self.rows[key]
        if self.spent(cand.method) >= self.plan.budget_s:
            return None
        if self.stop():
            raise _Cancelled
        shared = common(self.plan.settings, cand.method)
        if cand.method not in self.warm:  # one short warm-up run per method, not stored
            self.warm.add(cand.method)
            self.measure(self.pair, prompt, cand, {**shared, "max_new_tokens": 8},
                         self.plan.settings.raw)
        measured = self.measure(self.pair, prompt, cand, shared, self.plan.settings.raw)
        row = {"method": cand.method, "label": cand.label, "params": dict(cand.params),
               "prompt_id": prompt.id, "category": prompt.category, **measured}
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
        self.rows[key] = row
        self.progress(row)
        return row


class _Cancelled(Exception):
    pass


def score(rows: list[dict]) -> float | None:
    """The geometric mean of the trials' speedups (None without a usable one)."""
    vals = [r["speedup"] for r in rows if r.get("speedup")]
    return math.exp(statistics.fmean(math.log(v) for v in vals)) if vals else None


def cannot_pay(rows: list[dict]) -> bool:
    """The cost model predicts a speedup below 1 on every trial (see module docstring)."""
    preds = [r.get("predicted") for r in rows]
    return bool(preds) and all(p is not None and p < 1.0 for p in preds)


def search_method(trials: _Trials, plan: TunePlan, method: str) -> MethodResult:
    """Successive halving for one method (module docstring): the challengers halve rung by
    rung, the current setting runs on every rung, and the last rung is a duel of the best
    challenger and the current setting, which the challenger wins only by ``margin``."""
    s, tune = plan.settings, list(plan.tune)
    current, *challengers = plan.spaces[method]
    n, rungs, pruned, stopped = min(s.first_prompts, len(tune)), [], [], "done"
    last: dict[str, float | None] = {}
    while True:
        prompts, alive = tune[:n], [current, *challengers]
        got: dict[str, list[dict]] = {}
        for cand in alive:
            rows = [trials.get(cand, p) for p in prompts]
            if any(r is None for r in rows):
                stopped = "budget"
                break
            got[cand.label] = rows
        if stopped == "budget":
            break
        last = {c.label: score(got[c.label]) for c in alive}
        rungs.append({"prompts": [p.id for p in prompts], "scores": dict(last)})
        ranked = sorted(challengers, key=lambda c: -(last[c.label] or 0.0))
        if len(rungs) == 1:  # after the first rung: drop what cannot pay
            drop = [c for c in ranked if cannot_pay(got[c.label])]
            pruned = [c.label for c in drop]
            ranked = [c for c in ranked if c not in drop]
        if len(challengers) <= 1 or not ranked or n >= len(tune):
            break  # the duel (or the whole set) is measured
        challengers = ranked[:max(1, math.ceil(len(ranked) / s.eta))]
        n = min(len(tune), n * s.eta)
    if not rungs:  # not even the first rung: keep the current setting
        return MethodResult(method, current, None, None, (), stopped, ())
    best = max((c for c in plan.spaces[method][1:] if c.label in last
                and c.label not in pruned), key=lambda c: last[c.label] or 0.0, default=None)
    mine = last[current.label]
    wins = best is not None and (last[best.label] or 0.0) > (mine or 0.0) * (1 + s.margin)
    winner = best if wins else current
    return MethodResult(method, winner, last[winner.label], mine, tuple(rungs), stopped,
                        tuple(pruned))


# ------------------------------------------------------------------ the whole tune


@dataclass(frozen=True)
class TuneOutcome:
    out_dir: Path
    results: tuple[MethodResult, ...]
    report: dict[str, Any]
    finished: bool
    report_complete: bool = True  # False: the report's own budget cut it (its runs so far)


def run_tune(pair, plan: TunePlan, out_dir: str | Path, *, measure: Measure = measure_trial,
             progress: Callable[[str, dict], None] | None = None,
             cancelled: Callable[[], bool] | None = None,
             pair_names: dict[str, str] | None = None,
             report_budget_s: float | None = None) -> TuneOutcome:
    """Search every method, then report winners and current settings on the held-out part
    (see module docstring). ``progress(phase, row)``: after each new trial ("trial") and each
    new report run ("report"). ``report_budget_s``: the report's seconds (its stored runs',
    like the search's budget); once spent the report stops where it is, the winners stand and
    the outcome says the report is not complete (None: every report run)."""
    s = plan.settings
    names = pair_names or {"target": pair.target_name, "draft": pair.draft_name,
                           "device": pair.device_name}
    if measure is measure_trial:
        check_prompt_tokens(pair, list(plan.tune + plan.report), raw=s.raw,
                            max_new_tokens=s.max_new_tokens)
        from engine.bench.interleaved import compiled_steps

        if compiled_steps(pair):  # compiled and eager trials never share a folder
            names = {**names, "steps": "compiled"}
    out = open_run_dir(out_dir, run_arguments(names, plan), s.set_path)
    report_cb = progress or (lambda phase, row: None)
    stop = cancelled or (lambda: False)
    trials = _Trials(out, pair, plan, measure, lambda row: report_cb("trial", row), stop)
    results = []
    try:
        for method in plan.spaces:
            results.append(search_method(trials, plan, method))
        report, complete = _report(out, pair, plan, results, measure, report_cb, stop,
                                   report_budget_s)
    except _Cancelled:
        return TuneOutcome(out, tuple(results), {}, False)
    result = {"arguments": run_arguments(names, plan), "report_complete": complete, "methods": {
        r.method: {"winner": r.winner.label, "params": r.winner.values, "score": r.score,
                   "current_score": r.current_score, "stopped": r.stopped,
                   "pruned": list(r.pruned), "rungs": list(r.rungs),
                   "spent_s": trials.spent(r.method), "report": report.get(r.method, {})}
        for r in results}}
    (out / RESULT).write_text(json.dumps(result, indent=1))
    return TuneOutcome(out, tuple(results), report, True, complete)


def _report(out: Path, pair, plan: TunePlan, results: list[MethodResult], measure: Measure,
            progress: Callable[[str, dict], None], stop: Callable[[], bool],
            budget_s: float | None = None) -> tuple[dict, bool]:
    """Winner and current setting of each method on the report prompts: speedups per
    category (min / median / max) and over all; and whether every report run was made (the
    budget, spent by the stored runs' seconds, may stop the report: then its runs so far)."""
    path = out / REPORT
    rows = {trial_key(r["method"], r["label"], r["prompt_id"]): r for r in read_rows(path)}
    summary: dict[str, Any] = {}
    complete = True
    for res in results:
        shown = [res.winner] + [c for c in plan.spaces[res.method]
                                if c.label == CURRENT and c.label != res.winner.label]
        per: dict[str, Any] = {}
        for cand in shown:
            got = []
            for p in plan.report:
                key = trial_key(cand.method, cand.label, p.id)
                if key not in rows and budget_s is not None and complete and \
                        sum(r.get("seconds", 0.0) for r in rows.values()) >= budget_s:
                    complete = False
                if key not in rows and not complete:
                    continue
                if key not in rows:
                    if stop():
                        raise _Cancelled
                    shared = common(plan.settings, cand.method)
                    row = {"method": cand.method, "label": cand.label,
                           "params": dict(cand.params), "prompt_id": p.id,
                           "category": p.category,
                           **measure(pair, p, cand, shared, plan.settings.raw)}
                    with path.open("a", encoding="utf-8") as f:
                        f.write(json.dumps(row) + "\n")
                    rows[key] = row
                    progress("report", row)
                got.append(rows[key])
            per[cand.label] = _by_category(got)
        summary[res.method] = per
    return summary, complete


def _by_category(rows: list[dict]) -> dict[str, Any]:
    if not rows:  # a report its budget stopped before this setting ran
        return {"all": None}

    def mmm(rs: list[dict]) -> dict[str, float] | None:
        v = [r["speedup"] for r in rs if r.get("speedup")]
        return {"min": min(v), "median": statistics.median(v), "max": max(v),
                "runs": len(v)} if v else None

    cats = {c: mmm([r for r in rows if r["category"] == c])
            for c in dict.fromkeys(r["category"] for r in rows)}
    return {"all": mmm(rows), **cats,
            "identical": sum(bool(r.get("identical")) for r in rows if
                             r.get("identical") is not None),
            "checked": sum(r.get("identical") is not None for r in rows)}
