"""The Debugger's "Why is acceptance low?" accordion in Debian's Chromium: the recorded demo
and a new run diagnosed (four views, one suggestion each) and replayed in hindsight on the
embedded pair the demo was recorded on; screenshots go to artifacts/."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.ui.helpers import launch_app

pytestmark = [pytest.mark.e2e, pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore:.*(downcasting|copy keyword).*")]

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"
TIMEOUT_MS = 150_000


@pytest.fixture(scope="module")
def page():
    sync_api = pytest.importorskip("playwright.sync_api")
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian chromium is not installed (apt-get install -y chromium)")
    demo, url = launch_app(target="embedded")  # the pair the demo trace was recorded on
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        pg = browser.new_page(viewport={"width": 1500, "height": 1000})
        pg.set_default_timeout(30_000)
        pg.goto(url)
        pg.locator("#sv-forest .js-plotly-plot").wait_for()
        yield pg
        browser.close()
    demo.close()


def _diagnose_and_replay(page, name: str, before: str = "") -> str:
    """Diagnose and replay the run in view; returns the diagnosis' text (`before`: the
    previous run's, which the new one must replace)."""
    from playwright.sync_api import expect

    notes = page.locator("#sv-diagnosis-md")
    page.locator("#sv-diagnose").click()
    expect(notes).to_contain_text("Diagnosis of", timeout=TIMEOUT_MS)
    if before:
        expect(notes).not_to_have_text(before, timeout=TIMEOUT_MS)
    for elem in ("sv-diag-position", "sv-diag-entropy", "sv-diag-calibration",
                 "sv-diag-source"):
        page.locator(f"#{elem} .js-plotly-plot").wait_for()
    # one suggestion a view; the source view's where the drafts name their source (a run of
    # the hybrid drafter that drafted; the demo trace was recorded before sources were)
    text = notes.inner_text()
    assert notes.locator("li").count() == 4 + ("Source:" in text)
    assert name != "demo" or "Source:" not in text
    page.locator("#sv-replay").click()
    expect(page.locator("#sv-replay-md")).to_contain_text("Hindsight replay (exact",
                                                          timeout=TIMEOUT_MS)
    expect(page.locator("#sv-replay-table")).to_contain_text("clairvoyant lengths")
    ARTIFACTS.mkdir(exist_ok=True)
    page.locator("#sv-hindsight").screenshot(path=str(ARTIFACTS / f"e2e-hindsight-{name}.png"))
    return text


def test_the_demo_and_a_new_run_are_diagnosed_and_replayed(page):
    from playwright.sync_api import expect

    expect(page.locator("#sv-run-md")).to_contain_text("recorded demo trace")
    page.locator("#sv-hindsight").get_by_text("Why is acceptance low?").click()
    demo = _diagnose_and_replay(page, "demo")
    page.locator("#sv-run").click()
    run_md = page.locator("#sv-run-md")
    expect(run_md).not_to_contain_text("recorded demo trace", timeout=TIMEOUT_MS)
    # a run's own header (a model load shows a status line first: not a run yet)
    expect(run_md).to_contain_text("tokens in", timeout=TIMEOUT_MS)
    expect(run_md).not_to_contain_text("running", timeout=TIMEOUT_MS)
    _diagnose_and_replay(page, "new-run", before=demo)
