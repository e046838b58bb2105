"""The debugger in Debian's Chromium, driven by Playwright: run the embedded model, step,
see the forest and charts change, click a token, export a trace; screenshots go to
artifacts/ (gitignored) for a human look."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from engine.contract.trace import RunTrace
from tests.ui.helpers import launch_app

pytestmark = [pytest.mark.e2e, pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore:.*(downcasting|copy keyword).*")]

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"
RUN_TIMEOUT_MS = 150_000


@pytest.fixture(scope="module")
def app_url():
    demo, url = launch_app()  # the default target, as make app runs it
    yield url
    demo.close()


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api")
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian chromium is not installed (apt-get install -y chromium)")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser, app_url):
    ctx = browser.new_context(viewport={"width": 1500, "height": 1000}, accept_downloads=True)
    pg = ctx.new_page()
    pg.set_default_timeout(30_000)
    pg.goto(app_url)
    pg.locator("#sv-forest .js-plotly-plot").wait_for()
    yield pg
    ctx.close()


def _shot(page, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"e2e-{name}.png"), full_page=True)


def _round_md(page) -> str:
    return page.locator("#sv-round-md").inner_text()


def _wait_round(page, k: int) -> None:
    from playwright.sync_api import expect

    expect(page.locator("#sv-round-md")).to_contain_text(f"Round {k} of")


def _plot_html(page, elem: str) -> str:
    return page.locator(f"#{elem} .js-plotly-plot").first.inner_html()


def _choose_method(page, name: str) -> None:
    """Pick `name` and wait for the method change's answer (its about text), which re-renders
    the parameter boxes: a click into them before it arrives can be lost under load."""
    from playwright.sync_api import expect

    page.locator("#sv-method input").click()
    page.get_by_role("option", name=name, exact=True).click()
    expect(page.locator(".sv-about").first).to_contain_text(
        re.compile(rf"^\s*{re.escape(name)} \("), timeout=RUN_TIMEOUT_MS)


def _open_budget(page) -> None:
    """Open "Sampling, seed and budget" until its max_new_tokens box shows (a toggle that lands
    while the page re-renders can be lost; once the box shows it is not clicked again)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    box = page.get_by_label("max_new_tokens", exact=True)
    for _ in range(3):
        if box.is_visible():
            return
        page.get_by_text("Sampling, seed and budget").click()
        try:
            box.wait_for(state="visible", timeout=10_000)
            return
        except PlaywrightTimeout:
            continue
    box.wait_for(state="visible", timeout=10_000)  # the last chance: fails the test


def _set_number(page, label: str, value: int) -> None:
    box = page.get_by_label(label, exact=True)
    box.fill(str(value))
    box.press("Tab")


def _setup_sd_run(page, gamma: int, max_new: int) -> None:
    _choose_method(page, "sd")
    _set_number(page, "gamma", gamma)
    _open_budget(page)
    _set_number(page, "max_new_tokens", max_new)


