"""Measured cost profiles kept on disk, one file per machine class, so that every process on
the same kind of machine plans with the same costs.

A measured profile (engine.run.profile) is a few hundred timed forwards and two calibration
decodes: seconds of the first Run of a method, and noisy on a shared machine (one process
priced ``mcsd``'s 2x2 tree out where another drafted it at tau 1.33: docs/benchmarks.md). Here
each measurement of a pair loaded from specs is appended to its entry, up to KEEP of them; a
process plans with the elementwise median of the entry's measurements, measuring the missing
ones at once where fewer than KEEP are stored (engine.run.profile.measured: a first process
plans with a median too), and once KEEP are stored it measures nothing more. Two processes
on one machine then make the same decisions for a seed, the first included, and a restarted
app's first Runs skip the calibration.

An entry's key is the pair's spec identity (engine.run.specs.pair_key) and model sizes, its
device and dtype, the target's and the drafter's KV paths (dynamic, compiled, ...), torch's
thread count, the method, its width and its drafting settings. A file is named by the
machine class (engine.core.machine: the CPU's identity and vector extension; a GPU's name)
and the engine's code version: a changed engine, torch or transformers starts a new file, as
a changed kernel changes every cost. Kept measurements are not
refreshed: delete the folder to measure afresh (e.g. after they were taken on a loaded
machine).

``SPECVIZ_PROFILES``: the folder ($SPECVIZ_CACHE/cost-profiles by default), or ``off``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

import torch

from engine.control.cost import CostProfile
from engine.core.machine import code_version, machine
from engine.core.paths import cache_root
from engine.execution.placement import is_placed

try:
    import fcntl
except ImportError:  # not POSIX: no lock between processes (a rare lost entry at worst)
    fcntl = None

LOG = logging.getLogger(__name__)
KEEP = 3  # measurements an entry keeps; with KEEP stored a process measures no more


def store_dir() -> Path | None:
    """The store's folder: $SPECVIZ_PROFILES, else $SPECVIZ_CACHE/cost-profiles; None when
    $SPECVIZ_PROFILES is 'off' (or '0')."""
    env = os.environ.get("SPECVIZ_PROFILES", "").strip()
    if env.lower() in ("off", "0"):
        return None
    return Path(env) if env else cache_root() / "cost-profiles"


def entry_key(pair, kv: str, draft_kv: str, method: str, width: int,
              params: dict[str, Any]) -> str | None:
    """The entry of a measurement: the pair's spec identity, the sizes of its models (a
    folder retrained in place), device, dtype, the target's and the drafter's KV paths,
    torch's threads, the method, width and settings. None for a pair built from model
    objects (no spec names its weights), a placed one (its weights move at every forward)
    or with the store off."""
    if pair.key is None or store_dir() is None or is_placed(pair.target):
        return None
    dtype = next(pair.target.parameters()).dtype
    sizes = [sum(p.numel() for p in m.parameters()) if m is not None else 0
             for m in (pair.target, pair.drafter.model)]
    settings = sorted((k, repr(v)) for k, v in params.items())
    return json.dumps([repr(pair.key), sizes, str(pair.device), str(dtype), kv, draft_kv,
                       torch.get_num_threads(), method, width, settings])


def _path(device: str) -> Path:
    """One file per machine class and code version (two engines sharing a cache keep
    their own entries)."""
    name = hashlib.sha256(f"{machine(device)} {code_version()}".encode()).hexdigest()[:16]
    return store_dir() / f"{name}.json"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """The file's lock (other processes of the machine may measure at the same time)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "a") as lock:
        if fcntl is not None:
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            if fcntl is not None:
                fcntl.flock(lock, fcntl.LOCK_UN)


def _read(path: Path, device: str) -> dict[str, Any]:
    """The file's content for this machine and code version, else an empty store."""
    empty = {"machine": machine(device), "code": code_version(), "entries": {}}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return empty
    ok = isinstance(data, dict) and data.get("code") == code_version() and \
        data.get("machine") == machine(device) and isinstance(data.get("entries"), dict)
    return data if ok else empty


