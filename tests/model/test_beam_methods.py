"""Beam-level methods through the round loop, on tiny random models (CPU).

beam and atspeed_strict must equal generate(num_beams=K) (tokens identical, scores within 1e-4);
beam_sample follows beam_sample_step draw for draw; dsbd with a constant width has exactly the
law of beam sampling (exact enumeration through the whole engine); atspeed_relaxed is approximate
and its distance to beam sampling is measured and printed.
"""

from __future__ import annotations

import copy
import json
from collections import Counter, defaultdict
from functools import lru_cache

import pytest
import torch

from engine.beams.search import BeamConfig
from engine.contract.trace import STATUSES, RunTrace
from engine.control import cost
from engine.core.sampling import Warp, make_generator
from engine.run.api import generate, make_decoder
from engine.run.models import load_pair, model_from_config, tiny_config
from engine.verify.enumerate import enumerate_outcomes
from tests.oracles import run_beam_sampling
from tests.profiles import CATCHING, DEAR, EDGE, HOPELESS, MIXED, RESTING_BEAMS

VOCAB = 64
TOL = 1e-4


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models run fastest on one thread (thread wake-ups dominate on a busy machine)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


# ------------------------------------------------------------------ fixtures


@lru_cache(maxsize=None)
def tiny(seed: int, vocab: int = VOCAB, layers: int = 2, init: float = 0.3):
    cfg = tiny_config("llama", vocab_size=vocab, layers=layers, initializer_range=init)
    return model_from_config(cfg, seed=seed)


@lru_cache(maxsize=None)
def perturbed(seed: int, eps: float, vocab: int = VOCAB, layers: int = 2, init: float = 0.3):
    """The target with small weight noise: a draft with partial agreement."""
    model = copy.deepcopy(tiny(seed, vocab, layers, init))
    g = torch.Generator().manual_seed(99)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(eps * torch.randn(p.shape, generator=g))
    return model


def pair_of(target, draft):
    return load_pair(target=target, draft=draft)


def set_generation(model, eos=None, early_stopping=False, length_penalty=1.0) -> None:
    gc = model.generation_config
    gc.eos_token_id, gc.pad_token_id = eos, None
    gc.early_stopping, gc.length_penalty = early_stopping, length_penalty


def prompt(seed: int, n: int = 5) -> list[int]:
    g = torch.Generator().manual_seed(1000 + seed)
    return torch.randint(3, VOCAB, (n,), generator=g).tolist()


@torch.no_grad()
def frequent_token(model, ids: list[int]) -> int:
    """Most frequent token of a 12-token greedy run: an EOS the model emits often."""
    set_generation(model)
    out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=12)[0, len(ids):]
    return Counter(out.tolist()).most_common(1)[0][0]


@torch.no_grad()
def hf_beams(model, ids: list[int], k: int, n: int):
    out = model.generate(torch.tensor([ids]), num_beams=k, num_return_sequences=k,
                         do_sample=False, max_new_tokens=n, output_scores=True,
                         return_dict_in_generate=True)
    return out.sequences[:, len(ids):].tolist(), out.sequences_scores.tolist()


def assert_same_beams(trace: RunTrace, hf, eos) -> None:
    rows, scores = hf
    assert len(trace.beams) == len(rows)
    fill = eos if eos is not None else -1
    for beam, row, score in zip(trace.beams, rows, scores):
        n = len(beam.token_ids)
        assert row[:n] == list(beam.token_ids), (trace.method, beam.token_ids, row)
        assert all(t == fill for t in row[n:])
        assert abs(beam.score - score) < TOL
        assert beam.finished


# ------------------------------------------------------------------ beam / strict parity


@pytest.mark.parametrize("k", [2, 4])
@pytest.mark.parametrize("draft", ["same", "perturbed", "ngram", "feature", "ngram+feature"])
def test_beam_and_strict_match_generate_without_eos(k, draft):
    target = tiny(0)
    named = ("ngram", "feature", "ngram+feature")
    pair = pair_of(target, target if draft == "same" else draft if draft in named
                   else perturbed(0, 0.05))
    set_generation(target)
    for s in range(3):
        ids, n = prompt(s), 10
        hf = hf_beams(target, ids, k, n)
        beam = generate(pair, ids, "beam", beams=k, max_new_tokens=n)
        strict = generate(pair, ids, "atspeed_strict", beams=k, draft_beams=2 * k, gamma=3,
                          max_new_tokens=n)
        assert_same_beams(beam, hf, None)
        assert_same_beams(strict, hf, None)
        assert all(len(b.token_ids) == n for b in strict.beams)
        assert beam.stats.target_calls == n
        if draft == "same":  # the target drafting for itself: most steps accepted (children
            # of the draft's N - K extra beams can still push a target top-K child out)
            assert strict.stats.target_calls < beam.stats.target_calls
            assert strict.stats.acceptance_rate > 0.5


