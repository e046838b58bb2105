"""Trace import, every bad file: one line, the session's trace untouched, the next valid
import works; exports stay in the app's temp folder. No model: the demo trace and edits."""

from __future__ import annotations

import gc
import json
import tempfile
from pathlib import Path

import gradio as gr
import pytest

from specviz import callbacks as cb
from specviz import trace_file
from specviz.render import OUTPUTS
from specviz.state import DEMO_TRACE, SessionState

DEMO = json.loads(DEMO_TRACE.read_text())
DEMO_NODES = sum(len(r["nodes"]) for r in DEMO["rounds"])


def _round_with(nodes: int) -> int:
    """The first round of the demo trace with at least ``nodes`` forest nodes."""
    found = [i for i, r in enumerate(DEMO["rounds"]) if len(r["nodes"]) >= nodes]
    assert found, f"the demo trace has no round with {nodes} forest nodes"
    return found[0]


BEAM_ROUND = _round_with(2)  # the round the beam step records below go into


def _edit(**changes) -> dict:
    d = json.loads(json.dumps(DEMO))
    d.update(changes)
    return d


def _node_p(value) -> dict:
    d = _edit()
    d["rounds"][_round_with(1)]["nodes"][0]["p"] = value
    return d


def _nested(depth: int) -> dict:
    inner: dict = {}
    for _ in range(depth):
        inner = {"a": inner}
    return _edit(params=inner)


def _beam_steps(drafted: int = 2, **target) -> dict:
    """The demo with one AtSpeed-strict step record on BEAM_ROUND (K = 2, ``drafted``
    matches)."""
    d = _edit()
    beams = [{"rank": 1, "tree": 0, "parent": -1, "token_id": 5, "text": " a", "score": -0.5,
              "node": 0, **target},
             {"rank": 2, "tree": 0, "parent": -1, "token_id": 6, "text": " b", "score": -1.25}]
    d["rounds"][BEAM_ROUND]["beam_steps"] = [{
        "depth": 1, "kind": "drafted", "target_beams": beams, "accepted": False,
        "reason": "target beam #2 ' b' (score -1.25) was not drafted",
        "drafted": [{"tree": 0, "node": i, "rank": int(i == 0), "score": -0.5 - i}
                    for i in range(drafted)]}]
    return d


BAD = [  # (file text, message): the import door's table rows in the README
    ("not json {", "invalid JSON"),
    ("", "invalid JSON"),
    ("[1, 2]", "trace: expected an object, got array"),
    ('{"hello": 1}', "trace: missing field 'method'"),
    (_edit(rounds={}), "trace.rounds: expected an array, got object"),
    (_edit(rounds=[]), "no rounds"),
    (_edit(token_ids=[True]), "trace.token_ids[0]: expected int, got boolean"),
    (_node_p("x"), f"trace.rounds[{_round_with(1)}].nodes[0].p: expected float, got string"),
    (_edit(version=2), "version 2 is newer than this app reads (1)"),
    (json.dumps(_node_p(float("nan"))), "non-finite number NaN"),
    (json.dumps(_edit(stats={"wall_s": float("inf")})), "non-finite number Infinity"),
    (json.dumps(_node_p(0.5)).replace('"p": 0.5', '"p": -1e999', 1),
     "number -1e999 is out of range"),
    ("[" * 100_000 + "]" * 100_000, "nested more than 64 levels deep"),
    (_nested(100), "nested more than 64 levels deep"),
    (_edit(prompt="x" * 3_000_000), "a string of 3000000 characters (the limit is 100000)"),
    (_beam_steps(rank="1"),
     f"trace.rounds[{BEAM_ROUND}].beam_steps[0].target_beams[0].rank: expected int, got string"),
    (_beam_steps(drafted=len(DEMO["rounds"][BEAM_ROUND]["nodes"]) + 1),
     f"round {BEAM_ROUND} matches {len(DEMO['rounds'][BEAM_ROUND]['nodes']) + 1} drafted beams "
     f"to {len(DEMO['rounds'][BEAM_ROUND]['nodes'])} forest nodes"),
]


def _write(tmp_path: Path, content) -> Path:
    path = tmp_path / "trace.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


