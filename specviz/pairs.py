"""Model work of the UI: presets, a per-process model cache, the one thread that does all
model work, and the streaming decode that a Run event consumes.

Models are loaded once per process, keyed by (target, draft). Every load and every forward
runs on ``WORKER``, one dedicated thread with the engine's thread rule (engine/core/threads.py):
torch keeps one OpenMP team, and no two jobs use the weights at the same time. The thread
serves its jobs in turn (round-robin), one unit of work each: a decode (a Run, each Compare
method) is a step job of one round a step; a load or any other call is one unit; a Bench set
or a Check is one unit that lets the other jobs in between its runs (``pausing``, through the
engine's progress callback; a sampled Check calls it about once a second). So another
session's Run starts after about one round of each decode ahead of it, or one run of a Bench
set, instead of after all of them (Gradio lets up to ``specviz.wiring.MODEL_SLOTS`` model
events run at once; this thread shares the model among them). A unit is whole engine calls,
never part of one, so a run's tokens do not depend on what else runs.
A decode runs there while the event handler renders what has arrived, so the UI's rendering
overlaps the engine instead of adding to it; a handler that goes away (a client that
disconnects) cancels its decode after the current round.

On ZeroGPU (``configure`` with a HostConfig whose zero_gpu is set) the rules differ: every
allowed pair loads once at start in the main process (``preload_all``, weights moved to CUDA
there, which ZeroGPU intercepts), and only two ``spaces.GPU`` functions compute,
``_zero_stream`` (a generator of Updates) and ``_zero_trace``; ZeroGPU runs them in another
process, so their arguments, yields and results are pickled, and no model thread is used.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections import OrderedDict, deque
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterator

import engine
from engine.core import static_kv, threads
from engine.core.cached_model import CachedModel, warm_shapes, warming
from engine.core.config import layered
from engine.core.errors import ConfigError, ModelLoadError, SpecvizError
from engine.run.api import tune_threads
from engine.run.models import resolve_device
from engine.run.specs import pair_key
from engine.run.tuned import tuned_settings
from specviz.hosting import HostConfig, Preset

log = logging.getLogger("specviz")
MAX_PROMPT_CHARS = 2000
MAX_PROMPT_TOKENS = 1024
MAX_NEW_TOKENS = 256
MAX_FOREST_NODES = 1024  # per round; the forest view collapses far earlier
MAX_TRACE_NODES = 40_000  # per run: bounds the session's memory and each re-render
CACHE_SIZE = 2  # model pairs kept per process (ZeroGPU: every allowed pair, loaded at start)
GPU_DURATION_S = 120  # ZeroGPU: a call that runs longer is aborted


class ModelWorker:
    """One daemon thread that runs every model call of the process, its jobs served in turn.

    A job is a generator of units: ``submit_steps`` takes one whose every ``next()`` is one
    unit (a decode: one round), ``submit`` / ``call`` a function, run as a single unit. The
    thread runs one unit of the job at the head of its ready queue, then puts the job back at
    the tail unless it finished, so jobs take turns unit by unit (round-robin) and a new job
    starts after at most one unit of each job ahead of it. A long job that is one unit (a
    Bench set, a Check) lets others in at ``pause_point``, which it calls between its runs.
    Never inside one engine call: a unit is whole engine calls, so runs keep their tokens.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._ready: deque[tuple[Iterator, Future]] = deque()
        self._wake = threading.Condition()
        self._clock = clock
        self._slice_start = 0.0  # when the unit running now started or last resumed
        self.thread = threading.Thread(target=self._loop, name="specviz-model", daemon=True)
        self.threads = 0
        self.thread.start()

    def _loop(self) -> None:
        self.threads = threads.configure()
        static_kv.POLICY.deferred = True  # a compiled step shape not made yet runs static
        # here (the same bits): no unit waits for a compile (warm_up makes them)
        while True:
            with self._wake:
                while not self._ready:
                    self._wake.wait()
                job = self._ready.popleft()
            self._run_unit(job)

    def _run_unit(self, job: tuple[Iterator, Future]) -> None:
        """One unit of the job; the job back at the tail of the queue unless it finished."""
        steps, fut = job
        self._slice_start = self._clock()
        if not fut.running() and not fut.set_running_or_notify_cancel():
            steps.close()  # cancelled before its first unit
            return
        try:
            next(steps)
        except StopIteration as end:
            fut.set_result(end.value)
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            fut.set_exception(e)
        else:
            self._put(job)

    def _put(self, job: tuple[Iterator, Future]) -> None:
        with self._wake:
            self._ready.append(job)
            self._wake.notify()

    def submit_steps(self, steps: Iterator) -> Future:
        """Run a step job: each ``next(steps)`` one unit, in turn with the other jobs; the
        future gets the generator's return value (or its exception)."""
        fut: Future = Future()
        self._put((steps, fut))
        return fut

    def submit(self, fn: Callable, *args: Any, **kwargs: Any) -> Future:
        """Run fn(*args, **kwargs) on the model thread as one unit."""
        return self.submit_steps(_one_unit(fn, args, kwargs))

    def call(self, fn: Callable, *args: Any, **kwargs: Any) -> Any:
        """Run fn on the model thread and wait for its result (or exception); on the model
        thread itself, run it at once."""
        if threading.current_thread() is self.thread:
            return fn(*args, **kwargs)
        return self.submit(fn, *args, **kwargs).result()

    def call_steps(self, steps: Iterator) -> Any:
        """``submit_steps`` and wait for the result; on the model thread, run every step at
        once."""
        if threading.current_thread() is self.thread:
            return _to_end(steps)
        return self.submit_steps(steps).result()

    def pause_point(self) -> None:
        """Let the other jobs in, then return (call it on the model thread, between whole
        engine calls of a long unit).

        Every job ready when it is called runs one unit, in turn; then they go on taking
        turns until they have had about as long each as the caller ran since it last got the
        thread, or none is ready. The caller is not in the queue while it runs, so none of its
        own work runs here. A long job of one unit that starts here pauses in turn at its own
        pause points, and the caller resumes only when that job has ended."""
        if threading.current_thread() is not self.thread:
            raise RuntimeError("pause_point is for the model thread")
        now = self._clock()
        with self._wake:
            waiting = len(self._ready)
        until = now + (now - self._slice_start) * waiting
        turns = 0
        while True:
            with self._wake:
                if not self._ready or (turns >= waiting and self._clock() >= until):
                    break
                job = self._ready.popleft()
            self._run_unit(job)
            turns += 1
        self._slice_start = self._clock()


