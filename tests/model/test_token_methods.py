"""Token-level speculative methods: temperature 0 is token-identical to greedy generate()."""

from __future__ import annotations

import json

import pytest
import torch

import engine
from tests.conftest import counting_tokenizer, tiny_pair
from tests.profiles import DEAR, FREE, MIXED

METHODS = [
    ("sd", {"gamma": 3}),
    ("sd", {"controller": "beta_ts"}),
    ("sd", {"controller": "heuristic", "gamma": 2}),
    ("sd", {"controller": "cali_ts"}),
    ("mcsd", {"k_config": "4x2x2"}),
    ("mcsd", {"k_config": "3x2", "verifier": "rrs_wr"}),
    ("mcsd", {"k_config": "2x2x1", "verifier": "naive"}),
    ("mcsd", {"k_config": "3x1", "verifier": "kseq"}),
    ("greedy_drafts", {"k_config": "3x2x2"}),
    ("mcsd", {"k_config": "2x2x2x2", "controller": "beta_ts"}),
    ("mcsd", {"k_config": "2x2x2", "controller": "heuristic"}),
    ("sd", {"controller": "confidence", "confidence": 0.02, "cap": 6}),
    ("mcsd", {"k_config": "2x2x2", "controller": "confidence", "confidence": 0.02}),
    ("sd", {"switch": "cost", "costs": MIXED.name, "confidence": 0.0, "cap": 6}),
    ("mcsd", {"k_config": "2x2x2", "switch": "cost", "costs": MIXED.name}),
    ("greedy_drafts", {"k_config": "3x2x2", "switch": "cost", "costs": MIXED.name}),
    ("mcsd", {"k_config": "3x3x3", "tree": "dynamic", "tree_nodes": 10, "costs": FREE.name}),
    ("mcsd", {"k_config": "4x4x4", "tree": "dynamic", "switch": "cost", "costs": FREE.name}),
]


def _ref(pair, prompt, n):
    out = pair.target.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=n)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("method,params", METHODS)
@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_temperature_zero_equals_greedy_generate(method, params, family):
    pair = tiny_pair(family, layers=4, early_exit_layers=2)
    for prompt in ([3, 4, 5, 6], [11, 12]):
        trace = engine.generate(pair, prompt, method, max_new_tokens=20, **params)
        assert list(trace.token_ids) == _ref(pair, prompt, 20), (method, params, prompt)


@pytest.mark.parametrize("method,params", METHODS + [("sd", {"gamma": 8})])
def test_temperature_zero_with_the_ngram_drafter_equals_greedy_generate(method, params):
    """Prompts that repeat themselves, so lookups propose (and some rounds propose nothing)."""
    pair = tiny_pair(draft="ngram")
    proposed = 0
    for prompt in ([3, 4, 5, 6, 3, 4, 5, 7, 3, 4], [11, 12, 11, 12, 13, 11], [9, 8, 7]):
        trace = engine.generate(pair, prompt, method, max_new_tokens=24, **params)
        assert list(trace.token_ids) == _ref(pair, prompt, 24), (method, params, prompt)
        proposed += sum(r.drafted for r in trace.rounds)
    assert proposed > 0


def test_a_switch_whose_prior_plans_plain_probes_and_keeps_greedy_generates_tokens():
    pair = tiny_pair(layers=2, early_exit_layers=1)
    trace = engine.generate(pair, [3, 4, 5], "sd", switch="cost", costs=DEAR.name,
                            max_new_tokens=40)
    assert list(trace.token_ids) == _ref(pair, [3, 4, 5], 40)
    probes = [r for r in trace.rounds if r.switch is not None and r.switch.probe]
    assert probes and probes[0].index == 0 and all(r.drafted == 1 for r in probes)  # the
    # opening probe; the prior plans plain, so the next probe waits 16 plain rounds (if the
    # opening probe's draft failed) or the plan drafts from there (if it passed)
    later = [r.index for r in probes[1:]]
    assert not later or later[0] >= 17


