"""Static-shape KV storage and captured steps for
:class:`~engine.execution.cached_model.CachedModel`.

Three execution paths serve a forward (``SPECVIZ_KV`` picks one; :func:`kv_mode` holds the
measured rule):

- ``dynamic``: transformers' ``DynamicCache``; every forward concatenates its keys and values
  onto the cache and a commit builds new tensors (the CPU default: measured no slower there).
- ``static``: a preallocated K/V buffer per layer, (rows, H, S, D); a forward writes its fed
  slots in place (``index_copy_`` at :attr:`SlotCache.slots`) and attends to the written
  prefix; a commit moves the kept slots inside the buffers.
- ``captured``: the static path with every step of a fixed shape (rows, a bucket of fed tokens
  padded to :data:`BUCKETS`, attention over all S slots) replayed from a CUDA graph captured on
  first use (the CUDA default). Padded tokens write slots past the real ones, which no real
  token sees; a padded query sees slot 0 only, so nothing is NaN. On a CPU the same fixed-shape
  steps run eagerly from their static inputs (served as ``padded``): the padding, masks and
  slots of a captured step are tested there.
- ``compiled`` (CPU): the captured path with every step shape of up to COMPILED_MAX_TOKENS fed
  tokens per row compiled once by torch's inductor (``torch.compile``, static shapes) instead
  of run eagerly; longer forwards (a prompt) run on the static path. Fused, the small
  operations of a stock decoder shrink; they are most of a small model's CPU step once its
  weights are packed (docs/benchmarks.md, "Compiled steps on the CPU"). A shape compiles in
  20 s to a minute on one thread the first time on a machine; the step store
  (:mod:`engine.execution.step_store`) keeps the compiled step on disk and a later process
  loads it (the first in about 3.5 s, most of it torch's one-time set-up; later ones in well
  under a second). The mode is chosen (``SPECVIZ_KV=compiled``, or ``POLICY.packed``: the
  app, and bench, bench-set and tune through :func:`serving_compiled`), never a one-shot
  generate's default; a model fed embeddings (a feature drafter) compiles its steps too. A
  packed target's compiled step multiplies through qmm's op and attends through rowattn's, both
  opaque to inductor, and what inductor fuses around them stays within one token's row, so a
  token's bits do not depend on the step's shape; its RMSNorms and
  rotary cos / sin are traced as ops too (:mod:`engine.kernels.eager_bits`), so what inductor
  still fuses rounds as eager does and a compiled step gives every token the eager step's bits
  (tests/model/test_compiled_kv.py); a packed model at 8-bit activations whose attention is
  not rowattn's (the kernel does not build, or the model is not on sdpa) runs static, as the
  traced attention's float order would flip its roundings. A compiled step attends a view of
  the buffer, the first :func:`view_for` slots (a power of two from COMPILED_MIN_VIEW that
  holds the row's real slots): a shape is (rows, bucket, view), and attention's cost follows
  the run's length, not the buffer's, and runs of most lengths share one buffer size and so
  their compiled shapes. For an unpacked model fused kernels sum in another order: results
  equal the eager path's up to float rounding, as the captured path's do. On CUDA
  (``SPECVIZ_KV=compiled``, not the default) each compiled step shape is captured as a CUDA
  graph: inductor's fused kernels replayed, attending all S slots as a captured step does
  (one shape per rows and bucket; the step store keeps CPU steps only). A shape compiles in
  18 s (SmolLM2-1.7B-sized) to 30 s (Qwen2.5-7B-sized) on an H200 host, and its step then
  takes 0.63x / 0.76x the captured one's time (docs/benchmarks.md, "On a GPU").

The same 4D masks and position ids as the dynamic path (:func:`engine.core.forest.attention_inputs`)
are used, padded with the dtype's minimum to the attended width. The results equal the
dynamic path's up to float rounding, not bit for bit (another batch shape and reduction
order), as with any change of batch shape. Buffers and graphs live in a pool per model
(:func:`lease`): graphs are captured against fixed buffer addresses, so they are reused by
every later run of the same model and width; a :class:`KVSet` is held by one runner at a time
(a model drafting for itself leases two), and a free set that a larger free set of the same
rows supersedes is dropped. A shape whose capture fails runs eager from then on; the reason
is kept (:attr:`KVSet.failed`) and logged once per shape.

The pool is module state keyed by model, not a pair's: buffers and captured graphs outlive the
runs (and pairs) that lease them, for as long as the model lives.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import threading
import weakref
from dataclasses import dataclass, field
from typing import Callable
from weakref import WeakKeyDictionary

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from engine.core.errors import ConfigError
from engine.execution import step_store
from engine.execution.placement import is_placed
from engine.kernels import attention, qmm
from engine.kernels.packed4 import is_packed
from engine.kernels.siblings import SiblingCSE

LOG = logging.getLogger(__name__)
Forward = Callable[[dict], torch.Tensor]  # inputs -> (W, q, d) last hidden states
StepKey = tuple  # a step shape: (rows, bucket, input kind), compiled: + the attended view

MODES = ("dynamic", "static", "captured", "compiled")
COMPILED_MAX_TOKENS = 16  # fed tokens per row of a compiled step; more run static (eager)
RECOMPILE_LIMIT = 256  # step shapes compiled in memory (dynamo counts entries per code
# object; a DecoderStep is called through dynamo's inline wrapper, so every model's entries
# share one, told apart by a guard on the step's function: cached_model.own_decoder_call):
# rows x bucket x view x buffer size, about 20 for one-row runs in a 1,024-slot buffer. Past
# it a new shape's capture fails and that shape runs static (logged); dynamo's default, 8,
# would be reached by one run. Steps loaded from or compiled for the step store are not
# counted.
BUCKETS = (1, 2, 4, 8, 16, 32, 64)  # fed tokens per row of a captured step; more runs eager
MIN_SLOTS = 1024  # the smallest buffer (slots per row); larger ones are powers of two
COMPILED_MIN_VIEW = 128  # the fewest slots a compiled step attends; more in powers of two
SPARE_SLOTS = 64  # kept free at a buffer's end: capture warm-ups and padded slots land there


class CompilePolicy:
    """The process's compiled-path defaults (module state: one per process, set by its
    entry point; docs/ARCHITECTURE.md lists it).

    ``packed``: without SPECVIZ_KV, a packed model on a CPU runs the compiled path (the app
    turns it on: a long-lived process whose warm-up compiles in its idle time; so do bench,
    bench-set and tune, :func:`serving_compiled`; a one-shot generate or check keeps the eager
    path, which a compile or a load would outlast). ``deferred`` (per thread): a
    compiled step whose shape is not compiled yet runs on the static path instead of
    compiling on the spot (the app's model thread, so no Run waits for a compile: its
    warm-up compiles under :func:`compiling`), and its ops' Python kernels never build the
    C++ ones (``qmm.BUILDS``); the bits are the same either way for a packed model
    (engine.kernels.eager_bits). ``cpp_wrapper``: a packed model's CPU steps get inductor's
    C++ wrapper (:data:`CPP_WRAPPER`); False once one failed to build here (a compiler
    without Python's headers, say): later shapes take the Python wrapper at once."""

    def __init__(self) -> None:
        self.packed = False
        self.cpp_wrapper = True
        self._local = threading.local()
        self._made = 0
        self._lock = threading.Lock()

    @property
    def made(self) -> int:
        """Step shapes this process has made (captured, compiled or loaded, by any thread):
        a timing across which it changed includes that work (engine.bench.interleaved)."""
        return self._made

    def count_made(self) -> None:
        with self._lock:
            self._made += 1

    @property
    def deferred(self) -> bool:
        return getattr(self._local, "deferred", False)

    @deferred.setter
    def deferred(self, value: bool) -> None:
        self._local.deferred = value
        qmm.BUILDS.here = not value

    @property
    def deferrals(self) -> int:
        """Steps this thread ran static because their compiled shape was not made yet (a
        timing taken across one is not the compiled path's: engine.run.profile)."""
        return getattr(self._local, "deferrals", 0)

    def count_deferral(self) -> None:
        self._local.deferrals = self.deferrals + 1


POLICY = CompilePolicy()


def can_compile() -> bool:
    """Whether inductor can build CPU steps here: a C++ compiler and qmm's library."""
    compiler = shutil.which("c++") or shutil.which("g++") or os.environ.get("CXX")
    return bool(compiler) and qmm.library() is not None


@contextlib.contextmanager
def serving_compiled():
    """Within: a packed model on a CPU runs compiled steps unless SPECVIZ_KV says otherwise
    (``POLICY.packed``) where :func:`can_compile`, else one log line and eager steps. The
    long-lived commands (bench, bench-set, tune) run in it: their warm-up runs make the step
    shapes, and a timing across which a shape was made is taken again
    (engine.bench.interleaved.measure_run). A one-shot ``generate`` does not: loading even
    stored steps costs more than they save on one run (docs/benchmarks.md)."""
    saved = POLICY.packed
    if can_compile():
        POLICY.packed = True
    else:
        LOG.warning("no C++ compiler or packed kernel library here: packed targets run eager "
                    "steps")
    try:
        yield
    finally:
        POLICY.packed = saved


@contextlib.contextmanager
def compiling():
    """Within (this thread): a missing compiled step shape compiles on first use, deferred
    or not (a warm-up's own steps)."""
    saved = POLICY.deferred
    POLICY.deferred = False
    try:
        yield
    finally:
        POLICY.deferred = saved


@contextlib.contextmanager
def deferring():
    """Within (this thread): a missing compiled step shape runs static instead of compiling
    (a measurement that must not compile, such as the thread rule's: a compiled step bakes in
    the thread count it was compiled at)."""
    saved = POLICY.deferred
    POLICY.deferred = True
    try:
        yield
    finally:
        POLICY.deferred = saved


def kv_mode(device: torch.device, model: torch.nn.Module | None = None) -> str:
    """The path of a model on ``device``: dynamic for a model placed by a device map
    (accelerate's hooks move weights at every forward: no fixed-address step), else
    ``SPECVIZ_KV`` when set (``compiled`` on CUDA: compiled steps captured as CUDA graphs),
    else the measured rule (captured on CUDA: no step waits for a compile; on a CPU compiled
    for a packed model where the process asks for it (``POLICY.packed``), else dynamic;
    docs/benchmarks.md, "Static KV and captured steps")."""
    if model is not None and is_placed(model):
        return "dynamic"
    env = os.environ.get("SPECVIZ_KV", "").strip().lower()
    if env:
        if env not in MODES:
            raise ConfigError(f"SPECVIZ_KV={env!r}: expected one of {', '.join(MODES)}")
        return env
    if device.type == "cuda":
        return "captured"
    return "compiled" if POLICY.packed and model is not None and is_packed(model) \
        else "dynamic"


def bucket(q: int) -> int | None:
    """The smallest captured step that fits q fed tokens per row (None: run it eager)."""
    return next((b for b in BUCKETS if b >= q), None)


def view_for(length: int, slots: int) -> int:
    """The slots a compiled step attends when the row holds ``length`` real slots after it:
    the smallest power of two >= length, at least COMPILED_MIN_VIEW, at most the buffer's
    ``slots`` (a step compiles once per view; attention's cost grows with the view, not the
    buffer)."""
    return min(slots, 1 << (max(length, COMPILED_MIN_VIEW) - 1).bit_length())


def slots_for(length: int, minimum: int = MIN_SLOTS) -> int:
    """Buffer slots per row for sequences up to ``length`` (plus the spare end), at least
    ``minimum``."""
    need = max(minimum, length + SPARE_SLOTS)
    return 1 << (need - 1).bit_length()


class _SlotLayer(CacheLayerMixin):
    """One layer's preallocated keys and values (written by :meth:`SlotCache.update`)."""

    is_compileable = True

    def __init__(self, keys: torch.Tensor, values: torch.Tensor):
        super().__init__()
        self.keys, self.values = keys, values  # (R, H, S, D) each
        self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor,
                            value_states: torch.Tensor) -> None:  # noqa: D102
        pass

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args,
               **kwargs) -> tuple[torch.Tensor, torch.Tensor]:  # noqa: D102
        raise RuntimeError("SlotCache writes its layers")

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:  # noqa: D102
        return int(self.keys.shape[2]), 0

    def get_seq_length(self) -> int:  # noqa: D102
        return 0

    def get_max_length(self) -> int:  # noqa: D102
        return int(self.keys.shape[2])


