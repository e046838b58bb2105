"""Safety when hosted: no remote code, no pickled user files, capped uploads, custom models
refused by every model handler when the host turns them off."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import gradio as gr
import pytest

from engine import settle
from engine.run import models
from specviz import check_tab, compare, hosting, limits, pairs, streaming, trace_file
from specviz.hosting import HostConfig

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted([*ROOT.glob("engine/**/*.py"), *ROOT.glob("specviz/**/*.py"), ROOT / "app.py"])


def _calls(pattern: str) -> list[tuple[str, str]]:
    """(file, call text up to its closing parenthesis) of every match in the sources."""
    out = []
    for path in SOURCES:
        text = path.read_text()
        for m in re.finditer(pattern, text):
            depth, end = 0, m.end()
            for end in range(m.end() - 1, len(text)):
                depth += {"(": 1, ")": -1}.get(text[end], 0)
                if depth == 0:
                    break
            out.append((str(path.relative_to(ROOT)), text[m.start():end + 1]))
    return out


def test_remote_code_is_never_trusted_anywhere():
    for path in SOURCES:
        assert not re.search(r"trust_remote_code\s*=\s*True", path.read_text()), path
    for where, call in _calls(r"\.from_pretrained\("):
        assert "trust_remote_code=False" in call or "gguf_file=EMBEDDED_GGUF" in call, \
            (where, call)


class _Model:
    def eval(self):
        return self

    def to(self, device):
        return self


def test_a_typed_model_loads_without_remote_code_and_from_safetensors_only(monkeypatch,
                                                                          tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    seen: dict[str, dict] = {}

    def model(src, **kwargs):
        seen["model"] = kwargs
        return _Model()

    def tokenizer(src, **kwargs):
        seen["tokenizer"] = kwargs
        raise OSError("no tokenizer here")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", model)
    monkeypatch.setattr(AutoTokenizer, "from_pretrained", tokenizer)
    models.load_model(str(tmp_path), models.torch.device("cpu"), models.torch.float32)
    assert seen["model"]["trust_remote_code"] is False
    assert seen["model"]["use_safetensors"] is True
    assert seen["tokenizer"]["trust_remote_code"] is False


def test_no_pickle_is_ever_read():
    for where, call in _calls(r"torch\.load\("):
        assert "weights_only=True" in call, (where, call)
    for path in SOURCES:
        text = path.read_text()
        assert not re.search(r"\bpickle\.loads?\(|allow_pickle\s*=\s*True|import dill", text), \
            path


def test_uploads_are_read_as_json_only():
    text = (ROOT / "specviz/trace_file.py").read_text()
    assert "json.loads(" in text and "torch.load" not in text and "pickle" not in text.replace(
        "(no pickle)", "")


def test_uploads_are_capped_by_gradio_and_by_the_import_handler():
    import specviz

    opts = specviz.launch_options()
    assert opts["max_file_size"] == trace_file.MAX_IMPORT_BYTES == 20 * 2**20
    assert "max_file_size" in inspect.signature(gr.Blocks.launch).parameters
    assert "p.stat().st_size > MAX_IMPORT_BYTES" in (ROOT / "specviz/trace_file.py").read_text()


def _check(target: str, draft: str) -> dict:
    return dict(prompt="hi", method="sd", params_text="", temperature=1.0, top_k=0, top_p=1.0,
                max_new_tokens=8, target=target, draft=draft)


@pytest.fixture
def presets_only():
    hosting.configure(HostConfig(target="tiny", presets=("tiny",), allow_custom_models=False))
    yield
    hosting.configure(HostConfig())


def test_every_model_handler_refuses_a_typed_model_when_custom_models_are_off(presets_only,
                                                                              monkeypatch):
    monkeypatch.setattr(pairs, "load", lambda *a: pytest.fail("a model was loaded"))
    refused = "runs only its preset models (SPECVIZ_ALLOW_CUSTOM_MODELS=0)"
    with pytest.raises(gr.Error, match=re.escape(refused)):
        list(check_tab.check(**_check("gpt2", "")))
    with pytest.raises(gr.Error, match=re.escape(refused)):
        list(compare.compare(prompt="hi", methods=["greedy"], max_new_tokens=4,
                             temperature=0.0, seed=0, target="./my-model", draft=""))
    with pytest.raises(gr.Error, match=re.escape(refused)):
        list(check_tab.check(**_check("tiny", "gpt2")))
    with pytest.raises(models.ConfigError, match=re.escape(refused)):
        list(streaming.decode_stream('tiny:{"layers": 9}', "", "hi", settle("greedy")))


def test_the_forest_budget_counts_every_tree_when_strict_fills_its_pad_slots():
    params = {"beams": 8, "draft_beams": 16, "gamma": 4}  # 64 nodes; 512 with fill
    limits.check_forest_budget(settle("atspeed_strict", params))
    limits.check_forest_budget(settle("atspeed_strict", {**params, "fill": True, "gamma": 8}))
    with pytest.raises(models.ConfigError, match=r"beams x draft_beams x gamma \(fill\) = 2048"):
        limits.check_forest_budget(settle("atspeed_strict",
                                          {**params, "fill": "true", "gamma": 16}))