@pytest.mark.parametrize("loses", [False, True])
def test_the_timed_guards_plain_rounds_keep_greedy_generates_tokens(monkeypatch, loses):
    """The guard times plain rounds amid drafted ones, and where the drafted rounds lose
    plans plain for the rest of the run, else lets them draft (the rates it compares are
    scripted here: the clock is the machine's); the tokens stay greedy generate()'s."""
    from engine.control.guard import MIN_DRAFTED, MIN_PLAIN, TimedGuard

    rates = (1.0, 2.0) if loses else (2.0, 1.0)  # (drafted, plain) tokens a second
    monkeypatch.setattr(TimedGuard, "rates",
                        lambda self, context: None if len(self.plain) < MIN_PLAIN else rates)
    pair = tiny_pair(layers=2, early_exit_layers=1)
    trace = engine.generate(pair, [3, 4, 5], "sd", switch="cost", costs=FREE.name,
                            guard="timed", confidence=0.0, max_new_tokens=40)
    assert list(trace.token_ids) == _ref(pair, [3, 4, 5], 40)
    why = [r.switch.guard for r in trace.rounds if r.switch is not None]
    first = why.index("timing")
    assert first == 1 + MIN_DRAFTED  # round 0 starts the drafter (it reads the prompt): untimed
    assert why[first:first + MIN_PLAIN] == ["timing"] * MIN_PLAIN
    after = trace.rounds[first + MIN_PLAIN:-1]  # (the last round has no room to draft)
    if loses:
        assert after and all(r.switch.guard == "slower" and r.drafted == 0 for r in after)
    else:
        assert any(r.drafted for r in after)


def test_the_ngram_drafter_accepts_a_copied_span_and_skips_rounds_without_a_match():
    """The tiny target repeats spans of its own output; a repeated span is drafted whole and
    accepted whole."""
    pair = tiny_pair(draft="ngram")
    ref = _ref(pair, [3, 4, 5], 40)
    trace = engine.generate(pair, [3, 4, 5], "sd", gamma=6, max_new_tokens=40)
    assert list(trace.token_ids) == ref
    assert any(r.drafted == 0 for r in trace.rounds)  # no match yet: a plain step
    assert any(r.drafted == r.accepted == 6 for r in trace.rounds)
    assert trace.draft.startswith("n-gram")


@pytest.mark.parametrize("method,params", METHODS[:1] + METHODS[4:5] + METHODS[12:13])
def test_a_perfect_drafter_is_always_accepted(method, params):
    target = tiny_pair(layers=2, early_exit_layers=1).target
    pair = engine.load_pair(target=target, draft=target, device="cpu")
    trace = engine.generate(pair, [3, 4, 5], method, max_new_tokens=20, **params)
    assert trace.stats.acceptance_rate == 1.0
    assert list(trace.token_ids) == _ref(pair, [3, 4, 5], 20)
    assert trace.stats.tau > 2


def test_rounds_record_nodes_tests_and_statuses():
    pair = tiny_pair()
    rounds = list(engine.iter_rounds(pair, [3, 4, 5], "mcsd", k_config="2x2",
                                     max_new_tokens=8, temperature=1.0, seed=1))
    r = rounds[0]
    assert len([n for n in r.nodes if n.q is not None]) == 6
    statuses = {n.status for n in r.nodes}
    assert statuses & {"accepted", "rejected"}
    assert statuses & {"resampled", "bonus"}
    for t in r.tests:
        assert 0 <= t.ratio <= 1 and t.decision in ("accept", "reject")
    assert r.draft_calls == 2 and r.target_calls == 1
    for r in rounds:  # each draft forward timed, inside the propose phase
        assert len(r.draft_seconds) == r.draft_calls and all(s > 0 for s in r.draft_seconds)
        assert sum(r.draft_seconds) <= r.timings["propose"]