def _complete(cls: type) -> type:
    """cls with a stub for every abstract method this transformers release declares beyond
    the ones written here (the layer interface grows between releases; SlotCache calls none
    of them)."""
    missing = sorted(getattr(cls, "__abstractmethods__", ()))

    def stub(self, *args, **kwargs):
        raise NotImplementedError("a SlotCache layer is written by SlotCache.update")
    return type(cls.__name__, (cls,), {m: stub for m in missing}) if missing else cls


_SlotLayer = _complete(_SlotLayer)


class SlotCache(Cache):
    """A transformers ``Cache`` over preallocated (R, H, S, D) buffers: ``update`` writes the
    fed keys and values of rows [0, rows) at ``slots`` and returns slots [0, view) of those
    rows (the attended width: the written prefix eager, all S slots when captured, a
    power-of-two view when compiled)."""

    def __init__(self, layers: list[_SlotLayer]):
        super().__init__(layers=layers)
        self.rows = int(layers[0].keys.shape[0])
        self.view = 0
        self.written = 0  # slots [0, written) of every row hold committed or fed tokens
        self.slots = torch.zeros(0, dtype=torch.long, device=layers[0].keys.device)  # (q,)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        layer = self.layers[layer_idx]
        keys, values = layer.keys[: self.rows], layer.values[: self.rows]  # (W, H, S, D)
        keys.index_copy_(2, self.slots, key_states.to(keys.dtype))  # fp16 buffers: rounded to
        values.index_copy_(2, self.slots, value_states.to(values.dtype))  # nearest, ties even
        return keys[:, :, : self.view], values[:, :, : self.view]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.written


