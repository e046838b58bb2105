"""Stored cost profiles the tests plan with (registered by name, engine.run.profile)."""

from __future__ import annotations

from engine.control.cost import CostProfile
from engine.run import profile

# drafting costs about what it can gain: the switch takes plain steps and drafted rounds
MIXED = CostProfile("test-mixed", 0.15, ((0, 1.0), (2, 1.2), (4, 1.4), (8, 1.8), (16, 2.6)),
                    "tests: a cost where both plain and drafted rounds win at times")
profile.register(MIXED)

# a first draft pays at the prior's acceptance 0.5 but not after a rejection: the mean plan
# then takes plain steps until the posterior fades back (about 7 rounds)
EDGE = CostProfile("test-edge", 0.1, ((0, 1.0), (2, 1.2), (4, 1.3), (8, 1.6), (16, 2.2)),
                   "tests: drafting pays only while the acceptance looks good")
profile.register(EDGE)

# drafting and verifying cost nothing: a dynamic tree keeps every node up to its cap
FREE = CostProfile("test-free", 0.0, ((0, 1.0), (64, 1.0)),
                   "tests: every drafted node pays")
profile.register(FREE)

# drafting loses even at the prior's acceptance 0.5 (a chain, a 2x2 tree or 4 beam nodes a
# row), yet a depth-1 acceptance of 0.75 would pay: only the mean plan's probes draft
DEAR = CostProfile("test-dear", 0.1, ((0, 1.0), (1, 1.45), (2, 1.6), (4, 1.64), (16, 4.0)),
                   "tests: no depth pays at the prior")
profile.register(DEAR)

# drafting loses even at acceptance 1 (depth 1: 2 tokens for 2.25 plain steps, deeper worse):
# the switch plans plain for good and the run starts no drafter
HOPELESS = CostProfile("test-hopeless", 0.3, ((0, 1.0), (1, 1.95), (16, 16.95)),
                       "tests: no depth pays even at acceptance 1")
profile.register(HOPELESS)

# no depth pays at the prior's 0.5 and depth 1 costs more than a probe may lose (1.9 plain
# steps), yet a deep chain would pay at acceptance 1: the mean plan rests from its first round,
# and a run where every context does so starts no drafter
RESTING = CostProfile("test-resting", 0.3, ((0, 1.0), (1, 1.6), (4, 2.2), (8, 3.0)),
                      "tests: plain at the prior, no probe, not hopeless")
profile.register(RESTING)

# a beam method's depth-1 round of 4 nodes a row: 1.9 plain steps, which acceptance 1 repays
# (2 tokens) and the prior's 0.5 does not, with no probe (over 1.75): it rests from its first plan
RESTING_BEAMS = CostProfile("test-resting-beams", 0.1, ((0, 1.0), (4, 1.8), (16, 4.0)),
                            "tests: a beam round plain at the prior, no probe, not hopeless")
profile.register(RESTING_BEAMS)

# the model's draft calls lose even at acceptance 1 (a call costs 1.5 plain steps, more than
# the token it may add), a lookup's cost almost nothing: only the lookup's rounds can draft
LOOKUP_ONLY = CostProfile("test-lookup-only", 1.5, MIXED.verify,
                          "tests: only a lookup's draft calls can pay", c_lookup=0.01)
profile.register(LOOKUP_ONLY)

# EDGE, and every committed token a drafter has not read costs 0.2 plain steps to catch up:
# a 20-token prompt (3.8 steps) is repaid at the prior's gain 1.25 by 19 remaining tokens
CATCHING = CostProfile("test-catching", EDGE.c_draft, EDGE.verify,
                       "tests: a drafter's start costs what a short run cannot repay",
                       c_catch=0.2)
profile.register(CATCHING)
