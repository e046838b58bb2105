"""Stored cost profiles the tests plan with (registered by name, engine.core.profile)."""

from __future__ import annotations

from engine.control.cost import CostProfile
from engine.core import profile

# drafting costs about what it can gain: the switch takes plain steps and drafted rounds
MIXED = CostProfile("test-mixed", 0.15, ((0, 1.0), (2, 1.2), (4, 1.4), (8, 1.8), (16, 2.6)),
                    "tests: a cost where both plain and drafted rounds win at times")
profile.register(MIXED)