def test_strict_drafts_with_a_feature_drafter_first_after_plain_rounds(monkeypatch):
    """The switch's prior plans plain (DEAR) and the opening probe is off: the feature
    drafter's first draft is a probe after 16 plain beam steps; it knows the target's states
    of those steps and the beams stay generate()'s."""
    monkeypatch.setattr(cost, "OPENING_PROBE", False)
    target = tiny(0)
    pair = pair_of(target, "feature")
    set_generation(target)
    ids, n = prompt(0), 20
    strict = generate(pair, ids, "atspeed_strict", beams=2, draft_beams=4, gamma=1,
                      switch="cost", costs=DEAR.name, max_new_tokens=n)
    assert_same_beams(strict, hf_beams(target, ids, 2, n), None)
    assert [r.index for r in strict.rounds if r.switch is not None and r.switch.probe] == [16]
    assert strict.rounds[16].drafted == 1


@pytest.mark.parametrize("prof", [HOPELESS, RESTING_BEAMS], ids=lambda p: p.name)
def test_strict_under_a_switch_plain_for_good_runs_beam_search_with_no_drafter(prof,
                                                                               monkeypatch):
    """HOPELESS: no depth pays even at acceptance 1 (each round 'never'); RESTING_BEAMS: a
    depth-1 round pays at acceptance 1 but not at the prior and no probe qualifies (one rest
    from the first round). Either way atspeed_strict never starts its feature drafter and its
    rounds are beam search's, each recorded as plain for good."""
    target = tiny(0)
    pair = pair_of(target, "feature")
    set_generation(target)
    started = []
    runner = pair.drafter.runner
    monkeypatch.setattr(pair.drafter, "runner", lambda: started.append(1) or runner())
    ids, n = prompt(0), 12
    strict = generate(pair, ids, "atspeed_strict", beams=2, draft_beams=4, gamma=1,
                      switch="cost", costs=prof.name, max_new_tokens=n)
    assert_same_beams(strict, hf_beams(target, ids, 2, n), None)
    assert started == [] and all(r.drafted == 0 for r in strict.rounds)
    plans = [r.switch for r in strict.rounds[:-1]]
    if prof is HOPELESS:
        assert all(p.never for p in plans)
    else:
        assert all(p.rest and not p.never and p is plans[0] for p in plans)
    assert not any(r.beam_steps for r in strict.rounds[:-1])  # beam search's rounds: no
    # target top-K against drafts to record


def test_strict_whose_drafter_start_a_short_run_cannot_repay_rests_as_beam_search():
    """CATCHING: the draft model's read of a 20-token prompt costs 3.8 plain steps, which 12
    new tokens cannot repay: atspeed_strict rests from its first round, starts no drafter and
    its rounds are beam search's (no target top-K against drafts recorded)."""
    target = tiny(0)
    pair = pair_of(target, tiny(1))
    set_generation(target)
    ids, n = prompt(0, 20), 12
    strict = generate(pair, ids, "atspeed_strict", beams=2, draft_beams=4, gamma=2,
                      switch="cost", costs=CATCHING.name, max_new_tokens=n)
    assert_same_beams(strict, hf_beams(target, ids, 2, n), None)
    plans = [r.switch for r in strict.rounds if r.switch is not None]
    assert plans and all(p.held and p.rest for p in plans)
    assert all(r.drafted == 0 for r in strict.rounds)
    assert not any(r.beam_steps for r in strict.rounds[:-1])  # the last round: no room to
    # draft, so no plan, and a beam step's record as ever


def test_dsbd_under_a_switch_no_draft_can_pay_keeps_beam_samplings_law_with_no_records():
    """HOPELESS: every dsbd round is a plain layer planned so for good; the exact law of
    three steps is beam sampling's and no round records a draft match."""
    pair = law_pair()
    ref, _ = engine_law(pair, "beam_sample", new=3, top_k=2, beams=2)
    law, _ = engine_law(pair, "dsbd", new=3, top_k=2, draft_beams=2, min_width=2, gamma=2,
                        switch="cost", costs=HOPELESS.name)
    assert abs(sum(law.values()) - 1) < 1e-9 and gap(law, ref) < 1e-5, gap(law, ref)
    tr = generate(pair, [2, 3, 4], "dsbd", draft_beams=2, min_width=2, gamma=2, switch="cost",
                  costs=HOPELESS.name, temperature=1.0, max_new_tokens=6, seed=0)
    assert all(r.switch.never and not r.beam_steps for r in tr.rounds[:-1])


EOS_CASES = [(False, 1.0), (True, 1.0), ("never", 1.0), (False, 0.0), (True, 2.0),
             ("never", -1.0)]


@pytest.mark.parametrize("k", [2, 4])
@pytest.mark.parametrize("early_stopping, length_penalty", EOS_CASES)
def test_beam_and_strict_match_generate_with_eos(k, early_stopping, length_penalty):
    target = tiny(1)
    pair = pair_of(target, perturbed(1, 0.05))
    ended_early = 0
    for s in range(3):
        ids, n = prompt(10 + s), 10
        eos = frequent_token(target, ids)
        set_generation(target, eos, early_stopping, length_penalty)
        hf = hf_beams(target, ids, k, n)
        for method, extra in (("beam", {}), ("atspeed_strict", {"draft_beams": 2 * k})):
            tr = generate(pair, ids, method, beams=k, max_new_tokens=n, **extra)
            assert_same_beams(tr, hf, eos)
        ended_early += any(b.token_ids[-1] == eos for b in tr.beams)
    assert ended_early  # the EOS path was exercised


