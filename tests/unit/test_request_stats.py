"""The per-request speculative stats (vLLM's shape) mean what docs/cli.md says they mean."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

from engine.contract.records import RunSummary
from engine.contract.trace import RoundTrace, summarize

CLI_DOC = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def _rounds(drafted_accepted: list[tuple[int, int]]) -> list[RoundTrace]:
    return [RoundTrace(index=i, drafted=d, accepted=a, target_calls=1)
            for i, (d, a) in enumerate(drafted_accepted)]


def test_histogram_counts_drafting_rounds_by_accepted_drafts():
    # (drafted, accepted) per round; the plain rounds (0, 0) are no verification step
    s = summarize(_rounds([(0, 0), (3, 3), (3, 0), (0, 0), (2, 1), (3, 3), (1, 0)]), 12)
    assert s.acceptance_histogram == (2, 1, 0, 2)  # j = 0, 1, 2, 3
    assert s.per_step_accepted == (3, 0, 1, 3, 0)
    assert s.per_step_drafted == (3, 3, 2, 3, 1)


def test_histogram_agrees_with_the_run_totals():
    s = summarize(_rounds([(4, 2), (4, 4), (0, 0), (2, 0), (4, 1), (1, 1)]), 14)
    h = s.acceptance_histogram
    assert len(h) == 1 + max(s.per_step_drafted) == 5  # dense: j = 0 .. the longest draft
    assert sum(h) == len(s.per_step_accepted) == 5  # one entry per drafting round
    assert sum(j * n for j, n in enumerate(h)) == s.accepted == sum(s.per_step_accepted)
    assert sum(s.per_step_drafted) == s.drafted
    # vLLM's mean_acceptance_length: 1 + accepted drafts per verification step
    assert s.mean_accepted_per_round == sum(s.per_step_accepted) / len(s.per_step_accepted)


def test_a_run_that_never_drafted_has_an_empty_histogram():
    s = summarize(_rounds([(0, 0)] * 4), 4)
    assert s.acceptance_histogram == () and s.per_step_accepted == ()
    assert s.per_step_drafted == ()


def test_every_stats_field_is_documented_and_nothing_else():
    text = CLI_DOC.read_text()
    section = text.split("#### The run's statistics (`stats`)", 1)[1].split("\n#", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    documented = {name for line in rows
                  for name in re.findall(r"`([a-z_]+)`", line.split("|")[1])}
    assert documented == {f.name for f in fields(RunSummary)}
