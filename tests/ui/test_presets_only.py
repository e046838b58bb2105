"""A server with custom models off (SPECVIZ_ALLOW_CUSTOM_MODELS=0): the model boxes are not
editable, the handlers refuse any pair but the host's, and only the chosen presets show."""

from __future__ import annotations

import gradio as gr
import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError

from specviz import hosting
from specviz.hosting import HostConfig
from specviz.render import OUTPUTS
from tests.ui.helpers import TINY, free_port

pytestmark = [pytest.mark.ui, pytest.mark.filterwarnings("ignore::DeprecationWarning")]


@pytest.fixture(scope="module")
def served():
    import specviz

    hosting.configure(HostConfig(target=TINY, presets=("tiny",), allow_custom_models=False))
    demo = specviz.build_demo(TINY)
    demo.queue()
    _, url, _ = demo.launch(prevent_thread_lock=True, server_name="127.0.0.1",
                            server_port=free_port(), quiet=True, **specviz.launch_options())
    try:
        yield demo, Client(url, verbose=False)
    finally:
        demo.close()
        hosting.configure(HostConfig())


def test_the_model_boxes_are_not_editable_and_only_chosen_presets_show(served):
    demo, _ = served
    boxes = [b for b in demo.blocks.values()
             if isinstance(b, gr.Textbox) and str(b.label).startswith(("Target (p)", "Draft (q)"))]
    assert len(boxes) == 2 and all(b.interactive is False for b in boxes)
    presets = [b for b in demo.blocks.values()
               if isinstance(b, gr.Dropdown) and b.label == "Preset"]
    assert [c[0] for c in presets[0].choices] == ["Tiny random llama (instant, gibberish)"]


def test_the_run_handler_refuses_a_typed_model_in_one_line(served):
    _, client = served
    with pytest.raises(AppError) as err:
        client.predict(prompt="hello", method="greedy", target="gpt2", draft="",
                       p_max_new_tokens=4, api_name="/run")
    assert "runs only its preset models (SPECVIZ_ALLOW_CUSTOM_MODELS=0)" in str(err.value)
    assert "\n" not in str(err.value)
    with pytest.raises(AppError, match="runs only its preset models"):
        client.predict("hello", ["greedy"], 4, 0.0, 0, "tiny", "", "", api_name="/compare")
    v = dict(zip(OUTPUTS, client.predict(prompt="hello", method="greedy", target=TINY,
                                         draft="", p_max_new_tokens=4, api_name="/run")))
    assert "4 tokens in" in v["run_md"]


TINY3 = 'tiny:{"vocab_size": 64, "layers": 3}'  # the host's own pair: not the tiny preset's


@pytest.fixture(scope="module")
def served_ngram():
    """A host whose pair is (TINY3, ngram), custom models off: no pair of TINY3 with its
    default drafter (the early exit) is allowed."""
    import specviz

    hosting.configure(HostConfig(target=TINY3, draft="ngram", presets=("tiny",),
                                 allow_custom_models=False))
    demo = specviz.build_demo(TINY3, "ngram")
    demo.queue()
    _, url, _ = demo.launch(prevent_thread_lock=True, server_name="127.0.0.1",
                            server_port=free_port(), quiet=True, **specviz.launch_options())
    try:
        yield Client(url, verbose=False)
    finally:
        demo.close()
        hosting.configure(HostConfig())


def test_generate_runs_the_hosts_pair_where_no_target_or_draft_is_given(served_ngram):
    """/generate with no target takes the page's pair, and a target without a draft the
    host's pair of that target: with custom models off, the target's default drafter would
    be refused."""
    import json

    for target in ("", TINY3):
        trace = json.loads(served_ngram.predict("hello", "sd", '{"max_new_tokens": 3}', target,
                                                "", api_name="/generate"))
        assert trace["draft"].startswith("n-gram") and len(trace["token_ids"]) == 3
    with pytest.raises(AppError, match="runs only its preset models"):
        served_ngram.predict("hello", "sd", "{}", "gpt2", "", api_name="/generate")