@lru_cache(maxsize=None)
def strict_runs(k: int, fill: bool = False):
    """atspeed_strict with a partially agreeing draft and an EOS, on several prompts."""
    target = tiny(2)
    pair = pair_of(target, perturbed(2, 0.05))
    eos = frequent_token(target, prompt(20))
    set_generation(target, eos)
    return target, eos, [(prompt(20 + s), generate(
        pair, prompt(20 + s), "atspeed_strict", beams=k, draft_beams=2 * k, gamma=3,
        fill=fill, max_new_tokens=12)) for s in range(3)]


@pytest.mark.parametrize("fill", [True, False])
def test_strict_partial_acceptance_is_still_identical_to_generate(fill):
    target, eos, runs = strict_runs(2, fill)
    set_generation(target, eos)
    partial = 0
    for ids, tr in runs:
        assert_same_beams(tr, hf_beams(target, ids, 2, 12), eos)
        partial += sum(0 < r.accepted < r.drafted for r in tr.rounds)
    assert partial  # some rounds accepted a few steps, then failed
    total = sum(tr.stats.target_calls for _, tr in runs)
    steps = sum(len(tr.rounds[-1].beams_after[0].token_ids) for _, tr in runs)
    print(f"atspeed_strict K=2 N=4 gamma=3 fill={fill}, perturbed draft: {total} target calls "
          f"for {steps} beam steps")


@lru_cache(maxsize=None)
def gated_runs(confidence: float):
    """atspeed_strict K=2 N=4 gamma=2 with the draft-confidence gate, perturbed draft, EOS."""
    target = tiny(2)
    pair = pair_of(target, perturbed(2, 0.05))
    eos = frequent_token(target, prompt(20))
    set_generation(target, eos)
    return target, eos, [(prompt(20 + s), generate(
        pair, prompt(20 + s), "atspeed_strict", beams=2, draft_beams=4, gamma=2,
        draft_confidence=confidence, max_new_tokens=12)) for s in range(3)]


def top_q(r) -> list[float]:
    """Per tree, the draft probability of its likeliest depth-1 node (the root's top q)."""
    best: dict[int, float] = {}
    for n in r.nodes:
        if n.q is not None and n.depth == 1:
            best[n.tree] = max(best.get(n.tree, 0.0), n.q)
    return list(best.values())


@pytest.mark.parametrize("confidence", [0.2, 0.35, 1.0])
def test_the_confidence_gate_keeps_strict_identical_to_generate(confidence):
    target, eos, runs = gated_runs(confidence)
    set_generation(target, eos)
    for ids, tr in runs:
        assert_same_beams(tr, hf_beams(target, ids, 2, 12), eos)


def test_the_confidence_gate_drafts_only_rounds_whose_every_beam_is_confident():
    """A drafted round's every live tree has a depth-1 node of q >= the threshold (its top
    draftable token, when the N picks reach it); some
    rounds of the ungated run are not that confident, and the gated run skips them (a plain
    beam step: no nodes, one target call for one token)."""
    skipped = drafted = 0
    for (_, free), (_, gated) in zip(gated_runs(0.0)[2], gated_runs(0.2)[2]):
        assert any(min(top_q(r)) < 0.2 for r in free.rounds if top_q(r))
        for r in gated.rounds:
            info = r.extras.gate
            assert info.threshold == 0.2
            if info.confidence is None:  # the last token: no draft step fits
                continue
            if info.drafted:
                drafted += 1
                assert min(top_q(r)) >= 0.2 and info.confidence >= 0.2
            else:
                skipped += 1
                assert info.confidence < 0.2
                assert not any(n.q is not None for n in r.nodes) and r.drafted == 0
                assert [s.kind for s in r.beam_steps] == ["target"]
    assert skipped and drafted
    never = [r for _, tr in gated_runs(1.0)[2] for r in tr.rounds[1:]]
    assert not any(r.extras.gate.drafted for r in never)  # a tiny draft is never sure


def test_filled_pad_slots_make_every_tree_as_wide_as_the_widest_at_each_depth():
    """fill: a row with fewer of the N picks drafts its next-best continuations up to the
    widest row's count (the forward is that wide anyway); without fill, N nodes a depth."""
    widened = 0
    for fill in (False, True):
        for _, tr in strict_runs(2, fill)[2]:
            for r in tr.rounds:
                for d in range(1, r.drafted + 1):
                    per_tree = Counter(n.tree for n in r.nodes if n.q is not None
                                       and n.depth == d)
                    if not fill:
                        assert sum(per_tree.values()) == 4  # N nodes per drafted depth
                    else:
                        assert sum(per_tree.values()) >= 4
                        assert len(set(per_tree.values())) == 1  # live trees: equal
                        widened += sum(per_tree.values()) > 4
    assert widened  # some depth gained nodes


