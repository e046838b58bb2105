"""Round panel: the numbers of one round as tables and markdown (pure functions).

Verification table (tests in order with p, q, ratio, uniform draw, decision, residual mass),
beam sets before/after with scores, the beam match table of beam methods (the target's top-K
at each verified step, drafted or not, and why the step passed or stopped), method extras
(DSBD width decision, optimal acceptance next to the achieved one), and run-level statistics.
Absent fields render as "—".
"""

from __future__ import annotations

import json
import re
from dataclasses import fields, is_dataclass
from typing import Any

from engine import METHODS
from engine.cli.cost_text import ACCEPTANCE, TAU, cost_sentence
from engine.contract.records import CostRecord, GateRecord, SwitchPlan
from engine.contract.trace import ORIGIN_ACCEPTED, RoundTrace, RunTrace
from engine.control.config import CONTROL_PARAMS
from engine.core.errors import SpecvizError
from specviz.figures import plural, round_counts
from specviz.forest_view import token_label, vocab_of

TEST_HEADERS = ["#", "tree", "depth", "node", "token", "p (target)", "q (draft)",
                "ratio", "uniform u", "decision", "residual mass", "note"]
BEAM_HEADERS = ["set", "beam", "score", "finished", "last tokens"]
MATCH_HEADERS = ["step", "target beam", "text", "score", "drafted?", "accepted?",
                 "drafts in top-K", "reason"]


def _num(x: Any) -> str:
    if x is None:
        return "—"
    if isinstance(x, bool):
        return str(x)
    if isinstance(x, (int, float)):
        return f"{x:.4g}"
    return str(x)


def _round(trace: RunTrace, index: int) -> RoundTrace:
    return trace.rounds[min(max(index, 0), len(trace.rounds) - 1)]


def test_rows(trace: RunTrace | None, index: int) -> list[list[str]]:
    """One row per TestRecord of the round, in test order."""
    if trace is None or not trace.rounds:
        return []
    r = _round(trace, index)
    text = {(n.tree, n.id): n.text for n in r.nodes}
    vocab = vocab_of(trace)
    rows = []
    for i, t in enumerate(r.tests):
        tok = text.get((t.tree, t.node), vocab.get(t.token_id, f"<{t.token_id}>"))
        rows.append([str(i), str(t.tree), str(t.depth), str(t.node), token_label(tok),
                     _num(t.p), _num(t.q), _num(t.ratio), _num(t.uniform), t.decision,
                     _num(t.residual_mass), t.note])
    return rows


def beam_rows(trace: RunTrace | None, index: int) -> list[list[str]]:
    """Beam sets before and after the round (empty for single-sequence methods)."""
    if trace is None or not trace.rounds:
        return []
    r = _round(trace, index)
    if len(r.beams_before) <= 1 and len(r.beams_after) <= 1:
        return []
    vocab = vocab_of(trace)
    rows = []
    for name, beams in (("before", r.beams_before), ("after", r.beams_after)):
        for i, b in enumerate(beams):
            tail = "".join(vocab.get(t, f"<{t}>") for t in b.token_ids[-8:])
            rows.append([name, str(i), _num(b.score), "yes" if b.finished else "",
                         tail.replace("\n", "↵")])
    return rows


def beam_match_rows(trace: RunTrace | None, index: int) -> list[dict[str, str]]:
    """One row per target top-K beam per verified step of a beam method (step, drafts in
    top-K and reason on the step's first row); empty for other methods."""
    if trace is None or not trace.rounds:
        return []
    rows = []
    for s in _round(trace, index).beam_steps:
        ok = {"bonus": "bonus", "target": "—"}.get(s.kind, "yes" if s.accepted else "no")
        hits = f"{sum(m.rank > 0 for m in s.drafted)}/{len(s.drafted)}" if s.drafted else "—"
        for i, b in enumerate(s.target_beams):
            score = f"{b.score:.4g}" + (f" (p {b.p:.3g})" if b.p is not None else "")
            rows.append({"step": str(s.depth) if i == 0 else "", "target beam": f"#{b.rank}",
                         "text": _text(b.text), "score": score,
                         "drafted?": f"yes (beam {b.tree}, node {b.node})" if b.node >= 0 else "no",
                         "accepted?": ok, "drafts in top-K": hits if i == 0 else "",
                         "reason": s.reason if i == 0 else ""})
    return rows


def _text(text: str, limit: int = 28) -> str:
    t = repr(text if len(text) <= limit else "…" + text[-(limit - 1):])
    return t.replace("`", "ˋ")


