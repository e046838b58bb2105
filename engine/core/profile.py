"""Cost profiles for the cost-aware switch (:mod:`engine.control.cost`): measured on this
machine, or stored (a GPU's figures, for projections and for runs that decide as that GPU
would).

``measured``: once per process and (target, method, width, drafting settings):

- c_verify(n): the target's forward over a row's position plus n drafted nodes per row (a
  chain under tree attention) after a 32-token prompt, median of 3, over the median plain
  forward (n = 0) of the same width; n in VERIFY_NODES;
- c_draft: a short decode of the method with its switch off (``decode``, supplied by the
  caller: the engine's own run), propose seconds per draft call over the plain forward
  (n = 0) above.

The profile is fixed for the run and recorded in each round's decision, so a seed reproduces
a run in the same process and a trace says which costs its decisions used.

Stored profiles are rows of assets/cost_profiles.json: {"name", "c_draft": {method: c},
"verify": {width: [[n, c], ...]}, "source"}; a method without its own c_draft takes
"default".
"""

from __future__ import annotations

import json
import statistics
import time
import weakref
from typing import Any, Callable

import torch

from engine.control.cost import CostProfile
from engine.core.cached_model import CachedModel
from engine.core.errors import ConfigError
from engine.core.forest import ROOT
from engine.core.paths import ASSETS

VERIFY_NODES = (0, 1, 2, 3, 4, 6, 8, 12, 16)
PROMPT = 32  # tokens before the measured forwards
REPEATS = 3
PROFILES_FILE = ASSETS / "cost_profiles.json"
MEASURED = "measured"

_VERIFY: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # target -> {W: points}
_PROFILES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # target -> {key: profile}
_EXTRA: dict[str, CostProfile] = {}  # profiles registered in this process (tests, tools)


def stored_names() -> tuple[str, ...]:
    """Names a run's ``costs`` parameter accepts besides "measured"."""
    return tuple(row["name"] for row in _stored_rows()) + tuple(_EXTRA)


def register(profile: CostProfile) -> None:
    """Make `profile` selectable by name (``costs=<name>``) in this process."""
    _EXTRA[profile.name] = profile


def _stored_rows() -> list[dict[str, Any]]:
    if not PROFILES_FILE.is_file():
        return []
    return json.loads(PROFILES_FILE.read_text())


def stored(name: str, method: str, width: int) -> CostProfile:
    """The stored profile `name` for `method` at width W (nearest stored width)."""
    if name in _EXTRA:
        return _EXTRA[name]
    for row in _stored_rows():
        if row["name"] == name:
            widths = sorted(int(w) for w in row["verify"])
            w = min(widths, key=lambda x: (abs(x - width), x))
            c_draft = row["c_draft"].get(method, row["c_draft"]["default"])
            return CostProfile(name, float(c_draft),
                               tuple((int(n), float(c)) for n, c in row["verify"][str(w)]),
                               row.get("source", ""))
    known = ", ".join((MEASURED,) + stored_names())
    raise ConfigError(f"unknown cost profile '{name}' (known: {known})")


def verify_points(target: torch.nn.Module, vocab: int, width: int
                  ) -> tuple[float, tuple[tuple[int, float], ...]]:
    """(seconds of a plain forward, (n, c_verify(n)) points) on this machine for the target
    at width W (measured once per process)."""
    memo = _VERIFY.setdefault(target, {})
    if width not in memo:
        seconds = {n: _forward_s(target, vocab, width, n) for n in VERIFY_NODES}
        base = seconds[0]
        memo[width] = (base, tuple((n, round(seconds[n] / base, 4)) for n in VERIFY_NODES))
    return memo[width]


@torch.inference_mode()
def _forward_s(target: torch.nn.Module, vocab: int, width: int, nodes: int) -> float:
    """Median seconds of one target forward over W rows of (1 + nodes) positions."""
    model = CachedModel(target)
    ids = torch.tensor([[1 + (i * 7 + r) % max(vocab - 1, 1) for i in range(PROMPT)]
                        for r in range(width)])  # (W, PROMPT)
    model.start(ids)
    model.feed()
    keep = torch.arange(width)
    nothing = torch.zeros((width, 0), dtype=torch.long)
    model.commit(keep, nothing, nothing, torch.ones((width, 1), dtype=torch.long))
    tokens = torch.full((width, nodes), 2, dtype=torch.long)  # (W, n) a chain per row
    parents = torch.tensor([[ROOT] + list(range(nodes - 1))] * width)[:, :nodes]  # (W, n)
    times = []
    for _ in range(REPEATS + 1):  # the first forward warms up
        t0 = time.perf_counter()
        model.feed(tokens, parents)
        if model.device.type == "cuda":
            torch.cuda.synchronize(model.device)
        times.append(time.perf_counter() - t0)
        model.commit(keep, nothing, nothing, torch.ones((width, 1), dtype=torch.long))
    return statistics.median(times[1:])


def measured(pair, method: str, params: dict[str, Any], width: int,
             decode: Callable[[], list]) -> CostProfile:
    """This machine's profile for `method` (see module docstring); ``decode()`` runs the
    method with its switch off and returns its rounds (RoundTrace)."""
    key = (method, width, tuple(sorted((k, repr(v)) for k, v in params.items())))
    memo = _PROFILES.setdefault(pair.target, {})
    if key not in memo:
        base, points = verify_points(pair.target, pair.vocab_size, width)
        rounds = decode()[1:]
        calls = sum(r.draft_calls for r in rounds)
        propose = sum(r.timings.get("propose", 0.0) for r in rounds)
        c_draft = propose / calls / base if calls else 0.0
        memo[key] = CostProfile(MEASURED, round(c_draft, 4), points,
                                f"{pair.device.type}, {torch.get_num_threads()} thread(s)")
    return memo[key]