def test_strict_traces_record_target_topk_hits_and_node_statuses():
    _, _, runs = strict_runs(2, False)
    for _, tr in runs:
        for r in tr.rounds:
            steps = r.extras.steps
            assert [s["depth"] for s in steps] == list(range(1, len(steps) + 1))
            assert r.accepted == sum(s["accepted"] for s in steps if s["kind"] == "drafted")
            failing = r.extras.first_failing_step
            assert failing is None or not steps[failing - 1]["accepted"]
            assert all(len(s["target_topk"]) == 2 for s in steps)
            drafted_steps = [s for s in steps if s["kind"] == "drafted"]
            assert len([t for t in r.tests]) == 2 * len(drafted_steps)
            assert {t.decision for t in r.tests} <= {"match", "mismatch"}
            assert {n.status for n in r.nodes} <= set(STATUSES)
            real = [n for n in r.nodes if n.q is not None]
            assert len(real) == r.drafted * 4  # N nodes per drafted depth
            assert all(0 <= n.tree < 2 for n in r.nodes)
            assert len(r.beams_after) == 2 and len(r.beams_before) == 2
        json.loads(tr.to_json())  # JSON-serialisable


def target_scores(model, ids: list[int]):
    """seq -> (cumulative target log-prob of seq after the prompt, (V,) next-token log-probs),
    from one plain forward of prompt + seq (independent of the engine's forest forward)."""
    memo: dict = {}

    def of(seq: tuple[int, ...]):
        if seq not in memo:
            with torch.no_grad():
                x = torch.tensor([ids + list(seq)])
                lp = torch.log_softmax(model(input_ids=x).logits[0].float(), -1)  # (L, V)
            n = len(ids)
            cum = sum(float(lp[n - 1 + i, t]) for i, t in enumerate(seq))
            memo[seq] = cum, lp[-1]
        return memo[seq]
    return of


def path_ids(r, tree: int, node: int) -> tuple[int, ...]:
    """Generated ids of the path to (tree, node): the row's beam before the round + drafts."""
    by_id = {n.id: n for n in r.nodes if n.tree == tree}
    toks = []
    while node >= 0:
        toks.append(by_id[node].token_id)
        node = by_id[node].parent
    return r.beams_before[tree].token_ids + tuple(reversed(toks))


def check_strict_matches(model, ids: list[int], r, k: int, n: int) -> int:
    """Every BeamStep of round r against the target's top-K recomputed from plain forwards;
    returns the number of drafted steps checked."""
    of, checked = target_scores(model, ids), 0
    parents = [(row, -1) for row, b in enumerate(r.beams_before) if b.score > -1e8]
    parent_of = {(n.tree, n.id): (n.tree, n.parent) for n in r.nodes}
    for s in r.beam_steps:
        cand = []  # (score, parent position, token) of every child of the target's beams
        for pos in parents:
            cum, lp = of(path_ids(r, *pos))
            cand += [(cum + float(lp[v]), pos, v) for v in range(lp.numel())]
        top = sorted(cand, key=lambda c: -c[0])[:k]
        assert [(b.tree, b.parent, b.token_id) for b in s.target_beams] == [
            (pos[0], pos[1], v) for _, pos, v in top]
        assert all(abs(b.score - sc) < TOL for b, (sc, _, _) in zip(s.target_beams, top))
        rank = {(pos, v): i + 1 for i, (_, pos, v) in enumerate(top)}
        for m in s.drafted:
            node = next(n for n in r.nodes if (n.tree, n.id) == (m.tree, m.node))
            parent = parent_of[(m.tree, m.node)]
            assert m.rank == rank.get((parent, node.token_id), 0)
            if parent in parents:
                cum, lp = of(path_ids(r, *parent))
                assert abs(m.score - (cum + float(lp[node.token_id]))) < TOL
            else:
                assert m.score is None
        drafted = [b.node >= 0 for b in s.target_beams]
        if s.accepted:
            assert all(drafted), s  # an accepted step had every target top-K beam drafted
            assert {(b.tree, b.node) for b in s.target_beams} == {
                (m.tree, m.node) for m in s.drafted if m.rank}
        if s.kind == "drafted":
            checked += 1
            drafted_here = [x for x in r.nodes if x.q is not None and x.depth == s.depth]
            assert len(s.drafted) == len(drafted_here) >= n  # every drafted node of the
            # depth: the N picks, and with fill the pad slots' next-best continuations
            assert s.accepted == all(drafted)
            if not s.accepted:
                assert "was not drafted" in s.reason
                assert s.reason.startswith(f"target beam #{drafted.index(False) + 1} ")
        else:
            assert not s.drafted and not s.accepted
        parents = [(b.tree, b.node) for b in s.target_beams]
    return checked