def _one_unit(fn: Callable, args: tuple, kwargs: dict) -> Iterator:
    """A job of one unit: the first next() runs fn, its result the StopIteration's value."""
    return fn(*args, **kwargs)
    yield  # a generator with no yield reached: never a step in between


def _to_end(steps: Iterator) -> Any:
    """Every step of a step job, at once; its return value."""
    while True:
        try:
            next(steps)
        except StopIteration as end:
            return end.value


WORKER = ModelWorker()


def pausing(progress: Callable[..., None] | None = None) -> Callable[..., None]:
    """A progress callback for a long job of one unit (engine.bench.set_runner.run_set,
    engine.check.run.run_check, which call it between their runs): progress, then
    ``WORKER.pause_point``, so other sessions' work runs between the job's runs."""

    def report(*args: Any) -> None:
        if progress is not None:
            progress(*args)
        WORKER.pause_point()

    return report


HEAD_EVERY_S = 0.35  # streaming: a run head (text, stats) at most this often
_PAIRS: OrderedDict[tuple[str, str], engine.ModelPair] = OrderedDict()


class Hosting:
    """The process's hosting settings and, on ZeroGPU, its spaces.GPU-wrapped entry points."""

    def __init__(self) -> None:
        self.config = HostConfig()
        self.gpu_stream: Callable[..., Iterator[Update]] | None = None
        self.gpu_trace: Callable[..., engine.RunTrace] | None = None


HOST = Hosting()


def configure(config: HostConfig) -> None:
    """Serve with these settings (app.py, once, before building the demo)."""
    HOST.config = config
    HOST.gpu_stream = HOST.gpu_trace = None
    if config.zero_gpu:
        import spaces  # type: ignore[import-not-found]  # app.py imported it before torch

        gpu = spaces.GPU(duration=GPU_DURATION_S)
        HOST.gpu_stream, HOST.gpu_trace = gpu(_zero_stream), gpu(_zero_trace)


def presets() -> tuple[Preset, ...]:
    """Model pairs offered in the UI (assets/presets.json, filtered by SPECVIZ_PRESETS)."""
    return HOST.config.offered()


def tuned_params(target: str, draft: str) -> dict[str, dict[str, Any]]:
    """method -> the parameters measured best on this pair, as the engine reads them
    (engine.run.tuned, the same settings the loaded pair's runs start from); {} for a pair
    with none or a spec that does not parse (the handlers that load the pair say why)."""
    return tuned_settings(target, draft)