def beam_match_markdown(trace: RunTrace | None, index: int) -> str:
    """The beam match table (empty when the round has no beam steps)."""
    rows = beam_match_rows(trace, index)
    if not rows:
        return ""
    return ("**Beam match**: the target's top-K beams at each verified step, whether each was "
            "drafted, and why the step passed or stopped\n\n"
            + dict_table(rows, MATCH_HEADERS, max_rows=96))


def _cell(v: Any) -> str:
    """Compact table cell: numbers to 3 digits, short number lists inline, nesting elided."""
    if v is None:
        return "—"
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return f"{v:.3g}"
    if isinstance(v, list) and all(isinstance(x, (int, float)) for x in v):
        shown = ", ".join(f"{x:.3g}" for x in v[:6])
        return "[" + shown + (f", … {len(v) - 6} more" if len(v) > 6 else "") + "]"
    if isinstance(v, dict):  # nesting elided, its size said (the trace JSON holds it)
        return f"{{{plural(len(v), 'key')}}}"
    if isinstance(v, list):
        return f"[{plural(len(v), 'item')}]"
    return str(v).replace("|", "\\|")


def dict_table(rows: list[dict[str, Any]], columns: list[str] | None = None,
               max_rows: int = 16) -> str:
    """Markdown table of a list of dicts (columns: the union of keys, in first-seen order)."""
    cols = columns or list(dict.fromkeys(k for r in rows for k in r))
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows[:max_rows]:
        lines.append("| " + " | ".join(_cell(r.get(c)) if c in r else "—" for c in cols)
                     + " |")
    if len(rows) > max_rows:
        lines.append(f"\n*{len(rows) - max_rows} more rows not shown*")
    return "\n".join(lines)


def _is_table(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(x, dict) for x in v)


def _optimal(rows: Any) -> str:
    """Optimal acceptance alpha* next to the achieved (and expected) one, per position."""
    if not _is_table(rows):
        return ""
    if "depth" not in rows[0]:
        rows = [{"position": i, **r} for i, r in enumerate(rows)]
    lead = [c for c in ("position", "depth", "parent", "alpha_star", "achieved", "expected")
            if c in rows[0]]
    cols = lead + [k for k in dict.fromkeys(k for r in rows for k in r) if k not in lead]
    return "**Optimal acceptance vs achieved** (Hu et al.)\n\n" + dict_table(rows, cols)


def _width(extras: dict[str, Any]) -> str:
    keys = [k for k in extras if "width" in k.lower()]
    parts = []
    for k in keys:
        v = extras[k]
        if _is_table(v):
            parts.append(f"**Width decision** (`{k}`, DSBD Eq. 5-7)\n\n" + dict_table(v))
        else:
            parts.append(f"**Width decision**: {k} = `{_short(v)}`")
    return "\n\n".join(parts)


def gate_markdown(gate: GateRecord | None) -> str:
    """The beam methods' draft-confidence gate: why the round drafted or ran a plain step."""
    if gate is None or gate.confidence is None:
        return ""
    c, least = _num(gate.threshold), _num(gate.confidence)
    if gate.drafted:
        return (f"**Draft gate**: drafted: every live beam's likeliest draftable token has "
                f"q >= {c} (least {least})")
    return (f"**Draft gate**: not drafted: a live beam's likeliest draftable token has "
            f"q = {least} < {c}, so the round is a plain target step")


CONTEXTS = {  # the cost switch's contexts (SwitchPlan.context): what each means
    "lookup": ("Context `lookup`: the committed text ends in a suffix that occurred before, "
               "so the drafts copy what followed it (no drafter forward while they recur)"),
    "feature": ("Context `feature`: no recurring suffix, so the feature drafter's model "
                "drafts"),
}


