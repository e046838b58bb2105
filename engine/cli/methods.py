"""methods: list every registered method with its parameters: each one's default and, where
the model pair (--target / --draft, read as specs: no model loads) has a tuned value, that
value, which runs on the pair start from."""

from __future__ import annotations

import argparse
import json
from typing import Any

from engine.cli.flags import TARGET_HELP


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true")
    p.add_argument("--target", default=None,
                   help=f"the pair whose tuned values to show: {TARGET_HELP}")
    p.add_argument("--draft", default=None,
                   help="its drafter spec (default: the target's default drafter)")


def run(args: argparse.Namespace) -> int:
    from engine.methods import METHODS
    from engine.run.specs import default_draft, pair_key
    from engine.run.tuned import tuned_settings

    draft = default_draft(args.target) if args.draft is None else args.draft
    pair_key(args.target, draft)  # a bad spec is one error line
    tuned = tuned_settings(args.target, draft)
    if args.json:
        print(json.dumps([_describe(s, tuned.get(s.name, {})) for s in METHODS.values()],
                         indent=1))
        return 0
    print(f"pair: target {args.target!r}, draft {draft or 'early-exit'!r}; "
          + ("'tuned' = its measured best value, which runs start from" if tuned else
             "no tuned values (runs start from the method defaults)"))
    for spec in METHODS.values():
        print(f"{spec.name}  [{spec.family}]  {spec.summary}")
        print(f"    exactness: {spec.exactness}")
        mine = tuned.get(spec.name, {})
        for p in spec.all_params:
            extra = f" choices={list(p.choices)}" if p.choices else ""
            value = f", tuned {mine[p.name]!r}" if p.name in mine else ""
            print(f"    {p.flag} ({p.type.__name__}, default {p.default!r}{value}){extra}: "
                  f"{p.help}")
    return 0


def _describe(spec, tuned: dict[str, Any]) -> dict[str, Any]:
    """The method's description, each parameter with its tuned value (None: not tuned)."""
    out = spec.describe()
    for row in out["params"]:
        row["tuned"] = tuned.get(row["name"])
    return out
