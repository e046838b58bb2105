"""The hybrid drafter 'ngram+feature', engine/drafters/hybrid.py: per node the n-gram law where the
lookup proposes, the feature drafter's elsewhere; temperature 0 is token-identical to greedy
generate() with both branches used, and at temperature 1 sd keeps the target's law."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import torch

import engine
import engine.drafters.feature
import engine.drafters.hybrid
from engine.core.errors import ConfigError
from engine.core.forest import ROOT
from engine.drafters.ngram import ngram_law, support
from engine.execution.cached_model import CachedModel
from engine.run.specs import parse_model_spec
from tests.conftest import tiny_pair
from tests.laws import NEW, exact_law, position_probs, sample_counts, tiny_model
from tests.model.test_token_methods import _ref
from tests.profiles import LOOKUP_ONLY, MIXED
from tests.stats import chi_square, exactness_size

REPEATING = ([3, 4, 5, 6, 3, 4, 5, 7, 3, 4], [11, 12, 11, 12, 13, 11], [9, 8, 7])


def _feed_all(runners, tokens=None, parents=None):
    return [r.feed(tokens, parents) for r in runners]


def test_per_node_the_hybrid_takes_the_ngram_law_where_it_matches_else_the_features():
    pair = tiny_pair(draft="ngram+feature")
    h, n, f = (pair.drafter.runner(), pair.drafter.ngram.runner(),
               pair.drafter.feature.runner())
    target = CachedModel(pair.target)
    prompt = torch.tensor([[3, 4, 5, 6, 3, 4]])  # (1, 6)
    for r in (h, n, f, target):
        r.start(prompt)
    # round 0: the feature runner is blind; "3 4" recurs (-> 5), "4 5" recurs, "4 9" does not
    hr, nr, _ = _feed_all((h, n, f))
    torch.testing.assert_close(hr.root_logits, nr.root_logits)
    hn, nn_, _ = _feed_all((h, n, f), torch.tensor([[5, 9]]), torch.tensor([[ROOT, ROOT]]))
    torch.testing.assert_close(hn.node_logits[0, 0], nn_.node_logits[0, 0])
    assert support(hn.node_logits[0, 1]) == 0  # neither proposes: nothing
    scored = target.feed()
    commit = (torch.tensor([0]), torch.zeros((1, 0), dtype=torch.long),
              torch.zeros((1, 0), dtype=torch.long), torch.tensor([[5]]))
    for r in (h, n, f):
        r.commit(*commit, target=scored)
    # round 1, context 3 4 5 6 3 4 5: root "3 4 5" recurs; nodes 6 (ROOT), 9 (ROOT), 3 (after
    # 6), 7 (after 9): "5 6" and "6 3" recur, "5 9" and "9 7" do not
    outs = [_feed_all((h, n, f))]
    outs.append(_feed_all((h, n, f), torch.tensor([[6, 9]]), torch.tensor([[ROOT, ROOT]])))
    outs.append(_feed_all((h, n, f), torch.tensor([[3, 7]]), torch.tensor([[0, 1]])))
    hyb = [outs[0][0].root_logits[0]] + [x for o in outs[1:] for x in o[0].node_logits[0]]
    ngr = [outs[0][1].root_logits[0]] + [x for o in outs[1:] for x in o[1].node_logits[0]]
    fea = [outs[0][2].root_logits[0]] + [x for o in outs[1:] for x in o[2].node_logits[0]]
    matched = [support(x) > 0 for x in ngr]
    assert matched == [True, True, False, True, False]
    for m, got, want_n, want_f in zip(matched, hyb, ngr, fea):
        torch.testing.assert_close(got, want_n if m else want_f)
        assert not torch.equal(want_n, want_f)  # the two laws differ: an inverted choice fails


def test_hybrid_specs_are_drafters_with_an_optional_ngram_length():
    spec = parse_model_spec("ngram+feature", draft=True)
    assert (spec.kind, spec.layers) == ("ngram+feature", None)
    assert parse_model_spec("ngram+feature:3", draft=True).layers == 3
    with pytest.raises(ConfigError, match="drafter, not a target"):
        parse_model_spec("ngram+feature")
    with pytest.raises(ConfigError, match="n-gram length must be a positive integer"):
        parse_model_spec("ngram+feature:x", draft=True)


def test_the_trace_names_both_drafters():
    pair = tiny_pair(draft="ngram+feature:3")
    trace = engine.generate(pair, [3, 4, 5], "sd", gamma=3, max_new_tokens=8)
    assert trace.draft == ("n-gram (prompt lookup, n = 3..2) + feature (EAGLE-style, 1 layer, "
                           "untrained)")
    assert pair.draft_name == trace.draft


@pytest.fixture
def root_sources(monkeypatch):
    """Counts the round roots whose law came from the lookup and from the feature drafter."""
    seen = {"ngram": 0, "feature": 0}
    plain = engine.drafters.hybrid.hybrid_logits

    def spy(ngram, feature, laws=None):
        if ngram.dim() == 2:  # (W, V): a round's root
            has = (ngram > torch.finfo(ngram.dtype).min).any(-1)  # (W,)
            alive = (feature > torch.finfo(feature.dtype).min).any(-1)  # (W,)
            if laws is not None:  # the n-gram runner's own record agrees with its logits
                assert torch.equal(laws, has)
            seen["ngram"] += int(has.sum())
            seen["feature"] += int((~has & alive).sum())
        return plain(ngram, feature, laws)

    monkeypatch.setattr(engine.drafters.hybrid, "hybrid_logits", spy)
    lookup_only = engine.drafters.hybrid.HybridRunner._lookup_only

    def deferred(self, n):  # a feed the lookup covered: its root (if any) is the n-gram's
        if n.root_logits is not None:
            seen["ngram"] += int(n.root_logits.shape[0])
        return lookup_only(self, n)

    monkeypatch.setattr(engine.drafters.hybrid.HybridRunner, "_lookup_only", deferred)
    return seen


@pytest.mark.parametrize("method,params", [
    ("sd", {"gamma": 3}),
    ("sd", {"controller": "beta_ts"}),
    ("mcsd", {"k_config": "4x2x2"}),
    ("greedy_drafts", {"k_config": "3x2x2"}),
])
def test_temperature_zero_with_the_hybrid_drafter_equals_greedy_generate(method, params,
                                                                         root_sources):
    pair = tiny_pair(draft="ngram+feature")
    drafted = 0
    for prompt in REPEATING:
        trace = engine.generate(pair, prompt, method, max_new_tokens=24, **params)
        assert list(trace.token_ids) == _ref(pair, prompt, 24), (method, params, prompt)
        drafted += sum(r.drafted for r in trace.rounds)
    assert drafted > 0
    assert root_sources["ngram"] > 0 and root_sources["feature"] > 0, root_sources


def _decisions(trace) -> list:
    """What a run decided, round by round (every field but the timings, the KV path and
    the seconds of each forward: the lazy hybrid runs fewer feature forwards by design)."""
    rounds = [{k: v for k, v in r.items()
               if k not in ("timings", "step_paths", "draft_seconds")}
              for r in trace.to_dict()["rounds"]]
    return [list(trace.token_ids), rounds]


def _same(a, b, path="run") -> None:
    """Equal decisions: equal structure, ids, tokens and statuses; floats (q, laws) equal to
    rounding (the feature runner may feed the same tokens in other batch shapes)."""
    if isinstance(a, float) or isinstance(b, float):
        assert a == pytest.approx(b, rel=1e-4, abs=1e-6), path
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            _same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{path}[{i}]")
    else:
        assert a == b, path


@pytest.mark.parametrize("method,params", [
    ("sd", {"gamma": 4}),
    ("sd", {"controller": "confidence", "confidence": 0.3, "cap": 6}),
    ("mcsd", {"k_config": "3x2x2", "temperature": 1.0, "seed": 3}),
    ("greedy_drafts", {"k_config": "3x2x2"}),
    ("atspeed_strict", {"beams": 2, "draft_beams": 3, "gamma": 2}),
    ("dsbd", {"draft_beams": 3, "gamma": 2, "temperature": 1.0, "seed": 5}),
])
def test_the_lazy_hybrid_decides_as_feeding_both_runners_every_time(method, params,
                                                                    monkeypatch):
    pair = tiny_pair(draft="ngram+feature")
    feeds = {"n": 0}
    plain = engine.drafters.feature.FeatureRunner.feed

    def counted(self, *a, **kw):
        feeds["n"] += 1
        return plain(self, *a, **kw)

    monkeypatch.setattr(engine.drafters.feature.FeatureRunner, "feed", counted)
    runs = {}
    for lazy in (False, True):
        pair.drafter.lazy = lazy
        feeds["n"] = 0
        runs[lazy] = [_decisions(engine.generate(pair, prompt, method, max_new_tokens=20,
                                                 **params)) for prompt in REPEATING]
        runs[lazy, "feeds"] = feeds["n"]
    _same(runs[True], runs[False], f"{method} {params}")
    assert runs[True, "feeds"] < runs[False, "feeds"]  # lookups saved feature forwards


def test_a_round_the_lookup_covers_runs_no_feature_forward():
    pair = tiny_pair(draft="ngram+feature")
    runner = pair.drafter.runner()
    prompt = torch.tensor([[3, 4, 5, 6, 7, 3, 4]])  # "3 4" recurs: 5 6 7 3 4 follow
    runner.start(prompt)
    target = CachedModel(pair.target)
    target.start(prompt)
    root = runner.feed()
    node = runner.feed(torch.tensor([[5]]), torch.tensor([[ROOT]]))  # "4 5" recurs -> 6
    assert runner.feature_feeds == 0 and len(runner.deferred) == 2
    assert support(root.root_logits[0]) == 1 and support(node.node_logits[0, 0]) == 1
    blind = runner.feed(torch.tensor([[9]]), torch.tensor([[0]]))  # "5 9": the features
    assert runner.feature_feeds == 3 and runner.deferred == []  # two deferred, then this one
    assert blind.node_logits.shape == (1, 1, pair.vocab_size)
    runner.commit(torch.tensor([0]), torch.zeros((1, 0), dtype=torch.long),
                  torch.zeros((1, 0), dtype=torch.long), torch.tensor([[5]]),
                  target=target.feed())
    assert runner.deferred == [] and runner.feature.tail.shape == (1, 8)  # unfed tail kept


@pytest.mark.parametrize("method,params", [("sd", {"gamma": 4}),
                                           ("mcsd", {"k_config": "3x2x2"})])
def test_each_drafted_node_records_whether_its_law_was_the_lookups(method, params):
    """NodeTrace.source: "lookup" where the context up to the node's parent (the committed
    text and its drafted ancestors) ends in a recurring suffix, else "feature"; one-source
    drafters record none."""
    pair = tiny_pair(draft="ngram+feature")
    seen = set()
    for prompt in REPEATING:
        trace = engine.generate(pair, prompt, method, max_new_tokens=20, **params)
        done = list(trace.prompt_ids)
        for r in trace.rounds:
            by_id = {n.id: n for n in r.nodes}
            for n in r.nodes:
                if n.status in ("bonus", "resampled"):
                    assert n.source is None
                    continue
                path, at = [], n.parent
                while at != ROOT:
                    path.append(by_id[at].token_id)
                    at = by_id[at].parent
                toks, _ = ngram_law(np.array(done + path[::-1]))
                assert n.source == ("lookup" if toks.size else "feature"), (prompt, r.index)
                seen.add(n.source)
            done += [c.token_id for c in r.committed]
    assert seen == {"lookup", "feature"}
    plain = engine.generate(tiny_pair(draft="ngram"), REPEATING[0], method, max_new_tokens=12,
                            **params)
    assert all(n.source is None for r in plain.rounds for n in r.nodes)


# ------------------------------------------------------- temperature 1: chi-square, end to end

PROMPT = [3, 4, 5, 1, 3, 4, 6, 2, 3, 4]  # as test_ngram_sampling_exactness: "3 4" -> 5 or 6


@pytest.fixture(scope="module")
def pair():
    p = engine.load_pair(target=tiny_model(1, seed=5), draft="ngram+feature", device="cpu")
    p.target.generation_config.eos_token_id = None  # every run yields exactly 3 tokens
    return p


def accept_all_law(pair) -> dict[tuple[int, ...], float]:
    """The law of always accepting the drafts: token i from the hybrid q after prompt + x_<i
    (the lookup where it matches; else, after round 0, the feature drafter with true
    features), x1 from p where the lookup has no match (round 0: the feature drafter is
    blind)."""
    p = position_probs(pair.target, PROMPT)
    law = {}
    for seq, probs in p.items():
        prob = 1.0
        for i in range(NEW):
            ctx = PROMPT + list(seq[:i])
            toks, q = ngram_law(np.array(ctx))
            if toks.size:
                prob *= dict(zip(toks.tolist(), q.tolist())).get(seq[i], 0.0)
            elif i == 0:
                prob *= probs[0]
            else:
                logits = pair.drafter.feature.context_logits(torch.tensor([ctx]))[0, -1]
                prob *= float(torch.softmax(logits.double(), -1)[seq[i]])
        law[seq] = prob
    return law


@pytest.mark.slow
def test_sd_with_the_hybrid_drafter_keeps_the_target_law(pair, stats_summary):
    law = exact_law(pair.target, prompt=PROMPT)
    n, note = exactness_size(law, accept_all_law(pair))
    stats_summary.append(f"sd gamma 2 with the ngram+feature drafter: {note}")
    counts = sample_counts(pair, "sd", {"gamma": 2}, range(n), prompt=PROMPT)
    stat, threshold = chi_square(counts, law, n)
    assert stat < threshold, (n, stat, threshold)


def test_the_hybrid_feature_layer_runs_through_packed_weights_on_cpu(monkeypatch):
    """load_pair prepares the hybrid's feature drafter as it does a plain drafter's model (a
    model this small is packed only with the size floor lowered)."""
    from torch import nn

    import engine.kernels.layout as layout
    from engine.kernels.layout import SMALL_ROWS, _can_pack, layout_for, packed_active

    if not _can_pack():
        pytest.skip("this torch has no oneDNN")
    monkeypatch.setattr(layout, "PACK_MIN_BYTES", 0)
    pair = engine.load_pair(target=tiny_model(1, seed=5), draft="ngram+feature", device="cpu")
    model = pair.drafter.feature.model
    layer = [m for m in model.modules() if type(m) is nn.Linear]
    assert layer
    with layout_for(model, SMALL_ROWS):  # packed at every machine's rule
        assert all(packed_active(m) for m in layer)


def test_the_lookup_says_whether_a_root_recurs_before_the_rounds_first_feed():
    """NGramRunner.root_has says before the feed whether the root's suffix recurs (the cost
    switch's context), the round's first feed returns the law a fresh runner reads there,
    and after a commit it answers for the new root."""
    pair = tiny_pair(draft="ngram+feature")
    runner, target = pair.drafter.runner(), CachedModel(pair.target)
    prompt = torch.tensor([[3, 4, 5, 6, 3, 4]])  # "3 4" recurs
    runner.start(prompt)
    target.start(prompt)
    assert runner.ngram.root_has() == [True] and runner.root_lookup()
    fresh = pair.drafter.ngram.runner()
    fresh.start(prompt)
    torch.testing.assert_close(runner.feed().root_logits, fresh.feed().root_logits)
    runner.commit(torch.tensor([0]), torch.zeros((1, 0), dtype=torch.long),
                  torch.zeros((1, 0), dtype=torch.long), torch.tensor([[9]]),
                  target=target.feed())
    assert runner.ngram.root_has() == [False] and not runner.root_lookup()  # "4 9" is new


@pytest.mark.parametrize("method,params", [("sd", {"gamma": 4}), ("mcsd", {"k_config": "2x2"})])
def test_the_cost_switch_plans_each_round_in_its_roots_context(method, params):
    """With the hybrid drafter the switch's plan names the round's context: "lookup" where
    the committed tokens end in a recurring suffix (the round's root takes the lookup's
    law), else "feature"; a drafted round's first node came from that context's law, and
    the tokens are greedy generate()'s."""
    pair = tiny_pair(draft="ngram+feature")
    seen, drafted = set(), set()
    for prompt in REPEATING:
        trace = engine.generate(pair, prompt, method, max_new_tokens=20, switch="cost",
                                costs=MIXED.name, **params)  # both plain and drafted rounds
        assert list(trace.token_ids) == _ref(pair, prompt, 20), (method, prompt)
        done = list(trace.prompt_ids)
        for r in trace.rounds:
            if r.switch is not None and not r.switch.never:
                toks, _ = ngram_law(np.array(done))
                want = "lookup" if toks.size else "feature"
                assert r.switch.context == want, (prompt, r.index)
                firsts = [n.source for n in r.nodes if n.parent == ROOT and n.source]
                assert all(s == want for s in firsts), (prompt, r.index)
                seen.add(want)
                if firsts:
                    drafted.add(want)
            done += [c.token_id for c in r.committed]
    assert seen == drafted == {"lookup", "feature"}  # both contexts drafted