def switch_markdown(rec: SwitchPlan | None, drafted: int) -> str:
    """The cost switch's plan: the chosen depth, its predicted gain, every option."""
    if rec is None:
        return ""
    d = rec.depth
    what = "a plain target step" if d == 0 else f"draft to depth {d}"
    if rec.probe:
        what = ("a probe: every depth planned below a plain step (at the run's first plain "
                "plan, or after a stretch of plain rounds), so it drafts to depth 1 to learn "
                "its acceptance")
    # a rest holds every later round of the run, or of its context where the switch plans
    # contexts apart (then the other context may still draft)
    if rec.context is None:
        later, where, held_end, rest_end = ("every later round", "", " and no drafter runs",
                                            " and nothing is drafted")
    else:
        later = (f"every later round in the `{rec.context}` context (the other context plans "
                 "its own)")
        where, held_end, rest_end = f" in the `{rec.context}` context", "", ""
    if rec.held:
        what = (f"a plain target step: drafting to the best depth would pay this round, but "
                f"the drafter must first read the committed tokens it has not cached "
                f"({_num(rec.catch_up)} plain steps), more than the rest of the run would save")
        if rec.rest:
            what += (f"; nothing can change that before a draft, so {later} is held too (its "
                     f"catch-up only grows){held_end}")
    if rec.rest and not rec.held and not rec.never:
        what = (f"a plain target step for the rest of the run{where}: at the prior's "
                "acceptance no depth pays, no probe can start (one would cost more than it "
                "could teach, probes are off, or the drafter's start would not be repaid), "
                f"and without a draft nothing moves the prior, so {later} is planned the "
                f"same{rest_end}")
    if rec.never:
        what = (f"a plain target step for the rest of the run{where}: no depth would pay even "
                "if every draft were accepted (the options below are priced at acceptance 1), "
                + ("so no drafter runs" if rec.context is None else
                   f"so {later} is plain (its drafts cost more than they could add)"))
    if rec.guard == "timing":
        what = ("a plain target step to time one: the switch planned a draft, and the timed "
                "guard compares this context's drafted rounds with the run's plain rounds by "
                "the clock before it lets more through")
    elif rec.guard == "slower":
        what = (f"a plain target step for the rest of the run{where}: the switch planned a "
                "draft, but the timed guard found this context's drafted rounds committing "
                "fewer tokens a second than the run's plain rounds")
    head = (f"**Cost switch** (profile `{rec.profile}`): {what}, predicted "
            f"{_num(rec.predicted_gain)}x tokens per target-step time of a plain step; "
            f"drafted {drafted}. Acceptance drawn per depth: "
            f"`{', '.join(_num(a) for a in rec.drawn)}`")
    if rec.context is not None:
        head += "\n\n" + CONTEXTS.get(rec.context, f"Context `{rec.context}`") + (
            ": the switch planned this round with this context's own acceptance posterior")
    rows = [{"depth": o.depth, "expected tokens": o.expected_tokens,
             "cost (plain steps)": o.cost, "gain": o.gain,
             "chosen": "✔" if o.depth == d else ""} for o in rec.options]
    return head + "\n\n" + dict_table(rows)


def _short(v: Any, limit: int = 120) -> str:
    s = v if isinstance(v, str) else json.dumps(v, default=str)
    return s if len(s) <= limit else s[: limit - 1] + "…"


def _empty(v: Any) -> bool:
    return v is None or (isinstance(v, (tuple, list, dict)) and not v)


