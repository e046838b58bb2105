"""Aggregation of a set benchmark's result rows, per method and per category (and "all").

Pure functions over rows (dicts, one per (prompt, method, repeat), as the runner writes them
to results.jsonl). A row carries its rounds as two lists: ``drafted_depth`` (a round's
``RoundTrace.drafted``: the chain length, tree depth or beam depth it drafted) and
``accepted_depth`` (its ``RoundTrace.accepted``: the accepted drafts on the committed path,
for a tree the deepest accepted depth, for beams the accepted verified steps).

- tau: committed tokens per target call, as ``RunTrace.stats`` defines it, pooled over the
  rows (their new tokens over their target calls);
- acceptance at draft position j = 1.. (as vLLM reports it): rounds that accepted a token at
  depth j over rounds that drafted a depth j;
- accepted length per round: how many drafting rounds accepted 0, 1, 2, ... drafts (rounds
  that drafted nothing, e.g. a lookup without a match, are counted apart);
- speedup over the plain decode (the matching generate() call) min / median / max, identical
  runs where the method claims identity (temperature 0), the cost model's efficiency
  (measured / predicted speedup) median;
- the median of each row's ``projected_h100``: the speedup the stored H100 costs would give
  at the run's own tokens per round (engine.run.costs, projection): a projection, not a
  measurement (None where no row has one);
- the diagnosis (engine.analysis.diagnosis) of the rows that carry one, pooled: acceptance
  by position, target entropy, q (calibration), source, and the most rejected tokens (None
  where no row carries one: rows written before rows kept it);
- with bench-set --replay, the replayed rows' medians and the pooled share of target tokens
  the drafter's first draft could not have proposed.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from engine.analysis.diagnosis import from_record, pool, to_record
from engine.contract.trace import RoundTrace

ALL = "all"


def round_record(rounds: Sequence[RoundTrace], new_tokens: int) -> dict[str, Any]:
    """The per-round numbers a result row keeps of a run (``new_tokens``: the run's
    ``stats.new_tokens``)."""
    return {"new_tokens": new_tokens, "target_calls": sum(r.target_calls for r in rounds),
            "drafted_depth": [r.drafted for r in rounds],
            "accepted_depth": [r.accepted for r in rounds]}


def tau(rows: Sequence[dict]) -> float | None:
    """Committed tokens per target call over the rows (None: no target call)."""
    calls = sum(r["target_calls"] for r in rows)
    return sum(r["new_tokens"] for r in rows) / calls if calls else None


def position_counts(rows: Sequence[dict]) -> tuple[list[int], list[int]]:
    """(accepted, drafted): index j-1 holds the rounds that accepted / drafted depth j."""
    accepted: list[int] = []
    drafted: list[int] = []
    for row in rows:
        for d, a in zip(row["drafted_depth"], row["accepted_depth"]):
            for counts, upto in ((drafted, d), (accepted, min(a, d))):
                counts.extend([0] * (upto - len(counts)))
                for j in range(upto):
                    counts[j] += 1
    accepted.extend([0] * (len(drafted) - len(accepted)))
    return accepted, drafted


def acceptance_per_position(rows: Sequence[dict]) -> list[float]:
    """Acceptance at draft positions 1, 2, ... (index 0 = position 1)."""
    accepted, drafted = position_counts(rows)
    return [a / n for a, n in zip(accepted, drafted)]


def accepted_length_histogram(rows: Sequence[dict]) -> list[int]:
    """Index k: the drafting rounds that accepted k drafts."""
    hist: list[int] = []
    for row in rows:
        for d, a in zip(row["drafted_depth"], row["accepted_depth"]):
            if d > 0:
                hist.extend([0] * (a + 1 - len(hist)))
                hist[a] += 1
    return hist


def undrafted_rounds(rows: Sequence[dict]) -> int:
    """Rounds that drafted nothing (baselines, a lookup without a match)."""
    return sum(d == 0 for row in rows for d in row["drafted_depth"])


def spread(values: Sequence[float | None]) -> dict[str, float] | None:
    """min / median / max of the values that are not None (None when there are none)."""
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    return {"min": min(vals), "median": statistics.median(vals), "max": max(vals)}


def identity(rows: Sequence[dict]) -> str | None:
    """'k/n': identical runs of those that claim identity; None when none claims it."""
    claims = [r["identical"] for r in rows if r.get("identical") is not None]
    return f"{sum(claims)}/{len(claims)}" if claims else None


def group_summary(rows: Sequence[dict]) -> dict[str, Any]:
    """Every statistic of the module docstring over one group of rows."""
    accepted, drafted = position_counts(rows)
    eff = spread([r.get("efficiency") for r in rows])
    projected = spread([r.get("projected_h100") for r in rows])
    return {
        "runs": len(rows), "tau": tau(rows),
        "acceptance_per_position": [a / n for a, n in zip(accepted, drafted)],
        "drafts_per_position": drafted,
        "accepted_length_histogram": accepted_length_histogram(rows),
        "undrafted_rounds": undrafted_rounds(rows),
        "speedup": spread([r.get("speedup") for r in rows]),
        "identical": identity(rows),
        "efficiency_median": eff["median"] if eff else None,
        "projected_h100_median": projected["median"] if projected else None,
        "replay": replay_summary(rows),
        "diagnosis": pooled_diagnosis(rows),
    }


def pooled_diagnosis(rows: Sequence[dict]) -> dict[str, Any] | None:
    """The rows' diagnoses pooled (engine.analysis.diagnosis.pool), as JSON; None when no
    row carries one."""
    done = [from_record(r["diagnosis"]) for r in rows if r.get("diagnosis")]
    return to_record(pool(done)) if done else None


def replay_summary(rows: Sequence[dict]) -> dict[str, Any] | None:
    """Medians of the rows' hindsight replays (bench-set --replay): the best fixed length's
    speedup, the clairvoyant bound's, the runs' own; the best fixed length most often best;
    None when no row was replayed."""
    done = [r["replay"] for r in rows if r.get("replay")]
    if not done:
        return None
    labels = [d["best_fixed"] for d in done]
    probed = [d for d in done if "positions" in d]  # rows replayed before it was counted
    positions = sum(d["positions"] for d in probed)
    return {"runs": len(done), "best_fixed": max(dict.fromkeys(labels), key=labels.count),
            **{f"{k}_median": statistics.median(d[k] for d in done)
               for k in ("best_fixed_speedup", "bound_speedup", "own_speedup")},
            # pooled over the positions of the rows that counted them (None: none did)
            "not_first_share": sum(d["not_first"] for d in probed) / positions
            if positions else None,
            "not_top_share": sum(d["not_top"] for d in probed) / positions
            if positions else None,
            "top": max((d["top"] for d in probed), default=None)}


REPLAY_HEAD = ("method", "category", "replayed runs", "own (predicted) ×",
               "best fixed length (most often)", "best fixed ×", "clairvoyant bound ×",
               "not proposable: first draft / top-k")


def replay_cells(summary: Sequence[dict]) -> list[list[str]]:
    """The replay medians as table rows of text (REPLAY_HEAD); none without replays."""
    out = []
    for m in summary:
        for cat, g in m["categories"].items():
            r = g.get("replay")
            if r:
                out.append([m["method"], cat, str(r["runs"]), _num(r["own_speedup_median"]),
                            r["best_fixed"], _num(r["best_fixed_speedup_median"]),
                            _num(r["bound_speedup_median"]), _unproposable(r)])
    return out


def _unproposable(r: dict) -> str:
    if r.get("not_first_share") is None:
        return "n/a"
    top = f" / {r['not_top_share']:.0%} (top {r['top']})" if (r.get("top") or 1) > 1 else ""
    return f"{r['not_first_share']:.0%}{top}"


def summarize_rows(rows: Sequence[dict], labels: Sequence[str]) -> list[dict[str, Any]]:
    """One entry per method label: its reference and, per category ("all" first, then the
    categories in order of first appearance), :func:`group_summary`."""
    cats = [ALL, *dict.fromkeys(r["category"] for r in rows)]
    out = []
    for label in labels:
        mine = [r for r in rows if r["case"] == label]
        groups = {c: group_summary([r for r in mine if c == ALL or r["category"] == c])
                  for c in cats}
        out.append({"method": label,
                    "reference": mine[0]["reference"] if mine else None,
                    "categories": {c: g for c, g in groups.items() if g["runs"]}})
    return out


SUMMARY_HEAD = ("method", "category", "runs", "tau", "speedup min / med / max",
                "acceptance at position 1, 2, ...",
                "drafting rounds that accepted 0, 1, 2, ...", "identical",
                "measured / cost model", "H100 (projected) ×, median")


def _num(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.2f}"


def _mmm(s: dict[str, float] | None) -> str:
    return "n/a" if s is None else f"{s['min']:.2f} / {s['median']:.2f} / {s['max']:.2f}"


def summary_cells(summary: Sequence[dict]) -> list[list[str]]:
    """The summary as table rows of text, one per method and category (SUMMARY_HEAD)."""
    out = []
    for m in summary:
        for cat, g in m["categories"].items():
            out.append([
                m["method"], cat, str(g["runs"]), _num(g["tau"]), _mmm(g["speedup"]),
                " ".join(f"{a:.2f}" for a in g["acceptance_per_position"]) or "-",
                " ".join(map(str, g["accepted_length_histogram"])) or "-",
                g["identical"] or "n/a", _num(g["efficiency_median"]),
                _num(g.get("projected_h100_median"))])
    return out


def summary_markdown(summary: Sequence[dict], meta: dict[str, Any]) -> str:
    """The summary as one markdown table under a line of settings."""
    lines = ["| " + " | ".join(SUMMARY_HEAD) + " |", "|---" * len(SUMMARY_HEAD) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in summary_cells(summary)]
    if replayed := replay_cells(summary):
        lines += ["", REPLAY_NOTE, "", "| " + " | ".join(REPLAY_HEAD) + " |",
                  "|---" * len(REPLAY_HEAD) + "|"]
        lines += ["| " + " | ".join(row) + " |" for row in replayed]
    info = ", ".join(f"{k}={v}" for k, v in meta.items())
    return f"{info}\n\n" + "\n".join(lines) + "\n"


REPLAY_NOTE = ("Hindsight replay (medians over the temperature-0 runs, engine replay): the "
               "speedup the pair's measured costs predict for each run's own rounds, for the "
               "best fixed draft length and for a clairvoyant length controller on the same "
               "committed text. Not proposable: the share of the target's tokens (pooled over "
               "the runs' positions) that were not the drafter's first draft from their "
               "prefix, or not in its top k: no draft length or controller gets those "
               "accepted at depth 1, only a better drafter does.")
