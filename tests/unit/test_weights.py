"""Weight files and fingerprints (engine/core/weights.py): the one module both the drafters and the
predictor use, so that neither imports the other."""

from __future__ import annotations

import ast

import pytest
import torch

from engine.core.paths import ROOT
from engine.core.weights import file_digest, load_tensors, same_target, save_tensors

FP = {"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 8, "vocab_size": 64,
      "embed_abs_sum_256": 100.0}


def _engine_imports(module: str) -> set[str]:
    """engine modules a module imports at module level (not inside functions)."""
    path = ROOT / (module.replace(".", "/") + ".py")
    found = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return {m for m in found if m.startswith("engine.")
            and (ROOT / (m.replace(".", "/") + ".py")).is_file()}


def _module_level_closure(module: str) -> set[str]:
    seen, todo = set(), [module]
    while todo:
        for m in _engine_imports(todo.pop()) - seen:
            seen.add(m)
            todo.append(m)
    return seen


@pytest.mark.parametrize("module,other", [
    ("engine.drafters.early_exit", "engine.control.predictor"),
    ("engine.control.predictor", "engine.drafters.early_exit")])
def test_drafters_and_predictor_do_not_import_each_other(module, other):
    assert other not in _module_level_closure(module)
    assert "engine.core.weights" in _engine_imports(module)


def test_same_target_compares_shapes_exactly_and_the_checksum_within_rtol():
    assert same_target(FP, {**FP, "embed_abs_sum_256": 100.05})  # within 1e-3
    assert not same_target(FP, {**FP, "embed_abs_sum_256": 100.2})
    assert not same_target(FP, {**FP, "vocab_size": 65})
    assert not same_target(FP, {**FP, "model_type": "qwen2"})


def test_tensors_and_metadata_round_trip_and_the_digest_is_sha1(tmp_path):
    path = save_tensors(tmp_path / "sub" / "w.safetensors",
                        {"a": torch.arange(6).reshape(2, 3).T}, {"n_layers": "2"})
    tensors, meta = load_tensors(path)
    assert tensors["a"].tolist() == [[0, 3], [1, 4], [2, 5]] and meta == {"n_layers": "2"}
    assert not list((tmp_path / "sub").glob("*.tmp"))  # written atomically
    (tmp_path / "b").write_bytes(b"abc")
    assert file_digest(tmp_path / "b") == "a9993e364706816aba3e25717850c26c9cd0d89d"


def test_read_weight_file_refuses_a_missing_or_unreadable_file_in_one_line(tmp_path):
    from engine.core.errors import ConfigError
    from engine.core.weights import read_weight_file, save_tensors

    with pytest.raises(ConfigError, match="some drafter weights not found"):
        read_weight_file(tmp_path / "none.safetensors", "some drafter")
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"not safetensors")
    with pytest.raises(ConfigError, match="cannot read some drafter weights"):
        read_weight_file(junk, "some drafter")
    good = save_tensors(tmp_path / "w.safetensors", {"a": torch.ones(2)}, {"k": "v"})
    tensors, meta = read_weight_file(good, "some drafter")
    assert tensors["a"].tolist() == [1.0, 1.0] and meta == {"k": "v"}