def untuned(target: str, draft: str, method: str, params: dict[str, Any]) -> dict[str, Any]:
    """params without the values equal to the pair's tuned ones: the engine fills those in
    itself, and its trace then names them as the pair's tuned settings."""
    spec = engine.METHODS.get(method)
    tuned = tuned_params(target, draft).get(method, {})
    rows = {p.name: p for p in spec.all_params} if spec is not None else {}
    return {k: v for k, v in params.items()
            if not (k in tuned and k in rows and _same(rows[k], v, tuned[k]))}


def with_tuned(target: str, draft: str, method: str, params: dict[str, Any]
               ) -> dict[str, Any]:
    """params over the pair's tuned settings of the method: what the engine will run with,
    short of the method's defaults (for the UI's limits, checked before any model work)."""
    spec = engine.METHODS.get(method)
    tuned = tuned_params(target, draft).get(method, {})
    if spec is None:
        return {**tuned, **{k: v for k, v in params.items() if v is not None}}
    kept, given = layered(spec.all_params, tuned, params)  # as engine.run.api.run_params
    return {**kept, **given}


def _same(row: engine.ParamSpec, a: Any, b: Any) -> bool:
    """Whether two values of a parameter parse to the same value (a bad one: not the same)."""
    try:
        return row.parse(a) == row.parse(b)
    except ConfigError:
        return False


def usable_presets() -> tuple[Preset, ...]:
    """The presets this machine can run: a GPU preset only with a CUDA device (the others
    would be refused at Run)."""
    return tuple(p for p in presets() if not p.needs_gpu or _cuda_available())


def check_pair_spec(target: str, draft: str) -> tuple[str, str]:
    """Normalised (target, draft) strings, read by the engine's spec parser (a bad spec fails
    here, before any model work); with custom models off, only the host's pairs (returned as
    the host spells them); GPU-only presets refused without a CUDA device."""
    target = (target or "").strip() or HOST.config.target
    draft = (draft or "").strip()
    key = pair_key(target, draft)
    cfg = HOST.config
    if not cfg.allow_custom_models:
        match = next((p for p in cfg.allowed_pairs() if pair_key(*p) == key), None)
        if match is None:
            raise ConfigError(f"this server runs only its preset models "
                              f"(SPECVIZ_ALLOW_CUSTOM_MODELS=0): target '{target}', draft "
                              f"'{draft or 'early-exit'}' is not one of them")
        target, draft = match
    for p in presets():
        if p.needs_gpu and p.target == target and not _cuda_available():
            raise ModelLoadError(
                f"'{target}' is a GPU preset: it needs a CUDA device and network access, and "
                "this machine has no GPU (use the embedded model, or run the Space on a GPU)"
            )
    return target, draft


def _cuda_available() -> bool:
    return resolve_device(HOST.config.device).type == "cuda"


def is_loaded(target: str, draft: str = "") -> bool:
    """Whether a run on the pair starts without a load (10-40 s for the embedded models): it
    is in this process's model cache, or this is ZeroGPU, where every pair loads at start."""
    if HOST.config.zero_gpu:
        return True
    try:
        return check_pair_spec(target, draft) in _PAIRS
    except SpecvizError:
        return False


def get_pair(target: str, draft: str = "") -> engine.ModelPair:
    """The cached pair for (target, draft), loaded on the model thread on first use."""
    return WORKER.call(_get_pair, *check_pair_spec(target, draft))


def _get_pair(target: str, draft: str) -> engine.ModelPair:
    key = (target, draft)
    if key in _PAIRS:
        _PAIRS.move_to_end(key)
        return _PAIRS[key]
    cfg = HOST.config
    pair = engine.load_pair(target=target, draft=draft, device=cfg.device, dtype=cfg.dtype,
                            warm=not cfg.zero_gpu)  # ZeroGPU: no GPU in this process
    if not cfg.zero_gpu:
        WORKER.threads = tune_threads(pair)  # this is the model thread
        warm_up(pair)
    _PAIRS[key] = pair
    while len(_PAIRS) > CACHE_SIZE and not cfg.zero_gpu:
        _PAIRS.popitem(last=False)
    return pair


@dataclass
class Warmup:
    """What the warm-up thread (warm_up) has done (module state: one per process, read by
    the UI's status line)."""

    pair: str = ""  # the target it compiles for
    done: int = 0  # step shapes made
    total: int = 0
    seconds: float = 0.0  # spent so far

    def note(self) -> str:
        """One line for the UI ('' once every shape is made, or when there is none)."""
        if self.done >= self.total:
            return ""
        return (f"compiling step shapes in the background: {self.done} / {self.total} "
                f"({self.seconds:.0f} s so far); until then steps run eagerly, with the "
                "same bits")


WARMUP = Warmup()


