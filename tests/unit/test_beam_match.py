"""engine.beams.match on a hand-built step: K = 2 target beams, N = 3 drafted nodes, V = 4."""

from __future__ import annotations

import torch

from engine.beams.match import layer_reason, match_step, strict_reason
from engine.contract.trace import BeamStep, DraftMatch, TargetBeam

ROOTS = [(0, -1), (1, -1)]  # two rows, step 1: the parents are the rows' roots
JOINT = torch.tensor([[-1.0, -2.0, -0.5, -3.0],
                      [-1.5, -4.0, -2.5, -0.75]])  # (B=2, V=4) cumulative target log-probs
TOP = [(0, 2), (1, 3)]  # the target's top-2: row 0 token 2 (-0.5), row 1 token 3 (-0.75)
TEXT = {2: " foo", 3: " bar", 0: " a", 1: " b"}


def text(parent, token):
    return f"r{parent[0]}" + TEXT[token]


def step(drafted, **kw) -> BeamStep:
    return match_step(1, "drafted", ROOTS, JOINT, TOP, drafted, text, **kw)


def test_drafted_nodes_get_their_target_rank_or_not_in_top_k_with_the_target_score():
    s = step([((0, 0), (0, -1), 2), ((0, 1), (0, -1), 0), ((1, 0), (1, -1), 1)])
    assert s.drafted == (DraftMatch(0, 0, 1, -0.5), DraftMatch(0, 1, 0, -1.0),
                         DraftMatch(1, 0, 0, -4.0))


def test_target_beams_record_rank_path_score_and_the_drafted_node_or_minus_one():
    s = step([((0, 0), (0, -1), 2), ((0, 1), (0, -1), 0), ((1, 0), (1, -1), 1)])
    assert s.target_beams == (TargetBeam(1, 0, -1, 2, "r0 foo", -0.5, 0),
                              TargetBeam(2, 1, -1, 3, "r1 bar", -0.75, -1))


def test_strict_reason_names_the_first_target_beam_that_was_not_drafted():
    s = step([((0, 0), (0, -1), 2), ((0, 1), (0, -1), 0), ((1, 0), (1, -1), 1)])
    assert strict_reason(s) == "target beam #2 'r1 bar' (score -0.75) was not drafted"


def test_strict_reason_counts_the_other_missing_beams():
    s = step([((0, 0), (0, -1), 0), ((0, 1), (0, -1), 1), ((1, 0), (1, -1), 0)])
    assert [b.node for b in s.target_beams] == [-1, -1]
    assert strict_reason(s) == ("target beam #1 'r0 foo' (score -0.50) was not drafted "
                                "(and 1 more)")


def test_every_target_beam_drafted_passes_the_step():
    s = step([((0, 0), (0, -1), 2), ((1, 0), (1, -1), 3), ((1, 1), (1, -1), 0)])
    assert [b.node for b in s.target_beams] == [0, 0]
    assert [m.rank for m in s.drafted] == [1, 2, 0]
    assert strict_reason(s) == "all 2 target beams were drafted"
    assert strict_reason(s, done=True) == "all 2 target beams were drafted; beam search finished"


def test_a_drafted_node_under_a_parent_the_target_dropped_has_no_target_score():
    s = step([((0, 0), (0, -1), 2), ((0, 3), (0, 1), 3), ((1, 0), (1, -1), 3)])
    assert s.drafted[1] == DraftMatch(0, 3, 0, None)
    assert s.drafted[2] == DraftMatch(1, 0, 2, -0.75)


def test_a_parent_row_of_minus_infinity_gives_no_score():
    joint = JOINT.clone()
    joint[1] = float("-inf")  # row 1 is not a target beam (DSBD: a rejected parent)
    s = match_step(1, "drafted", ROOTS, joint, [(0, 2), (0, 0)], [((1, 0), (1, -1), 3)], text)
    assert s.drafted == (DraftMatch(1, 0, 0, None),)


def test_duplicate_drafts_share_the_first_node_and_both_carry_the_rank():
    law = torch.tensor([[0.2, 0.1, 0.4, 0.0], [0.1, 0.0, 0.0, 0.2]])  # (B, V) beam law
    s = step([((0, 0), (0, -1), 2), ((0, 1), (0, -1), 2), ((1, 0), (1, -1), 0)], law=law,
             accepted=True, reason="layer accepted")
    assert s.target_beams[0].node == 0 and s.target_beams[0].p == 0.4000000059604645
    assert [(m.node, m.rank, m.p) for m in s.drafted] == [
        (0, 1, 0.4000000059604645), (1, 1, 0.4000000059604645), (0, 0, 0.10000000149011612)]
    assert s.accepted and s.reason == "layer accepted"


def test_target_and_bonus_steps_explain_themselves():
    assert strict_reason(BeamStep(1, "target")) == ("no draft this round: the target chose "
                                                    "its beams")
    assert strict_reason(BeamStep(4, "bonus")).startswith("bonus step: every drafted step")


def test_layer_reasons_state_accepts_against_the_width_needed():
    assert layer_reason("accepted", 3, 4, 2, "width") == ("3 of 4 drafts accepted by "
                                                          "min(1, p/q): width = 2 reached")
    assert layer_reason("corrected", 1, 3, 2, "K") == ("only 1 of 3 drafts accepted (K = 2 "
                                                       "needed): the rest drawn from the residual")
    assert layer_reason("plain", 0, 0, 4, "width") == ("no draft this round: 4 beams drawn "
                                                       "from the target's beam law")
    assert layer_reason("bonus", 0, 0, 4, "width") == ("bonus layer: every drafted layer "
                                                       "passed; 4 beams drawn from the target's "
                                                       "beam law")


def test_the_draft_gate_reads_the_least_top_q_of_the_live_beams_only():
    from engine.methods.beam_forest import confidence_gate

    q = torch.tensor([[0.7, 0.2, 0.1],   # live, sure
                      [0.4, 0.3, 0.3],   # live, least sure of the live rows
                      [0.34, 0.33, 0.33]])  # finished / placeholder: not read
    live = torch.tensor([True, True, False])
    info = confidence_gate(0.4, q.log(), live)
    assert info == {"threshold": 0.4, "confidence": 0.4, "drafted": True}
    assert not confidence_gate(0.41, q.log(), live)["drafted"]
    assert confidence_gate(0.3, q.log(), torch.tensor([False, False, True]))["confidence"] == 0.34
    none = confidence_gate(0.1, q.log(), torch.tensor([False, False, False]))
    assert none == {"threshold": 0.1, "confidence": 0.0, "drafted": False}