@pytest.mark.parametrize("fill", [True, False])
def test_strict_beam_steps_agree_with_the_target_top_k_recomputed_from_log_probs(fill):
    target = tiny(2)
    pair = pair_of(target, perturbed(2, 0.05))
    set_generation(target)
    checked = rejected = 0
    for s in range(2):
        ids = prompt(30 + s)
        tr = generate(pair, ids, "atspeed_strict", beams=2, draft_beams=3, gamma=3,
                      fill=fill, max_new_tokens=10)
        for r in tr.rounds:
            assert [s.depth for s in r.beam_steps] == list(range(1, len(r.beam_steps) + 1))
            assert r.accepted == sum(s.accepted for s in r.beam_steps)
            checked += check_strict_matches(target, ids, r, 2, 3)
            rejected += sum(s.kind == "drafted" and not s.accepted for s in r.beam_steps)
        assert RunTrace.from_json(tr.to_json()) == tr
    assert checked > 4 and rejected  # both accepted and rejected steps were checked


def test_strict_accepts_a_draft_only_with_its_whole_step():
    """A step passes iff all K target beams were drafted (AtSpeed Alg. 1): the drafted nodes a
    failed step's target beams matched are rejected with it, the step's tokens are the
    target's own (a bonus after every drafted step passed), and the committed tokens'
    origins hold exactly the round's accepted steps."""
    _, _, runs = strict_runs(2, False)
    matched_in_failed = 0
    for _, tr in runs:
        for r in tr.rounds:
            passed = {s["depth"] for s in r.extras.steps if s["kind"] == "drafted"
                      and s["accepted"]}
            assert {n.depth for n in r.nodes if n.status == "accepted"} == passed
            origins = [c.origin for c in r.committed]
            assert origins.count("accepted") == r.accepted
            if origins[-1] != "accepted":  # the step after the last passed one
                assert origins[-1] == ("bonus" if r.accepted == r.drafted > 0 else "target")
            matched_in_failed += sum(1 for s in r.extras.steps if s["kind"] == "drafted"
                                     and not s["accepted"] and any(t[2] for t in
                                                                   s["target_topk"]))
    assert matched_in_failed  # failed steps whose target beams were partly drafted


def test_beam_baseline_records_no_beam_steps():
    target = tiny(2)
    set_generation(target)
    tr = generate(pair_of(target, None), prompt(30), "beam", beams=2, max_new_tokens=3)
    assert all(r.beam_steps == () for r in tr.rounds)


def test_strict_finished_origins_colour_accepted_tokens():
    target = tiny(0)
    pair = pair_of(target, target)
    set_generation(target)
    tr = generate(pair, prompt(0), "atspeed_strict", beams=2, draft_beams=4, gamma=3,
                  max_new_tokens=8)
    assert len(tr.token_origins) == 8
    assert tr.token_origins.count("accepted") >= 4  # drafted nodes the target kept


# ------------------------------------------------------------------ beam sampling


def test_beam_sample_is_reproducible_from_the_seed():
    target = tiny(3)
    pair = pair_of(target, None)
    set_generation(target, frequent_token(target, prompt(3)))
    runs = [generate(pair, prompt(3), "beam_sample", beams=3, max_new_tokens=10, top_k=10,
                     seed=s) for s in (7, 7, 8, 9)]
    assert runs[0].beams == runs[1].beams
    assert [r.beams_after for r in runs[0].rounds] == [r.beams_after for r in runs[1].rounds]
    assert len({r.beams for r in runs}) > 1
    assert all(a.score >= b.score for a, b in zip(runs[0].beams, runs[0].beams[1:]))


@torch.no_grad()
def test_beam_sample_follows_beam_sample_step_draw_for_draw():
    target, ids, k, n = tiny(3), prompt(4), 3, 10
    pair = pair_of(target, None)
    eos = frequent_token(target, ids)
    set_generation(target, eos)
    tr = generate(pair, ids, "beam_sample", beams=k, max_new_tokens=n, top_k=10, seed=5)
    cfg = BeamConfig.from_generation_config(target.generation_config, k, n, len(ids))

    def lp(seqs):
        return torch.log_softmax(target(input_ids=seqs).logits[:, -1].float(), -1)

    hyps, _ = run_beam_sampling(lp, torch.tensor([ids]), cfg, Warp(top_k=10), make_generator(5))
    assert [b.token_ids for b in tr.beams] == [h.tokens for h in hyps]
    assert all(abs(b.score - h.score) < TOL for b, h in zip(tr.beams, hyps))


# ------------------------------------------------------------------ dsbd / relaxed traces


@lru_cache(maxsize=None)
def dsbd_run(one_cache: bool):
    target = tiny(4)
    pair = pair_of(target, perturbed(4, 0.05))
    set_generation(target, frequent_token(target, prompt(5)))
    return generate(pair, prompt(5), "dsbd", draft_beams=4, gamma=3, threshold=0.7,
                    min_width=1, one_cache=one_cache, top_k=10, max_new_tokens=16, seed=3)


