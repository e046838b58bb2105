"""Model work of the UI: presets, a per-process model cache behind one lock, and the
streaming decode that a Run event consumes.

Models are loaded once per process, keyed by (target, draft); every forward runs under
``MODEL_LOCK`` so concurrent sessions never use the same weights at the same time. The
decode yields plain dicts (picklable) so it can run inside a ZeroGPU ``spaces.GPU`` worker.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass, replace
from typing import Any, Iterator

import engine
from engine.api import build_trace
from engine.errors import ConfigError, ModelLoadError
from specviz.state import ASSETS

MAX_PROMPT_CHARS = 2000
MAX_PROMPT_TOKENS = 1024
MAX_NEW_TOKENS = 256
MAX_FOREST_NODES = 1024  # per round; the forest view collapses far earlier
MAX_TRACE_NODES = 40_000  # per run: bounds the session's memory and each re-render
CACHE_SIZE = 2  # model pairs kept per process

MODEL_LOCK = threading.RLock()
_LOAD_LOCK = threading.Lock()
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
    """Normalised (target, draft) strings; GPU-only presets refused on a CPU machine."""
    target = (target or "").strip() or engine.EMBEDDED
    draft = (draft or "").strip()
    for p in presets():
        if p.needs_gpu and p.target == target and not _cuda_available():
            raise ModelLoadError(
                f"'{target}' is a GPU preset: it needs a CUDA device and network access, and "
                "this machine has no GPU (use the embedded model, or run the Space on a GPU)"
            )
    return target, draft


def parse_draft(draft: str) -> tuple[str | None, int | None]:
    """'' or 'early-exit' -> the target's own first layers; 'early-exit:N' -> its first N
    layers; anything else is a model spec for load_pair."""
    if not draft or draft in ("early-exit", "early_exit", "self"):
        return None, None
    head, _, n = draft.partition(":")
    if head in ("early-exit", "early_exit") and n:
        if not n.strip().isdigit() or int(n) < 1:
            raise ConfigError(f"early-exit layers must be a positive integer, got '{n}'")
        return None, int(n)
    return draft, None


def get_pair(target: str, draft: str = "") -> engine.ModelPair:
    """The cached pair for (target, draft), loading it on first use."""
    key = check_pair_spec(target, draft)
    with _LOAD_LOCK:
        if key in _PAIRS:
            _PAIRS.move_to_end(key)
            return _PAIRS[key]
        draft, layers = parse_draft(key[1])
        pair = engine.load_pair(target=key[0], draft=draft, device="auto",
                                early_exit_layers=layers)
        _PAIRS[key] = pair
        while len(_PAIRS) > CACHE_SIZE:
            _PAIRS.popitem(last=False)
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


def decode_stream(target: str, draft: str, prompt: str, method: str,
                  params: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Run one method round by round.

    Yields {"round": RoundTrace dict, "head": RunTrace dict without rounds} after every
    round; the head always holds the run so far (text, origins, stats). wall_s counts only
    time spent inside the engine, not the time the UI spends rendering between rounds.
    """
    check_run_limits(prompt, params)
    check_forest_budget(method, params)
    pair = get_pair(target, draft)
    with MODEL_LOCK:
        decoder, full, ids = engine.make_decoder(pair, prompt, method, **params)
    if len(ids) > MAX_PROMPT_TOKENS:
        raise ConfigError(f"prompt has {len(ids)} tokens; the UI limit is {MAX_PROMPT_TOKENS}")
    rounds: list[engine.RoundTrace] = []
    busy, total = 0.0, 0
    steps = decoder.rounds()
    while total <= MAX_TRACE_NODES:
        with MODEL_LOCK:
            t0 = time.perf_counter()
            r = next(steps, None)
            busy += time.perf_counter() - t0
        if r is None:
            return
        if len(r.nodes) > MAX_FOREST_NODES:
            raise ConfigError(f"round {r.index} drafted {len(r.nodes)} nodes; the UI limit is "
                              f"{MAX_FOREST_NODES} (use a smaller tree)")
        rounds.append(r)
        total += len(r.nodes)
        trace = build_trace(pair, decoder, method, full, prompt, ids, tuple(rounds), busy)
        head = _plain(replace(trace, rounds=()).to_dict())
        if total > MAX_TRACE_NODES and not decoder.done:
            head["stop_reason"] = f"stopped by the UI: more than {MAX_TRACE_NODES} forest nodes"
        yield {"round": _plain(asdict(r)), "head": head}


def _plain(d: dict[str, Any]) -> dict[str, Any]:
    """JSON types only (tuples become lists), as RunTrace.from_dict expects."""
    return json.loads(json.dumps(d))


def run_trace(target: str, draft: str, prompt: str, method: str,
              params: dict[str, Any]) -> dict[str, Any]:
    """A whole run as a RunTrace dict (used by the Compare tab)."""
    check_run_limits(prompt, params)
    check_forest_budget(method, params)
    pair = get_pair(target, draft)
    with MODEL_LOCK:
        return _plain(engine.generate(pair, prompt, method, **params).to_dict())


def _gpu(fn):
    """Wrap fn with spaces.GPU on ZeroGPU Spaces (no-op elsewhere)."""
    try:
        import spaces  # type: ignore[import-not-found]
    except ImportError:
        return fn
    return spaces.GPU(duration=120)(fn)


decode_stream = _gpu(decode_stream)
run_trace = _gpu(run_trace)
