"""The Debugger's diagnosis and hindsight replay through the API: a new run diagnosed and
replayed on its pair; a trace whose pair cannot be loaded refused in one line."""

from __future__ import annotations

import json

import pytest
from gradio_client import handle_file
from gradio_client.exceptions import AppError

from tests.ui.helpers import TINY

pytestmark = [pytest.mark.ui, pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore:.*(downcasting|copy keyword).*")]


def _run(client):
    client.predict(api_name="/run", prompt="a b a b a b a b c d", method="sd", target=TINY,
                   draft="", p_gamma=2, p_max_new_tokens=24, p_temperature=0.0)


def test_a_run_is_diagnosed_with_one_suggestion_a_view(client):
    _run(client)
    notes, position, entropy, calibration, source, rejected = client.predict(
        api_name="/diagnose")
    assert notes.startswith("**Diagnosis** of ") and notes.count("\n- ") == 4  # one source
    for plot in (position, entropy, calibration, source):
        assert plot["plot"]


def test_a_run_is_replayed_on_its_pair_with_the_bound(client):
    _run(client)
    md, table = client.predict(api_name="/replay")
    assert md.startswith("**Hindsight replay** (exact") and "clairvoyant" in md
    assert "this run replayed " in md and table["headers"][-1] == "replayed ×"  # a
    # simulation at the header's costs, named apart from the summary's speedups
    rows = {row[0]: row[1:] for row in table["data"]}
    own = table["data"][0]
    assert own[0].startswith("this run: sd ") and "clairvoyant lengths" in rows
    assert "sd gamma=8" in rows and "mcsd k_config=2x2" in rows
    assert rows[own[0].removeprefix("this run: ")] == own[1:]  # its own setting, replayed


def test_a_trace_whose_pair_cannot_be_loaded_is_refused_in_one_line(client, tmp_path):
    _run(client)
    trace = json.loads(open(client.predict(api_name="/export")).read())
    trace["target"] = "no-such-org/no-such-model"
    path = tmp_path / "other.json"
    path.write_text(json.dumps(trace))
    client.predict(handle_file(str(path)), api_name="/import")
    with pytest.raises(AppError) as err:
        client.predict(api_name="/replay")
    assert "no-such-org/no-such-model" in str(err.value) and "Traceback" not in str(err.value)