def check_layer_tests(r, width: int, n_drafts: int, capped: bool) -> None:
    """Every drafted candidate of every verified layer has a complete test record."""
    for layer in r.extras.layers:
        if layer["outcome"] == "bonus":
            continue
        tests = [t for t in r.tests if t.depth == layer["depth"]]
        assert len(tests) == n_drafts and 1 <= layer["width"] <= width
        n_accept = sum(t.decision == "accept" for t in tests)
        assert n_accept == layer["accepted_count"]
        assert (layer["outcome"] == "accepted") == (n_accept >= layer["width"])
        assert n_accept <= (layer["width"] if capped else n_drafts)
        for t in tests:
            assert t.decision in ("accept", "reject", "auto_reject", "skip")
            assert (t.uniform is not None) == (t.decision in ("accept", "reject"))
            assert 0.0 <= t.ratio <= 1.0 and t.q > 0.0 and t.p >= 0.0


@pytest.mark.parametrize("one_cache", [False, True])
def test_dsbd_runs_end_to_end_with_complete_width_records(one_cache):
    tr = dsbd_run(one_cache)
    assert tr.beams and all(b.finished for b in tr.beams)
    assert all(a.score >= b.score for a, b in zip(tr.beams, tr.beams[1:]))
    outcomes = Counter()
    for r in tr.rounds:
        assert len(r.beams_after) == (1 if one_cache else 4)
        check_layer_tests(r, 4, 4, capped=True)
        for w, layer in zip(r.extras.width, [x for x in r.extras.layers if "width" in x
                                               and x["outcome"] != "bonus"]):
            assert len(w.alphas) == 4 and len(w.P) == 5 and len(w.tails) == 5
            assert abs(sum(w.P) - 1) < 1e-9 and abs(w.tails[0] - 1) < 1e-9
            assert w.chosen == layer["width"] == max(w.w_min, w.w_tilde)
            assert w.t == 0.7
        assert r.accepted == sum(x["outcome"] == "accepted" for x in r.extras.layers)
        assert {n.status for n in r.nodes} <= set(STATUSES)
        outcomes.update(x["outcome"] for x in r.extras.layers)
    assert outcomes["corrected"] and outcomes["accepted"]  # both paths were exercised
    assert RunTrace.from_json(tr.to_json()).to_json() == tr.to_json()
    print(f"dsbd one_cache={one_cache}: {tr.stats.target_calls} target calls, "
          f"{len(tr.token_ids)} tokens, layer outcomes {dict(outcomes)}")


@pytest.mark.parametrize("one_cache", [False, True])
def test_dsbd_beam_steps_rank_drafts_by_the_target_beam_law_and_give_the_layer_reason(one_cache):
    tr = dsbd_run(one_cache)
    for r in tr.rounds:
        assert len(r.beam_steps) == len(r.extras.layers)
        for s, layer in zip(r.beam_steps, r.extras.layers):
            assert s.depth == layer["depth"] and s.accepted == (layer["outcome"] == "accepted")
            assert 1 <= len(s.target_beams) <= 4  # the W_S most probable target beams
            law = [b.p for b in s.target_beams]
            assert law == sorted(law, reverse=True) and all(x > 0 for x in law)
            if layer["outcome"] == "bonus" and not any(n.q is not None for n in r.nodes):
                assert s.kind == "target" and not s.drafted  # a round that drafted nothing
                assert s.reason.startswith("no draft this round")
                continue
            if layer["outcome"] == "bonus":
                assert s.kind == "bonus" and not s.drafted and s.reason.startswith("bonus")
                continue
            assert len(s.drafted) == 4 and s.kind == "drafted"
            assert s.reason.startswith("only" if layer["outcome"] == "corrected" else
                                       f"{layer['accepted_count']} of 4 drafts accepted")
            for m in s.drafted:  # a draft in the top-K has its rank's law and score
                if m.rank:
                    b = s.target_beams[m.rank - 1]
                    assert (m.p, m.score) == (b.p, b.score)
                if m.score is None:  # a draft under a parent the target rejected
                    assert m.p in (None, 0.0) and not m.rank
    assert RunTrace.from_json(tr.to_json()) == tr


def _relaxed_run():
    """atspeed_relaxed, K = 2, N = 4, gamma 3 on a tiny target and a perturbed draft."""
    target = tiny(4)
    pair = pair_of(target, perturbed(4, 0.05))
    set_generation(target, frequent_token(target, prompt(6)))
    return generate(pair, prompt(6), "atspeed_relaxed", beams=2, draft_beams=4, gamma=3,
                    top_k=10, max_new_tokens=16, seed=1)


def test_atspeed_relaxed_beam_steps_keep_k_target_beams_and_say_how_many_passed():
    tr = _relaxed_run()
    steps = [s for r in tr.rounds for s in r.beam_steps]
    assert steps and all(len(s.target_beams) == 2 for s in steps)
    for r in tr.rounds:
        for s, layer in zip(r.beam_steps, r.extras.layers):
            assert s.accepted == (layer["outcome"] == "accepted")
            if s.kind == "drafted":
                assert len(s.drafted) == 4 and "K = 2" in s.reason
                assert s.reason.startswith(f"{layer['accepted_count']} of 4" if s.accepted
                                           else f"only {layer['accepted_count']} of 4")