@pytest.mark.parametrize("content, message", BAD, ids=[m for _, m in BAD])
def test_a_bad_trace_file_is_refused_in_one_line(tmp_path, content, message):
    with pytest.raises(trace_file.TraceFileError) as err:
        trace_file.load_trace_file(_write(tmp_path, content))
    text = str(err.value)
    assert text.startswith("not a specviz trace: ") and message in text
    assert "\n" not in text and len(text) < 400


def test_a_file_over_the_cap_is_refused_before_it_is_read(tmp_path, monkeypatch):
    path = tmp_path / "huge.json"
    with open(path, "wb") as f:
        f.truncate(trace_file.MAX_IMPORT_BYTES + 1)  # sparse: no 20 MB written
    monkeypatch.setattr(Path, "read_bytes", lambda self: pytest.fail("read a huge file"))
    with pytest.raises(trace_file.TraceFileError, match="trace file is larger than 20 MB"):
        trace_file.load_trace_file(path)


def test_bytes_that_are_not_utf8_are_refused(tmp_path):
    path = tmp_path / "bin.json"
    path.write_bytes(b"\xff\xfe\x00{")
    with pytest.raises(trace_file.TraceFileError, match="not UTF-8 text"):
        trace_file.load_trace_file(path)


def test_more_nodes_than_a_run_may_hold_are_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(trace_file, "MAX_IMPORT_NODES", DEMO_NODES)
    assert sum(len(r.nodes) for r in trace_file.load_trace_file(DEMO_TRACE).rounds) == DEMO_NODES
    monkeypatch.setattr(trace_file, "MAX_IMPORT_NODES", DEMO_NODES - 1)
    with pytest.raises(trace_file.TraceFileError, match=f"{DEMO_NODES} forest nodes; the app "
                       f"holds at most {DEMO_NODES - 1}"):
        trace_file.load_trace_file(DEMO_TRACE)


def test_the_import_handler_keeps_the_session_and_a_later_import_works(tmp_path):
    before = SessionState()
    for content, message in BAD[:4]:
        with pytest.raises(gr.Error) as err:
            cb.import_trace(str(_write(tmp_path, content)), before)
        assert message in err.value.message and "\n" not in err.value.message
    assert before.trace is None
    out = dict(zip(OUTPUTS, cb.import_trace(str(DEMO_TRACE), before)))
    assert "imported trace" in out["run_md"] and before.trace is None


def test_a_trace_of_an_unknown_method_shows_and_leaves_the_controls(tmp_path, monkeypatch):
    path = _write(tmp_path, _edit(method="nope_method", params={"zeta": 3}))
    out = cb.import_trace(str(path), SessionState())
    state = out[-1]
    assert dict(zip(OUTPUTS, out))["run_md"].startswith("**nope_method**")
    from specviz.params import ParamPool

    controls = cb.make_import_controls(ParamPool({}, {}))(state)
    assert all(u == gr.update() for u in controls)  # nothing set: the method is unknown


def test_a_trace_recorded_with_another_model_shows_from_its_own_text(tmp_path):
    d = _edit(target="someone/another-model-70B", draft="someone/draft")
    d["token_ids"] = [10**6 + i for i in range(len(d["token_ids"]))]  # beyond any vocab here
    out = dict(zip(OUTPUTS, cb.import_trace(str(_write(tmp_path, d)), SessionState())))
    assert "someone/another-model-70B" in out["run_md"]
    generated = [text for text, origin in out["text"] if origin not in ("prompt", None)]
    assert generated[0] == f"<{10**6}>"  # ids no tokenizer here knows: shown as ids


def test_a_trace_no_view_can_show_is_one_line(tmp_path, monkeypatch):
    def broken(state):
        raise KeyError("cost")

    monkeypatch.setattr(cb, "render", broken)
    with pytest.raises(gr.Error) as err:
        cb.import_trace(str(DEMO_TRACE), SessionState())
    assert err.value.message == "not a specviz trace: cannot show it (KeyError: 'cost')"


