"""The thread rule shared by the CLI and the app (engine.kernels.threads): SPECVIZ_THREADS wins;
else the faster of one thread and every usable core, measured."""

from __future__ import annotations

import pytest
import torch

from engine.core.errors import ConfigError
from engine.kernels import threads


def test_the_environment_variable_wins_and_is_checked(monkeypatch):
    monkeypatch.setenv(threads.ENV, "3")
    assert threads.thread_count() == 3
    monkeypatch.setenv(threads.ENV, "zero")
    with pytest.raises(ConfigError, match="SPECVIZ_THREADS must be a positive integer"):
        threads.thread_count()
    monkeypatch.delenv(threads.ENV)
    assert threads.thread_count() is None  # measured per pair


def test_the_measurement_chooses_between_one_thread_and_every_core(monkeypatch):
    monkeypatch.setattr(threads, "usable_cores", lambda: 2)
    assert threads.candidates() == (1, 2)
    monkeypatch.setattr(threads, "usable_cores", lambda: 1)
    assert threads.candidates() == (1,)


class StepClock:
    """A clock that a step advances by the seconds its thread count is given."""

    def __init__(self, seconds: dict[int, float]):
        self.now, self.seconds = 0.0, seconds

    def __call__(self) -> float:
        return self.now

    def step(self) -> None:
        self.now += self.seconds[torch.get_num_threads()]


@pytest.mark.parametrize("seconds,chosen", [({1: 0.02, 2: 0.01}, 2), ({1: 0.01, 2: 0.02}, 1),
                                            ({1: 0.0100, 2: 0.0099}, 1)])  # a tie: fewer
def test_fastest_keeps_the_count_whose_step_is_faster(seconds, chosen):
    clock = StepClock(seconds)
    try:
        best, med = threads.fastest(clock.step, (1, 2), reps=3, clock=clock)
        assert best == chosen and torch.get_num_threads() == chosen
        assert med == pytest.approx(seconds)
    finally:
        torch.set_num_threads(1)


def test_tune_threads_measures_nothing_when_the_variable_is_set(monkeypatch):
    from engine.run import api
    from tests.conftest import tiny_pair

    monkeypatch.setenv(threads.ENV, "1")
    monkeypatch.setattr(threads, "fastest", lambda *a, **k: pytest.fail("measured"))
    assert api.tune_threads(tiny_pair()) == 1


def test_tune_threads_measures_once_per_pair_into_its_calibration(monkeypatch):
    from engine.run import api
    from tests.conftest import tiny_pair

    calls = []
    monkeypatch.delenv(threads.ENV, raising=False)
    monkeypatch.setattr(threads, "candidates", lambda: (1, 2))
    monkeypatch.setattr(threads, "fastest", lambda step, counts: calls.append(counts) or (1, {}))
    pair = tiny_pair()
    assert pair.calibration.threads is None
    try:
        assert api.tune_threads(pair) == 1 and api.tune_threads(pair) == 1
        assert calls == [(1, 2)] and pair.calibration.threads == 1
        pair.calibration.threads = 2  # the pair's calibration is what a later call reads
        assert api.tune_threads(pair) == 2 and torch.get_num_threads() == 2
        assert calls == [(1, 2)]
        fresh = tiny_pair()
        assert api.tune_threads(fresh) == 1 and fresh.calibration.threads == 1
        assert calls == [(1, 2), (1, 2)]  # a fresh pair measures afresh
    finally:
        torch.set_num_threads(1)


def test_load_pair_applies_the_variable_for_a_script_of_the_python_api(monkeypatch):
    from tests.conftest import tiny_pair

    monkeypatch.setenv(threads.ENV, "2")
    torch.set_num_threads(1)
    try:
        tiny_pair()
        assert torch.get_num_threads() == 2
        monkeypatch.delenv(threads.ENV)
        torch.set_num_threads(1)
        tiny_pair()
        assert torch.get_num_threads() == 1  # unset: the count is left as it was
    finally:
        torch.set_num_threads(1)
