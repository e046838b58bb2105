"""The diagnosis over a set (engine.analysis.diagnosis.pool, the bench rows' records,
engine.bench.set_summary, report.html), acceptance by source for the hybrid drafter, and the
set's pooled share of target tokens the drafter could not have proposed."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from engine.analysis import diagnosis_views as dv
from engine.analysis.diagnosis import (
    Bin,
    Diagnosis,
    RejectedToken,
    SourceShare,
    diagnose,
    from_record,
    pool,
    to_record,
)
from engine.bench.report import NO_DIAGNOSIS, report_html
from engine.bench.set_summary import group_summary, replay_cells, summarize_rows
from tests.unit.test_diagnosis import _round, _trace


def _sourced(r, sources):
    """Round r with its drafted nodes' sources set in depth order."""
    nodes = tuple(replace(n, source=sources[n.depth - 1]) if n.q is not None else n
                  for n in r.nodes)
    return replace(r, nodes=nodes)


def test_acceptance_by_source_counts_the_tested_drafts_of_each_source():
    rounds = [_sourced(_round(0, [5, 6, 7], 2), ["lookup", "lookup", "feature"]),
              _sourced(_round(1, [8, 9], 0), ["feature", "feature"])]
    d = diagnose(_trace(rounds))
    assert d.by_source == (SourceShare("lookup", 2, 2), SourceShare("feature", 2, 0))
    assert dv.source_note(d).startswith("Accepted by source: lookup 1.00 of 2; feature 0.00")
    assert diagnose(_trace([_round(0, [5, 6], 1)])).by_source == ()  # one source: none
    assert dv.source_note(diagnose(_trace([_round(0, [5], 1)]))) == ""


def test_the_source_note_reads_which_source_carries_the_run():
    lookup_wins = Diagnosis(40, 24, 5, by_source=(SourceShare("lookup", 20, 18),
                                                  SourceShare("feature", 20, 6)))
    assert "the lookup's drafts carry the run" in dv.source_note(lookup_wins)
    alike = replace(lookup_wins, by_source=(SourceShare("lookup", 20, 10),
                                            SourceShare("feature", 20, 11)))
    assert dv.source_note(alike).endswith("both sources are accepted alike.")
    assert dv.diagnosis_markdown(alike).count("\n- ") == 5  # the source line joins the four


def test_pooled_runs_add_their_counts_bin_by_bin():
    a = [_sourced(_round(0, [5, 6, 7], 2), ["lookup"] * 3), _round(1, [5, 9], 0)]
    b = [_sourced(_round(0, [5, 6], 1), ["feature"] * 2), _round(1, [7], 0)]
    pooled = pool([diagnose(_trace(a)), diagnose(_trace(b))])
    both = diagnose(_trace(a + b))  # the same drafts in one run (positions aside)
    assert (pooled.tested, pooled.accepted, pooled.runs) == (both.tested, both.accepted, 2)
    assert pooled.by_entropy == both.by_entropy
    assert [(t.token_id, t.count) for t in pooled.rejected] == [
        (t.token_id, t.count) for t in both.rejected]
    assert pooled.rejected[0].mean_q == pytest.approx(both.rejected[0].mean_q)
    assert pooled.by_source == (SourceShare("lookup", 3, 2), SourceShare("feature", 2, 1))
    assert sum(x.tested for x in pooled.by_position) == pooled.tested
    assert pool([]) is None


def test_pooled_calibration_weights_each_bins_mean_q_by_its_drafts():
    one = Diagnosis(4, 2, 3, calibration=(Bin(0.9, 1.0, 2, 2, 0.9),),
                    calibration_source="controller")
    two = Diagnosis(8, 2, 5, calibration=(Bin(0.9, 1.0, 6, 2, 0.98),),
                    calibration_source="tests")
    p = pool([one, two])
    assert p.calibration == (Bin(0.9, 1.0, 8, 4, pytest.approx(0.96)),)
    assert p.calibration_source == "mixed" and p.prompt_tokens == 4
    assert pool([one, one]).calibration_source == "controller"


