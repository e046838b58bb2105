"""specviz.share_page: a trace as one self-contained HTML page (the browser test opens one
offline: tests/e2e/test_browser.py)."""

from __future__ import annotations

import re
from dataclasses import replace

from engine.contract.trace import RunTrace
from specviz import share_page
from specviz.state import DEMO_TRACE

DEMO = RunTrace.from_json(DEMO_TRACE.read_text())


def test_the_page_inlines_plotly_once_and_fetches_nothing():
    page = share_page.trace_page(DEMO)
    assert page.startswith("<!DOCTYPE html>") and page.endswith("</body></html>")
    assert len(re.findall(r"<script[^>]*\bsrc=", page)) == 0  # no external script
    assert page.count("Plotly.newPlot") >= len(DEMO.rounds) + 3  # every forest, 3 charts
    assert len(re.findall(r"plotly\.js v\d", page)) == 1  # the library, inlined once
    outside = re.sub(r"<script[^>]*>.*?</script>", "", page, flags=re.S)  # the page's own
    assert "<link" not in outside and not re.search(r"""(href|src)=["']https?:""", outside)


def test_the_page_has_a_slider_over_every_round_and_the_text():
    page = share_page.trace_page(DEMO)
    n = len(DEMO.rounds)
    assert [int(i) for i in re.findall(r"id='round-(\d+)'", page)] == list(range(n))
    assert f"max='{n - 1}'" in page
    assert "Friday" in page and "<strong>Round 3</strong>" in page  # notes rendered as HTML


def test_a_long_run_draws_its_first_rounds_and_says_so(monkeypatch):
    monkeypatch.setattr(share_page, "MAX_ROUNDS", 4)
    page = share_page.trace_page(DEMO)
    assert len(re.findall(r"id='round-\d+'", page)) == 4
    assert f"The first 4 of {len(DEMO.rounds)} rounds are drawn." in page


def test_a_trace_without_rounds_still_makes_a_page(tmp_path):
    empty = replace(DEMO, rounds=())
    path = share_page.write_page(empty, tmp_path / "empty.html")
    page = path.read_text()
    assert "No rounds." in page and "sv-round'" not in page


def test_the_command_writes_the_page_and_a_bad_file_is_one_line(tmp_path, capsys):
    out = tmp_path / "demo.html"
    assert share_page.main([str(DEMO_TRACE), str(out)]) == 0
    assert out.read_text().startswith("<!DOCTYPE html>")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert share_page.main([str(bad), str(tmp_path / "x.html")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err


def test_the_pages_slider_counts_rounds_as_each_rounds_header_does():
    """Issue 57 (3): the slider said "Round 2 of 4" (its last index) beside the round's own
    "Round 2 of 5"; both now count the rounds."""
    page = share_page.trace_page(DEMO)
    n = len(DEMO.rounds)
    assert f"<span id='sv-round-label'>0</span> of {n}:" in page
    assert set(re.findall(r"<strong>Round \d+</strong> of (\d+)", page)) == {str(n)}


def test_a_pages_cache_name_changes_with_the_code_that_draws_it(monkeypatch):
    """The export folder outlives the app: a page cached for a trace must not be served as
    older code drew it (its round notes said another thing)."""
    text = DEMO.to_json()
    first = share_page.page_digest(text)
    assert first == share_page.page_digest(text) != share_page.page_digest(text + " ")
    monkeypatch.setattr(share_page, "BUILDER", "other code")
    assert share_page.page_digest(text) != first
