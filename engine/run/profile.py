"""Cost profiles for the cost-aware switch (:mod:`engine.control.cost`): measured on this
machine, or stored (a GPU's figures, for projections and for runs that decide as that GPU
would).

``measured``: once per pair and (method, width, drafting settings), kept in the pair's
``calibration`` (engine.run.models.Calibration: ``verify`` and ``profiles``) and, for a pair
loaded from specs, on disk for the machine class (engine.run.profile_store: a run plans with
the median of the kept measurements, and measures none once KEEP are kept), in units of
one plain round P of the engine at that width (its forward, verify and commit):

- the target's forward over a row's position plus n drafted nodes per row (a chain under tree
  attention) after a 32-token prompt, n in VERIFY_NODES, timed interleaved (every repeat runs
  each n once, in a rotated order, so a burst of load on the machine spreads over every n
  instead of landing on one), median of REPEATS; c_verify(n) = a plain round plus the
  forward's extra time over n = 0, made non-decreasing in n (:func:`monotone`);
- c_draft: a short decode of the method with its switch off (``decode``, supplied by the
  caller: the engine's own run, run twice, the first to warm up): the median over its
  rounds of a round's propose seconds past its first draft call per later call; c_round:
  the median round's rest, its first call's extra and its forward's time past the timed
  curve included (:func:`round_costs`); c_catch: the decode's first call, which
  read the whole prompt, past a later first call, per prompt token (:func:`catch_cost`);
  accept: the acceptance per depth the decode saw (:func:`calibrated_accept`); c_lookup, for
  a drafter that mixes a lookup with a model: one call the lookup covers, timed after the
  decode's context (``Drafter.lookup_call_s``).

The profile is fixed for the run and recorded in each round's decision, so a seed reproduces
a run on the same pair (unless the switch's timed guard is on: engine.control.guard) and a
trace says which costs its decisions used.

Stored profiles are rows of assets/cost_profiles.json: {"name", "c_draft": {method: c},
"verify": {width: [[n, c], ...]}, "source"}; a method without its own c_draft takes
"default".
"""

from __future__ import annotations

import functools
import json
import logging
import statistics
import time
from dataclasses import replace
from typing import Any, Callable

import torch

from engine.control.cost import CostProfile, DepthPosterior
from engine.core.errors import ConfigError
from engine.core.forest import ROOT
from engine.core.paths import ASSETS
from engine.execution import static_kv
from engine.execution.cached_model import CachedModel
from engine.run import profile_store
from engine.run.costs import NOT_DRAFTED

VERIFY_NODES = (0, 1, 2, 3, 4, 6, 8, 12, 16)
PROMPT = 32  # tokens before the measured forwards
REPEATS = 7  # timed forwards per node count (3 swung c_verify(4) from 1.26 to 1.55)
PROFILES_FILE = ASSETS / "cost_profiles.json"
MEASURED = "measured"

LOG = logging.getLogger(__name__)
_EXTRA: dict[str, CostProfile] = {}  # profiles registered in this process (tests, tools)


def stored_names() -> tuple[str, ...]:
    """Names a run's ``costs`` parameter accepts besides "measured"."""
    return tuple(row["name"] for row in _stored_rows()) + tuple(_EXTRA)


def register(profile: CostProfile) -> None:
    """Make `profile` selectable by name (``costs=<name>``) in this process."""
    _EXTRA[profile.name] = profile


@functools.lru_cache(maxsize=1)
def _stored_rows() -> tuple[dict[str, Any], ...]:
    """The rows of assets/cost_profiles.json, read once per process."""
    if not PROFILES_FILE.is_file():
        return ()
    return tuple(json.loads(PROFILES_FILE.read_text()))


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


