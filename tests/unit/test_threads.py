"""The thread rule shared by the CLI and the app (engine.core.threads)."""

from __future__ import annotations

import pytest

from engine.core import threads
from engine.core.errors import ConfigError


def test_small_machines_get_one_thread(monkeypatch):
    monkeypatch.delenv(threads.ENV, raising=False)
    monkeypatch.setattr(threads, "usable_cores", lambda: 2)
    assert threads.thread_count() == 1
    monkeypatch.setattr(threads, "usable_cores", lambda: 16)
    assert threads.thread_count() is None  # torch's default


def test_the_environment_variable_wins_and_is_checked(monkeypatch):
    monkeypatch.setenv(threads.ENV, "3")
    assert threads.thread_count() == 3
    monkeypatch.setenv(threads.ENV, "zero")
    with pytest.raises(ConfigError, match="SPECVIZ_THREADS must be a positive integer"):
        threads.thread_count()
