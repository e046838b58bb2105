"""The Bench tab's tuner (specviz.tune_tab) through the launched app: a tune of the tiny pair
streams its trials and ends with winners and held-out figures; Use as defaults fills this
session's method widgets with the winners and leaves another session's as they were; bad
input and the host's caps are one line."""

from __future__ import annotations

import json

import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError

from tests.ui.helpers import TINY

pytestmark = [pytest.mark.ui, pytest.mark.filterwarnings("ignore::DeprecationWarning")]


def _tune(client, **kw):
    args = dict(set_name="specbench_mini.jsonl", upload=None, tune_methods=["sd"],
                minutes=0.1, max_new_tokens=8, target=TINY, draft="")
    args.update(kw)
    return client.submit(api_name="/tune", **args)


def test_a_tune_streams_trials_then_winners_and_use_as_defaults_is_per_session(app_url):
    mine, other = Client(app_url, verbose=False), Client(app_url, verbose=False)
    job = _tune(mine)
    status, chart, table, files = job.result(timeout=300)[:4]
    outputs = job.outputs()
    assert any(o[0].startswith("searching") for o in outputs)  # trials streamed
    assert status.startswith("done:"), status
    names = {t.get("name") for t in json.loads(chart["plot"])["data"]}
    assert "sd" in names
    rows = [dict(zip(table["headers"], r)) for r in table["data"]]
    assert rows[0]["method"] == "sd" and rows[0]["winner"]
    assert {p.rsplit("/", 1)[-1] for p in [f["path"] if isinstance(f, dict) else f
                                           for f in files]} == {"report.html", "trials.jsonl"}
    winner = json.loads(rows[0]["parameters"])
    note = mine.predict(api_name="/tune_use")  # (the session state is not in the API)
    assert "now start from the tuned settings of sd" in note
    about, *widgets = mine.predict("sd", TINY, "", api_name="/method")
    mine_values = [w.get("value") if isinstance(w, dict) else w for w in widgets]
    other_values = [w.get("value") if isinstance(w, dict) else w
                    for w in other.predict("sd", TINY, "", api_name="/method")[1:]]
    for value in winner.values():  # the winners show in this session's widgets only
        assert value in mine_values
    assert mine_values != other_values or not winner


def test_the_smallest_budget_ends_with_winners_in_the_page_not_a_server_path(client):
    """Issue 57 (9): at the widget's smallest budget the tune ends "done:" with a winners
    table (the held-out report counts inside the minutes), and no status names a folder."""
    job = _tune(client, minutes=0.05)
    status, _, table, files = job.result(timeout=300)[:4]
    assert status.startswith("done:"), status
    assert "of 0.05 minutes" in status
    assert all("/tmp" not in o[0] and "specviz-tune" not in o[0] for o in job.outputs())
    rows = [dict(zip(table["headers"], r)) for r in table["data"]]
    assert [r["method"] for r in rows] == ["sd"] and rows[0]["winner"]
    assert files  # report.html and trials.jsonl, to download


@pytest.mark.parametrize("kw,message", [
    ({"tune_methods": []}, "pick at least one method"),
    ({"minutes": 100}, "greater than maximum value"),  # the widget's own cap
    ({"tune_methods": ["greedy"]}, "not in the list of choices"),  # exact tunable ones only
])
def test_bad_tune_input_is_one_line(client, kw, message):
    with pytest.raises(AppError) as err:
        _tune(client, **kw).result(timeout=60)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_use_as_defaults_without_a_tune_says_so(client):
    with pytest.raises(AppError, match="no finished tune"):
        client.predict(api_name="/tune_use")