@pytest.mark.parametrize("method,params", [
    ("sd", {"gamma": 3}),
    ("mcsd", {"k_config": "4x2x2"}),
    ("mcsd", {"k_config": "3x2", "verifier": "rrs_wr"}),
    ("mcsd", {"k_config": "2x2x1", "verifier": "naive"}),
    ("mcsd", {"k_config": "3x1", "verifier": "kseq"}),
    ("greedy_drafts", {"k_config": "3x2x2"}),
])
def test_temperature_zero_rounds_on_the_support_record_what_the_dense_rules_do(method, params):
    """At temperature 0 the rules run on the drafted tokens and the argmax (on_support);
    ``optimal`` keeps the dense laws. Both record the same nodes, tests and draws."""
    pair = tiny_pair()
    runs = [list(engine.iter_rounds(pair, [3, 4, 5, 6], method, max_new_tokens=16, seed=3,
                                    optimal=optimal, **params)) for optimal in (False, True)]
    assert [r.committed for r in runs[0]] == [r.committed for r in runs[1]]
    rejected = 0
    for sparse, dense in zip(*runs):
        assert sparse.nodes == dense.nodes
        assert len(sparse.tests) == len(dense.tests)
        for a, b in zip(sparse.tests, dense.tests):
            assert (a.node, a.depth, a.token_id, a.decision, a.uniform, a.note) == (
                b.node, b.depth, b.token_id, b.decision, b.uniform, b.note)
            assert (a.p, a.q, a.ratio) == pytest.approx((b.p, b.q, b.ratio), rel=1e-9)
            assert (a.residual_mass is None) == (b.residual_mass is None)
            if a.residual_mass is not None:
                assert a.residual_mass == pytest.approx(b.residual_mass, rel=1e-9)
            rejected += a.decision == "reject"
    assert rejected > 0


def test_eos_inside_an_accepted_draft_stops_the_run():
    target = tiny_pair(layers=2, early_exit_layers=1).target
    ref = target.generate(torch.tensor([[3, 4, 5]]), do_sample=False,
                                     max_new_tokens=12)[0, 3:].tolist()
    target.generation_config.eos_token_id = ref[4]
    pair = engine.load_pair(target=target, draft=target, device="cpu")
    trace = engine.generate(pair, [3, 4, 5], "sd", gamma=8, max_new_tokens=12)
    cut = ref.index(ref[4]) + 1
    assert list(trace.token_ids) == ref[:cut]
    assert trace.stop_reason == "eos"


@pytest.mark.parametrize("method,params,scheme", [
    ("mcsd", {"k_config": "3x2"}, "without_replacement"),
    ("mcsd", {"k_config": "3x2", "verifier": "kseq"}, "with_replacement"),
    ("greedy_drafts", {"k_config": "3x2"}, "greedy"),
])
def test_optimal_acceptance_is_recorded_per_verified_position(method, params, scheme):
    pair = tiny_pair()
    trace = engine.generate(pair, [3, 4, 5], method, max_new_tokens=10, temperature=1.0,
                            optimal=True, **params)
    recs = [rec for r in trace.rounds for rec in r.extras.optimal]
    assert recs and all(rec.scheme == scheme for rec in recs)
    for rec in recs:
        assert 0 <= rec.achieved <= 1 and 0 <= rec.alpha_star <= 1
        if rec.expected is not None:
            assert rec.expected <= rec.alpha_star + 1e-9
        if method == "greedy_drafts":
            assert abs(rec.expected - rec.alpha_star) < 1e-9
    eff = trace.stats.verifier_efficiency
    assert eff == pytest.approx(sum(r.achieved for r in recs)
                                / sum(r.alpha_star for r in recs))