def serve_compiled() -> bool:
    """app.py, at start: a packed target on this CPU runs compiled steps (made by warm_up on
    a thread of their own, engine.core.static_kv.POLICY) where a C++ compiler exists for
    inductor; else one log line and eager steps. Whether it does."""
    import shutil

    from engine.core import qmm

    if not (shutil.which("c++") or shutil.which("g++") or os.environ.get("CXX")) or \
            qmm.library() is None:
        log.warning("no C++ compiler for inductor here: packed targets run eager steps")
        return False
    static_kv.POLICY.packed = True
    return True


def warm_up(pair: engine.ModelPair) -> threading.Thread | None:
    """Compile the pair's common step shapes (its target's and a token-input drafter's
    runner) on a thread of their own, in their own KV buffers, while the model thread serves
    runs eagerly (it never compiles: ``ModelWorker``); the warm buffers go back to the pool at
    the end and later runs take them. None where the pair runs eagerly."""
    runners = [r for r in (CachedModel(pair.target), pair.drafter.runner())
               if isinstance(r, CachedModel) and warm_shapes(r)]
    if not runners:
        return None
    WARMUP.pair, WARMUP.done, WARMUP.seconds = pair.target_name, 0, 0.0
    WARMUP.total = sum(warm_shapes(r) for r in runners)
    log.info("compiling %d step shapes of %s in the background; steps run eagerly meanwhile",
             WARMUP.total, pair.target_name)
    thread = threading.Thread(target=_warming, args=(runners,), name="specviz-warm-up",
                              daemon=True)
    thread.start()
    return thread


def _warming(runners: list[CachedModel]) -> None:
    threads.configure()
    start = time.monotonic()
    try:
        for runner in runners:
            for _ in warming(runner):
                WARMUP.done += 1
                WARMUP.seconds = time.monotonic() - start
                log.info("warm-up: step shape %d / %d made (%.0f s)", WARMUP.done,
                         WARMUP.total, WARMUP.seconds)
    except Exception:  # noqa: BLE001 - runs keep the eager path; the log says why
        WARMUP.total = WARMUP.done
        log.warning("warm-up stopped: steps run eagerly", exc_info=True)


def _preloaded_pair(target: str, draft: str) -> engine.ModelPair:
    """ZeroGPU, inside a GPU call: a pair loaded at start, on the device this call holds."""
    pair = _PAIRS.get((target, draft))
    if pair is None:
        raise ModelLoadError(f"'{target}' was not loaded at start; on ZeroGPU every model "
                             "loads at start (SPECVIZ_TARGET, SPECVIZ_PRESETS)")
    return replace(pair, device=next(pair.target.parameters()).device)


def preload(target: str, draft: str = "") -> engine.ModelPair:
    """Load a pair and measure its plain target step (the cost model's unit) up front, so
    no user's first run pays for either (on ZeroGPU: load only, the main process has no GPU
    to measure on)."""
    pair = get_pair(target, draft)
    if HOST.config.zero_gpu:
        return pair
    from engine.run.api import plain_step_s

    WORKER.call(plain_step_s, pair, 1)
    return pair