@dataclass(eq=False)
class _Graph:
    """A captured step of one shape and its static inputs (filled before each replay)."""

    graph: torch.cuda.CUDAGraph | _EagerReplay  # the latter on a CPU
    inputs: dict[str, torch.Tensor]  # input_ids or inputs_embeds, position_ids, attention_mask
    slots: torch.Tensor  # (b,)
    out: torch.Tensor  # (W, b, d) last hidden states, overwritten by every replay


@dataclass(eq=False)
class KVSet:
    """Buffers of one model for ``rows`` rows and ``slots`` slots, and their captured steps."""

    cache: SlotCache
    slots: int
    graphs: dict[StepKey, _Graph | None] = field(default_factory=dict)  # None: that shape's
    # capture failed (its reason in `failed`)
    failed: dict[StepKey, str] = field(default_factory=dict)
    wanted: set[StepKey] = field(default_factory=set)  # compiled shapes a deferring step
    # asked for (run static meanwhile)
    busy: bool = False
    holder: weakref.finalize | None = None  # releases it when its holder is collected
    dtype: torch.dtype = torch.float32  # the model's (its steps' masks): a buffer may be fp16

    @property
    def rows(self) -> int:
        return int(self.cache.layers[0].keys.shape[0])


_POOL: WeakKeyDictionary = WeakKeyDictionary()  # model -> list[KVSet]
_POOL_LOCK = threading.RLock()  # a lease picks and marks a set as one step: the app's warm-up
# thread leases beside the model thread and may pause inside a lease (specviz.warmup); a set
# one thread picked and another then took would hold two runs' keys and values. Reentrant: a
# holder's finalizer (release) may run in a collection inside a lease


