"""Method registry: importing this package registers every method in METHODS.

One module per method family: base.py (the Method protocol, MethodSpec, the registry),
single.py (greedy, sample), token.py (sd, mcsd, greedy_drafts), dynamic_tree.py (the rules
of mcsd's EAGLE-2 tree), eesd.py, beam_forest.py
(what the beam methods share), beam.py (beam, beam_sample, atspeed_strict), dsbd.py (dsbd,
atspeed_relaxed) and hf.py (transformers' own modes)."""

from __future__ import annotations

from engine.methods import (  # noqa: F401  (registers the methods)
    beam,
    dsbd,
    eesd,
    hf,
    single,
    token,
)
from engine.methods.base import METHODS, MethodSpec

__all__ = ["METHODS", "MethodSpec"]