def test_run_step_click_and_export_in_the_browser(page):
    from playwright.sync_api import expect

    expect(page.locator("#sv-run-md")).to_contain_text("recorded demo trace")
    _shot(page, "01-demo-trace")
    _setup_sd_run(page, gamma=2, max_new=12)  # >= 4 rounds even if all accepted
    page.locator("#sv-run").click()
    run_md = page.locator("#sv-run-md")
    expect(run_md).to_contain_text("sd (max_new_tokens=12", timeout=RUN_TIMEOUT_MS)
    expect(run_md).to_contain_text("SmolLM2-135M-Instruct", timeout=RUN_TIMEOUT_MS)
    expect(run_md).not_to_contain_text("running", timeout=RUN_TIMEOUT_MS)
    n = int(re.search(r" of (\d+)", _round_md(page)).group(1))
    assert n >= 4
    _shot(page, "02-after-run")

    page.locator("#sv-reset").click()
    _wait_round(page, 0)
    forest0, progress0 = _plot_html(page, "sv-forest"), _plot_html(page, "sv-progress")
    for k in (1, 2, 3):
        page.locator("#sv-step").click()
        _wait_round(page, k)
    assert _plot_html(page, "sv-forest") != forest0
    assert _plot_html(page, "sv-progress") != progress0
    _shot(page, "03-stepped-to-round-3")

    page.locator("#sv-reset").click()
    _wait_round(page, 0)
    page.locator("#sv-play").click()  # the play timer advances one round per tick
    _wait_round(page, 2)
    page.locator("#sv-play").click()
    expect(page.locator("#sv-play")).to_have_text("▶ Play")
    page.wait_for_timeout(1200)  # let a tick already in flight land before rewinding

    page.locator("#sv-reset").click()
    _wait_round(page, 0)
    page.locator("#sv-text .token").last.click()
    _wait_round(page, n - 1)
    _shot(page, "04-token-clicked")

    with page.expect_download() as info:
        page.locator("#sv-export").click()
    saved = ARTIFACTS / "e2e-exported-trace.json"
    info.value.save_as(str(saved))
    trace = RunTrace.from_dict(json.loads(saved.read_text()))
    assert trace.method == "sd" and len(trace.rounds) == n


def test_bad_parameter_shows_a_one_line_error_and_no_traceback(page):
    from playwright.sync_api import expect

    _choose_method(page, "sd")
    _set_number(page, "gamma", 0)
    page.locator("#sv-run").click()
    toast = page.get_by_text("gamma must be >= 1, got 0")
    expect(toast).to_be_visible()
    page.wait_for_timeout(800)  # let the toast finish sliding in
    _shot(page, "05-error-toast")
    assert "Traceback" not in page.content()


def test_the_opening_page_steps_through_the_demo_forest(browser, app_url):
    """The first thing a visitor sees: the recorded demo, stepped to a round with a branching
    forest; the screenshot (1440 px wide) is the README's (docs/img/debugger.png)."""
    from playwright.sync_api import expect

    ctx = browser.new_context(viewport={"width": 1440, "height": 1000})
    page = ctx.new_page()
    page.set_default_timeout(30_000)
    page.goto(app_url)
    page.locator("#sv-forest .js-plotly-plot").wait_for()
    expect(page.locator("#sv-run-md")).to_contain_text("recorded demo trace")
    expect(page.locator("#sv-run-md")).to_contain_text("round-time")
    page.locator("#sv-reset").click()
    _wait_round(page, 0)
    for k in (1, 2):
        page.locator("#sv-step").click()
        _wait_round(page, k)
    expect(page.locator("#sv-forest")).to_contain_text("accepted")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "debugger.png"), full_page=True)
    ctx.close()


