"""The feature-level (EAGLE-style) drafter, engine/drafters/feature.py: temperature 0 is
token-identical to greedy generate() for every token method, the draft law at every round's
root is the law recomputed from scratch with the target's true features (so crops and re-feeds
keep the right feature at every committed slot), the trace names the drafter, and its weight
files load only for their own target."""

from __future__ import annotations

import pytest
import torch

import engine
from engine.cli import main
from engine.control import cost
from engine.core.errors import ConfigError
from engine.drafters.feature import (
    FeatureDrafter,
    FeatureParts,
    FeatureRunner,
    feature_drafter,
    load_feature,
    save_feature,
)
from engine.execution.cached_model import Scored
from engine.run.specs import parse_model_spec
from tests.conftest import near_perfect_feature_parts, tiny_pair
from tests.model.test_token_methods import METHODS, _ref
from tests.profiles import DEAR, FREE, HOPELESS, RESTING

PROMPTS = ([3, 4, 5, 6], [11, 12])


@pytest.mark.parametrize("method,params", METHODS + [("sd", {"controller": "cali_ts"})])
@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_temperature_zero_with_the_feature_drafter_equals_greedy_generate(method, params,
                                                                          family):
    pair = tiny_pair(family, layers=4, draft="feature")
    drafted = 0
    for prompt in PROMPTS:
        trace = engine.generate(pair, prompt, method, max_new_tokens=20, **params)
        assert list(trace.token_ids) == _ref(pair, prompt, 20), (method, params, prompt)
        drafted += sum(r.drafted for r in trace.rounds)
        assert trace.rounds[0].drafted == 0  # round 0: no target feature known yet
    assert drafted > 0


def test_an_untrained_feature_drafter_is_named_in_the_trace_and_its_forest():
    pair = tiny_pair(draft="feature")
    trace = engine.generate(pair, [3, 4, 5], "mcsd", k_config="2x2", max_new_tokens=8)
    assert trace.draft == "feature (EAGLE-style, 1 layer, untrained)"
    assert pair.draft_name == trace.draft
    drafted = [n for r in trace.rounds for n in r.nodes if n.q is not None]
    assert drafted and trace.rounds[1].draft_calls == 2  # the forest came from the drafter


@pytest.mark.parametrize("method,params", [("sd", {"gamma": 4}),
                                           ("mcsd", {"k_config": "3x2x2"})])
def test_the_root_law_every_round_is_the_law_with_the_targets_true_features(
        method, params, monkeypatch):
    """At temperature 1 tiny models accept many drafts, so commits of 0..gamma tokens,
    crops and re-feeds all happen; after each the drafter's root logits equal those computed
    from scratch over the committed tokens with the target's features."""
    pair = tiny_pair(draft="feature")
    run = engine.start(pair, [3, 4, 5, 6], method, max_new_tokens=30, temperature=1.0,
                       seed=2, **params)
    seen: list[tuple[list[int], torch.Tensor]] = []
    feed = FeatureRunner.feed

    def spy(self, tokens=None, parents=None):
        out = feed(self, tokens, parents)
        if tokens is None and not self.blind:
            seen.append((run._decoder.ctx.committed_ids()[0].tolist(), out.root_logits[0]))
        return out

    monkeypatch.setattr(FeatureRunner, "feed", spy)
    trace = run.to_end()
    assert max(r.accepted for r in trace.rounds) >= 2  # multi-token commits happened
    assert len(seen) == len(trace.rounds) - 1  # every round but round 0 proposed
    for ids, root in seen:
        fresh = pair.drafter.context_logits(torch.tensor([ids]))[0, -1]  # (V,)
        torch.testing.assert_close(root, fresh, atol=1e-5, rtol=1e-5)


def test_the_feature_runner_keeps_only_committed_slots_in_its_cache():
    pair = tiny_pair(draft="feature")
    run = engine.start(pair, [3, 4, 5, 6], "sd", gamma=3, max_new_tokens=12,
                       temperature=1.0, seed=1)
    for _ in run:
        ctx = run._decoder.ctx
        draft, n = ctx.draft_if_started, ctx.committed_ids().shape[1]
        if draft is not None:
            assert draft.cache.get_seq_length() == draft.base <= n
            assert draft.length == n and draft.feats.shape[1] == n - 1