def test_atspeed_relaxed_runs_end_to_end_with_complete_records():
    tr = _relaxed_run()
    assert 1 <= len(tr.beams) <= 2 and all(b.finished for b in tr.beams)
    for r in tr.rounds:
        assert len(r.beams_after) == 2
        check_layer_tests(r, 2, 4, capped=False)
        for layer in r.extras.layers:
            assert layer["width"] == 2
    json.loads(tr.to_json())
    from engine.methods import METHODS

    assert "not lossless" in METHODS["atspeed_relaxed"].exactness
    assert "not lossless" in METHODS["atspeed_relaxed"].summary


# ------------------------------------------------------------------ laws (exact enumeration)

LAW_VOCAB, LAW_TOPK = 6, 3
GATE = 0.5  # a draft-confidence threshold some states of law_pair's draft pass, some not


def law_pair():
    target = tiny(1, LAW_VOCAB, 1, 0.5)
    set_generation(target)
    return pair_of(target, perturbed(1, 0.05, LAW_VOCAB, 1, 0.5))


def engine_law(pair, method: str, key=tuple, new: int = 2, gates: Counter | None = None,
               top_k: int = LAW_TOPK, **params) -> tuple[dict, Counter]:
    """Exact law of the final beam rows (every branch of every random choice, float64);
    gates, when given, collects the weight of drafted / skipped rounds after round 0."""
    law, outcomes = defaultdict(float), Counter()

    def run(chooser):
        dec, _, _ = make_decoder(pair, [2, 3, 4], method, max_new_tokens=new, top_k=top_k,
                                 **params)
        dec.ctx.chooser = chooser
        rounds = list(dec.rounds())
        first = (rounds[0].extras.layers or ({},))[0].get("outcome")
        gated = tuple(r.extras.gate.drafted for r in rounds[1:]
                      if r.extras.gate is not None and r.extras.gate.confidence is not None)
        return key(tuple(s) for s in dec.ctx.seqs), first, gated

    for w, (seqs, first, gated) in enumerate_outcomes(run):
        law[seqs] += w
        outcomes[first] += w
        if gates is not None:
            for g in gated:
                gates[g] += w
    return dict(law), outcomes


def gap(a: dict, b: dict) -> float:
    return max(abs(a.get(x, 0.0) - b.get(x, 0.0)) for x in set(a) | set(b))


def tv(a: dict, b: dict) -> float:
    return 0.5 * sum(abs(a.get(x, 0.0) - b.get(x, 0.0)) for x in set(a) | set(b))


def test_dsbd_constant_width_output_law_equals_beam_sampling_end_to_end():
    """Theorem 3.1 through the engine: draft forest, one target forward, layer verification,
    correction / bonus layer and commit, on a 6-token model (K = W_S = 2, two steps)."""
    pair = law_pair()
    ref, _ = engine_law(pair, "beam_sample", beams=2)
    law, outcomes = engine_law(pair, "dsbd", draft_beams=2, min_width=2, gamma=1)
    assert abs(sum(law.values()) - 1) < 1e-9
    assert outcomes["accepted"] > 0.1 and outcomes["corrected"] > 0.1  # both paths weigh
    assert gap(law, ref) < 1e-5, gap(law, ref)


def test_gated_dsbd_output_law_still_equals_beam_sampling_end_to_end():
    """The draft-confidence gate reads the draft's law only: rounds it skips are plain
    beam-sampling steps, rounds it lets draft are DSBD rounds, and the law of three steps is
    beam sampling's either way (K = W_S = 2, gamma 1, top-2 warp; both kinds of round
    weigh)."""
    pair = law_pair()
    ref, _ = engine_law(pair, "beam_sample", new=3, top_k=2, beams=2)
    gates: Counter = Counter()
    law, _ = engine_law(pair, "dsbd", new=3, gates=gates, top_k=2, draft_beams=2, min_width=2,
                        gamma=1, draft_confidence=GATE)
    assert gates[True] > 0.05 and gates[False] > 0.05, gates  # both branches weigh
    assert abs(sum(law.values()) - 1) < 1e-9
    assert gap(law, ref) < 1e-5, gap(law, ref)


def test_a_round_gated_dsbd_skips_is_a_plain_layer_and_says_so():
    pair = law_pair()
    tr = generate(pair, [2, 3, 4], "dsbd", draft_beams=2, min_width=2, gamma=1,
                  draft_confidence=GATE, temperature=1.0, max_new_tokens=8, seed=3)
    kinds = {r.extras.gate.drafted: [s.kind for s in r.beam_steps] for r in tr.rounds
             if r.extras.gate.confidence is not None}
    assert kinds[False] == ["target"] and kinds[True][0] == "drafted"
    skipped = next(r for r in tr.rounds if r.extras.gate.confidence is not None
                   and not r.extras.gate.drafted)
    assert skipped.drafted == 0 and not any(n.q is not None for n in skipped.nodes)
    assert skipped.beam_steps[0].reason.startswith("no draft this round")


