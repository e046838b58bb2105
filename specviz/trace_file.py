"""Trace files of the app: reading an uploaded trace (JSON only, within limits) and writing
exports into the app's own temp folder.

An upload is user input: it is read as UTF-8 JSON and nothing else (no pickle), refused
beyond ``MAX_IMPORT_BYTES`` (Gradio refuses larger uploads first: ``max_file_size`` in
specviz.ui.launch_options), and checked before any view sees it: finite numbers, nesting
depth, string length, the RunTrace schema (engine.contract.trace; fields added later have defaults,
so older traces still import), the node count a run in the app may reach, and the size of
the beam-match records. Every refusal is one line.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any, Callable

from engine.contract.trace import RoundTrace, RunTrace
from engine.core.errors import ConfigError, SpecvizError
from specviz import limits
from specviz.state import HELD, weight

MAX_IMPORT_BYTES = 20 * 1024 * 1024
MAX_DEPTH = 64  # a recorded trace nests about 8 levels deep
MAX_STRING_CHARS = 100_000  # the UI's prompts are at most limits.MAX_PROMPT_CHARS
MAX_IMPORT_NODES = limits.MAX_TRACE_NODES + limits.MAX_FOREST_NODES  # a run's cap + its last round
MAX_STEP_BEAMS = 64  # target beams one beam step may list (beams K and dsbd draft_beams <= 64)
MAX_BEAM_STEPS = 17  # beam steps one round may list (gamma <= 16, + the bonus step)
TRACE_VERSION = 1
EXPORT_DIR = Path(tempfile.gettempdir()) / "specviz-exports"
MAX_EXPORTS = 200  # files kept in EXPORT_DIR, the oldest removed first


class TraceFileError(ConfigError):
    """An uploaded file that is not a trace this app shows."""


def _refuse(reason: str) -> TraceFileError:
    return TraceFileError(f"not a specviz trace: {reason}")


def _finite(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise _refuse(f"number {text} is out of range")
    return value


def _constant(name: str) -> float:
    raise _refuse(f"non-finite number {name}")


def _check_shape(data: Any) -> None:
    """Nesting depth and string lengths of parsed JSON, walked without recursion."""
    stack = [(data, 1)]
    while stack:
        v, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise _refuse(f"nested more than {MAX_DEPTH} levels deep")
        if type(v) is dict:
            _check_strings(v.keys())
            v = v.values()
        _check_strings(x for x in v if type(x) is str)
        stack.extend((x, depth + 1) for x in v if type(x) is dict or type(x) is list)


def _check_strings(strings: Any) -> None:
    longest = max(map(len, strings), default=0)
    if longest > MAX_STRING_CHARS:
        raise _refuse(f"a string of {longest} characters (the limit is {MAX_STRING_CHARS})")


def parse_trace(text: str) -> RunTrace:
    """A RunTrace from JSON text, or one TraceFileError line saying why not."""
    try:
        data = json.loads(text, parse_constant=_constant, parse_float=_finite)
    except RecursionError as e:
        raise _refuse(f"nested more than {MAX_DEPTH} levels deep") from e
    except SpecvizError:
        raise
    except ValueError as e:
        raise _refuse(f"invalid JSON ({str(e).splitlines()[0][:200]})") from e
    _check_shape(data)
    if isinstance(data, dict) and isinstance(data.get("version"), int) \
            and data["version"] > TRACE_VERSION:
        raise _refuse(f"version {data['version']} is newer than this app reads "
                      f"({TRACE_VERSION})")
    try:
        trace = RunTrace.from_dict(data)
    except SpecvizError as e:
        raise _refuse(str(e)) from e
    if not trace.rounds:
        raise _refuse("no rounds")
    nodes = sum(len(r.nodes) for r in trace.rounds)
    if nodes > MAX_IMPORT_NODES:
        raise _refuse(f"{nodes} forest nodes; the app holds at most {MAX_IMPORT_NODES}")
    for r in trace.rounds:
        _check_beam_steps(r)
    HELD.admit(weight(trace))
    return trace


def _check_beam_steps(r: RoundTrace) -> None:
    """A round's beam-match records stay as small as the engine writes them: K target beams
    per step, at most one match per drafted node."""
    if len(r.beam_steps) > MAX_BEAM_STEPS:
        raise _refuse(f"round {r.index} lists {len(r.beam_steps)} beam steps (at most "
                      f"{MAX_BEAM_STEPS})")
    widest = max((len(s.target_beams) for s in r.beam_steps), default=0)
    if widest > MAX_STEP_BEAMS:
        raise _refuse(f"round {r.index} lists {widest} target beams in one step (at most "
                      f"{MAX_STEP_BEAMS})")
    matches = sum(len(s.drafted) for s in r.beam_steps)
    if matches > len(r.nodes):
        raise _refuse(f"round {r.index} matches {matches} drafted beams to {len(r.nodes)} "
                      "forest nodes")


def load_trace_file(path: str | Path) -> RunTrace:
    """A RunTrace from an uploaded JSON file (size checked before it is read)."""
    p = Path(path)
    if p.stat().st_size > MAX_IMPORT_BYTES:
        raise TraceFileError(f"trace file is larger than {MAX_IMPORT_BYTES // 2**20} MB")
    try:
        text = p.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise _refuse(f"not UTF-8 text ({e.reason})") from e
    return parse_trace(text)


def write_export(name: str, text: str | Callable[[], str], digest: str,
                 suffix: str = ".json") -> str:
    """Write an export into EXPORT_DIR (the newest MAX_EXPORTS files kept); its path. text:
    the file's text, or a function that makes it (called only when the file is new)."""
    EXPORT_DIR.mkdir(parents=True, exist_ok=True)
    path = EXPORT_DIR / f"specviz-{name}-{digest}{suffix}"
    if not path.exists():
        path.write_text(text() if callable(text) else text, encoding="utf-8")
        _prune()
    return str(path)


def _prune() -> None:
    """Remove the oldest exports beyond MAX_EXPORTS (another session may prune too)."""
    try:
        old = sorted(EXPORT_DIR.glob("specviz-*"), key=lambda f: f.stat().st_mtime)
        for f in old[:-MAX_EXPORTS]:
            f.unlink(missing_ok=True)
    except OSError:
        pass