def verify_points(pair, width: int) -> tuple[float, tuple[tuple[int, float], ...]]:
    """(seconds of a plain forward, (n, c_verify(n)) points) on this machine for the pair's
    target at width W (measured once per pair: ``pair.calibration.verify``, unless a step
    ran static for want of its compiled shape; :func:`measured` drops it for each further
    measurement it takes); the ratios are non-decreasing in n and at
    least 1."""
    memo = pair.calibration.verify
    if width in memo:
        return memo[width]
    deferrals = static_kv.POLICY.deferrals
    seconds = _forward_s(pair.target, pair.vocab_size, width, VERIFY_NODES)
    base = seconds[0]
    points = (base, _non_decreasing(tuple((n, round(seconds[n] / base, 4))
                                          for n in VERIFY_NODES)))
    if static_kv.POLICY.deferrals == deferrals:  # not kept where a step ran static for want
        memo[width] = points  # of its compiled shape (the app's thread, during its warm-up)
    return points


def _non_decreasing(points: tuple[tuple[int, float], ...]) -> tuple[tuple[int, float], ...]:
    """The least-squares non-decreasing fit of the points' costs (pool adjacent violators),
    none below the first: a forward over more nodes never costs less, whatever a noisy
    timing of a busy machine said."""
    blocks: list[list[float]] = []  # [sum, count] of pooled neighbours
    for _, c in points:
        blocks.append([c, 1.0])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            s, k = blocks.pop()
            blocks[-1][0] += s
            blocks[-1][1] += k
    fitted = [b[0] / b[1] for b in blocks for _ in range(int(b[1]))]
    floor = points[0][1]
    return tuple((n, round(max(c, floor), 4)) for (n, _), c in zip(points, fitted))


def monotone(profile: CostProfile) -> CostProfile:
    """The profile with its c_verify(n) points non-decreasing in n (:func:`_non_decreasing`)."""
    return replace(profile, verify=_non_decreasing(profile.verify))


@torch.no_grad()
def _forward_s(target: torch.nn.Module, vocab: int, width: int,
               counts: tuple[int, ...]) -> dict[int, float]:
    """n -> median seconds of one target forward over W rows of (1 + n) positions, for each n
    in `counts`, timed interleaved (module docstring). Under no_grad, as every run, not
    inference_mode: the static paths' buffers and captured steps it leases from the model's
    pool are written in place by the runs after it, which an inference tensor refuses."""
    model = CachedModel(target)
    ids = torch.tensor([[1 + (i * 7 + r) % max(vocab - 1, 1) for i in range(PROMPT)]
                        for r in range(width)])  # (W, PROMPT)
    model.start(ids)
    model.feed()
    keep = torch.arange(width)
    nothing = torch.zeros((width, 0), dtype=torch.long)
    model.commit(keep, nothing, nothing, torch.ones((width, 1), dtype=torch.long))
    times: dict[int, list[float]] = {n: [] for n in counts}
    for rep in range(REPEATS + 1):  # the first repeat warms up
        for i in range(len(counts)):
            n = counts[(i + rep) % len(counts)]
            tokens = torch.full((width, n), 2, dtype=torch.long)  # (W, n) a chain per row
            parents = torch.tensor([[ROOT] + list(range(n - 1))] * width)[:, :n]  # (W, n)
            t0 = time.perf_counter()
            model.feed(tokens, parents)
            if model.device.type == "cuda":
                torch.cuda.synchronize(model.device)
            times[n].append(time.perf_counter() - t0)
            model.commit(keep, nothing, nothing, torch.ones((width, 1), dtype=torch.long))
    return {n: statistics.median(ts[1:]) for n, ts in times.items()}


