"""Letting other work in between a run's rounds: a caller's hook, and a clock without it.

``with between_rounds(hook):`` calls ``hook()`` after every round of every engine run
(``engine.run.api.Run``) stepped inside the block, on the same thread, outside the round's
timing. The app's model thread runs a Bench set, a tune or a check as one call of whole
engine calls inside such a block, and its hook lets other sessions' model work in there
(specviz.jobs), so another session's Run waits about one round, not one whole run.

Only between whole engine calls, so a run's tokens do not depend on what ran in between: a
round is one; a reference ``generate()`` call, and a transformers mode's run (its
``generate()`` goes on in a thread of its own, ``engine.run.hf_run``), each run whole.

A timed run is one segment: inside ``with whole():`` no hook runs, so what it measures holds
no other work (a benchmark's run and its reference ``generate()``,
engine.bench.interleaved.measure_run, which lets others in between the two). Other work
between two rounds would leave the hook's time out of ``Run.wall_s`` but not its traces: the
CPU time other threads spend on it meanwhile (a UI rendering what it computed), colder caches
for the next round. Timing stays the caller's own too: ``own_clock()``
(``time.perf_counter()`` less the seconds spent in the block's hook) times a span of whole
runs (a tune's trial seconds, a check's sizing run). ``pause()`` calls the hook between runs
too (a caller's progress report), counted the same way.

The block's hook is held in a context variable: it reaches the runs stepped inside the block
on this thread and nothing else, not the runs the hook itself steps (the app also runs each
unit of other work in a context of its own: specviz.worker).
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Callable, Iterator


@dataclass
class Pacing:
    """A between_rounds block: its hook and the seconds spent in it so far."""

    hook: Callable[[], None]
    yielded_s: float = 0.0


_BLOCK: ContextVar[Pacing | None] = ContextVar("engine_pacing", default=None)


@contextmanager
def between_rounds(hook: Callable[[], None]) -> Iterator[Pacing]:
    """Call ``hook()`` after every round of the runs stepped inside the block (module
    docstring); the block's ``Pacing`` says how long the hook took in all."""
    block = Pacing(hook)
    token = _BLOCK.set(block)
    try:
        yield block
    finally:
        _BLOCK.reset(token)


def pause() -> None:
    """Run the enclosing block's hook, timed (nothing outside a block): after each round
    (``Run``), or between whole runs (a caller's progress report)."""
    block = _BLOCK.get()
    if block is None:
        return
    token = _BLOCK.set(None)  # the runs the hook steps itself are not paced by it
    t0 = time.perf_counter()
    try:
        block.hook()
    finally:
        block.yielded_s += time.perf_counter() - t0
        _BLOCK.reset(token)


@contextmanager
def whole() -> Iterator[None]:
    """A segment run whole: no hook of the enclosing block runs inside (a timed run)."""
    token = _BLOCK.set(None)
    try:
        yield
    finally:
        _BLOCK.reset(token)


def own_clock() -> float:
    """``time.perf_counter()`` less the seconds the enclosing block's hook has taken: the
    difference of two readings is the time the calling code itself ran."""
    block = _BLOCK.get()
    return time.perf_counter() - (block.yielded_s if block is not None else 0.0)