def test_where_only_the_lookups_calls_can_pay_the_run_drafts_its_lookups_rounds_alone():
    """A profile whose model draft calls lose even at acceptance 1 plans the feature
    context's rounds plain for good, but the lookup's calls (c_lookup) can pay: the run
    starts its drafter, its lookup rounds draft, no feature round does, and the tokens are
    greedy generate()'s."""
    pair = tiny_pair(draft="ngram+feature")
    contexts = collections.Counter()
    for prompt in REPEATING:
        trace = engine.generate(pair, prompt, "sd", max_new_tokens=20, switch="cost",
                                costs=LOOKUP_ONLY.name, gamma=4)
        assert list(trace.token_ids) == _ref(pair, prompt, 20), prompt
        for r in trace.rounds:
            if r.switch is not None:
                kind = "never" if r.switch.never else "drafted" if r.drafted else "plain"
                contexts[(r.switch.context, kind)] += 1
    assert contexts[("lookup", "drafted")] > 0 and contexts[("feature", "never")] > 0
    assert contexts[("feature", "drafted")] == contexts[("feature", "plain")] == 0


def test_only_a_drafter_with_a_lookup_prices_a_lookup_call():
    """The hybrid times a call its lookup covers (no feature forward: the feature runner is
    never fed); a drafter of one source has no lookup to price."""
    pair = tiny_pair(draft="ngram+feature")
    fed = []
    pair.drafter.feature.runner = lambda: fed.append(1)  # any feature runner would show
    seconds = pair.drafter.lookup_call_s([3, 4, 5, 6, 7, 8, 9, 10, 11, 12])
    assert 0 < seconds < 0.5 and not fed
    assert tiny_pair(draft="ngram").drafter.lookup_call_s([3, 4, 5]) is None
    assert tiny_pair().drafter.lookup_call_s([3, 4, 5]) is None