def test_a_record_is_strict_json_and_reads_back_the_same():
    d = Diagnosis(10, 4, 7, by_entropy=(Bin(2.0, math.inf, 3, 1, 2.5),),
                  rejected=(RejectedToken(5, "x", 2, 0.1, 0.9),),
                  by_source=(SourceShare("lookup", 3, 1),), calibration_source="tests")
    text = json.dumps(to_record(d), allow_nan=False)  # no Infinity in results.jsonl
    assert from_record(json.loads(text)) == d


def _row(case, category, diagnosis=None, replay=None):
    row = {"case": case, "category": category, "new_tokens": 4, "target_calls": 2,
           "drafted_depth": [2, 1], "accepted_depth": [1, 0], "speedup": 1.0,
           "identical": True, "reference": "generate(greedy, width=1)"}
    if diagnosis is not None:
        row["diagnosis"] = to_record(diagnosis)
    if replay is not None:
        row["replay"] = replay
    return row


D1 = Diagnosis(3, 2, 6, by_position=(Bin(0, 32, 3, 2, 1.0),))
D2 = Diagnosis(5, 1, 8, by_position=(Bin(0, 32, 5, 1, 4.0),))


def test_the_set_summary_pools_the_rows_that_carry_a_diagnosis():
    g = group_summary([_row("sd", "chat", D1), _row("sd", "code", D2), _row("sd", "code")])
    d = from_record(g["diagnosis"])
    assert (d.tested, d.accepted, d.runs) == (8, 3, 2)  # the third row (older) carries none
    assert group_summary([_row("sd", "chat")])["diagnosis"] is None


def test_report_html_shows_each_methods_diagnosis_or_says_there_is_none():
    rows = [_row("sd", "chat", D1), _row("sd", "code", D2), _row("mcsd", "chat", D1)]
    summary = {"meta": {"set": "s.jsonl"}, "methods": summarize_rows(rows, ["sd", "mcsd"])}
    page = report_html(summary, rows)
    assert "Diagnosis over the set" in page and page.count('class="plotly-graph-div"') == 8
    assert "<b>Diagnosis</b> of sd: 8 tested drafts over 2 runs" in page
    assert "<i>Position</i>" in page and NO_DIAGNOSIS not in page
    old = [_row("sd", "chat")]
    page = report_html({"meta": {}, "methods": summarize_rows(old, ["sd"])}, old)
    assert NO_DIAGNOSIS in page and page.count('class="plotly-graph-div"') == 4


def test_the_set_figures_draw_one_series_per_method():
    fig = dv.position_figure({"sd": D1, "mcsd": D2})
    assert [t.name for t in fig.data] == ["sd", "mcsd"] and fig.layout.barmode == "group"
    assert "One source" in dv.source_figure({"sd": D1}).layout.annotations[0].text


def test_the_set_replay_table_pools_the_unproposable_share():
    rep = {"best_fixed": "sd gamma=2", "best_fixed_speedup": 1.5, "bound_speedup": 2.0,
           "own_speedup": 1.2, "standing": 0.1, "exact": True}
    rows = [_row("sd", "chat", replay={**rep, "positions": 10, "not_first": 2,
                                       "not_top": 1, "no_law": 0, "top": 4}),
            _row("sd", "chat", replay={**rep, "positions": 30, "not_first": 10,
                                       "not_top": 3, "no_law": 1, "top": 4}),
            _row("sd", "chat", replay=rep)]  # replayed before the share was counted
    g = group_summary(rows)["replay"]
    assert g["runs"] == 3 and g["not_first_share"] == 12 / 40 and g["not_top_share"] == 0.1
    cells = replay_cells([{"method": "sd", "categories": {"all": {"replay": g}}}])
    assert cells[0][-1] == "30% / 10% (top 4)"
    old = group_summary([_row("sd", "chat", replay=rep)])["replay"]
    assert old["not_first_share"] is None
    assert replay_cells([{"method": "sd", "categories": {"all": {"replay": old}}}])[0][-1] \
        == "n/a"