def preload_all() -> None:
    """Load every pair the host allows (ZeroGPU: at start, in the main process)."""
    for target, draft in HOST.config.allowed_pairs():
        if not any(p.needs_gpu and p.target == target for p in presets()) or _cuda_available():
            preload(target, draft)


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
    or up to beams x draft_beams with atspeed_strict's fill; gamma depths) exceeds the
    per-round UI limit."""
    spec = engine.METHODS.get(method)
    if spec is None:
        return
    full = {p.name: p.default for p in spec.all_params}
    full.update({k: v for k, v in params.items() if v is not None})
    if "draft_beams" in full and "gamma" in full:
        size = _as_number(full["draft_beams"]) * _as_number(full["gamma"])
        what = "draft_beams x gamma"
        if _as_bool(spec, "fill", full.get("fill", False)):
            size *= _as_number(full.get("beams", 1))  # every tree as wide as the widest
            what = "beams x draft_beams x gamma (fill)"
        if size > MAX_FOREST_NODES:
            raise ConfigError(f"{what} = {size:.0f} forest nodes per round; the UI "
                              f"limit is {MAX_FOREST_NODES}")


def _as_bool(spec, name: str, v: Any) -> bool:
    """A bool parameter as the method's ParamSpec parses it (False when it has no such
    parameter or the value is bad: the engine reports that itself)."""
    row = next((p for p in spec.all_params if p.name == name), None)
    try:
        return bool(row.parse(v)) if row is not None else False
    except ConfigError:
        return False


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


def _updates(run: engine.Run, cancel: threading.Event | None = None) -> Iterator[Update]:
    """Step the run to its end (or a cancel): an Update per round, with the run's head only
    now and then, since it is the one O(run) piece; the last one is ``final``."""
    nodes, last_head = 0, float("-inf")  # the first round shows at once
    for r in run:
        if len(r.nodes) > MAX_FOREST_NODES:
            raise ConfigError(f"round {r.index} drafted {len(r.nodes)} nodes; the UI limit "
                              f"is {MAX_FOREST_NODES} (use a smaller tree)")
        nodes += len(r.nodes)
        stop = nodes > MAX_TRACE_NODES and not run.done
        if run.done or stop or (cancel is not None and cancel.is_set()):
            note = f"stopped by the UI: more than {MAX_TRACE_NODES} forest nodes" if stop else ""
            run.cancel()  # (a finished run: nothing to do; transformers': generate() stops)
            yield Update([r], run.trace(with_rounds=False), final=True, note=note)
            return
        if time.monotonic() - last_head >= HEAD_EVERY_S:
            last_head = time.monotonic()
            yield Update([r], run.trace(with_rounds=False))
        else:
            yield Update([r])
    yield Update([], run.trace(with_rounds=False), final=True)


def _produce(run: engine.Run, out: queue.SimpleQueue, cancel: threading.Event
             ) -> Iterator[None]:
    """The model thread's side, a step job of one round a step: hand every Update of the run
    over to the handler."""
    try:
        for update in _updates(run, cancel):
            out.put(update)
            if not update.final and not run.own_thread:
                yield  # the next round: in this job's next turn (a run whose generate()
                # goes on in its own thread keeps the model thread until it is done)
    except BaseException as e:  # noqa: BLE001 - re-raised in the handler's thread
        out.put(e)
    finally:
        out.put(_DONE)


def _start(target: str, draft: str, prompt: str, method: str, params: dict[str, Any],
           pair_of: Callable[[str, str], engine.ModelPair] = _get_pair) -> engine.Run:
    pair = pair_of(*check_pair_spec(target, draft))
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
    the decode after its current round. On ZeroGPU the run is one GPU call instead.
    """
    full = with_tuned(target, draft, method, params)
    check_run_limits(prompt, full)
    check_forest_budget(method, full)
    if HOST.gpu_stream is not None:
        yield from HOST.gpu_stream(target, draft, prompt, method, params)
        return
    run = WORKER.call(_start, target, draft, prompt, method, params)
    out: queue.SimpleQueue = queue.SimpleQueue()
    cancel = threading.Event()
    WORKER.submit_steps(_produce(run, out, cancel))
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
                _merge(batch, item)
            yield batch
    finally:
        cancel.set()


def _merge(batch: Update, item: Update) -> None:
    batch.rounds += item.rounds
    if item.head is not None:
        batch.head, batch.final, batch.note = item.head, item.final, item.note


def run_trace(target: str, draft: str, prompt: str, method: str,
              params: dict[str, Any]) -> engine.RunTrace:
    """A whole run's RunTrace (used by the Compare tab), computed on the model thread (on
    ZeroGPU: in one GPU call)."""
    full = with_tuned(target, draft, method, params)
    check_run_limits(prompt, full)
    check_forest_budget(method, full)
    if HOST.gpu_trace is not None:
        return HOST.gpu_trace(target, draft, prompt, method, params)
    return WORKER.call_steps(_whole_run(target, draft, prompt, method, params))


def _whole_run(target: str, draft: str, prompt: str, method: str, params: dict[str, Any]
               ) -> Iterator[None]:
    """A step job: start the run, then one round a step; returns the whole RunTrace."""
    run = _start(target, draft, prompt, method, params)
    while not run.done:
        yield
        next(run, None)
    return run.trace()


# ------------------------------------------------------------ ZeroGPU: the GPU functions


def _zero_stream(target: str, draft: str, prompt: str, method: str,
                 params: dict[str, Any]) -> Iterator[Update]:
    """One run in a ZeroGPU call: rounds batched up to each run head (each yield is pickled
    across the process boundary, so fewer and larger is cheaper)."""
    threads.configure()
    run = _start(target, draft, prompt, method, params, pair_of=_preloaded_pair)
    batch = Update([])
    for update in _updates(run):
        _merge(batch, update)
        if batch.head is not None:
            yield batch
            batch = Update([])


def _zero_trace(target: str, draft: str, prompt: str, method: str,
                params: dict[str, Any]) -> engine.RunTrace:
    """A whole run's RunTrace in a ZeroGPU call (Compare)."""
    threads.configure()
    return _start(target, draft, prompt, method, params, pair_of=_preloaded_pair).to_end()