def test_the_bench_tab_runs_a_set_to_its_plots_and_its_report_opens_alone(browser, app_url):
    """Bench: two shipped prompts with sd, replay ticked, rows and then the three plots, the
    replay table and the diagnosis over the set (its lines and four views); a selected row
    opens its prompt in the Debugger; the exported report.html opens in Chromium without the
    app and draws its eight figures (four, then the diagnosis' four)."""
    from playwright.sync_api import expect

    from specviz import bench_tab

    ctx = browser.new_context(viewport={"width": 1440, "height": 1000})
    page = ctx.new_page()
    page.set_default_timeout(30_000)
    page.goto(app_url)
    page.get_by_role("tab", name="Bench").click()
    page.locator("#sv-bench-methods").get_by_text("mcsd", exact=True).click()  # sd alone
    for elem, value in (("sv-bench-limit", "2"), ("sv-bench-max-new", "6")):
        box = page.locator(f"#{elem} input")
        box.fill(value)
        box.press("Tab")
    page.locator("#sv-bench-replay").get_by_role("checkbox").check()
    page.locator("#sv-bench").click()
    expect(page.locator("#sv-bench-status")).to_contain_text("done: 2 / 2 runs",
                                                             timeout=RUN_TIMEOUT_MS)
    for elem in ("sv-bench-acc", "sv-bench-tau", "sv-bench-speedup"):
        expect(page.locator(f"#{elem} .js-plotly-plot")).to_be_visible()
    expect(page.locator("#sv-bench-replay-table")).to_contain_text("clairvoyant bound")
    page.locator("#sv-bench-diagnosis").get_by_text("Diagnosis over the set").click()
    expect(page.locator("#sv-bench-diagnosis-md")).to_contain_text("Diagnosis of sd: ")
    for elem in ("position", "entropy", "calibration", "source"):
        expect(page.locator(f"#sv-bench-diag-{elem} .js-plotly-plot")).to_be_visible()
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "e2e-bench-tab.png"), full_page=True)

    page.locator("#sv-bench-rows").get_by_text("chat-01", exact=True).last.click()
    expect(page.get_by_role("tab", name="Debugger")).to_have_attribute("aria-selected", "true")

    report = max(bench_tab.BENCH.runs_dir.glob("run-*/report.html"),
                 key=lambda p: p.stat().st_mtime)
    page.goto(report.as_uri())
    expect(page.locator(".js-plotly-plot")).to_have_count(8)
    page.screenshot(path=str(ARTIFACTS / "e2e-bench-report.png"), full_page=True)
    ctx.close()


def test_a_shared_page_opens_offline_and_its_slider_shows_each_round(browser, tmp_path):
    """specviz.share_page: the demo trace as one HTML file, opened from disk with the network
    off; nothing is fetched, no script fails, the slider shows one round's forest at a time."""
    from specviz.share_page import write_page
    from specviz.state import DEMO_TRACE

    trace = RunTrace.from_json(DEMO_TRACE.read_text())
    path = write_page(trace, tmp_path / "run.html")
    ctx = browser.new_context(offline=True, viewport={"width": 1300, "height": 900})
    pg = ctx.new_page()
    errors: list[str] = []
    urls: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.on("request", lambda r: urls.append(r.url))
    pg.goto(path.as_uri())
    pg.wait_for_function("typeof Plotly !== 'undefined'")
    assert pg.is_visible("#round-0") and not pg.is_visible("#round-3")
    pg.eval_on_selector("#sv-round", "e => {e.value = 3; e.dispatchEvent(new Event('input'))}")
    assert pg.is_visible("#round-3") and not pg.is_visible("#round-0")
    assert pg.locator("#round-3 .js-plotly-plot").count() == 1
    assert pg.inner_text("#sv-round-label") == "3"
    assert trace.text.split()[0] in pg.inner_text(".text")
    _shot(pg, "e2e-shared-page")
    ctx.close()
    assert errors == [] and all(u.startswith("file:") for u in urls), (errors, urls)