# ------------------------------------------------------------------------- specs and weights


def test_feature_specs_are_drafters_with_an_optional_weight_file():
    assert parse_model_spec("feature", draft=True).kind == "feature"
    assert parse_model_spec("feature:/x/w.safetensors", draft=True).weights == \
        "/x/w.safetensors"
    with pytest.raises(ConfigError, match="drafter, not a target"):
        parse_model_spec("feature")
    with pytest.raises(ConfigError, match="give a file"):
        parse_model_spec("feature:", draft=True)


def test_saved_weights_load_into_the_drafter_and_reproduce_its_logits(tmp_path):
    target = tiny_pair().target
    parts = FeatureParts(target, seed=3)
    short = torch.tensor([1, 3, 4, 5, 9, 20])
    path = save_feature(tmp_path / "f.safetensors", target, parts, short, dtype=torch.float32)
    loaded = feature_drafter(target, str(path))
    ids = torch.tensor([[3, 4, 5, 6, 7]])
    want = FeatureDrafter(target, parts, short).context_logits(ids)  # (1, 5, V)
    torch.testing.assert_close(loaded.context_logits(ids), want)
    assert loaded.name == "feature (EAGLE-style, 1 layer, trained, 6-token head)"
    assert (want[..., short] > -1e30).all() and (want.amax(-1) > -1e30).all()
    off = torch.ones(want.shape[-1], dtype=torch.bool)
    off[short] = False
    assert (want[..., off] == torch.finfo(want.dtype).min).all()


def test_weights_made_for_another_target_are_refused_in_one_line(tmp_path):
    a, b = tiny_pair(seed=0).target, tiny_pair(seed=1).target
    path = save_feature(tmp_path / "f.safetensors", a, FeatureParts(a))
    with pytest.raises(ConfigError, match="made for another target"):
        load_feature(b, path)
    with pytest.raises(ConfigError, match="not found"):
        engine.load_pair(target=a, draft=f"feature:{tmp_path / 'none.safetensors'}",
                         device="cpu")


