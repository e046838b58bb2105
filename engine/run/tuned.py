"""The measured best method settings of a model pair: the one reader of assets/presets.json
and of the tuner's stored results.

Each row of the presets file names a pair (target and draft specs) and, optionally, its
``params``: method -> the parameter values measured fastest on that pair (README, "Measured
numbers"). The tuner (``python -m engine tune``, engine.tune) stores a pair's winners in the
same format, one file per pair in ``tuned_dir()`` ($SPECVIZ_TUNED, else
$SPECVIZ_CACHE/tuned); a stored file's methods win over the preset row's. ``load_pair`` puts
the result on the ``ModelPair``, runs start from them (explicit parameters win), the CLI's
``methods`` lists them and the app's widgets open on them. A pair matches a row or a file by
its parsed specs (``engine.run.specs.pair_key``), not by spelling.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Mapping

from engine.core.errors import ConfigError
from engine.core.paths import ASSETS, cache_root
from engine.run.specs import DEFAULT_TARGET, pair_key

PRESETS_FILE = ASSETS / "presets.json"

Tuned = Mapping[str, Mapping[str, Any]]  # method -> parameter name -> value


def preset_rows() -> tuple[dict[str, Any], ...]:
    """Every row of the presets file, in file order."""
    return tuple(json.loads(PRESETS_FILE.read_text()))


def tuned_settings(target: str, draft: str | None = "") -> dict[str, dict[str, Any]]:
    """method -> the parameters measured best on the pair (target, draft): the ``params`` of
    the first preset row whose parsed target and draft are the pair's; {} for a pair no row
    names, or a spec that does not parse (loading the pair says why). Each method's values
    are as runs read them (``engine.core.config.normalised``: e.g. the deprecated
    ``controller=cost`` as ``switch=cost`` with ``controller=fixed``).

    Args:
        target: a target spec string ('' = DEFAULT_TARGET, the CPU default).
        draft: a draft spec string; None / '' = the target's early exit.
    """
    try:
        key = pair_key((target or "").strip() or DEFAULT_TARGET, (draft or "").strip())
    except (ConfigError, OSError, RuntimeError, ValueError):  # e.g. '~nobody/x', a long name
        return {}
    out: dict[str, dict[str, Any]] = {}
    for row in preset_rows():
        if pair_key(row["target"], row.get("draft", "")) == key:
            out = {m: _canonical(m, v) for m, v in row.get("params", {}).items()}
            break
    stored = _stored(key)
    out.update({m: _canonical(m, v) for m, v in stored.items()})
    return out


def tuned_dir() -> Path:
    """Where the tuner stores each pair's settings: $SPECVIZ_TUNED, else
    $SPECVIZ_CACHE/tuned."""
    env = os.environ.get("SPECVIZ_TUNED")
    return Path(env) if env else cache_root() / "tuned"


def tuned_path(key: tuple) -> Path:
    """The stored file of a pair (its ``pair_key``)."""
    digest = hashlib.sha256(json.dumps(key, default=str).encode()).hexdigest()[:16]
    return tuned_dir() / f"{digest}.json"


def save_tuned(target: str, draft: str, params: Mapping[str, Mapping[str, Any]],
               about: Mapping[str, Any] | None = None, path: str | Path | None = None) -> Path:
    """Store a pair's tuned settings (a preset row's format: target, draft, params; ``about``
    says how they were found) at ``path``, else in ``tuned_dir()`` where runs of the pair
    read them; the path written."""
    key = pair_key((target or "").strip() or DEFAULT_TARGET, (draft or "").strip())
    out = Path(path) if path else tuned_path(key)
    out.parent.mkdir(parents=True, exist_ok=True)
    row = {"target": target, "draft": draft, "params": {m: dict(v) for m, v in params.items()},
           "tuned": dict(about or {})}
    out.write_text(json.dumps(row, indent=1, default=str))
    return out


def _stored(key: tuple) -> dict[str, Any]:
    """The params of the pair's stored file ({} when none, or one that is not for the pair
    or does not parse: a stored file never stops a run)."""
    path = tuned_path(key)
    try:
        row = json.loads(path.read_text())
        if pair_key(row["target"], row.get("draft", "")) != key:
            return {}
        params = row.get("params", {})
        return params if isinstance(params, dict) else {}
    except (OSError, ValueError, KeyError, TypeError, ConfigError):
        return {}


def _canonical(method: str, values: Mapping[str, Any]) -> dict[str, Any]:
    """A method's tuned values in canonical spelling (unchanged for an unknown method)."""
    from engine.core.config import normalised
    from engine.methods import METHODS

    spec = METHODS.get(method)
    return normalised(spec.params, values) if spec is not None else dict(values)
