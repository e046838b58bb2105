"""A stand-in for Hugging Face's ``spaces`` package, for tests only (a test puts this folder
on sys.path). Its ``GPU`` decorator behaves as ZeroGPU does where it matters to the app: the
decorated function runs in a child process (forked, so it inherits what the main process
loaded at start), its arguments, every yielded value, its result and its exception cross
the process boundary by pickle, and a call that runs past ``duration`` is aborted.

``CALLS`` lists the child pid of every call (in the parent); ``PICKLED`` counts the values
that crossed the boundary.
"""

from __future__ import annotations

import functools
import inspect
import multiprocessing
import pickle
import time
from typing import Any, Callable, Iterator

CALLS: list[int] = []
PICKLED = {"args": 0, "yields": 0, "results": 0, "errors": 0}
_FORK = multiprocessing.get_context("fork")


def GPU(fn: Callable | None = None, *, duration: float = 60) -> Any:  # noqa: N802 - its name
    """``@GPU``, ``@GPU(duration=...)`` or ``GPU(fn)``: fn runs in a child process per call."""

    def wrap(f: Callable) -> Callable:
        if inspect.isgeneratorfunction(f):
            @functools.wraps(f)
            def gen(*args: Any, **kwargs: Any) -> Iterator[Any]:
                for kind, value in _in_child(f, args, kwargs, duration):
                    if kind == "yield":
                        yield value
                    elif kind == "return":
                        return value
            return gen

        @functools.wraps(f)
        def call(*args: Any, **kwargs: Any) -> Any:
            for kind, value in _in_child(f, args, kwargs, duration):
                if kind == "return":
                    return value
            raise RuntimeError("the GPU call returned nothing")
        return call

    return wrap(fn) if fn is not None else wrap


def _child(f: Callable, payload: bytes, conn: Any) -> None:
    args, kwargs = pickle.loads(payload)
    try:
        if inspect.isgeneratorfunction(f):
            for value in f(*args, **kwargs):
                conn.send_bytes(pickle.dumps(("yield", value)))
            conn.send_bytes(pickle.dumps(("return", None)))
        else:
            conn.send_bytes(pickle.dumps(("return", f(*args, **kwargs))))
    except BaseException as e:  # noqa: BLE001 - handed to the parent, as ZeroGPU does
        conn.send_bytes(pickle.dumps(("raise", e)))
    finally:
        conn.close()


def _in_child(f: Callable, args: tuple, kwargs: dict, duration: float) -> Iterator[tuple]:
    """Run f in a forked child; yield (kind, unpickled value) as they arrive."""
    payload = pickle.dumps((args, kwargs))
    PICKLED["args"] += 1
    recv, send = _FORK.Pipe(duplex=False)
    proc = _FORK.Process(target=_child, args=(f, payload, send), daemon=True)
    proc.start()
    send.close()
    CALLS.append(proc.pid)
    deadline = time.monotonic() + duration
    try:
        while True:
            if not recv.poll(max(deadline - time.monotonic(), 0)):
                raise RuntimeError(f"GPU task aborted: ran past its duration of {duration} s")
            try:
                kind, value = pickle.loads(recv.recv_bytes())
            except EOFError:
                raise RuntimeError("the GPU process ended without a result") from None
            PICKLED[{"yield": "yields", "return": "results", "raise": "errors"}[kind]] += 1
            if kind == "raise":
                raise value
            yield kind, value
            if kind == "return":
                return
    finally:
        recv.close()
        if proc.is_alive():
            proc.terminate()
        proc.join()
