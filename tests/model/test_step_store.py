"""Compiled steps kept on disk (engine.execution.step_store): a model of the same architecture
loads them and keeps its own tokens (weights are read at each call, not baked in); a loaded
step that disagrees with the eager step, or a damaged file, is compiled afresh; the key
separates what a trace bakes in; with the store off nothing is written."""

from __future__ import annotations

import logging
import shutil

import pytest
import torch

import engine
from engine.execution import step_store
from tests.conftest import tiny_pair

pytestmark = pytest.mark.slow  # step shapes compile (seconds each on a tiny model)
PROMPT, NEW = [3, 4, 5, 6], 8


def greedy_run(pair) -> tuple[list[int], list[int]]:
    """The compiled path's greedy tokens and generate()'s."""
    trace = engine.generate(pair, PROMPT, "greedy", max_new_tokens=NEW)
    assert trace.stats.step_paths.get("target:compiled", 0) == len(trace.rounds)
    ref = pair.target.generate(torch.tensor([PROMPT]), do_sample=False, max_new_tokens=NEW)
    return list(trace.token_ids), ref[0, len(PROMPT):].tolist()


def steps(root) -> list:
    """The stored step files under a store's folder."""
    return sorted(root.rglob("*.step"))


def model(seed: int, **kw):
    return tiny_pair(layers=2, early_exit_layers=1, seed=seed, **kw)  # two layers: quick


def refused_and_compiled_afresh(pair, caplog, message: str) -> None:
    """A run whose stored steps are all refused at their check: its own generate() tokens,
    no step loaded, the refusal logged."""
    before = dict(step_store.STATS)
    with caplog.at_level(logging.WARNING, logger=step_store.LOG.name):
        ours, ref = greedy_run(pair)
    assert ours == ref
    assert step_store.STATS["rejected"] - before["rejected"] >= 1
    assert step_store.STATS["loaded"] == before["loaded"]
    assert message in caplog.text


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A store holding the steps one model's greedy run compiled."""
    root = tmp_path_factory.mktemp("steps")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECVIZ_STEPS", str(root))
        mp.setenv("SPECVIZ_KV", "compiled")
        before = dict(step_store.STATS)
        ours, ref = greedy_run(model(seed=3))
        assert ours == ref
        assert step_store.STATS["compiled"] - before["compiled"] == len(steps(root))
    return root


@pytest.fixture
def use(monkeypatch, tmp_path):
    """Point the process at a copy of a store."""
    def point(root):
        copy = tmp_path / "steps"
        shutil.copytree(root, copy)
        monkeypatch.setenv("SPECVIZ_STEPS", str(copy))
        monkeypatch.setenv("SPECVIZ_KV", "compiled")
        return copy
    return point


def test_a_model_of_the_same_architecture_loads_the_stored_steps_and_keeps_its_tokens(
        store, use):
    use(store)
    before = dict(step_store.STATS)
    ours, ref = greedy_run(model(seed=4))  # other weights, the same shapes
    assert ours == ref
    assert step_store.STATS["loaded"] - before["loaded"] == len(steps(store)) >= 2
    assert step_store.STATS["compiled"] == before["compiled"]


def test_a_loaded_step_that_disagrees_with_the_eager_step_is_compiled_afresh(
        monkeypatch, tmp_path, caplog):
    """A key that missed a setting the trace baked in (here the norm's epsilon, a constant of
    the graph) would load another model's step: the first-call check refuses it."""
    monkeypatch.setenv("SPECVIZ_STEPS", str(tmp_path))
    monkeypatch.setenv("SPECVIZ_KV", "compiled")
    monkeypatch.setattr(step_store, "model_key", lambda decoder: "one key for every model")
    ours, ref = greedy_run(model(seed=3))  # stores its steps under that key
    assert ours == ref
    refused_and_compiled_afresh(model(seed=3, rms_norm_eps=0.5), caplog,
                                "disagrees with the eager step")


def test_a_damaged_step_file_is_compiled_afresh(store, use, caplog):
    copy = use(store)
    for path in steps(copy):  # its key line kept: the body is what cannot be read
        path.write_bytes(path.read_bytes().split(b"\n", 1)[0] + b"\nnot a compiled step")
    before = dict(step_store.STATS)
    with caplog.at_level(logging.WARNING, logger=step_store.LOG.name):
        ours, ref = greedy_run(model(seed=5))
    assert ours == ref
    assert step_store.STATS["loaded"] == before["loaded"]
    assert step_store.STATS["compiled"] - before["compiled"] == len(steps(copy))
    assert "unreadable, compiled afresh" in caplog.text