def measured(pair, method: str, params: dict[str, Any], width: int,
             decode: Callable[[], list], plain_s: Callable[[], float],
             prompt_tokens: int = 0, prompt_ids: list[int] | None = None) -> CostProfile:
    """This machine's profile for `method` (see module docstring); ``decode()`` runs the
    method with its switch off and returns its rounds (RoundTrace); ``plain_s()`` measures
    one plain round of the engine (forward, verify and commit) at this width, in seconds,
    just before the decode (not the pair's latest plain run: a process's first run is
    cold, and its rounds took 11.6-17.6 ms where warm ones take 11-12 ms); ``prompt_tokens``
    the decode's prompt length (c_catch: :func:`catch_cost`; 0: not priced); ``prompt_ids``
    its prompt, where the drafter prices a lookup's call after it and the decode's tokens
    (c_lookup: ``Drafter.lookup_call_s`` over P). A process's first measurement runs the
    decode twice and throws the first away: a cold first decode's rounds shrank from 2.9 P to
    1.4 P over its first ten rounds, pricing every drafted round too high. Measured once per
    pair and key (``pair.calibration.profiles``); where the machine class's store is on
    (engine.run.profile_store), until it keeps KEEP measurements of the entry, each with its
    own forwards, and the profile is their elementwise median: a process's first run plans
    with a median of KEEP as later processes do (one measurement's c_round spread 0.28-0.99
    over six back to back on the Intel Xeon, docs/benchmarks.md). A measurement across a
    step that ran static for want of its compiled shape is used, not kept, and ends the
    measuring; the store off, one measurement."""
    key = (method, width, tuple(sorted((k, repr(v)) for k, v in params.items())))
    memo = pair.calibration.profiles
    if key in memo:
        return memo[key]
    mode = CachedModel(pair.target).mode
    draft = pair.drafter.model
    draft_mode = static_kv.kv_mode(pair.device, draft) if draft is not None else ""
    stored_key = profile_store.entry_key(pair, mode, draft_mode, method, width, params)
    dev = str(pair.device)
    kept = [p for p in (profile_store.load(stored_key, dev) if stored_key else [])
            if tuple(n for n, _ in p.verify) == VERIFY_NODES]
    source = f"{pair.device.type}, {torch.get_num_threads()} thread(s), {mode} steps"
    wanted = profile_store.KEEP - len(kept) if stored_key else 1  # the store off: one
    for attempt in range(max(wanted, 0)):
        deferrals = static_kv.POLICY.deferrals
        if attempt:  # each measurement times its own forwards
            pair.calibration.verify.pop(width, None)
        fresh = _measure_once(pair, width, decode, plain_s, prompt_tokens, prompt_ids, source,
                              warm=attempt > 0)
        deferred = static_kv.POLICY.deferrals - deferrals
        if stored_key and not deferred:  # kept unless a step ran static for want of its
            # compiled shape (the app's thread defers compiles); a store it cannot write
            # returns the fresh one alone, and the process plans with its own then
            mine = (kept + [fresh])[-profile_store.KEEP:]
            stored = profile_store.add(stored_key, fresh, dev)
            kept = stored if len(stored) >= len(mine) else mine
            if len(kept) >= profile_store.KEEP:  # (another process may have added some)
                break
            continue
        kept = kept + [fresh]
        if stored_key:
            LOG.info("the %s cost profile was measured across %d steps whose compiled shape "
                     "was not made yet: used, not kept", method, deferred)
        break
    memo[key] = profile_store.median(kept)
    return memo[key]


def _measure_once(pair, width: int, decode: Callable[[], list], plain_s: Callable[[], float],
                  prompt_tokens: int, prompt_ids: list[int] | None, source: str,
                  warm: bool = False) -> CostProfile:
    """One measurement of :func:`measured`'s profile: the verify curve (once per pair unless
    dropped), a warm-up decode (none where `warm`: one just ran), P, the timed decode."""
    base, ratios = verify_points(pair, width)
    if not warm:
        decode()  # warm-up: a process's first drafted rounds ran up to 2x the later ones'
    plain = plain_s()
    every = decode()
    fresh = round_costs(base, ratios, plain, every[1:], source)
    lookup = None if prompt_ids is None else pair.drafter.lookup_call_s(
        list(prompt_ids) + [c.token_id for r in every for c in r.committed])
    return replace(fresh, c_catch=catch_cost(every, prompt_tokens, plain),
                   accept=calibrated_accept(every),
                   c_lookup=None if lookup is None else round(lookup / plain, 4))