def test_atspeed_relaxed_distance_from_beam_sampling_is_measured():
    pair = law_pair()
    ref, _ = engine_law(pair, "beam_sample", key=lambda rows: tuple(sorted(rows)), beams=2)
    law, _ = engine_law(pair, "atspeed_relaxed", key=lambda rows: tuple(sorted(rows)),
                        beams=2, draft_beams=3, gamma=1)
    exact_tv, distinct_tv = tv(law, ref), tv(law, distinct_beam_sampling_law(pair))
    trials, mc = 300, Counter()
    for seed in range(trials):
        dec, _, _ = make_decoder(pair, [2, 3, 4], "atspeed_relaxed", max_new_tokens=2,
                                 top_k=LAW_TOPK, beams=2, draft_beams=3, gamma=1, seed=seed)
        list(dec.rounds())
        mc[tuple(sorted(tuple(s) for s in dec.ctx.seqs))] += 1
    mc_tv = tv({x: c / trials for x, c in mc.items()}, ref)
    print(f"atspeed_relaxed (K=2, N=3, gamma=1, V=6, top-k 3, 2 steps): TV from beam sampling "
          f"= {exact_tv:.4f} exact, {mc_tv:.4f} Monte Carlo ({trials} runs); from beam "
          f"sampling without replacement = {distinct_tv:.4f} exact")
    assert abs(sum(law.values()) - 1) < 1e-9
    assert all(0.0 <= x <= 1.0 for x in (exact_tv, mc_tv, distinct_tv))  # approximate by design


@torch.no_grad()
def distinct_beam_sampling_law(pair) -> dict:
    """Exact law of beam sampling with distinct draws per step (beam_sample_step,
    replacement=False), as sorted beam sets: the law relaxed verification approximates."""
    model, ids = pair.target, torch.tensor([[2, 3, 4]])
    cfg = BeamConfig.from_generation_config(model.generation_config, 2, 2, 3)

    def lp(seqs):
        return torch.log_softmax(model(input_ids=seqs).logits[:, -1].float(), -1)

    def run(chooser):
        _, steps = run_beam_sampling(lp, ids, cfg, Warp(top_k=LAW_TOPK), chooser,
                                     replacement=False)
        rows = [[] for _ in range(2)]
        for info in steps:
            rows = [rows[a] + [t] for a, t in zip(info.parents.tolist(), info.tokens.tolist())]
        return tuple(sorted(tuple(r) for r in rows))

    law: dict = defaultdict(float)
    for w, beams in enumerate_outcomes(run):
        law[beams] += w
    return law


# ------------------------------------------------------------------ the cost-aware switch


def test_the_cost_switch_keeps_strict_identical_to_generate_and_takes_plain_steps():
    """atspeed_strict with the cost switch: rounds it plans as plain are beam steps without a
    draft call, drafted ones replay the target's beam search; the beams stay generate()'s."""
    target = tiny(2)
    pair = pair_of(target, tiny(7))  # an unrelated draft: rejections make plain steps pay
    eos = frequent_token(target, prompt(20))
    set_generation(target, eos)
    depths = Counter()
    for s in range(3):
        ids = prompt(20 + s)
        tr = generate(pair, ids, "atspeed_strict", beams=2, draft_beams=4, gamma=3,
                      switch="cost", costs=EDGE.name, max_new_tokens=12)
        assert_same_beams(tr, hf_beams(target, ids, 2, 12), eos)
        for r in tr.rounds:
            sw = r.switch  # every round records the switch's plan (None: it did not plan)
            if sw is None:  # the run's last step: no draft step fits
                continue
            depths[sw.depth] += 1
            assert r.drafted <= sw.depth
            if sw.depth == 0:
                assert r.draft_calls == 0 and r.drafted == 0
    assert depths[0] > 0 and sum(v for d, v in depths.items() if d > 0) > 0, depths


def test_switched_dsbd_output_law_still_equals_beam_sampling_end_to_end():
    """The switch plans from past rounds and its own side draws, never from the round's
    target scores: the exact law of three steps of dsbd with the switch (K = W_S = 2,
    gamma 2, top-2 warp) is beam sampling's, with plain and drafted rounds both weighing
    (the side seed fixes the switch's draws; which round is plain depends on the outcomes)."""
    pair = law_pair()
    ref, _ = engine_law(pair, "beam_sample", new=3, top_k=2, beams=2)
    law, depths = defaultdict(float), Counter()

    def run(chooser):
        dec, _, _ = make_decoder(pair, [2, 3, 4], "dsbd", max_new_tokens=3, top_k=2,
                                 draft_beams=2, min_width=2, gamma=2, switch="cost",
                                 costs=MIXED.name, seed=1)  # seed 1: plans follow the past
        dec.ctx.chooser = chooser
        rounds = list(dec.rounds())
        return (tuple(tuple(s) for s in dec.ctx.seqs),
                tuple(r.switch.depth for r in rounds if r.switch is not None))

    for w, (seqs, planned) in enumerate_outcomes(run):
        law[seqs] += w
        for d in planned:
            depths[d > 0] += w
    assert depths[True] > 0.05 and depths[False] > 0.05, depths
    assert abs(sum(law.values()) - 1) < 1e-9
    assert gap(law, ref) < 1e-5, gap(law, ref)