def _kv_shape(model: torch.nn.Module) -> tuple[int, int, int]:
    """(layers, KV heads, head dim) of a stock decoder."""
    cfg = model.config
    heads = int(getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads)
    dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
    return int(cfg.num_hidden_layers), heads, dim


def _new_set(model: torch.nn.Module, rows: int, slots: int) -> KVSet:
    """Buffers for every layer: in the model's dtype, or fp16 for a layer of a packed target
    whose attention (rowattn) reads its keys and values as half (attention.kv_dtype)."""
    n, heads, dim = _kv_shape(model)
    p = next(model.parameters())
    decoder = getattr(getattr(model, "model", None), "layers", None)
    dtypes = [attention.kv_dtype(decoder[i], p.dtype) if decoder is not None and i < len(decoder)
              else p.dtype for i in range(n)]
    layers = [_SlotLayer(torch.zeros((rows, heads, slots, dim), dtype=dt, device=p.device),
                         torch.zeros((rows, heads, slots, dim), dtype=dt, device=p.device))
              for dt in dtypes]  # (R, H, S, D) each
    return KVSet(SlotCache(layers), slots, dtype=p.dtype)


def lease(model: torch.nn.Module, rows: int, length: int, owner: object,
          minimum: int = MIN_SLOTS) -> KVSet:
    """A free KV set of ``model`` with ``rows`` rows and room for ``length`` slots per row,
    held until ``owner`` is collected or :func:`release` (the pool keeps it for later runs).
    Thread-safe: two threads never hold one set."""
    need = slots_for(length, minimum)
    with _POOL_LOCK:
        sets = _POOL.setdefault(model, [])
        free = [s for s in sets if not s.busy and s.rows == rows and s.slots >= need]
        kv = min(free, key=lambda s: (s.slots, -len(s.graphs))) if free else \
            _new_set(model, rows, need)  # the smallest; of those the one with most steps made
        if not free:  # a new, larger set supersedes the smaller free ones of the same rows
            sets[:] = [s for s in sets if s.busy or s.rows != rows or s.slots >= need]
            sets.append(kv)
        kv.busy = True
    kv.cache.written = 0
    kv.holder = weakref.finalize(owner, release, kv)
    return kv