def test_the_confidence_controller_stops_a_chain_at_the_first_unsure_draft():
    """sd's chain goes on exactly while the draft gave its newest token q >= the threshold
    (temperature 1 of the draft logits), and stops at the cap otherwise."""
    pair = tiny_pair(layers=4, early_exit_layers=2)
    trace = engine.generate(pair, [3, 4, 5, 6], "sd", controller="confidence", confidence=0.02,
                            cap=5, max_new_tokens=40)
    assert list(trace.token_ids) == _ref(pair, [3, 4, 5, 6], 40)
    reasons = set()
    for r in trace.rounds:
        if not r.drafted:
            continue
        steps, state = r.controller.steps, r.controller
        assert [s["step"] for s in steps] == list(range(1, len(steps) + 1))
        if state.stop_reason is None:  # the token budget ended the chain (the run's end)
            assert len(steps) == r.drafted - 1 and all(s["continue"] for s in steps)
            continue
        assert len(steps) == r.drafted
        assert all(s["q"] >= 0.02 for s in steps[:-1] if s["q"] is not None)
        last = steps[-1]
        assert (last["continue"] is False) and (
            (state.stop_reason == "confidence" and last["q"] < 0.02)
            or (state.stop_reason == "cap" and r.drafted == 5))
        reasons.add(state.stop_reason)
    assert reasons == {"confidence", "cap"}  # both ways of ending a chain were seen


@pytest.mark.parametrize("controller", ["beta_ts", "heuristic", "cali_ts"])
def test_a_controller_cuts_mcsd_trees_by_depth_and_records_its_posterior(controller):
    pair = tiny_pair(layers=4, early_exit_layers=2)
    trace = engine.generate(pair, [3, 4, 5, 6], "mcsd", k_config="2x2x2x2",
                            controller=controller, max_new_tokens=40, seed=1)
    assert list(trace.token_ids) == _ref(pair, [3, 4, 5, 6], 40)
    depths = [r.drafted for r in trace.rounds if r.drafted]
    assert all(1 <= d <= 4 for d in depths) and min(depths) < 4  # stopped before level 4
    states = [r.controller for r in trace.rounds if r.drafted]
    assert all(s.kind == controller and s.update["drafted"] == r.drafted
               for s, r in zip(states, [r for r in trace.rounds if r.drafted]))
    fixed = engine.generate(pair, [3, 4, 5, 6], "mcsd", k_config="2x2x2x2",
                            max_new_tokens=12)
    assert all(r.drafted == 4 for r in fixed.rounds if r.drafted and r.index < 2)


def test_the_cost_switch_takes_plain_and_drafted_rounds_and_records_each_decision():
    """sd under the cost controller: some rounds are plain target steps (no draft call, no
    node), others draft to the planned depth; each round's state holds the decision (the
    options, the drawn acceptances, the predicted gain) and the output stays greedy's."""
    pair = tiny_pair(layers=4, early_exit_layers=2)
    costs = MIXED.name  # Thompson draws at these costs: some rounds plain, some drafted
    params = {"switch": "cost", "costs": costs, "confidence": 0.0, "cap": 4,
              "plan": "thompson"}
    trace = engine.generate(pair, [3, 4, 5, 6], "sd", max_new_tokens=40, **params)
    assert list(trace.token_ids) == _ref(pair, [3, 4, 5, 6], 40)
    later = [r for r in trace.rounds if r.switch is not None]
    assert all(r.controller is not None for r in later)  # a plain round records its state too
    unplanned = [r for r in trace.rounds if r.switch is None]  # only a last round with one
    assert all(r is trace.rounds[-1] and len(r.committed) == 1 for r in unplanned)  # token left
    plain = [r for r in later if r.switch.depth == 0]
    drafted = [r for r in later if r.switch.depth > 0]
    assert plain and drafted
    assert all(r.drafted == 0 and r.draft_calls == 0 and not r.nodes[:-1] for r in plain)
    for r in drafted:
        sw = r.switch
        assert r.drafted <= sw.depth and r.draft_calls == r.drafted
        assert sw.predicted_gain == max(o.gain for o in sw.options)
        assert sw.profile == costs and 2 <= len(sw.options) <= 5  # depths 0..cap
    again = engine.generate(pair, [3, 4, 5, 6], "sd", max_new_tokens=40, **params)
    assert [r.switch for r in again.rounds] == [r.switch for r in trace.rounds]  # seeded