def test_a_transformers_mode_runs_in_the_app_shows_its_forest_and_exports_a_page(page,
                                                                                 browser):
    """hf_prompt_lookup (transformers' own generate(), recorded) in the Debugger: its rounds
    step like the engine's, the forest shows a drafted chain, and Export page gives one HTML
    file that opens offline."""
    from playwright.sync_api import expect

    page.locator("#sv-prompt textarea").fill(
        "Repeat exactly: the red fox jumps over the lazy dog. the red fox jumps over the "
        "lazy dog.")
    _choose_method(page, "hf_prompt_lookup")
    _open_budget(page)
    _set_number(page, "max_new_tokens", 24)
    page.locator("#sv-run").click()
    run_md = page.locator("#sv-run-md")
    expect(run_md).to_contain_text("hf_prompt_lookup", timeout=RUN_TIMEOUT_MS)
    expect(run_md).not_to_contain_text("running", timeout=RUN_TIMEOUT_MS)
    expect(run_md).to_contain_text("prompt lookup (transformers")
    n = int(re.search(r" of (\d+)", _round_md(page)).group(1))
    assert 1 < n < 24  # the lookup's drafts committed more than a token in some round
    page.locator("#sv-reset").click()
    _wait_round(page, 0)
    forest0 = _plot_html(page, "sv-forest")
    page.locator("#sv-step").click()
    _wait_round(page, 1)
    assert _plot_html(page, "sv-forest") != forest0
    _shot(page, "05-transformers-prompt-lookup")

    page.locator("#sv-export-page").click()
    link = page.locator("#sv-page-file a").first
    link.wait_for(timeout=60_000)
    with page.expect_download() as info:
        link.click()
    saved = ARTIFACTS / "e2e-hf-page.html"
    info.value.save_as(str(saved))
    ctx = browser.new_context(offline=True)
    pg = ctx.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.goto(saved.as_uri())
    pg.wait_for_function("typeof Plotly !== 'undefined'")
    assert "hf_prompt_lookup" in pg.title()
    assert pg.locator("#round-0 .js-plotly-plot").count() == 1
    ctx.close()
    assert errors == []


def test_tuning_in_the_bench_tab_streams_trials_and_its_winners_become_the_defaults(browser,
                                                                                   app_url):
    """The Bench tab's tuner on the tiny pair: the trials chart and the winners table fill,
    and Use as defaults applies them (tests/ui/test_tune_tab.py checks the widgets' values)."""
    from playwright.sync_api import expect

    from tests.ui.helpers import TINY

    ctx = browser.new_context(viewport={"width": 1440, "height": 1000})
    page = ctx.new_page()
    page.set_default_timeout(30_000)
    page.goto(app_url)
    page.get_by_text("Model pair").first.click()
    target = page.get_by_label("Target (p)")
    target.fill(TINY)
    target.press("Tab")
    page.get_by_role("tab", name="Bench").click()
    page.locator("#sv-tune-box").get_by_text("Tune the pair").click()
    box = page.locator("#sv-tune-minutes input")
    box.fill("0.1")
    box.press("Tab")
    page.locator("#sv-tune-methods").get_by_text("mcsd", exact=True).click()  # sd alone
    page.locator("#sv-tune").click()
    expect(page.locator("#sv-tune-status")).to_contain_text("done:", timeout=RUN_TIMEOUT_MS)
    expect(page.locator("#sv-tune-chart .js-plotly-plot")).to_be_visible()
    expect(page.locator("#sv-tune-table")).to_contain_text("sd")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "e2e-tune.png"), full_page=True)
    page.locator("#sv-tune-use").click()
    expect(page.locator("#sv-tune-status")).to_contain_text("now start from the tuned")
    ctx.close()


# ------------------------------------------------- issue 57: every number agrees, every page reads


def _ctx_page(browser, app_url, width: int = 1440):
    ctx = browser.new_context(viewport={"width": width, "height": 1000}, accept_downloads=True)
    pg = ctx.new_page()
    pg.set_default_timeout(30_000)
    pg.goto(app_url)
    pg.locator("#sv-forest .js-plotly-plot").wait_for()
    return ctx, pg


def _use_tiny_pair(page) -> None:
    """The Debugger's Target box set to the tiny pair (the tabs' model work reads it)."""
    from tests.ui.helpers import TINY

    page.get_by_text("Model pair").first.click()
    target = page.get_by_label("Target (p)", exact=False)
    target.fill(TINY)
    target.press("Tab")


def _forest(page) -> tuple[str, dict[str, int]]:
    """The forest figure's title and the nodes it draws per trace name (plotly's own data)."""
    return page.evaluate("""() => {
        const gd = document.querySelector('#sv-forest .js-plotly-plot');
        const drawn = {};
        for (const t of gd.data) drawn[t.name] = (t.x || []).filter(x => x !== null).length;
        return [gd.layout.title.text.split('<br>')[0], drawn];
    }""")


