"""The measured best method settings of a model pair: the one reader of assets/presets.json.

Each row of the presets file names a pair (target and draft specs) and, optionally, its
``params``: method -> the parameter values measured fastest on that pair (README, "Measured
numbers"). ``load_pair`` puts them on the ``ModelPair``, runs start from them (explicit
parameters win), the CLI's ``methods`` lists them and the app's widgets open on them. A pair
matches a row by its parsed specs (``engine.run.specs.pair_key``), not by spelling.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

from engine.core.errors import ConfigError
from engine.core.paths import ASSETS
from engine.run.specs import EMBEDDED, pair_key

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
        target: a target spec string ('' = the embedded model).
        draft: a draft spec string; None / '' = the target's early exit.
    """
    try:
        key = pair_key((target or "").strip() or EMBEDDED, (draft or "").strip())
    except (ConfigError, OSError, RuntimeError, ValueError):  # e.g. '~nobody/x', a long name
        return {}
    for row in preset_rows():
        if pair_key(row["target"], row.get("draft", "")) == key:
            return {m: _canonical(m, v) for m, v in row.get("params", {}).items()}
    return {}


def _canonical(method: str, values: Mapping[str, Any]) -> dict[str, Any]:
    """A method's tuned values in canonical spelling (unchanged for an unknown method)."""
    from engine.core.config import normalised
    from engine.methods import METHODS

    spec = METHODS.get(method)
    return normalised(spec.params, values) if spec is not None else dict(values)
