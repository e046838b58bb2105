"""The typed run context: methods/ sits below run/, so a method takes the protocol
``RunState`` (engine/methods/base.py) and the round loop hands it its ``RunContext``
(engine/run/loop.py). These tests keep the two in step: the context provides every member the
protocol declares, the protocol declares every member a method reads, and every ``ctx``
parameter of a method is annotated with it."""

from __future__ import annotations

import ast
import typing
from pathlib import Path

import pytest

from engine.methods.base import PairView, RunState
from engine.run.loop import RunContext
from engine.run.models import ModelPair

ROOT = Path(__file__).resolve().parents[2]
ATTRIBUTE, PROPERTY, METHOD = "attribute", "property", "method"


def protocol_members(proto: type) -> dict[str, str]:
    """Name -> kind of every member a protocol declares (its annotations, properties and
    methods; dunder and private names aside)."""
    out = {name: ATTRIBUTE for name in proto.__dict__.get("__annotations__", {})}
    for name, value in vars(proto).items():
        if name.startswith("_"):
            continue
        if isinstance(value, property):
            out[name] = PROPERTY
        elif callable(value):
            out[name] = METHOD
    return out


def missing_members(proto: type, cls: type) -> list[str]:
    """The members of `proto` that `cls` does not provide as the right kind: an attribute as
    an annotated (dataclass) field or a property, a property likewise, a method as a method."""
    annotated: set[str] = set()
    for klass in cls.__mro__:
        annotated |= set(klass.__dict__.get("__annotations__", {}))
    missing = []
    for name, kind in protocol_members(proto).items():
        value = getattr(cls, name, None)
        if kind == METHOD:
            ok = callable(value) and not isinstance(value, property)
        else:
            ok = isinstance(value, property) or name in annotated
        if not ok:
            missing.append(name)
    return missing


def stub(members: dict[str, str]) -> type:
    """A class that provides exactly `members` (name -> kind)."""
    body: dict = {"__annotations__": {n: "int" for n, k in members.items() if k == ATTRIBUTE}}
    for name, kind in members.items():
        if kind == PROPERTY:
            body[name] = property(lambda self: None)
        elif kind == METHOD:
            body[name] = lambda self: None
    return type("Stub", (), body)


def test_the_protocol_declares_the_run_state_methods_use():
    members = protocol_members(RunState)
    assert {"seqs", "scores", "origins", "pair", "target", "chooser", "side"} <= set(members)
    assert members["width"] == members["remaining"] == members["draft_if_started"] == PROPERTY
    assert members["draft_feed"] == members["committed_ids"] == METHOD
    hints = typing.get_type_hints(RunState)  # every annotation resolves to a real type
    assert set(hints) == {n for n, k in members.items() if k == ATTRIBUTE}


def test_run_context_provides_every_member_of_the_protocol():
    assert missing_members(RunState, RunContext) == []


def test_model_pair_provides_every_member_of_the_pair_view():
    assert missing_members(PairView, ModelPair) == []


@pytest.mark.parametrize("proto", [RunState, PairView])
def test_the_member_check_flags_each_member_a_class_lacks(proto):
    members = protocol_members(proto)
    assert missing_members(proto, stub(members)) == []
    for name in members:
        rest = {n: k for n, k in members.items() if n != name}
        assert missing_members(proto, stub(rest)) == [name]
    wrong = {n: (METHOD if k != METHOD else ATTRIBUTE) for n, k in members.items()}
    assert sorted(missing_members(proto, stub(wrong))) == sorted(members)


def method_sources() -> list[Path]:
    return sorted((ROOT / "engine" / "methods").glob("*.py"))


def test_the_protocol_declares_every_member_a_method_reads_or_writes():
    used = set()
    for path in method_sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id == "ctx"):
                used.add(node.attr)
    assert used and used <= set(protocol_members(RunState)), used - set(
        protocol_members(RunState))


def test_every_ctx_parameter_is_annotated_with_the_protocol():
    bare = []
    for folder in ("methods", "drafters", "control"):
        for path in sorted((ROOT / "engine" / folder).glob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                for arg in node.args.posonlyargs + node.args.args + node.args.kwonlyargs:
                    if arg.arg == "ctx" and not (isinstance(arg.annotation, ast.Name)
                                                 and arg.annotation.id == "RunState"):
                        bare.append(f"{path.name}:{node.lineno} {node.name}")
    assert bare == []