def release(kv: KVSet) -> None:
    """Give a set back to the pool (its holder's finalizer is dropped)."""
    with _POOL_LOCK:
        if kv.holder is not None:
            kv.holder.detach()
            kv.holder = None
        kv.busy = False


def pool_sets(model: torch.nn.Module) -> list[KVSet]:
    """The KV sets the pool holds for ``model`` (for tests and the GPU benchmark)."""
    return list(_POOL.get(model, []))


def run_step(kv: KVSet, forward: Forward, inputs: dict[str, torch.Tensor],
             mask: torch.Tensor, pos: torch.Tensor, captured: bool,
             compiled: bool = False, whole_view: bool = False) -> tuple[torch.Tensor, str]:
    """One forward writing its (W, q) fed tokens at slots [written, written + q).

    Args:
        forward: runs the decoder on a dict of inputs (input_ids or inputs_embeds,
            attention_mask, position_ids) with ``kv.cache``; returns (W, q, d) hidden states.
        mask: (W, 1, q, kv) additive mask over the written slots and the fed ones.
        pos: (W, q) position ids.
        captured: fixed-shape steps (CUDA graphs; eager on a CPU).
        compiled: fixed-shape steps compiled by inductor (on CUDA then captured), up to
            COMPILED_MAX_TOKENS;
            a shape not compiled yet runs static where this thread defers compiles
            (``POLICY.deferred``).
        whole_view: a compiled step attends every slot (its attention reads a row's visible
            slots only, as rowattn's: one shape per rows and bucket, not per view too).
    Returns:
        the (W, q, d) hidden states (a fresh tensor) and the path that served the step.
    """
    cache, (W, q) = kv.cache, pos.shape
    start = cache.written
    if start + q > kv.slots - SPARE_SLOTS:
        raise RuntimeError("static KV buffer full")  # CachedModel grows it before this
    b = bucket(q) if captured else None
    if compiled and q <= COMPILED_MAX_TOKENS:
        b = bucket(q)
    view = kv.slots if whole_view or not compiled else view_for(start + q, kv.slots)
    key = step_key(W, b, "inputs_embeds" if "inputs_embeds" in inputs else "input_ids",
                   compiled, view)
    if compiled and b is not None and key not in kv.graphs and POLICY.deferred:
        kv.wanted.add(key)  # recorded only: nothing compiles it later (the
        # warm-up makes the common shapes: cached_model.warming)
        POLICY.count_deferral()
        b = None
    graph = _graph(kv, forward, inputs, W, b, compiled, view) if b is not None else None
    if graph is None:
        cache.rows, cache.view = W, start + q
        cache.slots = torch.arange(start, start + q, device=pos.device)  # (q,)
        out = forward({**inputs, "attention_mask": mask, "position_ids": pos})
        cache.written = start + q
        return out, "static"
    _fill(graph, kv, inputs, mask, pos, start)
    with qmm.padded_rows(b, q):  # a packed model's products skip the padded tokens
        graph.graph.replay()
    cache.written = start + q
    path = "compiled" if compiled else "captured" if pos.device.type == "cuda" else "padded"
    return graph.out[:, :q].clone(), path


