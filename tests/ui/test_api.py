"""The launched app through gradio_client: run, navigation, export/import, errors, compare.

Most runs use a tiny random model (instant); one run uses the embedded SmolLM2-135M.
Outputs come back in specviz.render.OUTPUTS order.
"""

from __future__ import annotations

import json
import re

import pytest
import torch
from gradio_client import handle_file
from gradio_client.exceptions import AppError

from engine import METHODS
from engine.contract.trace import RunTrace
from specviz.render import OUTPUTS
from tests.ui.helpers import TINY

pytestmark = [pytest.mark.ui, pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore:.*(downcasting|copy keyword).*")]


def _views(out) -> dict:
    return dict(zip(OUTPUTS, out))


def _run(client, **kw):
    args = dict(prompt="hello world", method="sd", target=TINY, draft="", p_gamma=3,
                p_max_new_tokens=12)
    args.update(kw)
    return _views(client.predict(api_name="/run", **args))


def _plot_names(plot: dict) -> set[str]:
    return {t.get("name") for t in json.loads(plot["plot"])["data"]}


def test_fresh_session_opens_the_recorded_demo_trace(client):
    client.predict(api_name="/reset")
    v = _views(client.predict(api_name="/step"))
    assert "recorded demo trace" in v["run_md"]
    assert v["round_md"].startswith("**Round 1** of ")
    assert any(s["class_or_confidence"] == "prompt" for s in v["text"])


def test_run_streams_a_tiny_model_run_and_shows_its_last_round(client):
    v = _run(client)
    assert v["run_md"].startswith("**sd** (max_new_tokens=12")
    assert "12 tokens in" in v["run_md"] and "running" not in v["run_md"]
    n = v["slider"]["maximum"] + 1
    assert v["round_md"].startswith(f"**Round {n - 1}** of {n}")
    generated = [s for s in v["text"] if s["class_or_confidence"] != "prompt"]
    assert len(generated) == 12
    assert {"accepted", "rejected", "committed path"} <= _plot_names(v["forest"])


def test_a_run_that_loads_its_pair_first_says_so_before_its_rounds(client):
    """Issue 57 (8): a load (10-40 s for the embedded models) showed only a spinner under the
    last run's header; the summary now says what the run waits for."""
    fresh = 'tiny:{"vocab_size": 64, "layers": 3}'  # a pair no other test loads
    args = dict(prompt="hello world", method="sd", target=fresh, draft="", p_gamma=3,
                p_max_new_tokens=4)
    job = client.submit(api_name="/run", **args)
    job.result(timeout=120)
    said = [_views(o)["run_md"] for o in job.outputs()]
    assert said[0] == f"**sd**: loading the model pair first (target `{fresh}`, draft " \
                      "`its default`): 10-40 s on first use, while it is cached …"
    assert said[-1].startswith("**sd** (") and "4 tokens in" in said[-1]
    again = client.submit(api_name="/run", **args)  # cached now: no such line
    again.result(timeout=120)
    assert not any("loading the model pair" in _views(o)["run_md"] for o in again.outputs())


def test_run_streams_updates_while_rounds_arrive(client):
    job = client.submit(prompt="hello world", method="sd", target=TINY, draft="", p_gamma=2,
                        p_max_new_tokens=16, api_name="/run")
    job.result()
    runs = [_views(o)["run_md"] for o in job.outputs()]
    assert len(runs) >= 2
    assert "(running…)" in runs[0] and "running" not in runs[-1]


def test_play_toggles_the_round_timer(client):
    _run(client)
    assert client.predict(api_name="/reset")[-1]["active"] is False
    assert client.predict("▶ Play", api_name="/play")[-1]["active"] is True  # last: timer
    assert client.predict("⏸ Pause", api_name="/play")[-1]["active"] is False


def test_step_back_reset_and_seek_move_the_selected_round(client):
    _run(client)
    assert _views(client.predict(api_name="/reset"))["round_md"].startswith("**Round 0**")
    assert _views(client.predict(api_name="/step"))["round_md"].startswith("**Round 1**")
    v = _views(client.predict(api_name="/step"))
    assert v["round_md"].startswith("**Round 2**") and v["slider"]["value"] == 2
    assert _views(client.predict(api_name="/back"))["round_md"].startswith("**Round 1**")
    assert _views(client.predict(3, api_name="/seek"))["round_md"].startswith("**Round 3**")
    v = _views(client.predict(api_name="/reset"))
    assert v["round_md"].startswith("**Round 0**")
    assert len(v["tests"]["data"]) >= 1  # round 0 verified drafts


def test_export_writes_a_trace_that_round_trips_and_imports(client):
    _run(client, method="mcsd")
    path = client.predict(api_name="/export")
    trace = RunTrace.from_json(open(path).read())
    assert trace.method == "mcsd" and len(trace.token_ids) == 12
    other = _views(client.predict(handle_file(path), api_name="/import"))
    assert "imported trace" in other["run_md"]
    assert other["run_md"].startswith("**mcsd**")


def test_import_sets_prompt_method_and_parameters_from_the_trace(client):
    _run(client, method="mcsd", p_k_config="2x3", prompt="Name a colour.")
    path = client.predict(api_name="/export")
    _run(client, method="sd", prompt="something else")
    client.predict(handle_file(path), api_name="/import")
    out = client.predict(api_name="/import_controls")
    value = [u.get("value") if isinstance(u, dict) else u for u in out]
    assert value[0] == "Name a colour." and value[1] == "mcsd"
    assert "2x3" in value[2:]  # the k_config widget shows the trace's value


def test_import_rejects_a_file_that_is_not_a_trace(client, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"hello": 1}')
    with pytest.raises(AppError, match="not a specviz trace"):
        client.predict(handle_file(str(bad)), api_name="/import")


def test_an_upload_over_the_cap_is_refused_and_the_session_keeps_working(client, tmp_path):
    from specviz.trace_file import MAX_IMPORT_BYTES

    own = _views(_run(client, p_max_new_tokens=4) and client.predict(api_name="/reset"))
    huge = tmp_path / "huge.json"
    huge.write_bytes(b" " * (MAX_IMPORT_BYTES + 1))
    with pytest.raises(Exception) as err:
        client.predict(handle_file(str(huge)), api_name="/import")
    assert "Traceback" not in str(err.value)
    v = _views(client.predict(api_name="/step"))
    assert v["run_md"] == own["run_md"] and v["round_md"].startswith("**Round 1**")


@pytest.mark.parametrize("kw, message", [
    (dict(p_gamma=0), "gamma must be >= 1, got 0"),
    (dict(p_max_new_tokens=2.5), "max_new_tokens: expected int, got 2.5"),  # never runs 2
    (dict(p_gamma=2.5), "gamma: expected int, got 2.5"),
    (dict(p_max_new_tokens=300), "max_new_tokens must be <= 256 in the UI"),
    (dict(prompt="  "), "prompt is empty"),
    (dict(prompt="x" * 2001), "the UI limit is 2000"),
    (dict(method="mcsd", p_k_config="9x9x9"), "k_config '9x9x9' makes 819 nodes"),
    (dict(method="atspeed_strict", p_draft_beams=256, p_gamma=16),
     "draft_beams x gamma = 4096 forest nodes per round; the UI limit is 1024"),
    (dict(target="Qwen/Qwen2.5-7B-Instruct"), "is a GPU preset: it needs a CUDA device"),
    (dict(target="/no/such/model"), "cannot load model '/no/such/model'"),
    (dict(p_max_new_tokens=0), "max_new_tokens must be >= 1"),
    (dict(p_temperature=-1), "temperature must be >= 0.0"),
    (dict(p_temperature=11), "temperature must be <= 10.0"),
    (dict(p_top_p=0), "top_p must be > 0.0"),
    (dict(p_top_p=1.5), "top_p must be <= 1.0"),
    (dict(p_top_k=-1), "top_k must be >= 0"),
    (dict(p_seed=-1), "seed must be >= 0"),
    (dict(method="mcsd", p_k_config="axb"), "k_config"),
    (dict(method="nope"), "nope"),
    (dict(target="tiny:{oops"), "bad tiny model spec"),
    (dict(target="early-exit"), "is a drafter"),
    (dict(target='tiny:{"hidden_size": 8192, "layers": 64}'), "tiny models are toys"),
    (dict(draft="early-exit:0"), "early-exit layers must be a positive integer"),
    (dict(draft='tiny:{"vocab_size": 32}'), "target vocab size 64, draft 32"),
    (dict(draft="/no/such/draft"), "cannot load model '/no/such/draft'"),
])
def test_bad_inputs_become_one_line_errors(client, kw, message):
    with pytest.raises(AppError) as err:
        _run(client, **kw)
    text = str(err.value)
    assert message in text
    assert "\n" not in text and "Traceback" not in text
    assert "4 tokens in" in _run(client, p_max_new_tokens=4)["run_md"]  # the session works


@pytest.mark.parametrize("args, message", [
    (("hi", [], 8, 0.0, 0, TINY, "", ""), "pick at least one method"),
    (("hi", ["sd"], 0, 0.0, 0, TINY, "", ""), "Value 0 is less than minimum value 1"),
    (("hi", ["sd"], 500, 0.0, 0, TINY, "", ""), "Value 500 is greater than maximum value 128"),
    (("  ", ["sd"], 8, 0.0, 0, TINY, "", ""), "prompt is empty"),
    (("x" * 2001, ["sd"], 8, 0.0, 0, TINY, "", ""), "the UI limit is 2000"),
    (("hi", ["sd"], 8, -1.0, 0, TINY, "", ""), "Value -1.0 is less than minimum value 0"),
    (("hi", ["sd"], 8, 0.0, 0, TINY, "", "nope:gamma=2"), "unknown method 'nope'"),
    (("hi", ["sd"], 8, 0.0, 0, TINY, "", ",".join(["sd:gamma=2"] * 3 + [
        f"sd:gamma={g}" for g in range(3, 10)])), "compare at most 8 methods"),
    (("hi", ["sd"], 8, 0.0, 0, "tiny:{oops", "", ""), "bad tiny model spec"),
    (("hi", ["sd"], 2.5, 0.0, 0, TINY, "", ""), "max_new_tokens must be a whole number"),
    (("hi", ["sd"], 8, 0.0, 1.5, TINY, "", ""), "seed must be a whole number, got 1.5"),
])
def test_bad_compare_inputs_become_one_line_errors(client, args, message):
    with pytest.raises(AppError) as err:
        client.predict(*args, api_name="/compare")
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("args, message", [
    (("hi", "sd", "gamma", 1.0, 0, 1.0, 8), "bad parameter 'gamma' (use key=value"),
    (("hi", "sd", "gamma=0", 1.0, 0, 1.0, 8), "gamma must be >= 1"),
    (("hi", "sd", "", -1.0, 0, 1.0, 8), "Value -1.0 is less than minimum value 0"),
    (("hi", "sd", "", 1.0, 0, 2.0, 8), "Value 2.0 is greater than maximum value 1"),
    (("hi", "sd", "", 1.0, -3, 1.0, 8), "Value -3 is less than minimum value 0"),
    (("", "sd", "", 1.0, 0, 1.0, 8), "prompt is empty"),
    (("hi", "sd", "", 0.0, 0, 1.0, 999), "max_new_tokens must be <= 256 in the UI"),
    (("hi", "beam_sample", "", 0.0, 0, 1.0, 8), "temperature"),
    (("hi", "sd", "", 0.0, 0, 1.0, 8.5), "max_new_tokens must be a whole number"),
    (("hi", "sd", "", 0.0, 0, 1.0, 8, 0), "Value 0 is less than minimum value 1"),
    (("hi", "sd", "", 0.0, 0, 1.0, 8, 99999), "is greater than maximum value"),
])
def test_bad_check_inputs_become_one_line_errors(client, args, message):
    with pytest.raises(AppError) as err:
        client.predict(*args[:7], TINY, "", *args[7:], api_name="/check")
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_check_keeps_to_the_seconds_it_is_given_and_says_what_it_took(client):
    """Issue 57 (10): Check's budget is a control, like Bench's caps; a law check sized past
    it runs fewer runs, says so, and reports its time against the budget."""
    report, _ = client.predict("hello world", "sd", "", 1.0, 0, 1.0, 8, TINY, "", 3,
                               api_name="/check")
    assert "to stay within 3 s" in report  # the runs it kept
    took = re.search(r"took (\d+) s of a 3-s budget", report)
    assert took and int(took.group(1)) <= 30, report


def test_method_change_shows_that_methods_parameters_with_defaults(client):
    out = client.predict("dsbd", api_name="/method")
    assert out[0].startswith("**dsbd** (beam)")
    shown = [u.get("value") for u in out[1:] if u.get("visible")]
    hidden = [u for u in out[1:] if u.get("visible") is False]
    assert 0.7 in shown and 3 in shown  # threshold and gamma defaults of dsbd
    assert hidden  # e.g. mcsd's k_config


def test_method_change_fills_in_the_pairs_measured_best_settings(client):
    def shown(target, draft, method="sd"):
        out = client.predict(method, target, draft, api_name="/method")
        return [u.get("value") for u in out[1:] if u.get("visible")]

    assert "cost" in shown("embedded", "ngram+feature")  # the embedded preset's sd switch
    assert "cost" in shown("embedded", "ngram+feature", "eesd")  # eesd's cost switch
    assert "off" in shown(TINY, "") and "cost" not in shown(TINY, "")  # sd's own defaults
    mcsd = shown("embedded", "ngram+feature", "mcsd")
    assert {"2x2", "cost"} <= set(mcsd)  # the tree and its cost switch
    assert 0.3 in shown("embedded", "ngram+feature", "atspeed_strict")  # the draft gate
    assert 0.3 not in shown(TINY, "", "atspeed_strict")


def test_preset_fills_the_model_pair_fields_and_gpu_presets_need_a_gpu(client):
    target, draft = client.predict("Tiny random llama (instant, gibberish)",
                                   api_name="/preset")
    assert (target, draft) == (TINY, "")
    if not torch.cuda.is_available():  # issue 57 (13): not offered, so never refused at Run
        with pytest.raises(AppError, match="not in the list of choices"):
            client.predict("Qwen2.5-7B-Instruct + n-gram lookup (GPU)", api_name="/preset")


def test_compare_checks_each_output_against_its_reference(client):
    table, timeline, bars, note = client.predict("hello world", ["sd", "mcsd"], 8, 0.0, 0, TINY,
                                                 "", "sd:gamma=1", api_name="/compare")
    rows = {r[0]: dict(zip(table["headers"], r)) for r in table["data"]}
    assert rows["sd"]["equals plain decode"] == "yes" == rows["mcsd"]["equals plain decode"]
    assert rows["sd:gamma=1"]["equals plain decode"] == "yes"  # the same method, other settings
    assert rows["sd:gamma=1"]["parameters"].startswith("gamma=1 (typed),")
    assert rows["greedy"]["role"] == "plain decode"
    assert rows["greedy"]["equals plain decode"] == "is the plain decode"
    assert "beam" not in rows  # no beam method ticked: no beam baseline
    assert float(rows["sd"]["predicted ×"]) > 0 and float(rows["sd"]["measured ×"]) > 0
    names = _plot_names(timeline)
    assert {"draft (propose)", "target forward (score)"} <= names
    assert {"measured ×", "predicted ×"} <= _plot_names(bars)
    assert "Ran" in note and "- **sd**: over " in note
    for name in ("sd", "mcsd"):  # the note's figures are the table's, under the same names
        line = next(ln for ln in note.splitlines() if ln.startswith(f"- **{name}**"))
        row = rows[name]
        assert (f"predicted {row['predicted ×']}x, round-time {row['round-time ×']}x"
                in line)
        assert f"measured {row['measured ×']}x (the whole run against its plain decode)" in line


def test_compare_puts_transformers_prompt_lookup_beside_the_engines_ngram_sd(client):
    """The Compare preset's pair of runs on one prompt: transformers' own prompt lookup and
    the engine's sd with the n-gram drafter, each with its cost model and where a round's
    time went."""
    prompt = "one two three four one two three four one two three"
    table, _, _, note = client.predict(prompt, ["hf_prompt_lookup", "sd"], 12, 0.0, 0, TINY,
                                       "ngram", "", api_name="/compare")
    rows = {r[0]: dict(zip(table["headers"], r)) for r in table["data"]}
    for name in ("hf_prompt_lookup", "sd"):
        assert rows[name]["equals plain decode"] == "yes", rows[name]
        assert float(rows[name]["predicted ×"]) > 0 and float(rows[name]["measured ×"]) > 0
    for name in ("hf_prompt_lookup", "sd"):
        line = next(ln for ln in note.splitlines() if ln.startswith(f"- **{name}**"))
        assert "a round took" in line and "drafting" in line and "verifying" in line
        assert "a plain step takes" in line


def test_a_run_exports_as_one_self_contained_html_page(client):
    _run(client, method="hf_prompt_lookup", p_max_new_tokens=8,
         prompt="one two one two one two")
    out = client.predict(api_name="/export_page")  # the File's update: shown, with the page
    assert out["visible"] is True
    text = open(out["value"]).read()
    assert text.startswith("<!DOCTYPE html>") and "hf_prompt_lookup" in text
    assert "id='round-0'" in text and "https://" not in text.split("<script")[0]


def test_compare_names_a_bad_extra_run_in_one_line(client):
    with pytest.raises(AppError) as err:
        client.predict("hello world", ["sd"], 8, 0.0, 0, TINY, "", "sd:gamma=0",
                       api_name="/compare")
    assert "gamma must be >= 1" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_registered_method_runs_and_renders_without_ui_changes(client, method):
    overrides = {f"p_{k}": v for k, v in METHODS[method].defaults.items()}
    v = _run(client, method=method, p_max_new_tokens=4, **overrides)
    assert v["run_md"].startswith(f"**{method}**")
    assert "4 tokens in" in v["run_md"] or "(eos)" in v["run_md"]
    n = int(v["round_md"].split(" of ")[1].split()[0])
    for i in range(n):
        assert _views(client.predict(i, api_name="/seek"))["round_md"].startswith(
            f"**Round {i}**")


def _generate(client, settings="{}", method="sd", target="", draft="", prompt="Say hi."):
    return RunTrace.from_json(client.predict(prompt, method, settings, target, draft,
                                             api_name="/generate"))


@pytest.mark.embedded
def test_generate_runs_the_pairs_tuned_settings_under_the_ones_given(client):
    """/run takes every widget's value, so an API call passing only a prompt and a method ran
    the widgets' opening values, not the pair's tuned settings the page opens the method on;
    /generate layers the settings given over the tuned ones, as `engine generate` does."""
    tuned = _generate(client, '{"max_new_tokens": 2}', target="embedded")
    assert tuned.params["switch"] == "cost" and "switch" in tuned.tuned_names  # the preset
    assert tuned.params["max_new_tokens"] == 2 and 1 <= len(tuned.token_ids) <= 2
    given = _generate(client, '{"max_new_tokens": 2, "switch": "off", "gamma": 2}',
                      target="embedded")
    assert (given.params["switch"], given.params["gamma"]) == ("off", 2)
    assert "switch" not in given.tuned_names
    plain = _generate(client, '{"max_new_tokens": 3}')  # the page's target: a tiny pair
    default = {p.name: p.default for p in METHODS["sd"].all_params}  # with no tuned settings
    assert plain.params["switch"] == default["switch"] == "off"
    assert plain.tuned_names == () and len(plain.token_ids) == 3


def test_a_run_the_ui_stops_early_says_why_in_run_and_generate(client, monkeypatch):
    """Past the trace's node cap the UI stops a run; both handlers keep its reason as the
    run's stop reason (/generate dropped it before the review fix)."""
    from specviz import streaming

    monkeypatch.setattr(streaming, "MAX_TRACE_NODES", 2)  # the app runs in this process
    why = "stopped by the UI: more than 2 forest nodes"
    trace = _generate(client, '{"max_new_tokens": 40, "gamma": 3}', prompt="hello world")
    assert trace.stop_reason == why and len(trace.token_ids) < 40
    assert why in _run(client, p_max_new_tokens=40)["run_md"]


@pytest.mark.parametrize("settings, method, prompt, message", [
    ("{oops", "sd", "hi", "settings: not a JSON object"),
    ("[2]", "sd", "hi", "settings: expected a JSON object"),
    ('{"gamma": 0}', "sd", "hi", "gamma must be >= 1"),
    ('{"nope": 1}', "sd", "hi", "unknown parameter 'nope'"),
    ("{}", "nope", "hi", "unknown method 'nope'"),
    ('{"max_new_tokens": 300}', "sd", "hi", "max_new_tokens must be <= 256 in the UI"),
    ("{}", "sd", "x" * 2001, "the UI limit is 2000"),
    ('{"seed": 1e30}', "sd", "hi", "seed must be <="),
    ({"gamma": 0}, "sd", "hi", "gamma must be >= 1"),  # an object, not its text
    ("{}", ["sd"], "hi", "method: expected a string, got list"),
])
def test_bad_generate_inputs_become_one_line_errors(client, settings, method, prompt, message):
    """Each refused in one line, the app's caps (tokens, prompt) held as /run holds them."""
    with pytest.raises(AppError) as err:
        _generate(client, settings, method, prompt=prompt)
    text = str(err.value)
    assert message in text and "\n" not in text and "Traceback" not in text


@pytest.mark.embedded
def test_run_on_the_embedded_model(client):
    v = _run(client, target="embedded", prompt="Say hi.", p_gamma=2, p_max_new_tokens=4)
    assert "SmolLM2-135M-Instruct" in v["run_md"]
    assert "4 tokens in" in v["run_md"] or "eos" in v["run_md"]
