"""Model work of the UI: presets, a per-process model cache, the one thread that does all
model work, and the streaming decode that a Run event consumes.

Models are loaded once per process, keyed by (target, draft). Every load and every forward
runs on ``WORKER``, one dedicated thread with the engine's thread rule (engine/threads.py):
sessions queue for it, never share weights at the same time, and torch keeps one OpenMP team.
A decode runs there to its end while the event handler renders what has arrived, so the UI's
rendering overlaps the engine instead of adding to it; a handler that goes away (a client
that disconnects) cancels its decode after the current round.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import engine
from engine import threads
from engine.errors import ConfigError, ModelLoadError
from engine.models import parse_model_spec
from specviz.state import ASSETS

MAX_PROMPT_CHARS = 2000
MAX_PROMPT_TOKENS = 1024
MAX_NEW_TOKENS = 256
MAX_FOREST_NODES = 1024  # per round; the forest view collapses far earlier
MAX_TRACE_NODES = 40_000  # per run: bounds the session's memory and each re-render
CACHE_SIZE = 2  # model pairs kept per process


class ModelWorker:
    """One daemon thread that runs every model call of the process, in submission order."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._loop, name="specviz-model", daemon=True)
        self.threads = 0
        self.thread.start()

    def _loop(self) -> None:
        self.threads = threads.configure()
        while True:
            fn, args, kwargs, fut = self._jobs.get()
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn(*args, **kwargs))
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                fut.set_exception(e)

    def submit(self, fn: Callable, *args: Any, **kwargs: Any) -> Future:
        fut: Future = Future()
        self._jobs.put((fn, args, kwargs, fut))
        return fut

    def call(self, fn: Callable, *args: Any, **kwargs: Any) -> Any:
        """Run fn on the model thread and wait for its result (or exception)."""
        if threading.current_thread() is self.thread:
            return fn(*args, **kwargs)
        return self.submit(fn, *args, **kwargs).result()


WORKER = ModelWorker()

HEAD_EVERY_S = 0.35  # streaming: a run head (text, stats) at most this often
_PAIRS: OrderedDict[tuple[str, str], engine.ModelPair] = OrderedDict()


@dataclass(frozen=True)
class Preset:
    name: str
    target: str
    draft: str = ""
    needs_gpu: bool = False


def presets() -> list[Preset]:
    """Model pairs offered in the UI (assets/presets.json)."""
    rows = json.loads((ASSETS / "presets.json").read_text())
    return [Preset(**row) for row in rows]


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def check_pair_spec(target: str, draft: str) -> tuple[str, str]:
    """Normalised (target, draft) strings, read by the engine's spec parser (a bad spec fails
    here, before any model work); GPU-only presets refused on a CPU machine."""
    target = (target or "").strip() or engine.EMBEDDED
    draft = (draft or "").strip()
    parse_model_spec(target)
    parse_model_spec(draft, draft=True)
    for p in presets():
        if p.needs_gpu and p.target == target and not _cuda_available():
            raise ModelLoadError(
                f"'{target}' is a GPU preset: it needs a CUDA device and network access, and "
                "this machine has no GPU (use the embedded model, or run the Space on a GPU)"
            )
    return target, draft


def get_pair(target: str, draft: str = "") -> engine.ModelPair:
    """The cached pair for (target, draft), loaded on the model thread on first use."""
    return WORKER.call(_get_pair, *check_pair_spec(target, draft))


def _get_pair(target: str, draft: str) -> engine.ModelPair:
    key = (target, draft)
    if key in _PAIRS:
        _PAIRS.move_to_end(key)
        return _PAIRS[key]
    pair = engine.load_pair(target=target, draft=draft, device="auto")
    _PAIRS[key] = pair
    while len(_PAIRS) > CACHE_SIZE:
        _PAIRS.popitem(last=False)
    return pair


def preload(target: str, draft: str = "") -> engine.ModelPair:
    """Load a pair and measure its plain target step (the cost model's unit) up front, so
    no user's first run pays for either."""
    pair = get_pair(target, draft)
    from engine import costs

    WORKER.call(costs.plain_step_s, pair, 1)
    return pair


def check_run_limits(prompt: str, params: dict[str, Any]) -> None:
    """UI limits on prompt length and new tokens (one-line ConfigError each)."""
    if not isinstance(prompt, str) or not prompt.strip():
        raise ConfigError("prompt is empty: type a prompt or pick an example")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise ConfigError(f"prompt has {len(prompt)} characters; the UI limit is "
                          f"{MAX_PROMPT_CHARS}")
    n = params.get("max_new_tokens")
    if n is not None and _as_number(n) > MAX_NEW_TOKENS:
        raise ConfigError(f"max_new_tokens must be <= {MAX_NEW_TOKENS} in the UI, got {n}")


