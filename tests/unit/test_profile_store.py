"""The cost profiles stored per machine class (engine.run.profile_store): a pair loaded from
specs measures until KEEP measurements are stored (its first process all KEEP, each with its
own forwards), then plans with their median and measures no more; model objects, the store off
and a deferring thread store nothing; a changed engine voids the file."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

import engine
from engine.control.cost import CostProfile
from engine.execution import static_kv
from engine.run import profile, profile_store

TINY = 'tiny:{"vocab_size": 64, "layers": 2}'


def _profile(scale: float, c_draft: float = 0.1, c_round: float = 0.0) -> CostProfile:
    return CostProfile("measured", c_draft, tuple((n, round(1 + scale * n, 4))
                                                  for n in profile.VERIFY_NODES), "cpu",
                       c_round)


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECVIZ_PROFILES", str(tmp_path))
    return tmp_path


@pytest.fixture
def timings(monkeypatch):
    """Fake forward timings that differ at every measurement (so the median is visible), and
    a counter of the calibration decodes."""
    calls = {"forwards": 0, "decodes": 0}

    def forward_s(target, vocab, width, counts):
        calls["forwards"] += 1
        slope = (0.5, 0.1, 0.3, 0.9, 0.7, 0.2, 0.4, 0.8)[(calls["forwards"] - 1) % 8]
        return {n: 0.01 * (1 + slope * n) for n in counts}

    def decode():
        calls["decodes"] += 1
        return []

    monkeypatch.setattr(profile, "_forward_s", forward_s)
    return calls, decode


def _measure(pair, decode):
    return profile.measured(pair, "sd", {"gamma": 2}, 1, decode, lambda: 0.01)


def test_the_median_of_measurements_is_taken_cost_by_cost():
    a, b, c = _profile(0.5, 0.1, 0.2), _profile(0.1, 0.3, 0.0), _profile(0.3, 0.2, 0.4)
    a, b, c = (replace(a, c_catch=0.05, accept=(0.4, 0.9), c_lookup=0.02),
               replace(b, c_catch=0.01), replace(c, c_catch=0.03, accept=(0.6, 0.7),
                                                 c_lookup=0.01))
    m = profile_store.median([a, b, c])
    assert m.verify == c.verify and m.c_draft == 0.2 and m.c_round == 0.2
    assert m.c_catch == 0.03 and m.accept == (0.5, 0.8)  # of those that saw acceptances
    assert m.c_lookup == 0.015  # of those that priced a lookup
    assert profile_store.median([b, replace(b, c_draft=0.5)]).c_lookup is None
    assert all(x[1] <= y[1] for x, y in zip(m.verify, m.verify[1:]))
    assert "median of 3" in m.source
    assert profile_store.median([a]) is a


def test_a_spec_pair_measures_until_keep_are_stored_then_plans_with_their_median(store,
                                                                                  timings):
    """The first process measures KEEP times (one warm-up decode, then a timed one each, each
    measurement timing its own forwards) and plans with their median, as later processes,
    which measure nothing."""
    calls, decode = timings
    got = []
    for _ in range(3):  # a fresh pair: a new process
        pair = engine.load_pair(TINY, "", device="cpu")
        assert pair.key is not None
        got.append(_measure(pair, decode))
    assert calls["forwards"] == profile_store.KEEP and calls["decodes"] == profile_store.KEEP + 1
    # slopes 0.5, 0.1 and 0.3 in the first process: their median 0.3, then stored
    assert [p.c_verify(1) for p in got] == [1.3, 1.3, 1.3]
    assert got[0] == got[1] == got[2] and "median of 3" in got[0].source
    files = [f for f in store.iterdir() if f.suffix == ".json"]
    data = json.loads(files[0].read_text())
    assert len(files) == 1 and data["machine"] == profile_store.machine("cpu")
    (rows,) = data["entries"].values()
    assert len(rows) == profile_store.KEEP


def test_another_setting_width_or_thread_count_is_its_own_entry(store, timings, monkeypatch):
    calls, decode = timings
    pair = engine.load_pair(TINY, "", device="cpu")
    _measure(pair, decode)
    profile.measured(pair, "sd", {"gamma": 3}, 1, decode, lambda: 0.01)
    profile.measured(pair, "sd", {"gamma": 2}, 2, decode, lambda: 0.01)
    pair.calibration.profiles.clear()
    monkeypatch.setattr(profile_store.torch, "get_num_threads", lambda: 7)
    _measure(pair, decode)
    (path,) = (f for f in store.iterdir() if f.suffix == ".json")
    assert len(json.loads(path.read_text())["entries"]) == 4


def test_model_objects_the_store_off_and_a_deferred_step_store_nothing(store, timings,
                                                                          monkeypatch):
    from tests.conftest import tiny_pair

    calls, decode = timings
    assert profile_store.load("any entry") == [] and not any(store.iterdir())  # a read of an
    # empty store makes no file
    pair = tiny_pair()
    assert pair.key is None
    _measure(pair, decode)
    assert not any(store.iterdir())
    spec_pair = engine.load_pair(TINY, "", device="cpu")

    def deferring_decode():  # a step ran static for want of its compiled shape
        static_kv.POLICY.count_deferral()
        return decode()

    _measure(spec_pair, deferring_decode)  # measured and used, not stored
    assert not any(f.suffix == ".json" for f in store.iterdir()) and calls["forwards"] == 2
    monkeypatch.setenv("SPECVIZ_PROFILES", "off")
    spec_pair.calibration.profiles.clear()
    _measure(spec_pair, decode)  # (its verify points read back: no deferral in their forwards)
    assert not any(f.suffix == ".json" for f in store.iterdir()) and calls["decodes"] == 6
    monkeypatch.setenv("SPECVIZ_PROFILES", str(store))
    spec_pair.calibration.profiles.clear()
    _measure(spec_pair, decode)  # no deferral: stored, KEEP measurements (one warm-up)
    assert any(f.suffix == ".json" for f in store.iterdir())
    assert calls["decodes"] == 6 + profile_store.KEEP + 1


def test_verify_points_timed_across_a_deferral_are_not_kept(monkeypatch):
    from tests.conftest import tiny_pair

    def forward_s(target, vocab, width, counts):
        static_kv.POLICY.count_deferral()
        return {n: 0.01 * (1 + n) for n in counts}

    monkeypatch.setattr(profile, "_forward_s", forward_s)
    pair = tiny_pair()
    profile.verify_points(pair, 1)
    assert pair.calibration.verify == {}
    monkeypatch.setattr(profile, "_forward_s", lambda t, v, w, c: {n: 0.01 for n in c})
    points = profile.verify_points(pair, 1)
    assert pair.calibration.verify == {1: points}


def test_a_changed_engine_starts_a_new_file_and_a_damaged_one_is_measured_afresh(
        store, timings, monkeypatch):
    calls, decode = timings
    _measure(engine.load_pair(TINY, "", device="cpu"), decode)
    (old,) = (f for f in store.iterdir() if f.suffix == ".json")
    monkeypatch.setattr(profile_store, "code_version", lambda: "another-engine")
    _measure(engine.load_pair(TINY, "", device="cpu"), decode)
    keep = profile_store.KEEP
    assert calls["forwards"] == 2 * keep  # measured again, into its own file
    (new,) = (f for f in store.iterdir() if f.suffix == ".json" and f != old)
    assert json.loads(new.read_text())["code"] == "another-engine"
    assert len(next(iter(json.loads(old.read_text())["entries"].values()))) == keep
    new.write_text("{not json")
    _measure(engine.load_pair(TINY, "", device="cpu"), decode)
    assert calls["forwards"] == 3 * keep  # measured again, the file rewritten
    assert len(json.loads(new.read_text())["entries"]) == 1


def test_a_damaged_row_is_dropped_and_an_unwritable_store_leaves_the_run_measuring(
        store, timings, monkeypatch, caplog):
    calls, decode = timings
    key = profile_store.entry_key(engine.load_pair(TINY, "", device="cpu"), "dynamic",
                                  "dynamic", "sd", 1, {"gamma": 2})
    profile_store.add(key, _profile(0.5))
    (path,) = (f for f in store.iterdir() if f.suffix == ".json")
    data = json.loads(path.read_text())
    data["entries"][key].insert(0, {"at": "no profile"})
    path.write_text(json.dumps(data))
    assert len(profile_store.load(key)) == 1
    assert len(profile_store.add(key, _profile(0.2))) == 2  # the damaged row dropped
    assert len(json.loads(path.read_text())["entries"][key]) == 2
    blocker = store / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("SPECVIZ_PROFILES", str(blocker / "profiles"))  # under a file
    prof = _measure(engine.load_pair(TINY, "", device="cpu"), decode)
    # its own KEEP measurements (slopes 0.5, 0.1, 0.3): their median, though none was stored
    assert prof.c_verify(1) == 1.3 and calls["forwards"] == profile_store.KEEP
    assert "median of 3" in prof.source and "not stored" in caplog.text


def test_a_first_process_stops_measuring_once_another_filled_the_entry(store, timings,
                                                                        monkeypatch):
    """Two first processes at once: where the other stored the rest meanwhile, this one
    measures no more and plans with the entry's median."""
    calls, decode = timings
    pair = engine.load_pair(TINY, "", device="cpu")
    key = profile_store.entry_key(pair, "dynamic", "dynamic", "sd", 1, {"gamma": 2})
    real_add = profile_store.add

    def add_with_another(k, prof, device="cpu"):
        real_add(k, _profile(0.9), device)  # the other process's measurements
        real_add(k, _profile(0.7), device)
        return real_add(k, prof, device)

    monkeypatch.setattr(profile_store, "add", add_with_another)
    prof = _measure(pair, decode)
    assert calls["forwards"] == 1 and len(profile_store.load(key)) == profile_store.KEEP
    assert prof.c_verify(1) == 1.7  # the median of 0.9, 0.7 and its own 0.5