def _fill(g: _Graph, kv: KVSet, inputs: dict, mask: torch.Tensor, pos: torch.Tensor,
          start: int) -> None:
    """Copy one step's inputs into a graph's static ones: padded tokens sit after the real
    ones (slots start + q ...), see slot 0 only, and take position 0."""
    W, q = pos.shape
    b = int(g.slots.shape[0])
    g.slots.copy_(torch.arange(start, start + b, device=pos.device))  # (b,)
    name = "inputs_embeds" if "inputs_embeds" in inputs else "input_ids"
    g.inputs[name].zero_()  # (W, b) ids or (W, b, d) embeddings
    g.inputs[name][:, :q].copy_(inputs[name])
    g.inputs["position_ids"].zero_()  # (W, b)
    g.inputs["position_ids"][:, :q].copy_(pos)
    full = g.inputs["attention_mask"]  # (W, 1, b, view)
    full.fill_(torch.finfo(full.dtype).min)
    full[:, :, :q, : mask.shape[-1]].copy_(mask)  # (W, 1, q, kv) of the real queries
    full[:, :, q:, 0] = 0  # padded queries: slot 0 only


def step_key(W: int, b: int | None, name: str, compiled: bool, view: int) -> StepKey:
    """A step shape's key in ``KVSet.graphs``: (rows, bucket, input kind[, view])."""
    return (W, b, name, view) if compiled else (W, b, name)


def _graph(kv: KVSet, forward: Forward, inputs: dict, W: int, b: int,
           compiled: bool = False, view: int | None = None) -> _Graph | None:
    """The captured step of (W rows, b fed tokens, this input kind; compiled: attending the
    first ``view`` slots), captured on first use; None where capture failed (that shape then
    runs eager, recorded as static). A captured step attends every slot."""
    name = "inputs_embeds" if "inputs_embeds" in inputs else "input_ids"
    key = step_key(W, b, name, compiled, view or kv.slots)
    if key not in kv.graphs:
        POLICY.count_made()  # at the start and the end: a timing across either sees it
        try:
            kv.graphs[key] = _capture(kv, forward, inputs[name], W, b, name, compiled,
                                      view if compiled else None)
        except torch.cuda.OutOfMemoryError:
            raise
        except Exception as e:  # noqa: BLE001 - a shape that cannot be captured runs eager
            kv.graphs[key] = None
            kv.failed[key] = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"
            LOG.warning("step shape %s not captured, it runs eager: %s", key, kv.failed[key])
        finally:
            POLICY.count_made()
    return kv.graphs[key]


def _capture(kv: KVSet, forward: Forward, sample: torch.Tensor, W: int, b: int,
             name: str, compiled: bool = False, view: int | None = None) -> _Graph:
    """Capture one step shape: its static inputs write the spare end of the buffer, so the
    warm-up and the capture never touch a live slot; it attends the first ``view`` slots
    (default: all). Raises what the capture raised (the stream is synchronised first)."""
    cache, dev = kv.cache, sample.device
    view = kv.slots if view is None else view
    dtype = kv.dtype  # the mask's: the model's, not an fp16 buffer's (whose lowest value
    # rowattn would not take as hidden)
    shape = (W, b) if name == "input_ids" else (W, b, int(sample.shape[-1]))
    inputs = {name: torch.zeros(shape, dtype=sample.dtype, device=dev),
              "position_ids": torch.zeros((W, b), dtype=torch.long, device=dev),
              "attention_mask": torch.zeros((W, 1, b, view), dtype=dtype, device=dev)}
    slots = torch.arange(kv.slots - b, kv.slots, device=dev)  # (b,) the spare end
    saved = (cache.rows, cache.view, cache.slots)
    cache.rows, cache.view, cache.slots = W, view, slots
    try:
        if dev.type != "cuda":  # compiled: inductor's kernels (the first call compiles)
            replay = _cpu_step(forward, cache, inputs, (W, view, slots), compiled)
            return _Graph(replay, inputs, slots, replay.out)
        step = _compile(forward, cache) if compiled else forward  # captured on CUDA
        stream = torch.cuda.Stream(dev)
        stream.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm-up outside the capture (allocator, lazy inits)
                step(inputs)
        torch.cuda.current_stream(dev).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):  # other threads
            out = step(inputs)  # (W, b, d)  # (the UI's) may use CUDA meanwhile
        return _Graph(graph, inputs, slots, out)
    except Exception:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        raise
    finally:
        cache.rows, cache.view, cache.slots = saved


