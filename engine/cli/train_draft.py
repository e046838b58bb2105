"""train-draft: train the EESD early-exit drafter and its Cali-TS predictor.

Placeholder until the training package provides this module: it delegates to engine.train.
"""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    from engine import train

    train.add_arguments(p)


def run(args: argparse.Namespace) -> int:
    from engine import train

    return train.run(args)