def round_costs(base: float, ratios: tuple[tuple[int, float], ...], plain_s: float,
                rounds: list, source: str = "") -> CostProfile:
    """Costs in plain *rounds* P (``plain_s``, a whole plain round of the engine at this
    width: the unit the switch's E_0 / C_0 = 1 assumes; ``base`` only where it is not
    positive), so that c_round + calls x c_draft + c_verify(n) is a drafted round's whole
    time over P:

    - c_verify(n) = 1 + (f(n) - f(0)) / P, f(n) = base x ratio the timed forward with n
      drafted nodes per row: a plain round plus the extra rows' forward, timed back to back;
    - c_draft = the median over the rounds of two or more calls of their propose seconds
      past the first call (``RoundTrace.draft_seconds``) per later call, over P. A round's
      first call also catches the drafter up on what the last round committed and costs
      more (0.2-0.5 ms more on the embedded model): c_round holds that. Where no round made
      a second call, or kept no call times (an older trace): the median round's propose
      seconds per draft call;
    - c_round = the rest of what the median round costs beyond c_verify(nodes) P and calls x
      c_draft P (its first call's extra, the verify rule, the commit, a method's own caches,
      and what its forward takes beyond the timed one's: on the embedded model's compiled
      path a drafted round's forward ran 1.9 ms past the timed curve at one node and 2.7 at
      three (0.25-0.36 P), a price per round, not per node: counted per node, it priced depth
      1 a fifth too cheap), over P (a median: one round slowed by the machine does not
      set every plan's price).
    """
    plain = plain_s if plain_s > 0 else base
    nodes = [_nodes(r) for r in rounds]
    points = tuple((n, round(1.0 + (r - 1.0) * base / plain, 4)) for n, r in ratios)
    curve = CostProfile(MEASURED, 0.0, points)
    later = [(r.timings.get("propose", 0.0) - r.draft_seconds[0]) / (r.draft_calls - 1)
             for r in rounds if r.draft_calls > 1 and len(r.draft_seconds) == r.draft_calls]
    # per round: its propose seconds past the first call, per later call (the draft forward
    # and the method's own work around it: a hybrid's deferred lookups, a tree's top-k)
    per_call = [r.timings.get("propose", 0.0) / r.draft_calls for r in rounds
                if r.draft_calls]
    c_draft = statistics.median(later or per_call) / plain if later or per_call else 0.0
    rest = [sum(r.timings.values()) - curve.c_verify(n) * plain - r.draft_calls * c_draft * plain
            for r, n in zip(rounds, nodes)]  # per round: its time less the curve's and calls'
    c_round = max(statistics.median(rest), 0.0) / plain if rest else 0.0
    return CostProfile(MEASURED, round(c_draft, 4), points, source, round(c_round, 4))


def catch_cost(rounds: list, prompt_tokens: int, plain_s: float) -> float:
    """c_catch: one committed token a drafter had not cached, past a round's usual one, in
    plain rounds. The calibration decode's first round drafts (its switch is off), so its
    first draft call reads the whole prompt (a drafter with a cache of its own catches up at
    its start); its seconds past a later round's first call (the median: one or two new
    tokens), per prompt token past the first, over P. 0 where the first round made no call
    or the prompt length is unknown. A short prompt prices a token high (the call's own
    overhead spread over fewer tokens): the switch then holds rather than drafts."""
    if not rounds or not rounds[0].draft_seconds or prompt_tokens < 2 or plain_s <= 0:
        return 0.0
    later = [r.draft_seconds[0] for r in rounds[1:] if r.draft_seconds]
    usual = statistics.median(later) if later else 0.0
    extra = max(rounds[0].draft_seconds[0] - usual, 0.0)
    return round(extra / (prompt_tokens - 1) / plain_s, 4)


ACCEPT_DEPTH = 16  # depths whose acceptance a calibration records


def calibrated_accept(rounds: list) -> tuple[float, ...]:
    """a_d, d = 1..ACCEPT_DEPTH, as the switch's posterior would hold them after the
    calibration decode's rounds (its prior Beta(1, 1), no fading): a depth it never reached
    stays at 0.5. () where no round drafted."""
    if not any(r.drafted for r in rounds):
        return ()
    posterior = DepthPosterior(ACCEPT_DEPTH, discount=1.0)
    for r in rounds:
        posterior.observe(r.drafted, r.accepted)
    return tuple(round(m, 4) for m in posterior.means())


def _nodes(r) -> float:
    """Drafted nodes per row of a round (the nodes the drafter proposed over its width)."""
    width = max(len(r.beams_before), 1)
    return sum(1 for n in r.nodes if n.status not in NOT_DRAFTED) / width