def _cpu_step(forward: Forward, cache: SlotCache, inputs: dict, state: tuple,
              compiled: bool) -> "_EagerReplay":
    """The replay of one CPU step shape (compiled: its first call compiles it). Where a
    packed model's step fails with the C++ wrapper (the step store's ahead-of-time compile,
    then the in-memory one: both logged) and builds with the Python one, every later shape
    of the process takes the Python one at once (``POLICY.cpp_wrapper``: a compiler without
    Python's headers, say); failing with both, it raises the first error and the policy stays
    as it was."""
    cpp = compiled and _cpp_wrapped(forward, cache.layers[0].keys.device)
    try:
        return _EagerReplay(_compile(forward, cache) if compiled else forward, inputs, cache,
                            state)
    except Exception as e:  # noqa: BLE001 - the Python wrapper next, else the caller's
        if not cpp:
            raise
        saved, POLICY.cpp_wrapper = POLICY.cpp_wrapper, False
        try:
            replay = _EagerReplay(_compile(forward, cache), inputs, cache, state)
        except Exception as second:  # noqa: BLE001 - not the wrapper's failure
            POLICY.cpp_wrapper = saved
            LOG.debug("the step failed with the Python wrapper too: %s", second)
            raise e from None
        LOG.warning("the C++ step wrapper did not build here, steps compile with the Python "
                    "one: %s: %s", type(e).__name__, (str(e).splitlines() or [""])[0][:200])
        return replay


@dataclass(frozen=True, eq=False)
class DecoderStep:
    """A stock decoder's forward over a cache as a :data:`Forward`: ``call(decoder,
    cache_kw, inputs)`` (cached_model's decoder_call, or its copy with a code object of the
    decoder's own). It holds no runner: a compiled step outlives its run in the pool."""

    call: Callable
    decoder: torch.nn.Module
    cache_kw: dict

    def __call__(self, inputs: dict) -> torch.Tensor:
        return self.call(self.decoder, self.cache_kw, inputs)  # (W, q, d)


COMPILE_OPTIONS = {"size_asserts": False,  # no check of every input's and product's strides
                   # at each call (about a thousand a step of the embedded model; the shapes
                   # are fixed)
                   "post_grad_custom_post_pass": SiblingCSE()}  # sibling products run once
# a packed model's CPU step in C++ end to end: inductor writes the step's wrapper (which calls
# its ~340 kernels and custom ops, 1.3 ms of a 4.8 ms one-row step as Python) as C++, compiled
# apart from the kernels at -O1 (about 8 s more a shape than the Python wrapper's 46)
CPP_WRAPPER = {"cpp_wrapper": True, "cpp_wrapper_build_separate": True}


def compile_options(model: torch.nn.Module | None, device: torch.device) -> dict:
    """Inductor's options for a step of ``model`` on ``device``: COMPILE_OPTIONS, with
    CPP_WRAPPER for a packed model on a CPU (the unpacked models' steps are few kernels of
    much work each; a CUDA step is captured as a graph, so its wrapper runs once)."""
    if device.type == "cpu" and model is not None and is_packed(model) and POLICY.cpp_wrapper:
        return {**COMPILE_OPTIONS, **CPP_WRAPPER}
    return dict(COMPILE_OPTIONS)


def _cpp_wrapped(forward: Forward, device: torch.device) -> bool:
    """Whether `forward`'s compiled step takes the C++ wrapper (compile_options)."""
    decoder = forward.decoder if isinstance(forward, DecoderStep) else None
    return bool(compile_options(decoder, device).get("cpp_wrapper"))


def _compile(forward: Forward, cache: SlotCache) -> Forward:
    """`forward` compiled by inductor for the static shapes of its first call (one compiled
    function per step shape), loaded from or saved to the step store
    (:mod:`engine.execution.step_store`) where ``forward`` is a :class:`DecoderStep` and the
    store is on; the cache's buffers, written in place by every step, are marked as fixed
    addresses."""
    import torch._dynamo

    torch._dynamo.config.accumulated_recompile_limit = max(
        torch._dynamo.config.accumulated_recompile_limit, 4 * RECOMPILE_LIMIT)  # all models
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit,
                                               RECOMPILE_LIMIT)
    for layer in cache.layers:
        torch._dynamo.mark_static_address(layer.keys)
        torch._dynamo.mark_static_address(layer.values)
    options = compile_options(forward.decoder if isinstance(forward, DecoderStep) else None,
                              cache.layers[0].keys.device)
    in_memory = torch.compile(forward, dynamic=False, fullgraph=True, options={  # fullgraph:
        # a graph break would compile the model's inner frames on code objects every model
        # shares (cached_model.own_decoder_call separates the step's own), so it fails the
        # capture instead and the shape runs eager
        "guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe,
        **options})
    if not isinstance(forward, DecoderStep) or cache.layers[0].keys.device.type != "cpu":
        return in_memory  # the step store keeps CPU steps (a CUDA step is captured anyway)
    chosen: list[Forward] = []

    def step(inputs: dict) -> torch.Tensor:
        if not chosen:  # the first call: the capture's, on its static inputs
            stored = step_store.load_or_compile(
                forward.call, forward.decoder, forward.cache_kw, cache, inputs, forward,
                options, exact=is_packed(forward.decoder))
            chosen.append(stored or in_memory)
        return chosen[0](inputs)

    return step