def test_the_cli_refuses_a_missing_feature_weight_file_with_one_error_line(capsys, tmp_path):
    code = main(["generate", "--target", "tiny", "--draft", f"feature:{tmp_path}/no.st",
                 "--raw", "--prompt", "1 2 3", "--method", "sd"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: feature drafter")


def test_a_dynamic_tree_feeds_each_expanded_node_on_its_own_path():
    """tree=dynamic feeds the drafter only each level's best nodes: every fed node must be
    drafted after its own parent (the drafter's index, not the tree's id), so a drafter that
    copies the target has nearly every level of the 4x2x2x2 tree accepted (its levels keep 2
    of 4 nodes, so drafter indices and tree ids differ from level 2 on; a wrong index feeds
    a node before its parent). Not every one: a level may leave the target's path unexpanded
    when a sibling's path looks likelier to the draft."""
    pair = tiny_pair(layers=1, draft="ngram")
    drafter = FeatureDrafter(pair.target, near_perfect_feature_parts(pair.target, 0.0))
    pair.drafter, pair.draft_name = drafter, drafter.name
    rounds = []
    for prompt in PROMPTS:
        trace = engine.generate(pair, prompt, "mcsd", k_config="4x2x2x2", tree="dynamic",
                                tree_nodes=16, costs=FREE.name, max_new_tokens=30)
        assert list(trace.token_ids) == _ref(pair, prompt, 30)
        rounds += [(r.drafted, r.accepted) for r in trace.rounds[1:] if r.drafted]
    assert rounds and max(d for d, _ in rounds) == 4
    assert sum(a for _, a in rounds) >= 0.9 * sum(d for d, _ in rounds), rounds


@pytest.mark.parametrize("method,params", [("sd", {"gamma": 4}), ("mcsd", {"k_config": "2x2x2"}),
                                           ("sd", {"controller": "beta_ts"})])
@pytest.mark.parametrize("eps", [0.0, 0.002])
def test_a_near_perfect_feature_drafter_commits_long_chains_and_still_equals_greedy(
        method, params, eps):
    """A 1-layer target and a drafter that copies it (eps = 0: every draft accepted; eps > 0:
    the features move the drafts and some fail): commits of every length, then crops and
    re-feeds, keep the output the greedy one."""
    pair = tiny_pair(layers=1, draft="ngram")
    drafter = FeatureDrafter(pair.target, near_perfect_feature_parts(pair.target, eps))
    pair.drafter, pair.draft_name = drafter, drafter.name
    rounds = []  # (drafted, accepted) after round 0
    for prompt in PROMPTS:
        trace = engine.generate(pair, prompt, method, max_new_tokens=30, **params)
        assert list(trace.token_ids) == _ref(pair, prompt, 30), (method, params, prompt)
        rounds += [(r.drafted, r.accepted) for r in trace.rounds[1:] if r.drafted]
    accepted = [a for _, a in rounds]
    if eps == 0.0:
        assert rounds and all(a == d for d, a in rounds) and max(accepted) >= 3
    else:
        assert 0 < sum(accepted) and min(accepted) < max(accepted)


@pytest.mark.parametrize("method,params", [("sd", {}), ("mcsd", {"k_config": "2x2"})])
def test_a_first_draft_after_plain_rounds_knows_every_feature_and_is_accepted(method, params,
                                                                           monkeypatch):
    """The cost switch's prior plans plain (DEAR) and the opening probe is off, so the
    drafter's first draft is the probe of round 16: the drafter kept the target's states of the
    16 plain commits, so a drafter that copies the target has its probe accepted, and the
    output is greedy's."""
    monkeypatch.setattr(cost, "OPENING_PROBE", False)
    pair = tiny_pair(layers=1, draft="ngram")
    drafter = FeatureDrafter(pair.target, near_perfect_feature_parts(pair.target, 0.0))
    pair.drafter, pair.draft_name = drafter, drafter.name
    trace = engine.generate(pair, PROMPTS[0], method, switch="cost", costs=DEAR.name,
                            max_new_tokens=30, **params)
    assert list(trace.token_ids) == _ref(pair, PROMPTS[0], 30)
    assert all(r.drafted == 0 for r in trace.rounds[:16])
    probe = trace.rounds[16]
    assert probe.switch.probe and probe.drafted == probe.accepted == 1


@pytest.mark.parametrize("method,params", [("sd", {}), ("mcsd", {"k_config": "2x2"})])
def test_a_switch_under_which_no_draft_can_pay_starts_no_drafter(method, params, monkeypatch):
    """HOPELESS: no depth pays even at acceptance 1, so every round is planned plain for good
    (recorded as such), the feature drafter is never started (no prefill, no commits) and the
    output is greedy's; under DEAR (a probe could pay) the same run starts it."""
    pair = tiny_pair(layers=1, draft="feature")
    started = []
    runner = pair.drafter.runner
    monkeypatch.setattr(pair.drafter, "runner", lambda: started.append(1) or runner())
    trace = engine.generate(pair, PROMPTS[0], method, switch="cost", costs=HOPELESS.name,
                            max_new_tokens=12, **params)
    assert list(trace.token_ids) == _ref(pair, PROMPTS[0], 12) and started == []
    assert all(r.drafted == 0 and r.switch.never and r.switch.depth == 0
               for r in trace.rounds[:-1])
    engine.generate(pair, PROMPTS[0], method, switch="cost", costs=DEAR.name,
                    max_new_tokens=12, **params)
    assert started == [1]


def test_a_switch_that_rests_from_its_first_plan_starts_no_drafter(monkeypatch):
    """RESTING: no depth pays at the prior and no probe could, though a deep chain would pay
    at acceptance 1 (not 'never'): every round is the first plan's rest, the feature drafter
    is never started (no prefill, no commits, no context read) and the output is greedy's."""
    pair = tiny_pair(layers=1, draft="feature")
    started = []
    runner = pair.drafter.runner
    monkeypatch.setattr(pair.drafter, "runner", lambda: started.append(1) or runner())
    trace = engine.generate(pair, PROMPTS[0], "sd", switch="cost", costs=RESTING.name,
                            max_new_tokens=12)
    assert list(trace.token_ids) == _ref(pair, PROMPTS[0], 12) and started == []
    plans = [r.switch for r in trace.rounds[:-1]]
    assert all(p.rest and not p.never and p.depth == 0 and p.context is None for p in plans)
    assert all(p is plans[0] for p in plans)  # one record, reused


def test_the_exactness_check_sizes_against_the_feature_drafters_law_with_true_features():
    from engine.check.laws import exact_laws
    from engine.core.sampling import Warp

    pair = tiny_pair(draft="feature")
    _, q_law, _ = exact_laws(pair, [3, 4, 5], Warp(temperature=1.0), 1, set())
    q = torch.softmax(pair.drafter.context_logits(torch.tensor([[3, 4, 5]]))[0, -1].double(), -1)
    assert q_law.keys() and all(abs(v - float(q[t])) < 1e-6 for (t,), v in q_law.items())


def test_plain_feature_uses_shipped_weights_only_when_made_for_the_target(tmp_path, monkeypatch):
    import engine.drafters.feature as feature

    a, b = tiny_pair(seed=0).target, tiny_pair(seed=1).target
    save_feature(tmp_path / feature.FEATURE_FILE, a, FeatureParts(a, seed=4))
    monkeypatch.setattr(feature, "FEATURE_DIR", tmp_path)
    assert feature_drafter(a).trained and feature_drafter(a).source.startswith(str(tmp_path))
    assert feature_drafter(b).name == "feature (EAGLE-style, 1 layer, untrained)"


def test_the_runner_feeds_true_features_after_a_commit_crops_drafts_and_refeeds_the_path():
    """Literal walk through three rounds with target states that hold a number in every
    coordinate: round 0 is blind; round 1 feeds slots 0..3 with f_{-1..2} = 0, 10, 11, 12,
    drafts a tree from predicted features (two root children, one grandchild), accepts node
    0; the commit keeps slots 0..3 (fed with true features), crops all three drafts and
    re-feeds the accepted token and the correction in round 2 with f_3 = 13 (the target's
    tail) and f_4 = 20 (the target's state at node 0)."""
    from engine.core.forest import ROOT
    from engine.drafters.ngram import support

    target = tiny_pair().target
    d = int(target.config.hidden_size)
    runner = FeatureDrafter(target).runner()
    fed: list[list[float]] = []
    inputs = runner.drafter.parts.inputs
    runner.drafter.parts.inputs = lambda e, prev: fed.append(prev[0, :, 0].tolist()) \
        or inputs(e, prev)

    def states(*v):  # (1, n, d) states whose every coordinate is v_i
        return torch.tensor(v, dtype=torch.float32)[None, :, None].expand(1, len(v), d)

    def scored(tail, nodes):
        return Scored(torch.zeros(1, len(nodes), 64), states(*nodes), torch.zeros(1, 64),
                      states(*tail)[:, -1], states(*tail))

    runner.start(torch.tensor([[3, 4, 5]]))
    assert support(runner.feed().root_logits[0]) == 0 and fed == []  # round 0: blind
    runner.commit(torch.tensor([0]), torch.zeros((1, 0), dtype=torch.long),
                  torch.zeros((1, 0), dtype=torch.long), torch.tensor([[7]]),
                  target=scored([10, 11, 12], []))
    assert runner.feats[0, :, 0].tolist() == [10, 11, 12] and runner.tail.tolist() == [[3, 4, 5, 7]]
    root = runner.feed()  # round 1: slots 0..3
    assert fed[-1] == [0, 10, 11, 12]
    kids = runner.feed(torch.tensor([[8, 2]]), torch.tensor([[ROOT, ROOT]]))
    assert fed[-1] == [root.root_hidden[0, 0].item()] * 2  # the root's predicted f'
    runner.feed(torch.tensor([[9]]), torch.tensor([[0]]))
    assert fed[-1] == [kids.node_hidden[0, 0, 0].item()]  # node 0's predicted f'
    assert runner.cache.get_seq_length() == 7
    runner.commit(torch.tensor([0]), torch.tensor([[0]]), torch.tensor([[8]]),
                  torch.tensor([[6]]), target=scored([13], [20, 21, 22]))
    assert runner.feats[0, :, 0].tolist() == [10, 11, 12, 13, 20]
    assert runner.cache.get_seq_length() == runner.base == 4
    assert runner.tail.tolist() == [[8, 6]]
    runner.feed()  # round 2: the accepted token and the correction, true features
    assert fed[-1] == [13, 20]