def _rows(data: dict[str, Any], key: str) -> list[tuple[dict[str, Any], CostProfile]]:
    """An entry's readable rows (a damaged one is dropped, and overwritten by the next add)."""
    out = []
    rows = data["entries"].get(key, [])
    for row in rows if isinstance(rows, list) else []:
        try:
            out.append((row, CostProfile.from_json(row["profile"])))
        except (KeyError, TypeError, ValueError):
            continue
    return out


def load(key: str, device: str = "cpu") -> list[CostProfile]:
    """The measurements stored for an entry, oldest first ([] where the store cannot be
    read: one log line, the process measures its own)."""
    path = _path(device)
    if not path.is_file():
        return []  # nothing kept yet (and no folder or lock made for a read)
    try:
        with _locked(path):
            return [p for _, p in _rows(_read(path, device), key)]
    except OSError as e:
        LOG.warning("cost profiles not read from %s: %s", path.parent, e)
        return []


def add(key: str, profile: CostProfile, device: str = "cpu") -> list[CostProfile]:
    """Append a measurement to its entry (the newest KEEP stay); the entry's measurements
    ([profile] alone where the store cannot be written: one log line)."""
    path = _path(device)
    try:
        with _locked(path):
            data = _read(path, device)
            kept = _rows(data, key) + [({"profile": profile.to_json(),
                                         "at": time.strftime("%Y-%m-%dT%H:%M:%S")}, profile)]
            kept = kept[-KEEP:]
            data["entries"][key] = [row for row, _ in kept]
            fd, tmp = tempfile.mkstemp(suffix=".tmp", dir=path.parent)
            try:
                with os.fdopen(fd, "w") as f:
                    json.dump(data, f, indent=1)
                os.chmod(tmp, 0o644)  # a cache shared by the machine's users
                os.replace(tmp, path)
            finally:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
            return [p for _, p in kept]
    except OSError as e:
        LOG.warning("cost profile not stored in %s: %s", path.parent, e)
        return [profile]


def median(profiles: list[CostProfile]) -> CostProfile:
    """The elementwise median of measurements of one entry: each c_verify(n), c_draft,
    c_round, c_catch, c_lookup and calibrated acceptance the median of theirs, over the
    measurements at the newest one's node counts. Every input's c_verify is non-decreasing
    in n, so the median's is too (an order statistic of non-decreasing sequences)."""
    nodes = [n for n, _ in profiles[-1].verify]
    profiles = [p for p in profiles if [n for n, _ in p.verify] == nodes]
    if len(profiles) == 1:
        return profiles[0]
    first = profiles[0]
    points = tuple((n, round(statistics.median(p.verify[i][1] for p in profiles), 4))
                   for i, (n, _) in enumerate(first.verify))
    return CostProfile(
        first.name, round(statistics.median(p.c_draft for p in profiles), 4), points,
        f"{first.source}; median of {len(profiles)} measurements on this machine class "
        f"(engine.run.profile_store)",
        round(statistics.median(p.c_round for p in profiles), 4),
        round(statistics.median(p.c_catch for p in profiles), 4),
        _median_accept([p.accept for p in profiles]), _median_lookup(profiles))


def _median_lookup(profiles: list[CostProfile]) -> float | None:
    """The median c_lookup of the measurements that priced a lookup (None: none did)."""
    seen = [p.c_lookup for p in profiles if p.c_lookup is not None]
    return round(statistics.median(seen), 4) if seen else None


def _median_accept(accepts: list[tuple[float, ...]]) -> tuple[float, ...]:
    """The elementwise median of the measurements that saw acceptances (all of one length:
    engine.run.profile.ACCEPT_DEPTH); () where none did."""
    seen = [a for a in accepts if a]
    if not seen or len({len(a) for a in seen}) > 1:
        return seen[-1] if seen else ()
    return tuple(round(statistics.median(col), 4) for col in zip(*seen))