def _accepted_tokens(page) -> int:
    """Tokens the text colours 'accepted' (text_view.ORIGIN_COLORS, 50% alpha in the page)."""
    return page.locator("#sv-text .token").evaluate_all(
        "els => els.filter(e => (e.style.backgroundColor || '').startsWith("
        "'rgba(127, 209, 139')).length")


def _header_counts(round_md: str) -> tuple[str, dict[str, int]]:
    """The header's drafted phrase and its committed tokens by origin."""
    drafted = round_md.split(" · ")[1]
    committed = re.search(r"committed \d+ tokens? \(([^)]*)\)", round_md)
    origins = {o: int(n) for n, o in (p.split(" ") for p in committed.group(1).split(", "))} \
        if committed else {}
    return drafted, origins


def _open_round(page, k: int) -> None:
    """Type round k in the slider's number box and press Enter (the page's js: the box sends
    its value when it loses focus)."""
    number = page.locator("#sv-slider input[type=number]")
    number.fill(str(k))
    number.press("Enter")
    _wait_round(page, k)


def test_the_demos_summary_forest_header_text_and_exported_page_agree(browser, app_url):
    """For the opening trace: the run summary's accepted drafts are the tokens the text colours
    accepted; in the rounds opened (typed in the slider's box, Enter) the forest's title is the
    header's count and its accepted nodes are the header's; the exported page shows the same
    summary, the same round count and the same header under its slider."""
    from specviz.state import DEMO_TRACE

    ctx, page = _ctx_page(browser, app_url)
    run_md = page.locator("#sv-run-md").inner_text()
    acc = re.search(r"acceptance ([\d.]+) \((\d+) of (\d+) drafted tokens accepted\)", run_md)
    assert acc, run_md
    accepted, drafted = int(acc.group(2)), int(acc.group(3))
    assert abs(float(acc.group(1)) - accepted / drafted) < 1e-3
    assert _accepted_tokens(page) == accepted
    tau = re.search(r"tau ([\d.]+) tokens per target call", run_md).group(1)
    n = len(RunTrace.from_json(DEMO_TRACE.read_text()).rounds)
    headers = {}
    for k in (0, 2, 7, n - 1):  # round 0, the opening round, a resampled one, the last
        _open_round(page, k)
        header = _round_md(page)
        assert f"Round {k} of {n}" in header
        phrase, origins = _header_counts(header)
        title, drawn = _forest(page)
        assert title == f"Round {k}: {phrase}", (title, phrase)
        shown = re.search(r"(?:accepted (\d+)|(\d+) accepted)$", phrase)
        accepted_said = int(shown.group(1) or shown.group(2)) if shown else 0
        assert shown or phrase == "no draft this round", phrase
        assert drawn["accepted"] == accepted_said, (phrase, drawn)
        assert drawn["bonus"] == origins.get("bonus", 0)  # a token method: one a round
        headers[k] = header
    page.locator("#sv-export-page").click()
    link = page.locator("#sv-page-file a").first
    link.wait_for(timeout=60_000)
    with page.expect_download() as info:
        link.click()
    saved = ARTIFACTS / "e2e-demo-page.html"
    ARTIFACTS.mkdir(exist_ok=True)
    info.value.save_as(str(saved))
    ctx.close()
    ctx = browser.new_context(offline=True)
    pg = ctx.new_page()
    pg.goto(saved.as_uri())
    pg.wait_for_function("typeof Plotly !== 'undefined'")
    body = pg.inner_text("body")
    assert acc.group(0) in body and f"tau {tau} tokens per target call" in body
    assert re.search(rf"Round 0 of {n}:", body)  # the slider counts rounds as headers do
    for k in (0, n - 1):
        pg.eval_on_selector("#sv-round", f"e => {{e.value = {k}; "
                            "e.dispatchEvent(new Event('input'))}")
        notes = pg.inner_text(f"#round-{k}")
        assert _header_counts(headers[k])[0] in notes
        assert re.search(rf"Round {k}\s+of {n}", notes)
    ctx.close()