def test_exports_stay_in_the_apps_temp_folder_and_old_ones_are_pruned(tmp_path, monkeypatch):
    assert trace_file.EXPORT_DIR.parent == Path(tempfile.gettempdir())
    monkeypatch.setattr(trace_file, "EXPORT_DIR", tmp_path / "exports")
    monkeypatch.setattr(trace_file, "MAX_EXPORTS", 3)
    paths = [trace_file.write_export("sd", f"{{}}{i}", f"{i:012d}") for i in range(5)]
    assert all(Path(p).parent == tmp_path / "exports" for p in paths)
    assert len(list((tmp_path / "exports").iterdir())) == 3 and Path(paths[-1]).exists()


def test_the_servers_trace_budget_counts_each_trace_once_and_frees_it_with_its_sessions(
        monkeypatch):
    from specviz.state import HELD, ROUND_RECORDS, weight

    gc.collect()
    trace = trace_file.load_trace_file(DEMO_TRACE)
    base = HELD.total
    a = SessionState(trace=trace, source="import")
    b, c = a.at(3), SessionState(trace=trace)  # navigation copies and sessions share it
    records = sum(ROUND_RECORDS + len(r["nodes"]) + len(r["tests"])  # rounds, nodes, tests,
                  + sum(len(s["target_beams"]) + len(s["drafted"])  # beam matches
                        for s in r.get("beam_steps", []))
                  for r in DEMO["rounds"])
    assert HELD.total == base + weight(trace) and weight(trace) == records > DEMO_NODES
    monkeypatch.setattr(HELD, "cap", base + weight(trace) + 10)
    with pytest.raises(gr.Error, match="the server holds .* trace records for its sessions"):
        cb.import_trace(str(DEMO_TRACE), SessionState())
    del a, b, c, trace
    assert HELD.total == base  # the last holder gone: released


# What a parsed trace holds (tracemalloc on imports at the caps, README "Memory"): a round's
# own fields (beams, committed tokens, target top-k, timings, extras) and each forest node,
# verification test or beam match
ROUND_BYTES, RECORD_BYTES = 6_500, 340


def _rounds_of(n_rounds: int, node_copies: int) -> str:
    """The demo's rounds repeated to ``n_rounds``, each round's forest copied ``node_copies``
    times (ids and parents shifted), as trace JSON."""
    rounds = []
    for i in range(n_rounds):
        r = DEMO["rounds"][i % len(DEMO["rounds"])]
        k = len(r["nodes"])
        nodes = [{**n, "id": n["id"] + c * k, "parent": n["parent"] + c * k if n["parent"] >= 0
                  else -1} for c in range(node_copies) for n in r["nodes"]]
        rounds.append({**r, "index": i, "nodes": nodes})
    return json.dumps(_edit(rounds=rounds))


def _held_bytes(text: str):
    """(trace, bytes of Python objects the parsed trace holds)."""
    import tracemalloc

    from engine.contract.trace import RunTrace

    gc.collect()
    tracing = tracemalloc.is_tracing()
    if not tracing:
        tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        trace = RunTrace.from_json(text)
        gc.collect()
        return trace, tracemalloc.get_traced_memory()[0] - before
    finally:
        if not tracing:
            tracemalloc.stop()


def test_small_and_large_rounds_of_the_same_memory_weigh_about_the_same():
    from specviz.state import weight

    def records(rounds, copies: int = 1) -> int:  # nodes, tests, beam matches
        return sum(len(r["nodes"]) * copies + len(r["tests"])
                   + sum(len(s["target_beams"]) + len(s["drafted"])
                         for s in r.get("beam_steps", [])) for r in rounds)

    def cycles(copies: int) -> int:  # repeats of the demo's rounds that hold about 3 MB
        held = ROUND_BYTES * len(DEMO["rounds"]) + RECORD_BYTES * records(DEMO["rounds"], copies)
        return 3_000_000 // held

    copies = 24  # the large rounds: the demo's forests copied 24 times (~70 nodes a round)
    n = len(DEMO["rounds"])
    small, small_bytes = _held_bytes(_rounds_of(n * cycles(1), 1))
    large, large_bytes = _held_bytes(_rounds_of(n * cycles(copies), copies))
    assert len(small.rounds) > 3 * len(large.rounds)  # many small rounds, few large ones
    # the constants still describe what a parsed trace holds: the two hold about as much
    assert 1 / 1.3 < small_bytes / large_bytes < 1.3, (small_bytes, large_bytes)
    # and so the budget counts them about the same; counting a round as 1 record did not
    ratio = (weight(small) / small_bytes) / (weight(large) / large_bytes)
    assert 1 / 1.5 < ratio < 1.5, (weight(small), small_bytes, weight(large), large_bytes)

    def old(t) -> int:
        return sum(1 + len(r.nodes) + len(r.tests)
                   + sum(len(s.target_beams) + len(s.drafted) for s in r.beam_steps)
                   for r in t.rounds)

    old_ratio = (old(small) / small_bytes) / (old(large) / large_bytes)
    assert not 1 / 1.5 < old_ratio < 1.5  # the shapes tell the two formulas apart


