"""The Debugger's Export timeline: the run's rounds as trace-event JSON any viewer opens."""

from __future__ import annotations

import json

import pytest

from engine.contract.trace import RunTrace
from tests.ui.helpers import TINY
from tests.unit.test_timeline import check_trace_event_format

pytestmark = [pytest.mark.ui, pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore:.*(downcasting|copy keyword).*")]


def test_a_run_exports_its_timeline_beside_its_trace(client):
    client.predict(api_name="/run", prompt="hello world", method="sd", target=TINY, draft="",
                   p_gamma=2, p_max_new_tokens=10)
    trace = RunTrace.from_json(open(client.predict(api_name="/export")).read())
    path = client.predict(api_name="/export_timeline")
    assert path.endswith(".timeline.json")
    events = check_trace_event_format(json.loads(open(path).read()))
    rounds = [e for e in events if e["ph"] == "X" and e["cat"] == "round"]
    assert [e["args"]["committed"] for e in rounds] == [len(r.committed) for r in trace.rounds]
