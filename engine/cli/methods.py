"""methods: list every registered method with its parameters."""

from __future__ import annotations

import argparse
import json


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true")


def run(args: argparse.Namespace) -> int:
    from engine.methods import METHODS

    if args.json:
        print(json.dumps([s.describe() for s in METHODS.values()], indent=1))
        return 0
    for spec in METHODS.values():
        print(f"{spec.name}  [{spec.family}]  {spec.summary}")
        print(f"    exactness: {spec.exactness}")
        for p in spec.all_params:
            extra = f" choices={list(p.choices)}" if p.choices else ""
            print(f"    {p.flag} ({p.type.__name__}, default {p.default!r}){extra}: {p.help}")
    return 0