def test_with_the_store_off_steps_compile_in_memory_and_nothing_is_written(monkeypatch,
                                                                           tmp_path):
    monkeypatch.setenv("SPECVIZ_STEPS", "off")
    monkeypatch.setenv("SPECVIZ_KV", "compiled")
    before = dict(step_store.STATS)
    ours, ref = greedy_run(model(seed=6))
    assert ours == ref
    assert step_store.STATS == before


def test_the_key_separates_what_a_trace_bakes_in_and_not_the_weights():
    from engine.kernels import eager_bits
    from engine.kernels.packed4 import quantize_linears, set_activation_bits

    key = step_store.model_key
    a, b = model(seed=3).target.model, model(seed=4).target.model
    assert key(a) == key(b)  # weights are inputs of a compiled step
    assert key(model(seed=3, rms_norm_eps=0.5).target.model) != key(a)  # a graph constant
    assert key(model(seed=3, num_key_value_heads=4).target.model) != key(a)
    quantize_linears(b)
    assert key(b) != key(a)  # packed linears: another module class, other tensors
    packed16 = key(b)
    set_activation_bits(b, 8)
    assert key(b) != packed16  # the kernel's activation width is an argument of the op
    plain = model(seed=3).target.model
    eager_bits.keep_eager_bits(plain)  # subclasses that keep the stock classes' names
    assert key(plain) != key(a)


def test_a_new_folder_keeps_only_the_most_recent_other_step_folders(tmp_path):
    import os

    names = [f"{i:016x}" for i in range(4)]  # step folders' names: 16 hex digits
    for i, name in enumerate(names):
        (tmp_path / name).mkdir()
        (tmp_path / name / "a.step").write_bytes(b"")
        os.utime(tmp_path / name, (1000 + i, 1000 + i))  # the last the most recent
    (tmp_path / "work").mkdir()  # not a step folder: a user's, in a shared folder
    (tmp_path / f"{9:016x}").mkdir()
    (tmp_path / f"{9:016x}" / "notes.txt").write_text("not steps")
    new = tmp_path / ("f" * 16)
    new.mkdir()
    step_store._prune(new)
    kept = sorted(p.name for p in tmp_path.iterdir())
    assert kept == sorted([new.name, "work", f"{9:016x}",
                           *names[4 - step_store.KEEP_FOLDERS + 1:]])


def test_the_file_of_a_step_names_its_buffers_shape_and_grad_mode(monkeypatch, tmp_path):
    """A trace bakes in the KV buffer's rows and slots: a step of another buffer size has
    another file (with no guards it would index outside the buffer)."""
    from types import SimpleNamespace

    monkeypatch.setenv("SPECVIZ_STEPS", str(tmp_path))
    decoder = model(seed=3).target.model
    inputs = {"input_ids": torch.zeros((1, 1), dtype=torch.long),
              "position_ids": torch.zeros((1, 1), dtype=torch.long),
              "attention_mask": torch.zeros((1, 1, 1, 128))}

    def cache(slots):
        kv = SimpleNamespace(keys=torch.zeros(1, 2, slots, 8), values=torch.zeros(1, 2, slots, 8))
        return SimpleNamespace(layers=[kv, kv], rows=1, view=128, slots=torch.zeros(1))

    path = step_store.step_path(decoder, cache(1024), inputs)
    assert path == step_store.step_path(decoder, cache(1024), inputs)
    assert path != step_store.step_path(decoder, cache(2048), inputs)
    with torch.no_grad():
        assert path != step_store.step_path(decoder, cache(1024), inputs)


def test_a_file_stored_for_another_step_is_refused_before_it_runs(monkeypatch, tmp_path,
                                                                   caplog):
    """A file that holds another step (another architecture and every other shape: each
    shape sent to one file here, as a digest's collision or a copied file would) is refused
    by its key line, never run: run on this cache, a step of other shapes would write
    outside the slots it is given (it did, now and then, before the line was checked)."""
    monkeypatch.setenv("SPECVIZ_KV", "compiled")
    one = tmp_path / "one.step"
    monkeypatch.setattr(step_store, "step_path", lambda *a, **k: one)
    ours, ref = greedy_run(model(seed=3))
    assert ours == ref and one.exists()
    ran = []
    real = torch.compiler.load_compiled_function
    monkeypatch.setattr(torch.compiler, "load_compiled_function",
                        lambda *a, **k: ran.append(1) or real(*a, **k))
    refused_and_compiled_afresh(model(seed=3, num_key_value_heads=4), caplog,
                                "was stored for another step")
    assert not ran  # no stored step was even loaded