def test_an_unknown_cost_profile_is_one_clear_error():
    pair = tiny_pair(layers=4, early_exit_layers=2)
    with pytest.raises(engine.ConfigError, match="unknown cost profile 'nope'"):
        engine.generate(pair, [3, 4], "sd", switch="cost", costs="nope", max_new_tokens=4)


@pytest.mark.parametrize("method,params", [
    ("sd", {"cap": 4}), ("mcsd", {"k_config": "2x2x2"}), ("greedy_drafts", {"k_config": "2x2"}),
    ("eesd", {}),
])
def test_switch_cost_and_the_deprecated_controller_cost_give_the_same_run(method, params):
    """One switch, two spellings: the same validated (canonical) params, tokens and plans."""
    pair = tiny_pair(layers=4, early_exit_layers=2)
    common = {"costs": MIXED.name, "plan": "thompson", "temperature": 1.0, "seed": 5,
              "max_new_tokens": 16, **params}
    new = engine.generate(pair, [3, 4, 5], method, switch="cost", **common)
    old = engine.generate(pair, [3, 4, 5], method, controller="cost", **common)
    assert old.params == new.params
    assert (new.params["switch"], new.params["controller"]) == ("cost", "fixed")
    assert list(old.token_ids) == list(new.token_ids)
    assert [r.switch for r in old.rounds] == [r.switch for r in new.rounds]
    states = [r.controller for r in new.rounds if r.controller is not None]  # None: a last
    assert states and all(s.kind == "cost" for s in states)  # round with no room to draft


def test_a_switch_and_a_length_controller_together_are_one_config_error():
    pair = tiny_pair(layers=4, early_exit_layers=2)
    with pytest.raises(engine.ConfigError) as err:
        engine.generate(pair, [3, 4], "sd", switch="cost", controller="beta_ts",
                        max_new_tokens=4)
    assert "switch=cost" in str(err.value) and "controller=beta_ts" in str(err.value)
    assert "\n" not in str(err.value)


def test_a_trace_recorded_with_controller_cost_still_imports():
    from specviz.trace_file import parse_trace

    pair = tiny_pair(layers=4, early_exit_layers=2)
    trace = engine.generate(pair, [3, 4], "sd", switch="cost", costs=MIXED.name,
                            max_new_tokens=4)
    old = trace.to_dict()
    del old["params"]["switch"]  # written before the switch had its one name
    old["params"]["controller"] = "cost"
    text = json.dumps(old)
    assert engine.RunTrace.from_json(text).params["controller"] == "cost"  # data, as stored
    assert parse_trace(text).token_ids == trace.token_ids
    again = engine.generate(pair, [3, 4], "sd", **{k: v for k, v in old["params"].items()})
    assert again.params == trace.params and again.token_ids == trace.token_ids


def test_a_pairs_runs_decode_each_token_id_alone_once():
    """A round names every drafted and committed token, and a trace its prompt's: the pair
    keeps each id's text, so the tokenizer decodes an id alone once for all runs (a call
    costs about 55 us of a 10 ms round on the embedded model)."""
    pair = tiny_pair()
    tok = pair.tokenizer = counting_tokenizer(pair.vocab_size)
    prompt = [3, 4, 5, 6, 3, 4, 5]
    first = engine.generate(pair, prompt, "sd", max_new_tokens=12, gamma=3)
    assert sorted(tok.calls) == sorted(set(tok.calls))  # no id twice
    named = {n.token_id for r in first.rounds for n in r.nodes}
    assert named | set(prompt) | set(first.token_ids) <= set(tok.calls)
    assert first.prompt_text == tuple(f"<{i}>" for i in prompt)
    tok.calls.clear()
    again = engine.generate(pair, prompt, "sd", max_new_tokens=12, gamma=3)
    assert again.token_ids == first.token_ids and tok.calls == []
    other = pair.tokenizer = counting_tokenizer(pair.vocab_size)  # its own texts
    engine.generate(pair, prompt, "sd", max_new_tokens=12, gamma=3)
    assert set(prompt) <= set(other.calls)