def test_a_measured_profile_of_the_hybrid_prices_its_lookup_calls():
    """The switch's measured profile holds c_lookup for a drafter with a lookup (a covered
    call, far cheaper than a feature draft call) and none for a drafter of one source."""
    hybrid = tiny_pair(draft="ngram+feature")
    engine.generate(hybrid, REPEATING[0], "sd", max_new_tokens=4, switch="cost")
    (profile,) = hybrid.calibration.profiles.values()
    assert profile.c_lookup is not None and 0 < profile.c_lookup
    single = tiny_pair()
    engine.generate(single, REPEATING[0], "sd", max_new_tokens=4, switch="cost")
    (profile,) = single.calibration.profiles.values()
    assert profile.c_lookup is None


def test_the_hybrids_warm_up_makes_its_feature_drafters_steps_the_lookup_runs_none(
        monkeypatch):
    from engine.drafters.feature import FeatureRunner
    from engine.execution.cached_model import warm_shapes

    monkeypatch.setenv("SPECVIZ_KV", "compiled")
    pair = tiny_pair(draft="ngram+feature")
    runner = pair.drafter.warm_runner()
    assert isinstance(runner, FeatureRunner) and runner.model is pair.drafter.feature.model
    assert runner.mode == "compiled" and warm_shapes(runner) == 8  # 4 at 1 row, 4 at 4