def test_a_beam_run_draws_what_its_header_counts(browser, app_url):
    """atspeed_strict on the tiny pair, the issue's case: in every round the forest draws as
    many accepted nodes as the header counts, and a round that passed no step draws none."""
    from playwright.sync_api import expect

    ctx, page = _ctx_page(browser, app_url)
    _use_tiny_pair(page)
    _choose_method(page, "atspeed_strict")
    _open_budget(page)
    _set_number(page, "max_new_tokens", 6)
    page.locator("#sv-run").click()
    run_md = page.locator("#sv-run-md")
    expect(run_md).to_contain_text("atspeed_strict (", timeout=RUN_TIMEOUT_MS)
    expect(run_md).not_to_contain_text("running", timeout=RUN_TIMEOUT_MS)
    summary = run_md.inner_text()
    steps = re.search(r"\((\d+) of (\d+) drafted steps passed\)", summary)
    assert steps, summary
    n = int(re.search(r" of (\d+)", _round_md(page)).group(1))
    page.locator("#sv-reset").click()
    _wait_round(page, 0)
    passed_total = 0
    for k in range(n):
        if k:
            page.locator("#sv-step").click()
            _wait_round(page, k)
        phrase, origins = _header_counts(_round_md(page))
        title, drawn = _forest(page)
        assert title == f"Round {k}: {phrase}"
        m = re.search(r"(\d+) passed \((\d+) accepted nodes?\)", phrase)
        assert m or phrase.startswith("no draft this round"), phrase
        passed, nodes = (int(m.group(1)), int(m.group(2))) if m else (0, 0)
        assert drawn["accepted"] == nodes, (phrase, drawn)
        assert origins.get("accepted", 0) == passed  # the text's colours: the steps passed
        assert passed or drawn["accepted"] == 0
        passed_total += passed
    assert passed_total == int(steps.group(1))
    ctx.close()


def test_compares_table_note_and_bars_agree_and_its_preset_leaves_the_debugger_alone(
        browser, app_url):
    """Compare on the tiny pair at 1280 px: for each speculative row the note's predicted,
    round-time and measured speedups are the table's, the bars are the measured column, no
    beam baseline runs without a beam method, headers stay whole; the prompt-lookup preset
    sets this comparison's drafter, not the Debugger's."""
    from playwright.sync_api import expect

    ctx, page = _ctx_page(browser, app_url, width=1280)
    _use_tiny_pair(page)
    draft_box = page.get_by_label("Draft (q)", exact=False)
    debugger_draft = draft_box.input_value()
    page.get_by_role("tab", name="Compare").click()
    page.locator("#sv-compare-hf").click()
    expect(page.locator("#sv-compare-draft textarea, #sv-compare-draft input").first
           ).to_have_value("ngram")
    page.get_by_role("tab", name="Debugger").click()
    assert draft_box.input_value() == debugger_draft  # the Debugger's pair is untouched
    page.get_by_role("tab", name="Compare").click()
    page.get_by_label("max_new_tokens (at most 128)").fill("8")
    page.locator("#sv-compare").click()
    expect(page.locator("#sv-compare")).to_be_enabled(timeout=RUN_TIMEOUT_MS)
    expect(page.get_by_text("decodes on the same prompt")).to_be_visible(
        timeout=RUN_TIMEOUT_MS)
    table = page.locator("#sv-compare-table")
    heads = table.locator("thead th").evaluate_all("ths => ths.map(t => t.title)")
    rows = [dict(zip(heads, r)) for r in table.locator(".virtual-row").evaluate_all(
        "rs => rs.map(r => [...r.children].map(c => c.innerText.trim()))")]
    by = {r["run"]: r for r in rows}
    assert set(by) == {"hf_prompt_lookup", "sd", "greedy"}  # no beam baseline
    note = page.locator("#sv-compare-note").inner_text()
    bars = dict(page.evaluate("""() => {
        const gd = document.querySelector('#sv-compare-bars .js-plotly-plot');
        const t = gd.data.find(d => d.name === 'measured ×');
        return t.y.map((name, i) => [name, t.x[i]]);
    }"""))
    for name in ("hf_prompt_lookup", "sd"):
        row = by[name]
        line = next(ln for ln in note.splitlines() if ln.startswith(name + ":"))
        assert f"predicted {row['predicted ×']}x, round-time {row['round-time ×']}x" in line
        assert f"measured {row['measured ×']}x" in line
        assert f"{bars[name]:.2f}" == row["measured ×"]
    assert len(bars) == 2  # a bar per chosen speculative run
    for th in table.locator("thead th").all():  # headers whole: never wrapped
        box = th.bounding_box()
        assert box["height"] < 60, th.inner_text()
    table_box = table.bounding_box()
    assert table_box["x"] + table_box["width"] <= 1280  # the table scrolls inside the page
    assert page.evaluate("document.documentElement.scrollWidth") <= 1280
    page.screenshot(path=str(ARTIFACTS / "e2e-06-compare.png"), full_page=True)
    ctx.close()


