"""The exactness check on the embedded model: sd at temperature 0 (token by token against
generate()) and at temperature 1 with top-k 4 (the first two tokens; a fixed 60 runs to stay
short: the power calculation would ask for more, and the report states the power kept)."""

from __future__ import annotations

import pytest

from engine.check.result import CheckConfig
from engine.check.run import run_check

pytestmark = pytest.mark.embedded
PROMPT = "What is the capital of France?"


def test_sd_passes_the_check_on_the_embedded_model(embedded_pair):
    r = run_check(embedded_pair, PROMPT, "sd", gamma=4, temperature=0.0, max_new_tokens=16)
    assert (r.mode, r.verdict) == ("identical", "pass"), r.text()
    r = run_check(embedded_pair, PROMPT, "sd", gamma=4, temperature=1.0, top_k=4,
                  config=CheckConfig(runs=60))
    print(r.text())
    assert (r.mode, r.verdict, r.runs) == ("law", "pass", 60), r.text()
    assert r.stats["depth"] == 2 and "power" in r.text()