class _EagerReplay:
    """A CPU stand-in for a CUDA graph: replay runs the forward (eager, or compiled) on the
    same static inputs and writes into the same output buffer."""

    def __init__(self, forward: Forward, inputs: dict, cache: SlotCache, state: tuple):
        self.forward, self.inputs, self.cache, self.state = forward, inputs, cache, state
        cache.rows, cache.view, cache.slots = state
        self.out = forward(inputs).clone()  # (W, b, d) also the warm-up

    def replay(self) -> None:
        cache, saved = self.cache, (self.cache.rows, self.cache.view, self.cache.slots)
        cache.rows, cache.view, cache.slots = self.state
        try:
            self.out.copy_(self.forward(self.inputs))
        finally:
            cache.rows, cache.view, cache.slots = saved


def gather(kv: KVSet, W: int, rows: torch.Tensor, prefix: int, node_slots: torch.Tensor,
           same: int = 0) -> None:
    """Commit inside the buffers: every new row r keeps slots [0, prefix) of parent row
    rows[r] followed by that row's node_slots[r] (W' = len(rows) <= buffer rows). ``same``:
    slots [0, same) already hold the same values in every new row and its parent (a beam
    run's shared prompt), so a reorder moves slots [same, prefix) only."""
    cache = kv.cache
    W2, f = node_slots.shape
    identity = W2 == W and bool((rows == torch.arange(W, device=rows.device)).all())
    if identity and f:
        in_place = bool((node_slots == torch.arange(prefix, prefix + f,
                                                    device=node_slots.device)).all())  # a
        # chain's accepted drafts already follow the prefix: nothing moves
        for layer in () if in_place else cache.layers:  # the kept nodes move in their rows
            for buf in (layer.keys, layer.values):
                H, D = buf.shape[1], buf.shape[3]
                idx = node_slots[:, None, :, None].expand(W, H, f, D)  # (W, H, f, D)
                buf[:W, :, prefix:prefix + f] = buf[:W].gather(2, idx)
    elif not identity:
        lo = min(same, prefix)
        idx = torch.cat([torch.arange(lo, prefix, device=rows.device).expand(W2, prefix - lo),
                         node_slots], dim=1)  # (W', prefix - lo + f)
        flats: dict[tuple[int, int], torch.Tensor] = {}  # one index per buffer shape (H, S)
        for layer in cache.layers:
            for buf in (layer.keys, layer.values):
                R, H, S, D = buf.shape
                if (H, S) not in flats:
                    flats[H, S] = flat_index(rows, idx, H, S)  # (W' * H * (prefix - lo + f),)
                moved = buf.view(R * H * S, D).index_select(0, flats[H, S])
                buf[:W2, :, lo: prefix + f] = moved.view(W2, H, prefix - lo + f, D)
    cache.written = prefix + f


def flat_index(rows: torch.Tensor, idx: torch.Tensor, H: int, S: int) -> torch.Tensor:
    """(W' * H * S',) positions of x[rows[r], h, idx[r, s]] in a (W, H, S, D) cache tensor
    flattened to (W * H * S, D)."""
    heads = torch.arange(H, device=idx.device)  # (H,)
    flat = (rows[:, None, None] * H + heads[None, :, None]) * S + idx[:, None, :]  # (W', H, S')
    return flat.reshape(-1)


def copy_row(kv: KVSet, src: int, dst: slice, length: int) -> None:
    """Copy slots [0, length) of row ``src`` into rows ``dst`` (a shared prompt's prefill)."""
    for layer in kv.cache.layers:
        for buf in (layer.keys, layer.values):  # (R, H, S, D)
            buf[dst, :, :length] = buf[src : src + 1, :, :length]  # (1, H, length, D) copies