def test_every_session_shares_the_opening_trace_instead_of_copying_it():
    import copy

    from specviz.state import demo_state

    opening = demo_state()
    session = copy.deepcopy(opening)  # what Gradio does for each new session
    assert session.trace is opening.trace and session.memo is opening.memo


def test_a_largest_allowed_import_parses_whole(tmp_path):
    """A file just under both caps opens, every round and node of it (its time is a benchmark's
    business, not a test's: about 3 s for 20 MB on a quiet 2-core AMD EPYC)."""
    d = _edit(rounds=[])
    rounds, big = DEMO["rounds"], []
    nodes, size = 0, len(json.dumps(d))
    while True:  # the demo's rounds over and over until the next would pass a cap
        r = {**rounds[len(big) % len(rounds)], "index": len(big)}
        n, b = len(r["nodes"]), len(json.dumps(r)) + 2  # + ", " between rounds
        if nodes + n > trace_file.MAX_IMPORT_NODES or size + b > trace_file.MAX_IMPORT_BYTES:
            break
        big.append(r)
        nodes, size = nodes + n, size + b
    d["rounds"] = big
    path = _write(tmp_path, d)
    assert path.stat().st_size > trace_file.MAX_IMPORT_BYTES // 2  # near a cap, not a toy
    trace = trace_file.load_trace_file(path)  # the import door: refuses a file past a cap
    assert len(trace.rounds) == len(big) and sum(len(r.nodes) for r in trace.rounds) == nodes


def test_beam_match_records_survive_export_and_import(tmp_path, monkeypatch):
    # a fresh export folder: write_export keeps an existing file of the same name, and the
    # shared one may hold this name from a run on another demo trace
    monkeypatch.setattr(trace_file, "EXPORT_DIR", tmp_path / "exports")
    trace = trace_file.parse_trace(json.dumps(_beam_steps()))
    path = trace_file.write_export("beam", trace.to_json(), "t1")
    back = trace_file.load_trace_file(path)
    assert back == trace
    step = back.rounds[BEAM_ROUND].beam_steps[0]
    assert [(b.rank, b.text, b.score, b.node) for b in step.target_beams] == [
        (1, " a", -0.5, 0), (2, " b", -1.25, -1)]
    assert [(m.node, m.rank, m.score, m.p) for m in step.drafted] == [(0, 1, -0.5, None),
                                                                      (1, 0, -1.5, None)]
    assert step.reason == "target beam #2 ' b' (score -1.25) was not drafted"


def test_a_trace_written_before_beam_match_records_imports_without_them():
    old = _beam_steps()
    for r in old["rounds"]:
        r.pop("beam_steps", None)
    trace = trace_file.parse_trace(json.dumps(old))
    assert trace.version == trace_file.TRACE_VERSION == 1
    assert all(r.beam_steps == () for r in trace.rounds)
    demo = trace_file.parse_trace(DEMO_TRACE.read_text())
    assert [r.nodes for r in trace.rounds] == [r.nodes for r in demo.rounds]


def test_too_many_target_beams_in_a_step_are_refused(monkeypatch):
    monkeypatch.setattr(trace_file, "MAX_STEP_BEAMS", 1)
    with pytest.raises(trace_file.TraceFileError, match=f"round {BEAM_ROUND} lists 2 target beams "
                       "in one step"):
        trace_file.parse_trace(json.dumps(_beam_steps()))