def check_forest_budget(method: str, params: dict[str, Any]) -> None:
    """Refuse, before any model work, beam drafts whose forest (draft_beams nodes per depth,
    gamma depths) exceeds the per-round UI limit."""
    spec = engine.METHODS.get(method)
    if spec is None:
        return
    full = {p.name: p.default for p in spec.all_params}
    full.update({k: v for k, v in params.items() if v is not None})
    if "draft_beams" in full and "gamma" in full:
        size = _as_number(full["draft_beams"]) * _as_number(full["gamma"])
        if size > MAX_FOREST_NODES:
            raise ConfigError(f"draft_beams x gamma = {size:.0f} forest nodes per round; the UI "
                              f"limit is {MAX_FOREST_NODES}")


def _as_number(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return 0.0  # the engine reports the type error itself


@dataclass
class Update:
    """What a streaming decode hands the UI: rounds since the last update, and either the
    run's head (a RunTrace without rounds, at most every HEAD_EVERY_S) or, at the end, the
    whole RunTrace (``final``)."""

    rounds: list[engine.RoundTrace]
    head: engine.RunTrace | None = None
    final: bool = False
    note: str = ""  # why the UI stopped the run early, if it did


_DONE = object()


def _produce(run: engine.Run, out: queue.SimpleQueue, cancel: threading.Event) -> None:
    """The model thread's side: step the run to its end (or a cancel) and hand every round
    over; the head only now and then, since it is the one O(run) piece."""
    nodes, last_head = 0, float("-inf")  # the first round shows at once
    try:
        for r in run:
            if len(r.nodes) > MAX_FOREST_NODES:
                raise ConfigError(f"round {r.index} drafted {len(r.nodes)} nodes; the UI limit "
                                  f"is {MAX_FOREST_NODES} (use a smaller tree)")
            nodes += len(r.nodes)
            stop = nodes > MAX_TRACE_NODES and not run.done
            if run.done or stop or cancel.is_set():
                note = (f"stopped by the UI: more than {MAX_TRACE_NODES} forest nodes"
                        if stop else "")
                out.put(Update([r], run.trace(with_rounds=False), final=True, note=note))
                return
            if time.monotonic() - last_head >= HEAD_EVERY_S:
                last_head = time.monotonic()
                out.put(Update([r], run.trace(with_rounds=False)))
            else:
                out.put(Update([r]))
        out.put(Update([], run.trace(with_rounds=False), final=True))
    except BaseException as e:  # noqa: BLE001 - re-raised in the handler's thread
        out.put(e)
    finally:
        out.put(_DONE)


def _start(target: str, draft: str, prompt: str, method: str,
           params: dict[str, Any]) -> engine.Run:
    pair = _get_pair(*check_pair_spec(target, draft))
    run = engine.start(pair, prompt, method, **params)
    if len(run.prompt_ids) > MAX_PROMPT_TOKENS:
        raise ConfigError(f"prompt has {len(run.prompt_ids)} tokens; the UI limit is "
                          f"{MAX_PROMPT_TOKENS}")
    return run


def decode_stream(target: str, draft: str, prompt: str, method: str,
                  params: dict[str, Any]) -> Iterator[Update]:
    """Run one method on the model thread; yield an Update whenever rounds have arrived.

    Several rounds that arrive while the caller is busy come as one Update. The last one
    has ``final`` set and the head of the finished run. Closing the generator early cancels
    the decode after its current round.
    """
    check_run_limits(prompt, params)
    check_forest_budget(method, params)
    run = WORKER.call(_start, target, draft, prompt, method, params)
    out: queue.SimpleQueue = queue.SimpleQueue()
    cancel = threading.Event()
    WORKER.submit(_produce, run, out, cancel)
    try:
        while True:
            items = [out.get()]
            while not out.empty():  # take everything that is ready: one render for all
                items.append(out.get())
            batch = Update([])
            for item in items:
                if item is _DONE:
                    if batch.rounds or batch.head is not None:
                        yield batch
                    return
                if isinstance(item, BaseException):
                    if batch.rounds:
                        yield batch
                    raise item
                batch.rounds += item.rounds
                if item.head is not None:
                    batch.head, batch.final, batch.note = item.head, item.final, item.note
            yield batch
    finally:
        cancel.set()


def run_trace(target: str, draft: str, prompt: str, method: str,
              params: dict[str, Any]) -> engine.RunTrace:
    """A whole run's RunTrace (used by the Compare tab), computed on the model thread."""
    check_run_limits(prompt, params)
    check_forest_budget(method, params)
    return WORKER.call(lambda: _start(target, draft, prompt, method, params).to_end())


def _gpu(fn):
    """Wrap fn with spaces.GPU on ZeroGPU Spaces (no-op elsewhere)."""
    try:
        import spaces  # type: ignore[import-not-found]
    except ImportError:
        return fn
    return spaces.GPU(duration=120)(fn)


decode_stream = _gpu(decode_stream)
run_trace = _gpu(run_trace)
