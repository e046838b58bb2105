"""engine/check/run.py, the product's exactness check: every exact method passes it on a tiny
pair at temperature 0 and 1, a rule that ignores p fails it, an approximate method gets a
distance; the CLI's output and exit codes; the Check tab's handler."""

from __future__ import annotations

import json

import pytest

import engine
import engine.methods.token as token_method
import engine.verify.token as token_rules
from engine.check.result import CheckConfig
from engine.check.run import run_check
from engine.check.stats import mixture_at_tv, power_against, runs_for_power
from engine.cli import main
from engine.methods import METHODS

# vocab 8, peaked laws (tests/laws.py), two layers so the early exit (1 layer) is a drafter
TINY = {"vocab_size": 8, "layers": 2, "hidden_size": 16, "intermediate_size": 32,
        "initializer_range": 0.3, "seed": 5}
SPEC = "tiny:" + json.dumps(TINY)
PROMPT = [3, 4]
PARAMS = {"beam": {"beams": 2}, "atspeed_strict": {"beams": 2, "draft_beams": 3, "gamma": 2},
          "beam_sample": {"beams": 2}, "dsbd": {"draft_beams": 2, "gamma": 1},
          "atspeed_relaxed": {"beams": 2, "draft_beams": 3, "gamma": 1},
          "sd": {"gamma": 2}, "mcsd": {"k_config": "2x2"}, "greedy_drafts": {"k_config": "2x2"},
          "eesd": {"gamma": 2}}
EXACT = [m for m, s in METHODS.items() if s.exact]


@pytest.fixture(scope="module")
def pair():
    return engine.load_pair(target=SPEC, draft="early-exit:1", device="cpu")


@pytest.mark.parametrize("method", [m for m in EXACT if not METHODS[m].sampling_only])
def test_every_exact_method_is_identical_to_its_reference_at_temperature_0(pair, method):
    r = run_check(pair, PROMPT, method, max_new_tokens=10, temperature=0.0,
                  **PARAMS.get(method, {}))
    assert (r.mode, r.verdict, r.exit_code) == ("identical", "pass", 0), r.text()
    assert "PASS: identical" in r.lines[-1]


@pytest.mark.parametrize("method", EXACT)
def test_every_exact_method_passes_the_law_check_at_temperature_1(pair, method):
    r = run_check(pair, PROMPT, method, temperature=1.0, **PARAMS.get(method, {}))
    assert r.verdict == "pass", r.text()
    if METHODS[method].samples:
        assert r.mode == "law" and r.stats["p_value"] >= 1e-3
        assert min(r.stats["power"].values()) >= 0.95, r.text()  # stated, near the 0.99 goal
        assert r.plot and abs(sum(o for _, o, _ in r.plot) - 1) < 1e-9
    else:  # greedy, beam, atspeed_strict ignore temperature: token by token
        assert r.mode == "identical" and "ignores temperature" in r.text()


def _always_accept(p, q, candidates, rng):
    """A wrong rule: takes the first draft without looking at p."""
    return token_rules.TokenVerdict(0, int(candidates[0]), (), None)


def test_a_rule_that_ignores_p_fails_the_law_check(pair, monkeypatch):
    monkeypatch.setitem(token_rules.RULES, "sd", _always_accept)
    monkeypatch.setitem(token_method.RULES, "sd", _always_accept)
    r = run_check(pair, PROMPT, "sd", temperature=1.0, gamma=2)
    assert (r.verdict, r.exit_code) == ("fail", 1), r.text()
    assert r.stats["p_value"] < 1e-3 and "FAIL" in r.lines[-1]


def test_the_approximate_method_gets_a_distance_not_a_verdict(pair):
    assert not METHODS["atspeed_relaxed"].exact
    r = run_check(pair, PROMPT, "atspeed_relaxed", **PARAMS["atspeed_relaxed"])
    assert (r.verdict, r.exit_code) == ("distance", 0)
    assert 0 < r.stats["tv"] <= 1 and "TV(observed, exact law)" in r.text()


def test_a_time_cap_cuts_the_runs_and_progress_is_reported(pair):
    seen = []
    r = run_check(pair, PROMPT, "sd", temperature=1.0, gamma=2,
                  config=CheckConfig(max_seconds=1e-6),
                  progress=lambda done, total, msg: seen.append((done, total, msg)))
    assert r.runs == 2 and "capped at 2 runs" in r.text()
    assert seen[0][2].startswith("2 runs, about") and seen[-1][:2] == (2, 2)


def test_the_sample_size_reaches_the_power_goal_against_both_alternatives():
    law = {(i,): p for i, p in enumerate([0.5, 0.3, 0.1, 0.1])}
    q = {(0,): 0.1, (1,): 0.1, (2,): 0.4}  # 0.4 of its mass where p is 0
    uniform = mixture_at_tv(law, {c: 0.25 for c in law}, 0.1)
    n, pw = runs_for_power(law, {"q": q, "u": uniform})
    assert min(pw.values()) >= 0.99 and 50 <= n < 2000 and n % 10 == 0
    assert power_against(law, uniform, n - 10) < 0.99 or n == 50
    assert power_against(law, q, 10) >= 1 - 0.6 ** 10  # one sample outside fails the check


def _cli(capsys, *args):
    code = main(["check", "--target", SPEC, "--draft", "early-exit:1", "--prompt", "ab",
                 "--raw", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_prints_the_report_and_exits_0_on_pass_1_on_fail_2_on_bad_input(capsys,
                                                                            monkeypatch):
    code, out, err = _cli(capsys, "--method", "sd", "--gamma", "2", "--temperature", "1")
    assert code == 0 and "PASS" in out and "chi-square" in out and "[check]" in err
    code, out, _ = _cli(capsys, "--method", "sd", "--temperature", "0", "--max-new-tokens",
                        "6", "--json")
    assert code == 0 and json.loads(out)["verdict"] == "pass"
    monkeypatch.setitem(token_rules.RULES, "sd", _always_accept)
    monkeypatch.setitem(token_method.RULES, "sd", _always_accept)
    code, out, _ = _cli(capsys, "--method", "sd", "--gamma", "2", "--temperature", "1")
    assert code == 1 and "FAIL" in out
    for bad in (["--method", "nope"], ["--method", "sd", "--runs", "1", "--temperature", "1"],
                ["--method", "beam_sample", "--temperature", "0"]):
        code, _, err = _cli(capsys, *bad)
        assert code == 2 and err.startswith("error: ") and len(err.strip().splitlines()) == 1


def test_the_check_tab_handler_streams_progress_then_the_report(pair):
    from specviz import check_tab

    def check(params_text, temperature, max_new_tokens):
        return list(check_tab.check(prompt="ab", method="sd", params_text=params_text,
                                    temperature=temperature, top_k=0, top_p=1.0,
                                    max_new_tokens=max_new_tokens, target=SPEC,
                                    draft="early-exit:1"))

    outs = check("gamma=2", 1.0, 24)  # a pair not in the app's cache says it loads first
    assert outs[0][0].startswith("loading the model pair first (target `tiny:")
    assert any("runs" in md for md, _ in outs[1:-1])
    assert check("gamma=2", 1.0, 4)[0][0] == "checking …"  # loaded now: checking at once
    md, fig = outs[-1]
    assert md.startswith("✅ **PASS**") and len(fig.data) == 2  # expected and observed bars
    md, fig = check("", 0.0, 6)[-1]
    assert "PASS: identical" in md