def _names_on_one_line(page) -> None:
    """The Methods tab: every method name on one line, the table no wider than its holder."""
    page.get_by_role("tab", name="Methods").click()
    table = page.locator(".sv-methods table")
    table.wait_for()
    line = page.evaluate("parseFloat(getComputedStyle(document.querySelector("
                         "'.sv-methods td')).lineHeight) || 24")
    for cell in table.locator("tbody td:first-child").all():  # the method names
        assert cell.locator("strong").bounding_box()["height"] < 1.6 * line, cell.inner_text()
    box, holder = table.bounding_box(), page.locator(".sv-methods").first.bounding_box()
    assert box["width"] <= holder["width"] + 1  # fits: nothing clipped or scrolled
    page.get_by_role("tab", name="Debugger").click()


def test_the_pages_read_and_the_debugger_says_what_it_refuses(browser, app_url):
    """The Methods tab keeps every name on one line at 1280 and 1440 px; a prompt over the cap
    is kept whole and refused in one line (never cut to 2,000 characters); a fixed-length run
    hides the empty controller panel."""
    from playwright.sync_api import expect

    ctx, page = _ctx_page(browser, app_url, width=1280)
    _names_on_one_line(page)
    _open_budget(page)
    clipped = page.evaluate("""() => [...document.querySelectorAll(
        '.sv-params [data-testid=block-info]')].filter(e => e.offsetParent !== null)
        .map(e => e.closest('.block')).filter(b => b.scrollWidth > b.clientWidth + 1)
        .map(b => b.innerText.split('\\n')[0])""")
    assert clipped == []  # every parameter's name whole in its box
    page.set_viewport_size({"width": 1440, "height": 1000})
    _names_on_one_line(page)
    box = page.locator("#sv-prompt textarea")
    long = "word " * 500  # 2,500 characters
    box.fill(long)
    assert len(box.input_value()) == len(long)
    page.locator("#sv-run").click()
    expect(page.get_by_text("the UI limit is 2000")).to_be_visible()
    expect(page.locator("#sv-posterior")).to_be_visible()  # the demo's confidence controller
    _use_tiny_pair(page)
    box.fill("Hello there")
    _choose_method(page, "sd")
    _open_budget(page)
    _set_number(page, "max_new_tokens", 6)
    page.locator("#sv-run").click()
    run_md = page.locator("#sv-run-md")
    expect(run_md).to_contain_text("sd (", timeout=RUN_TIMEOUT_MS)
    expect(run_md).not_to_contain_text("running", timeout=RUN_TIMEOUT_MS)
    expect(page.locator("#sv-posterior")).to_be_hidden()  # controller=fixed: no chart
    ctx.close()