def _plain(v: Any) -> Any:
    """JSON-like form of an extras value for the generic listing: a record becomes the dict
    of its non-empty fields (None / empty left out), tuples become lists; free-form dicts
    keep every key."""
    if is_dataclass(v) and not isinstance(v, type):
        return {f.name: _plain(x) for f in fields(v)
                if not _empty(x := getattr(v, f.name))}
    if isinstance(v, (tuple, list)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    return v


def extras_markdown(trace: RunTrace | None, index: int) -> str:
    """Method-specific numbers of the round: width decision, optimal acceptance, the rest
    (lists of records as tables, scalars inline), then the controller's posterior step."""
    if trace is None or not trace.rounds:
        return ""
    r = _round(trace, index)
    ex = _plain(r.extras)  # the non-empty fields of the round's RoundExtras
    ex.pop("gate", None)
    parts = [p for p in (switch_markdown(r.switch, r.drafted),
                         gate_markdown(r.extras.gate), beam_match_markdown(trace, index),
                         _width(ex), _optimal(ex.pop("optimal", None))) if p]
    rest = {k: v for k, v in ex.items() if "width" not in k.lower()}
    inline = {k: v for k, v in rest.items() if not _is_table(v)}
    if inline:
        parts.append("**Extras**: " + ", ".join(f"{k} = `{_short(v)}`"
                                                for k, v in inline.items()))
    parts += [f"**{k}**\n\n" + dict_table(v) for k, v in rest.items() if _is_table(v)]
    if r.controller is not None and r.controller.kind != "cost":
        c = r.controller
        parts.append(f"**Controller** `{c.kind or '?'}`: before `{_short(c.before)}`"
                     f" → after `{_short(c.after)}`, stop: {c.stop_reason or '—'}")
    return "\n\n".join(parts)


def round_markdown(trace: RunTrace | None, index: int) -> str:
    """One-line header of the selected round."""
    if trace is None or not trace.rounds:
        return "**No trace yet.** Run a method, or import a trace JSON."
    r = _round(trace, index)
    c = round_counts(r)
    toks = "".join(t.text for t in r.committed)
    ms = ", ".join(f"{k} {1000 * v:.1f} ms" for k, v in r.timings.items())
    calls = f"{r.draft_calls}" + (  # each draft forward (the first also catches up)
        " (" + ", ".join(f"{1000 * s:.1f}" for s in r.draft_seconds) + " ms)"
        if r.draft_seconds else "")
    return (f"**Round {r.index}** of {len(trace.rounds)} · {c.drafted_phrase} · "
            f"{c.committed_phrase} `{toks!r}` · target calls {r.target_calls}, draft calls "
            f"{calls}" + (f" · {ms}" if ms else ""))


def run_markdown(trace: RunTrace | None, live: bool = False, source: str = "") -> str:
    """Run-level summary: method, the parameters that shaped the run, models, device and the
    engine's statistics, each figure under its one name (engine.cli.cost_text)."""
    if trace is None:
        return ""
    s = trace.stats
    state = "running…" if live else (trace.stop_reason or "done")
    origin = {"demo": "recorded demo trace", "import": "imported trace"}.get(source, "")
    shown, hidden = shown_params(trace)
    tuned = set(trace.tuned_names)  # taken from the pair's measured best settings
    params = ", ".join(f"{k}={v}" + (" (tuned)" if k in tuned else "") for k, v in shown)
    if hidden:
        params += f"; {plural(hidden, 'other')} at {'its' if hidden == 1 else 'their'} " \
                  "default or unused by the run's controller"
    return (
        f"**{trace.method}** ({params}) · target `{trace.target}` · draft "
        f"`{drafter_of(trace) or '—'}` · {device_text(trace.device)}"
        + (f" · *{origin}*" if origin else "")
        + f"\n\n{len(trace.token_ids)} tokens in {len(trace.rounds)} rounds ({state}) · "
        f"{acceptance_text(trace)} · {TAU} {_num(s.tau)} tokens per target call · "
        f"target calls {_num(s.target_calls)} · draft calls {_num(s.draft_calls)} · wall "
        f"{_num(s.wall_s)} s · {_num(s.tokens_per_s)} tok/s" + cost_markdown(s.cost)
    )


def acceptance_text(trace: RunTrace) -> str:
    """The run's acceptance with what it divides (tokens, or a beam method's steps)."""
    s = trace.stats
    if not s.drafted:
        return f"{ACCEPTANCE} — (nothing drafted)"
    steps = any(round_counts(r).steps for r in trace.rounds)
    what = "drafted steps passed" if steps else "drafted tokens accepted"
    text = f"{ACCEPTANCE} {_num(s.acceptance_rate)} ({s.accepted} of {s.drafted} {what})"
    kept = trace.token_origins.count(ORIGIN_ACCEPTED)
    if steps and kept > s.accepted:  # a sampled beam step keeps its accepted drafts
        text += (f"; the text's {kept} accepted tokens include drafts a step kept without "
                 "passing (the rest of it drawn from the residual)")
    return text


def drafter_of(trace: RunTrace) -> str:
    """The drafter the run drafted with: a round's own record of it (eesd drafts with the
    target's early exit, whatever the pair's drafter is), else the trace's."""
    own = next((r.extras.drafter for r in trace.rounds if r.extras.drafter), None)
    return own or trace.draft


def device_text(device: str) -> str:
    """The device as the engine names it, its thread count in the singular for one."""
    return re.sub(r"\b1 threads\b", "1 thread", device)


def controller_reads(trace: RunTrace) -> set[str] | None:
    """The settings the run's controller read (its rounds' ControllerState.config); None
    when no round recorded a controller."""
    configs = [r.controller.config for r in trace.rounds if r.controller is not None]
    return set().union(*configs) if configs else None


def shown_params(trace: RunTrace) -> tuple[list[tuple[str, Any]], int]:
    """The parameters worth a line: every everyday one, and an advanced one that is tuned or
    off its default, unless it is a controller setting the run's controller did not read;
    with how many were left out. An unknown method's are all shown."""
    params = dict(trace.params or {})
    spec = METHODS.get(trace.method)
    if spec is None:
        return list(params.items()), 0
    rows = {p.name: p for p in spec.all_params}
    reads, tuned = controller_reads(trace), set(trace.tuned_names)
    shown = []
    for k, v in params.items():
        p = rows.get(k)
        ignored = reads is not None and k in CONTROLLER_SETTINGS and k not in reads
        quiet = p is not None and p.advanced and k not in tuned and _same(p, v, p.default)
        if p is None or not (ignored or quiet):
            shown.append((k, v))
    return shown, len(params) - len(shown)


CONTROLLER_SETTINGS = {p.name for p in CONTROL_PARAMS} - {"controller", "switch"}


def _same(p, a: Any, b: Any) -> bool:
    try:
        return p.parse(a) == p.parse(b)
    except SpecvizError:
        return False


def cost_markdown(cost: CostRecord | None) -> str:
    """The run's cost model (engine.run.costs): predicted vs measured speedup and why."""
    text = cost_sentence(cost)
    return f"\n\n**Cost model**: {text}." if text else ""
