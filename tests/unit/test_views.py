"""Figure builders, text view and round panel as pure functions of recorded traces."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from engine.contract.records import (
    ControllerState,
    CostRecord,
    DepthPosteriorState,
    GateRecord,
    OptimalRecord,
    ProjectionRecord,
    RoundExtras,
    RunSummary,
    SwitchOption,
    SwitchPlan,
    WidthDecision,
)
from engine.contract.trace import (
    STATUSES,
    BeamStep,
    BeamTrace,
    CommittedToken,
    DraftMatch,
    NodeTrace,
    RoundTrace,
    RunTrace,
    TargetBeam,
    TestRecord,
)
from engine.core.errors import ConfigError
from specviz import charts, forest_view, round_panel, text_view
from specviz.render import OUTPUTS, render
from specviz.state import DEMO_TRACE, SessionState, demo_state


def _node(i, parent, depth, text, status, tree=0, p=0.5, q=0.25):
    return NodeTrace(i, parent, tree, depth, 100 + i, text, q, p, status)


def _tree_round() -> RoundTrace:
    """A 2-level tree: a accepted, b rejected, c skipped; a's kids: d rejected, e resampled
    (pseudo node), f not_reached below b, g auto_rejected below b."""
    nodes = (
        _node(0, -1, 1, " a", "rejected"),
        _node(1, -1, 1, " b", "accepted"),
        _node(2, -1, 1, " c", "skipped"),
        _node(3, 1, 2, " d", "rejected"),
        _node(4, 0, 2, "\n", "not_reached", p=None),
        _node(5, 0, 2, " g", "auto_rejected"),
        _node(6, 1, 2, " e", "resampled", q=None),
    )
    tests = (
        TestRecord(0, 0, 1, 100, 0.1, 0.4, 0.25, 0.9, "reject", 0.75),
        TestRecord(1, 0, 1, 101, 0.6, 0.3, 1.0, 0.2, "accept"),
        TestRecord(3, 0, 2, 103, 0.05, 0.5, 0.1, 0.7, "reject", 0.95, "residual"),
    )
    committed = (CommittedToken(101, " b", "accepted", 0, 1),
                 CommittedToken(106, " e", "resampled", 0, -1))
    controller = ControllerState(
        kind="beta_ts", before={"alpha": 2.0, "beta": 3.0},
        steps=({"step": 1, "theta": 0.7, "uniform": 0.2, "continue": True},
               {"step": 2, "theta": 0.3, "uniform": 0.5, "continue": False}),
        after={"alpha": 3.0, "beta": 4.0})
    return RoundTrace(index=0, nodes=nodes, tests=tests, committed=committed, drafted=2,
                      accepted=1, target_calls=1, draft_calls=2,
                      timings={"propose": 0.01, "score": 0.02, "verify": 0.001,
                               "commit": 0.002},
                      controller=controller,
                      extras=RoundExtras(width=(WidthDecision(chosen=2, w_tilde=2),),
                                         optimal=(OptimalRecord(alpha_star=0.8, achieved=0.6,
                                                                expected=0.7),)))


def _beam_round() -> RoundTrace:
    """Two beams, one node each with the same id (ids are unique per tree only)."""
    nodes = (_node(7, -1, 1, " x", "accepted", tree=0),
             NodeTrace(7, -1, 1, 1, 108, " y", 0.25, 0.5, "bonus"))
    before = (BeamTrace((101,), -0.5), BeamTrace((106,), -0.9))
    after = (BeamTrace((101, 107), -0.7), BeamTrace((106, 108), -1.2, True))
    return RoundTrace(index=1, nodes=nodes, beams_before=before, beams_after=after,
                      committed=(CommittedToken(107, " x", "accepted", 0, 7),),
                      drafted=1, accepted=1, target_calls=1, draft_calls=1,
                      timings={"propose": 0.02, "score": 0.03})


def _baseline_round() -> RoundTrace:
    return RoundTrace(index=2, committed=(CommittedToken(7, "!", "target"),), target_calls=1,
                      timings={"score": 0.01})


@pytest.fixture
def trace() -> RunTrace:
    rounds = (_tree_round(), _beam_round(), _baseline_round())
    return RunTrace(method="mcsd", params={"k_config": "3x2"}, target="t", draft="d",
                    device="cpu", prompt="Hi", prompt_ids=(5, 6), rounds=rounds,
                    token_ids=(101, 106, 107, 7), text=" b e x!", beams=(), stats=RunSummary(),
                    token_origins=("accepted", "resampled", "accepted", "target"),
                    token_rounds=(0, 0, 1, 2), prompt_text=("H", "i"))


def _by_name(fig, name):
    return next(t for t in fig.data if t.name == name)


def test_tidy_layout_centres_parents_over_children_and_puts_trees_side_by_side(trace):
    g = forest_view.forest_graph(trace.rounds[0])
    pos = forest_view.tidy_layout(g)
    assert pos[("n", 0, 1)][0] == (pos[("n", 0, 3)][0] + pos[("n", 0, 6)][0]) / 2
    assert pos[("root", 0)][0] == (pos[("n", 0, 0)][0] + pos[("n", 0, 2)][0]) / 2
    assert pos[("n", 0, 3)][1] == -2
    beams = forest_view.tidy_layout(forest_view.forest_graph(trace.rounds[1]))
    assert beams[("root", 1)][0] > beams[("n", 0, 7)][0]
    assert beams[("n", 1, 7)][0] == beams[("root", 1)][0]


def test_forest_figure_colours_every_status_with_a_legend_entry(trace):
    fig = forest_view.forest_figure(trace, 0)
    names = {t.name for t in fig.data}
    assert set(STATUSES) <= names
    rejected = _by_name(fig, "rejected")
    assert rejected.marker.color == forest_view.STATUS_COLORS["rejected"]
    assert list(rejected.text) == ["␣a", "␣d"]
    assert fig.layout.height == forest_view.HEIGHT


def test_forest_hover_joins_node_with_its_test_record(trace):
    fig = forest_view.forest_figure(trace, 0)
    hover = _by_name(fig, "rejected").hovertext[1]
    for part in ("p (target) = 0.5", "q (draft) = 0.25", "min(1, p/q) = 0.1", "u = 0.7",
                 "decision: <b>reject</b>", "residual mass = 0.95", "(residual)"):
        assert part in hover
    assert "not tested" in _by_name(fig, "skipped").hovertext[0]


def test_committed_path_highlights_accepted_and_resampled_edges(trace):
    path = _by_name(forest_view.forest_figure(trace, 0), "committed path")
    xs = [x for x in path.x if x is not None]
    assert len(xs) == 4  # root -> b, b -> e


def test_baseline_round_draws_target_tokens_with_a_note(trace):
    fig = forest_view.forest_figure(trace, 2)
    assert list(_by_name(fig, "target").text) == ["!"]
    assert "no draft forest" in fig.layout.title.text


def test_big_forest_folds_not_reached_subtrees_and_hides_labels():
    nodes = [_node(0, -1, 1, "r", "rejected")]
    for i in range(1, 600):  # a chain of not_reached nodes hanging below the rejected one
        nodes.append(_node(i, i - 1, i + 1, "z", "not_reached"))
    nodes += [_node(600 + i, -1, 1, "s", "skipped") for i in range(100)]
    r = RoundTrace(index=0, nodes=tuple(nodes))
    t = RunTrace("sd", {}, "t", "d", "cpu", "", (), (r,), (), "", (), RunSummary())
    fig = forest_view.forest_figure(t, 0)
    shown = sum(len([x for x in tr.x if x is not None]) for tr in fig.data
                if tr.name in STATUSES)
    assert shown <= forest_view.NODE_LIMIT
    assert "598 nodes below not_reached nodes folded" in fig.layout.title.text
    assert "labels of skipped / not_reached nodes hidden" in fig.layout.title.text
    assert _by_name(fig, "rejected").mode == "markers+text"
    assert _by_name(fig, "skipped").mode == "markers"


def test_text_segments_colour_tokens_by_origin_and_map_clicks_to_rounds(trace):
    segs = text_view.segments(trace)
    assert segs == [("H", "prompt"), ("i", "prompt"), (" b", "accepted"), (" e", "resampled"),
                    (" x", "accepted"), ("!", "target")]
    assert text_view.round_at(trace, 4) == 1
    assert text_view.round_at(trace, 1) is None
    assert text_view.round_at(trace, 5) == 2


def test_long_prompts_keep_their_tail_and_click_indices_follow():
    t = RunTrace("sd", {}, "t", "d", "cpu", "", tuple(range(30)), (), (9,), "", (), RunSummary(),
                 token_origins=("target",), token_rounds=(0,),
                 prompt_text=tuple(str(i) for i in range(30)))
    segs = text_view.segments(t, max_prompt=5)
    assert segs[0] == ("… (25 prompt tokens before) ", None) and segs[1] == ("25", "prompt")
    assert text_view.round_at(t, 6, max_prompt=5) == 0


def test_verification_table_lists_tests_in_order(trace):
    rows = round_panel.test_rows(trace, 0)
    assert [r[4] for r in rows] == ["␣a", "␣b", "␣d"]
    assert rows[0][5:11] == ["0.1", "0.4", "0.25", "0.9", "reject", "0.75"]
    assert rows[1][10] == "—"


def test_beam_table_shows_sets_before_and_after_with_scores(trace):
    rows = round_panel.beam_rows(trace, 1)
    assert [r[:4] for r in rows] == [["before", "0", "-0.5", ""], ["before", "1", "-0.9", ""],
                                     ["after", "0", "-0.7", ""], ["after", "1", "-1.2", "yes"]]
    assert rows[2][4] == " b x"
    assert round_panel.beam_rows(trace, 0) == []


def test_extras_show_width_decision_and_optimal_next_to_achieved(trace):
    md = round_panel.extras_markdown(trace, 0)
    assert ("**Width decision** (`width`, DSBD Eq. 5-7)\n\n| chosen | w_tilde |\n|---|---|\n"
            "| 2 | 2 |") in md
    assert "| 0 | 0.8 | 0.6 | 0.7 |" in md
    assert "`beta_ts`" in md
    assert round_panel.extras_markdown(trace, 2) == ""


def test_lists_of_records_in_extras_become_tables():
    r = RoundTrace(0, extras=RoundExtras(
        width=(WidthDecision(depth=1, alphas=(0.98, 0.41), chosen=2),),
        steps=({"depth": 1, "accepted": True, "nested": {"a": 1}},)))
    t = RunTrace("dsbd", {}, "t", "d", "cpu", "", (), (r,), (), "", (), RunSummary())
    md = round_panel.extras_markdown(t, 0)
    assert "| depth | alphas | chosen |\n|---|---|---|\n| 1 | [0.98, 0.41] | 2 |" in md
    assert "**steps**\n\n| depth | accepted | nested |" in md and "| 1 | True | {1 key} |" in md


def test_progress_figure_has_per_round_and_cumulative_series(trace):
    fig = charts.progress_figure(trace, 1)
    assert list(_by_name(fig, "per round").y) == [0.5, 1.0, None]
    assert list(_by_name(fig, "cumulative").y) == [0.5, 2 / 3, 2 / 3]
    assert list(_by_name(fig, "drafted (path length)").y) == [2, 1, 0]
    assert list(_by_name(fig, "cumulative tau").y) == [2.0, 1.5, 4 / 3]
    assert fig.layout.shapes[0].x0 == 1  # selected round marker


def test_posterior_figure_draws_beta_density_and_sampled_thetas(trace):
    fig = charts.posterior_figure(trace, 0)
    curve = _by_name(fig, "round 0: Beta(2, 3)")
    assert max(curve.y) == pytest.approx(1.7777, abs=2e-3)  # mode 1/3: 12 x (1-x)^2
    assert list(_by_name(fig, "sampled theta: continue").x) == [0.7]
    assert list(_by_name(fig, "sampled theta: stop").x) == [0.3]
    assert _by_name(fig, "after: Beta(3, 4)")


def test_posterior_figure_draws_gaussian_for_cali_ts():
    ctl = ControllerState(
        kind="cali_ts", before={"sigma": 0.2},
        steps=({"step": 1, "mu": 0.5, "sigma": 0.2, "theta": 0.4, "continue": True,
                "theta_M": 0.62},
               {"step": 2, "mu": 0.3, "sigma": 0.2, "theta": 0.1, "continue": False,
                "theta_M": 0.35}))
    t = RunTrace("sd", {}, "t", "d", "cpu", "", (), (RoundTrace(0, controller=ctl),), (), "",
                 (), RunSummary())
    fig = charts.posterior_figure(t, 0)
    curve = next(tr for tr in fig.data if tr.name.startswith("round 0: N(0.5"))
    assert max(curve.y) == pytest.approx(1.9947, abs=1e-3)
    assert list(_by_name(fig, "predictor theta_M").x) == [0.62, 0.35]


def test_posterior_figure_shows_the_confidence_controllers_q_per_step():
    ctl = ControllerState(
        kind="confidence", before={"threshold": 0.5},
        steps=({"step": 1, "theta": None, "uniform": None, "q": 0.93, "continue": True},
               {"step": 2, "theta": None, "uniform": None, "q": 0.31, "continue": False}))
    t = RunTrace("sd", {}, "t", "d", "cpu", "", (), (RoundTrace(0, controller=ctl),), (), "",
                 (), RunSummary())
    fig = charts.posterior_figure(t, 0)
    bars = _by_name(fig, "q of the newest draft")
    assert list(bars.y) == [0.93, 0.31] and list(bars.x) == [1, 2]
    assert fig.layout.shapes[0].y0 == 0.5  # the threshold line
    assert "confidence controller, round 0" in fig.layout.title.text
    assert charts.has_controller_panel(t)


def test_the_controller_panel_hides_when_no_controller_has_a_chart(trace):
    """Issue 57 (12): a fixed length (or no controller) has no chart: the panel hides."""
    fixed = ControllerState(kind="fixed", before={"length": 4})
    t = RunTrace("sd", {}, "t", "d", "cpu", "", (), (RoundTrace(0, controller=fixed),
                                                     _baseline_round()), (), "", (),
                 RunSummary())
    assert not charts.has_controller_panel(t) and not charts.has_controller_panel(None)
    assert charts.has_controller_panel(trace)  # a Beta-TS round
    from specviz.render import views
    assert views(SessionState(t))["posterior_visible"] is False


def test_the_round_header_times_each_draft_call_where_the_trace_has_them(trace):
    assert "draft calls 2 · propose 10.0 ms" in round_panel.round_markdown(trace, 0)  # untimed
    timed = replace(trace, rounds=(replace(trace.rounds[0], draft_seconds=(0.0018, 0.0014)),)
                    + trace.rounds[1:])
    assert "draft calls 2 (1.8, 1.4 ms) · propose 10.0 ms" in \
        round_panel.round_markdown(timed, 0)


def test_posterior_figure_explains_when_no_controller_ran(trace):
    fig = charts.posterior_figure(RunTrace("sd", {}, "t", "d", "cpu", "", (),
                                           (_baseline_round(),), (), "", (), RunSummary()), 0)
    assert "no draft-length controller" in fig.layout.annotations[0].text


def test_timeline_lays_rounds_end_to_end_per_phase(trace):
    fig = charts.timeline_figure([("mcsd", trace)])
    score = _by_name(fig, "target forward (score)")
    assert list(score.base) == pytest.approx([10.0, 53.0, 83.0])
    assert list(score.x) == pytest.approx([20.0, 30.0, 10.0])


def test_every_view_renders_every_round_of_the_demo_trace():
    state = demo_state()
    assert DEMO_TRACE.exists() and state.n_rounds > 5
    assert len(DEMO_TRACE.read_bytes()) < 400_000
    for i in range(state.n_rounds):
        out = render(state.at(i))
        assert len(out) == len(OUTPUTS)
    data = json.loads(DEMO_TRACE.read_text())
    again = json.loads(RunTrace.from_dict(data).to_json())
    for r in again["rounds"]:  # recorded before nodes named their source, before a
        # dynamic tree's drafted_nodes and before draft calls were timed: null / (), as read
        for n in r["nodes"]:
            assert n.pop("source") is None
        assert r["extras"].pop("drafted_nodes") is None
        assert r.pop("draft_seconds") == []
    assert again == data


def test_the_demo_trace_shows_the_default_drafter_accepted_and_rejected_in_a_forest():
    from engine.drafters.ngram import NGramDrafter
    from engine.run.specs import EMBEDDED_DEFAULT_DRAFT

    trace = demo_state().trace
    # the app opens on its embedded pair: re-record the demo when that default changes
    assert EMBEDDED_DEFAULT_DRAFT == "ngram+feature"
    assert trace.draft.startswith(NGramDrafter(1).name + " + feature (EAGLE-style, 1 layer, "
                                  "trained")
    statuses = {n.status for r in trace.rounds for n in r.nodes}
    assert {"accepted", "rejected"} <= statuses
    roots = [sum(n.parent == -1 for n in r.nodes if n.q is not None) for r in trace.rounds]
    assert max(roots) >= 2  # some round drafts more than one candidate at its root


def test_the_run_summary_labels_the_parameters_taken_from_the_pairs_tuned_settings():
    t = RunTrace("sd", {"gamma": 2, "seed": 0}, "t", "d", "cpu", "", (), (), (), "", (),
                 RunSummary(), tuned_names=("gamma",))
    assert "**sd** (gamma=2 (tuned), seed=0)" in round_panel.run_markdown(t)


def test_empty_state_renders_placeholders():
    out = dict(zip(OUTPUTS, render(SessionState())))
    assert out["text"] == []
    assert "No trace yet" in out["round_md"]
    assert "Run a method" in json.loads(out["forest"].plot)["layout"]["annotations"][0]["text"]


def test_navigation_reuses_the_whole_trace_views_and_moves_only_the_marker(monkeypatch):
    from specviz import charts, text_view

    state = demo_state()
    first = dict(zip(OUTPUTS, render(state.at(1))))
    calls = []
    monkeypatch.setattr(charts, "progress_figure", lambda *a: calls.append("progress"))
    monkeypatch.setattr(text_view, "segments", lambda *a: calls.append("text"))
    again = dict(zip(OUTPUTS, render(state.at(4))))
    assert calls == []  # built once per trace, not per navigation event
    assert again["text"] == first["text"]
    marks = [sh["x0"] for sh in json.loads(again["progress"].plot)["layout"]["shapes"]]
    assert marks and set(marks) == {4}
    before = json.loads(first["progress"].plot)
    assert json.loads(again["progress"].plot)["data"] == before["data"]


def test_run_summary_states_the_cost_model_with_each_figure_under_its_own_name():
    """The chain's per-token alpha is not the run's acceptance, and the round-time speedup is
    not Compare's measured one: the sentence names them apart and says what it averages."""
    from specviz import round_panel

    cost = CostRecord(kind="chain", c_draft=0.2, c_verify=1.2, gamma=2.0, acceptance=0.5,
                      break_even_acceptance=0.45, predicted_speedup=1.1, measured_speedup=1.0,
                      efficiency=1.0 / 1.1, rounds_used=7)
    assert round_panel.cost_markdown(cost) == (
        "\n\n**Cost model**: over rounds 1..7 (round 0, which also prefills the prompt, left "
        "out): draft steps cost 0.20 of a target step and verifying 1.20; at 2.0 drafts per "
        "round break-even needs per-token α 0.45; this run's per-token α 0.50 (accepted / "
        "tested drafts; the acceptance, accepted / drafted, also counts the drafts after a "
        "rejection, never tested) · predicted 1.10x, round-time 1.00x (tokens × a plain "
        "step's time / the rounds' time; efficiency 91% = round-time / predicted).")
    assert "measured" not in round_panel.cost_markdown(cost)
    assert round_panel.cost_markdown(None) == "" == round_panel.cost_markdown(CostRecord())


def test_session_state_is_json_round_trippable():
    state = demo_state().at(3)
    again = SessionState.from_json(state.to_json())
    assert again == state and again.round == 3
    assert state.at(10_000).round == state.n_rounds - 1 and state.at(-5).round == 0


def test_compare_plan_runs_each_decode_once_with_plain_decodes_and_baseline():
    from specviz import compare

    common = {"max_new_tokens": 8, "temperature": 0.0, "seed": 0}
    jobs, refs = compare.plan(["sd", "greedy", "atspeed_strict"], common)
    labels = [j.label for j in jobs]
    assert labels == ["sd", "greedy", "atspeed_strict", "beam"]
    assert [j.role for j in jobs] == ["chosen", "chosen, plain decode", "chosen",
                                      "plain decode, baseline"]
    assert jobs[3].own_params == "beams=4"
    assert refs["sd"] == refs["greedy"] == jobs[1].key and refs["atspeed_strict"] == jobs[3].key
    sampled, refs = compare.plan(["sd"], {**common, "temperature": 0.8})
    assert [(j.label, j.role) for j in sampled] == [("sd", "chosen"), ("sample", "plain decode")]
    assert refs == {"sd": sampled[1].key}  # no beam method ticked: no beam baseline
    narrow_beam, _ = compare.plan(["dsbd:draft_beams=2"], {**common, "temperature": 0.8})
    assert "baseline" in narrow_beam[-1].role and narrow_beam[-1].method == "beam"
    variants, refs = compare.plan(["sd", "sd:gamma=1", "sd:gamma=4"], common)
    labels = [j.label for j in variants]
    assert labels[:2] == ["sd = sd:gamma=4", "sd:gamma=1"]  # gamma=4 is sd's default: the
    # same decode, run once, its row under both entries' names and measured against their
    # plain decode
    assert compare._ref_key(variants[0], refs) == refs["sd"] == refs["sd:gamma=4"] is not None
    assert refs["sd:gamma=1"] == refs["sd"] and dict(variants[1].params)["gamma"] == 1
    narrow, refs = compare.plan(["atspeed_strict:beams=2"], common)
    assert dict(narrow[1].params)["beams"] == 2  # the plain decode has the run's own width
    with pytest.raises(ConfigError, match="unknown method 'nope'"):
        compare.plan(["nope:x=1"], common)


def test_a_live_render_updates_only_the_cheap_views():
    import gradio as gr

    from specviz.render import LIVE, render_live

    state = demo_state().at(2)
    out = dict(zip(OUTPUTS, render_live(state, forest=False)))
    skipped = {k for k, v in out.items() if isinstance(v, type(gr.skip()))
               and v == gr.skip()}
    assert skipped == set(OUTPUTS) - set(LIVE)
    assert out["round_md"].startswith("**Round 2**")
    with_forest = dict(zip(OUTPUTS, render_live(state, forest=True)))
    assert json.loads(with_forest["forest"].plot)["data"]  # the newest round's forest


def test_live_renders_are_spaced_by_their_own_cost(monkeypatch):
    from specviz import callbacks

    now = [100.0]
    monkeypatch.setattr(callbacks.time, "monotonic", lambda: now[0])
    pace = callbacks.LivePace()
    assert pace.due() and pace.forest_due() and not pace.forest_due()
    pace.spent(0.3)  # a 300 ms render may come back only after 0.3 / DUTY seconds
    now[0] += 0.3 / callbacks.LivePace.DUTY - 0.01
    assert not pace.due()
    now[0] += 0.02
    assert pace.due() and pace.forest_due()
    pace.spent(0.001)  # cheap renders still wait MIN_GAP_S
    now[0] += callbacks.LivePace.MIN_GAP_S / 2
    assert not pace.due()


# ------------------------------------------------------------------ beam match (K = 2, N = 3)


def _strict_trace() -> RunTrace:
    """atspeed_strict, K = 2 trees, N = 3 drafts per depth: step 1 passes (target #1 = x at
    tree 0, #2 = z at tree 1, y not in the top-K); step 2 stops: target #2 ' z q' was not
    drafted (u is #1; v and w are not in the top-K)."""
    nodes = (NodeTrace(0, -1, 0, 1, 110, " x", 0.5, 0.6, "accepted"),
             NodeTrace(1, -1, 0, 1, 111, " y", 0.2, 0.1, "rejected"),
             NodeTrace(0, -1, 1, 1, 112, " z", 0.3, 0.3, "accepted"),
             NodeTrace(2, 0, 0, 2, 113, " u", 0.4, 0.5, "accepted"),
             NodeTrace(1, 0, 1, 2, 114, " v", 0.3, 0.2, "rejected"),
             NodeTrace(3, 0, 0, 2, 115, " w", 0.2, 0.1, "rejected"))
    steps = (
        BeamStep(1, "drafted", (TargetBeam(1, 0, -1, 110, " x", -0.5, 0),
                                TargetBeam(2, 1, -1, 112, " z", -0.75, 0)),
                 (DraftMatch(0, 0, 1, -0.5), DraftMatch(0, 1, 0, -2.0),
                  DraftMatch(1, 0, 2, -0.75)), True, "all 2 target beams were drafted"),
        BeamStep(2, "drafted", (TargetBeam(1, 0, 0, 113, " x u", -0.9, 2),
                                TargetBeam(2, 1, 0, 116, " z q", -1.1)),
                 (DraftMatch(0, 2, 1, -0.9), DraftMatch(1, 1, 0, -1.4),
                  DraftMatch(0, 3, 0, None)), False,
                 "target beam #2 ' z q' (score -1.10) was not drafted"),
    )
    before = (BeamTrace((101,), -0.2), BeamTrace((106,), -0.4))
    r = RoundTrace(index=0, nodes=nodes, beams_before=before, beams_after=before, drafted=2,
                   accepted=1, target_calls=1, draft_calls=2, beam_steps=steps)
    return RunTrace("atspeed_strict", {"beams": 2}, "t", "d", "cpu", "", (), (r,), (), "",
                    (), RunSummary())


def test_forest_rings_drafted_beams_in_the_target_top_k_with_their_rank():
    fig = forest_view.forest_figure(_strict_trace(), 0)
    ring = _by_name(fig, "ring: in target's top-K (#rank)")
    assert list(ring.text) == ["#1", "#2", "#1"]  # x (tree 0), z (tree 1), u (step 2)
    assert ring.marker.symbol == "circle-open" and ring.marker.color == forest_view.IN_TOP_K
    pos = forest_view.tidy_layout(forest_view.forest_graph(_strict_trace().rounds[0]))
    assert list(zip(ring.x, ring.y)) == [pos[("n", 0, 0)], pos[("n", 1, 0)], pos[("n", 0, 2)]]


def test_forest_rings_drafted_beams_outside_the_top_k_differently():
    fig = forest_view.forest_figure(_strict_trace(), 0)
    ring = _by_name(fig, "ring: drafted, not in target's top-K")
    assert len(ring.x) == 3  # y, w (tree 0), v (tree 1)
    assert ring.marker.symbol == "square-open" and ring.marker.color == forest_view.NOT_IN_TOP_K
    assert ring.hoverinfo == "skip"


def test_forest_hover_says_where_the_target_ranks_a_drafted_beam():
    fig = forest_view.forest_figure(_strict_trace(), 0)
    hovers = list(_by_name(fig, "accepted").hovertext) + list(_by_name(fig, "rejected").hovertext)
    assert any("<b>target top-K #2</b> (target score -0.75)" in h for h in hovers)
    assert any("<b>not in the target's top-K</b> (target score -2)" in h for h in hovers)
    assert any("(its parent is not a target beam)" in h for h in hovers)


def test_forests_without_beam_steps_have_no_rings(trace):
    names = {t.name for t in forest_view.forest_figure(trace, 1).data}
    assert not any(n.startswith("ring:") for n in names)


def test_beam_match_table_lists_each_steps_target_top_k_drafted_and_the_reason():
    rows = round_panel.beam_match_rows(_strict_trace(), 0)
    assert [[r[h] for h in round_panel.MATCH_HEADERS] for r in rows] == [
        ["1", "#1", "' x'", "-0.5", "yes (beam 0, node 0)", "yes", "2/3",
         "all 2 target beams were drafted"],
        ["", "#2", "' z'", "-0.75", "yes (beam 1, node 0)", "yes", "", ""],
        ["2", "#1", "' x u'", "-0.9", "yes (beam 0, node 2)", "no", "1/3",
         "target beam #2 ' z q' (score -1.10) was not drafted"],
        ["", "#2", "' z q'", "-1.1", "no", "no", "", ""],
    ]


def test_beam_match_table_leads_the_round_extras_and_is_absent_elsewhere(trace):
    md = round_panel.extras_markdown(_strict_trace(), 0)
    assert md.startswith("**Beam match**")
    assert ("| 2 | #1 | ' x u' | -0.9 | yes (beam 0, node 2) | no | 1/3 | target beam #2 ' z q' "
            "(score -1.10) was not drafted |") in md
    assert md.endswith("\n|  | #2 | ' z q' | -1.1 | no | no |  |  |")
    assert "Beam match" not in round_panel.extras_markdown(trace, 0)


def test_the_draft_gate_says_why_a_beam_round_drafted_or_not():
    said = {}
    for drafted, least in ((True, 0.62), (False, 0.12)):
        gate = GateRecord(threshold=0.3, confidence=least, drafted=drafted)
        r = RoundTrace(0, extras=RoundExtras(gate=gate))
        t = RunTrace("atspeed_strict", {}, "t", "d", "cpu", "", (), (r,), (), "", (), RunSummary())
        said[drafted] = round_panel.extras_markdown(t, 0)
    assert said[True] == ("**Draft gate**: drafted: every live beam's likeliest draftable "
                          "token has q >= 0.3 (least 0.62)")
    assert said[False].startswith("**Draft gate**: not drafted: a live beam's likeliest "
                                  "draftable token has q = 0.12 < 0.3")
    no_step = RoundTrace(0, extras=RoundExtras(gate=GateRecord(threshold=0.3, confidence=None,
                                                               drafted=False)))
    t = RunTrace("atspeed_strict", {}, "t", "d", "cpu", "", (), (no_step,), (), "", (),
                 RunSummary())
    assert round_panel.extras_markdown(t, 0) == ""  # no draft step fitted: nothing to say


def test_sampling_beam_steps_show_the_target_law_next_to_the_score():
    t = _strict_trace()
    step = BeamStep(1, "bonus", (TargetBeam(1, 0, -1, 110, " x", -0.5, -1, 0.25),),
                    reason="bonus layer: every drafted layer passed; 1 beams drawn")
    r = RoundTrace(index=0, beam_steps=(step,))
    rows = round_panel.beam_match_rows(RunTrace(**{**t.__dict__, "rounds": (r,)}), 0)
    assert rows == [{"step": "1", "target beam": "#1", "text": "' x'",
                     "score": "-0.5 (p 0.25)", "drafted?": "no", "accepted?": "bonus",
                     "drafts in top-K": "—", "reason": step.reason}]


def test_render_shows_the_rings_and_the_beam_match_table():
    out = dict(zip(OUTPUTS, render(SessionState(trace=_strict_trace()))))
    assert "ring: in target's top-K (#rank)" in out["forest"].plot
    assert "**Beam match**" in out["extras"] and "was not drafted" in out["extras"]


def test_the_app_opens_the_demo_at_its_first_most_accepted_round_with_the_largest_forest():
    state = demo_state()
    rounds = state.trace.rounds
    best = max(r.accepted for r in rounds)
    widest = max(len(r.nodes) for r in rounds if r.accepted == best)
    opened = rounds[state.round]
    assert opened.accepted == best and len(opened.nodes) == widest
    assert all((r.accepted, len(r.nodes)) < (best, widest) for r in rounds[: state.round])


def test_compare_plan_takes_the_pairs_tuned_params_where_an_entry_sets_none():
    from specviz import compare

    common = {"max_new_tokens": 8, "temperature": 0.0, "seed": 0}
    tuned = {"sd": {"gamma": 2}, "atspeed_strict": {"draft_beams": 4, "gamma": 1}}
    jobs, refs = compare.plan(["sd", "sd:gamma=5", "atspeed_strict"], common, tuned)
    params = {j.label: dict(j.params) for j in jobs}
    assert params["sd"]["gamma"] == 2 and params["sd:gamma=5"]["gamma"] == 5
    assert (params["atspeed_strict"]["draft_beams"], params["atspeed_strict"]["gamma"]) == (4, 1)
    assert jobs[0].own_params.startswith("gamma=2 (tuned)")
    untuned, _ = compare.plan(["sd"], common)
    assert dict(untuned[0].params)["gamma"] == 4  # sd's own default
    assert untuned[0].own_params.startswith("gamma=4,")  # a default carries no mark


def test_compare_marks_each_parameter_with_where_it_came_from():
    from specviz import compare

    common = {"max_new_tokens": 8, "temperature": 0.0, "seed": 0}
    tuned = {"mcsd": {"k_config": "2x2", "controller": "confidence"}}
    jobs, _ = compare.plan(["mcsd:controller=fixed"], common, tuned)
    shown = jobs[0].own_params
    assert "k_config=2x2 (tuned)" in shown and "controller=fixed (typed)" in shown
    assert "(tuned)" not in shown.split("controller=")[1].split(",")[0]  # typed beats tuned
    assert "verifier=rrs_wor," in shown + ","  # the method default, unmarked


def test_compare_speedup_bars_hold_the_tables_measured_and_predicted_numbers():
    from specviz import compare

    common = {"max_new_tokens": 8, "temperature": 0.0, "seed": 0}
    jobs, refs = compare.plan(["sd", "greedy"], common)
    by = {j.label: j for j in jobs}

    def trace(tps, predicted=None):
        cost = CostRecord(kind="chain", predicted_speedup=predicted) if predicted else None
        return RunTrace("sd", {}, "t", "d", "cpu", "p", (), (), (), "", (),
                        RunSummary(tokens_per_s=tps, cost=cost))

    traces = {by["sd"].key: trace(30.0, 1.8), by["greedy"].key: trace(20.0)}
    assert compare.speedups(jobs, traces, refs) == [("sd", 1.5, 1.8)]  # greedy: its own
    fig = compare._bars(jobs, traces, refs)
    assert list(fig.data[0].x) == [1.5] and list(fig.data[1].x) == [1.8]
    del traces[by["greedy"].key]
    assert compare.speedups(jobs, traces, refs) == []  # no plain decode yet: no bar


def test_compare_shows_the_h100_projection_beside_the_measured_speedup():
    from specviz import compare

    common = {"max_new_tokens": 8, "temperature": 0.0, "seed": 0}
    jobs, refs = compare.plan(["sd", "greedy"], common)
    by = {j.label: j for j in jobs}

    def trace(tps, kind, projected):
        cost = CostRecord(kind=kind, predicted_speedup=1.8,
                          projected=ProjectionRecord(profile="h100", speedup=projected))
        return RunTrace("sd", {}, "t", "d", "cpu", "p", (), (), (), "", (),
                        RunSummary(tokens_per_s=tps, cost=cost))

    traces = {by["sd"].key: trace(30.0, "chain", 2.345), by["greedy"].key: trace(20.0, "plain",
                                                                                 1.0)}
    head = compare.HEADERS
    assert head.index("H100 (projected)") == head.index("measured ×") + 1
    rows = {r["run"]: r for r in compare.table(jobs, traces, refs).to_dict("records")}
    assert rows["sd"]["H100 (projected)"] == "2.35" and rows["sd"]["measured ×"] == "1.50"
    assert rows["greedy"]["H100 (projected)"] == "—"  # the plain decode: nothing to project
    note = compare._note(jobs, traces, refs, common)
    assert "*H100 (projected)*" in note and "not a measurement" in note


def _switch_plan(depth: int, gain: float) -> SwitchPlan:
    """A round's cost switch plan (token and beam methods alike)."""
    return SwitchPlan(depth=depth, predicted_gain=gain, drawn=(0.8, 0.4), profile="measured",
                      posterior=DepthPosteriorState(),
                      options=(SwitchOption(0, 1.0, 1.0, 1.0), SwitchOption(1, 1.8, 1.2, 1.5),
                               SwitchOption(2, 2.12, 1.5, 1.4133)))


def test_the_round_panel_shows_the_cost_switchs_plan_and_every_option():
    token = RoundTrace(0, drafted=1, accepted=1, controller=ControllerState(kind="cost"),
                       switch=_switch_plan(1, 1.5))
    beam = RoundTrace(0, switch=_switch_plan(0, 1.0))
    md = {}
    for name, r in (("sd", token), ("atspeed_strict", beam)):
        t = RunTrace(name, {}, "t", "d", "cpu", "", (), (r,), (), "", (), RunSummary())
        md[name] = round_panel.extras_markdown(t, 0)
    assert md["sd"].startswith("**Cost switch** (profile `measured`): draft to depth 1, "
                               "predicted 1.5x tokens per target-step time of a plain step; "
                               "drafted 1. Acceptance drawn per depth: `0.8, 0.4`")
    assert "| 1 | 1.8 | 1.2 | 1.5 | ✔ |" in md["sd"]
    assert "**Controller**" not in md["sd"]  # the plan says it all
    assert md["atspeed_strict"].startswith("**Cost switch** (profile `measured`): a plain "
                                           "target step, predicted 1x")
    assert "| 0 | 1 | 1 | 1 | ✔ |" in md["atspeed_strict"]


def test_a_probe_round_says_why_it_drafted_against_the_plan_and_the_chart_counts_it():
    probe = replace(_switch_plan(1, 0.9), probe=True)
    r = RoundTrace(0, drafted=1, accepted=0, controller=ControllerState(kind="cost"),
                   switch=probe)
    t = RunTrace("sd", {}, "t", "d", "cpu", "", (), (r, RoundTrace(1, switch=_switch_plan(0, 1))),
                 (), "", (), RunSummary())
    md = round_panel.extras_markdown(t, 0)
    assert md.startswith("**Cost switch** (profile `measured`): a probe: every depth planned "
                         "below a plain step")
    assert "| 1 | 1.8 | 1.2 | 1.5 | ✔ |" in md  # depth 1 drafted
    assert "1 of 2 rounds planned plain, 1 probe" in charts.posterior_figure(t, 1).layout.title.text


def test_a_round_planned_plain_for_good_says_no_draft_could_pay():
    never = replace(_switch_plan(0, 1.0), never=True)
    t = RunTrace("atspeed_strict", {}, "t", "d", "cpu", "", (), (RoundTrace(0, switch=never),),
                 (), "", (), RunSummary())
    md = round_panel.extras_markdown(t, 0)
    assert md.startswith("**Cost switch** (profile `measured`): a plain target step for the "
                         "rest of the run: no depth would pay even if every draft were "
                         "accepted")


def test_a_round_the_timed_guard_made_plain_says_which_of_its_reasons():
    md = {}
    for why in ("timing", "slower"):
        plan = replace(_switch_plan(0, 1.0), guard=why, context="feature")
        t = RunTrace("sd", {}, "t", "d", "cpu", "", (), (RoundTrace(0, switch=plan),),
                     (), "", (), RunSummary())
        md[why] = round_panel.extras_markdown(t, 0)
    assert md["timing"].startswith("**Cost switch** (profile `measured`): a plain target "
                                   "step to time one: the switch planned a draft")
    assert md["slower"].startswith("**Cost switch** (profile `measured`): a plain target "
                                   "step for the rest of the run in the `feature` context: "
                                   "the switch planned a draft, but the timed guard found")
    assert "| 0 | 1 | 1 | 1 | ✔ |" in md["slower"]  # what ran: the plain option


def test_a_held_round_says_the_drafter_s_catch_up_would_not_be_repaid():
    held = replace(_switch_plan(0, 1.0), held=True, catch_up=2.72)
    t = RunTrace("eesd", {}, "t", "d", "cpu", "", (), (RoundTrace(0, switch=held),),
                 (), "", (), RunSummary())
    md = round_panel.extras_markdown(t, 0)
    assert md.startswith("**Cost switch** (profile `measured`): a plain target step: drafting "
                         "to the best depth would pay this round, but the drafter must first "
                         "read the committed tokens it has not cached (2.72 plain steps)")
    assert ("1 of 1 rounds planned plain, 1 held for the drafter's catch-up"
            in charts.posterior_figure(t, 0).layout.title.text)
    assert "every later round is held" not in md
    t = replace(t, rounds=(RoundTrace(0, switch=replace(held, rest=True)),))
    assert "(2.72 plain steps), more than the rest of the run would save; nothing can change " \
           "that before a draft, so every later round is held too" in \
           round_panel.extras_markdown(t, 0)
    t = replace(t, rounds=(RoundTrace(0, switch=replace(_switch_plan(0, 1.0), rest=True)),))
    assert round_panel.extras_markdown(t, 0).startswith(
        "**Cost switch** (profile `measured`): a plain target step for the rest of the run: at "
        "the prior's acceptance no depth pays, no probe can start")


def test_the_posterior_panel_charts_the_switchs_plans_when_a_switch_planned():
    rounds = (RoundTrace(0, drafted=2, accepted=1, switch=_switch_plan(2, 1.41)),
              RoundTrace(1, switch=_switch_plan(0, 1.0)),
              RoundTrace(2, drafted=1, accepted=1, switch=_switch_plan(1, 1.5)))
    t = RunTrace("atspeed_strict", {}, "t", "d", "cpu", "", (), rounds, (), "", (),
                 RunSummary())
    fig = charts.posterior_figure(t, 2)
    assert list(_by_name(fig, "planned depth").y) == [2, 0, 1]
    assert list(_by_name(fig, "drafted").y) == [2, 0, 1]
    assert list(_by_name(fig, "accepted").y) == [1, 0, 1]
    assert list(_by_name(fig, "predicted gain").y) == [1.41, 1.0, 1.5]
    assert "1 of 3 rounds planned plain" in fig.layout.title.text
    assert "(to round" not in fig.layout.title.text  # the last round: the whole run
    assert charts.posterior_figure(t, 1).layout.title.text.endswith(
        "1 of 2 rounds planned plain (to round 1 of 3)")  # the rounds so far, said so
    assert fig.layout.yaxis.dtick == 1 and list(fig.layout.yaxis.range)[0] == 0  # whole depths
    assert "yaxis3" not in fig.layout  # two panels, no second axis on one


def test_compares_table_and_note_give_each_speedup_under_one_name_and_agree():
    """Issue 57 (1): the cost model's round-time speedup and the whole run's measured one are
    two figures; the table and the note name them apart and print the same numbers."""
    from specviz import compare

    common = {"max_new_tokens": 8, "temperature": 0.0, "seed": 0}
    jobs, refs = compare.plan(["sd", "greedy"], common)
    by = {j.label: j for j in jobs}
    cost = CostRecord(kind="tree", predicted_speedup=1.8, measured_speedup=1.2,
                      efficiency=1.2 / 1.8, rounds_used=5, c_draft=0.1, c_verify=1.1,
                      draft_calls_per_round=2.0, tokens_per_round=2.5)
    traces = {by["sd"].key: RunTrace("sd", {}, "t", "d", "cpu", "p", (), (), (), "", (),
                                      RunSummary(tokens_per_s=30.0, cost=cost)),
              by["greedy"].key: RunTrace("greedy", {}, "t", "d", "cpu", "p", (), (), (), "",
                                         (), RunSummary(tokens_per_s=20.0))}
    row = {r["run"]: r for r in compare.table(jobs, traces, refs).to_dict("records")}["sd"]
    assert (row["predicted ×"], row["round-time ×"], row["measured ×"]) == ("1.80", "1.20",
                                                                            "1.50")
    note = compare._note(jobs, traces, refs, common)
    line = next(ln for ln in note.splitlines() if ln.startswith("- **sd**"))
    assert "predicted 1.80x, round-time 1.20x" in line
    assert "measured 1.50x (the whole run against its plain decode)" in line
    assert "efficiency 67% = round-time / predicted" in line
    assert "*measured ×* is the whole run's tokens/s against its plain decode's" in note


def test_a_token_no_round_recorded_takes_its_text_from_the_runs_decoded_text(trace):
    """Issue 57 (5): a beam method's best hypothesis ends on an end-of-text token no round
    committed; the text shows it as the tokenizer wrote it, not as its id."""
    from dataclasses import replace

    ended = replace(trace, token_ids=trace.token_ids + (2,), text=trace.text + "<|im_end|>",
                    token_origins=trace.token_origins + ("target",))
    assert text_view.token_texts(ended) == [" b", " e", " x", "!", "<|im_end|>"]
    assert text_view.segments(ended)[-1] == ("<|im_end|>", "target")
    garbled = replace(ended, text="something else")  # no alignment: the id, not a guess
    assert text_view.token_texts(garbled)[-1] == "<2>"


def test_a_run_that_drafted_nothing_draws_its_draft_length_axis_from_zero():
    """Issue 57 (12): plotly's autorange put an all-zero axis at -1..1."""
    t = RunTrace("greedy", {}, "t", "", "cpu", "", (), (_baseline_round(), _baseline_round()),
                 (), "", (), RunSummary())
    fig = charts.progress_figure(t, 0)
    assert list(fig.layout.yaxis2.range) == [0, 1.1] and fig.layout.yaxis2.dtick == 1


def test_a_deep_forest_gets_a_taller_figure_so_its_labels_stay_apart():
    """Issue 57 (12): an 11-deep chain overlapped its labels in the fixed height."""
    chain = tuple(_node(i, i - 1, i + 1, f" t{i}", "accepted") for i in range(11))
    deep = RunTrace("sd", {}, "t", "d", "cpu", "", (), (RoundTrace(0, nodes=chain, drafted=11,
                                                                   accepted=11),),
                    (), "", (), RunSummary())
    fig = forest_view.forest_figure(deep, 0)
    assert fig.layout.height >= 110 + forest_view.DEPTH_PX * 11 > forest_view.HEIGHT
    shallow = forest_view.forest_figure(deep.__class__(**{**deep.__dict__, "rounds": (
        RoundTrace(0, nodes=chain[:2], drafted=2, accepted=2),)}), 0)
    assert shallow.layout.height == forest_view.HEIGHT


def test_the_guide_describes_the_demo_the_page_opens():
    """Issue 57 (5): docs/debugger.md described another demo (3x2x2, 11 rounds, tau 2.64)
    than the one the page opens; its figures are the shipped trace's."""
    import re
    from pathlib import Path

    from specviz.figures import round_counts

    guide = Path(__file__).resolve().parents[2] / "docs" / "debugger.md"
    said = re.search(r"\(mcsd (\S+) with the confidence\s+controller at ([\d.]+), the pair's "
                     r"tuned settings; (\d+) rounds, (\d+) drafted nodes, acceptance ([\d.]+),"
                     r"\s+tau ([\d.]+);", guide.read_text())
    assert said, "docs/debugger.md no longer describes the demo trace"
    demo = demo_state().trace
    assert (demo.method, demo.params["k_config"], demo.params["controller"]) == (
        "mcsd", said.group(1), "confidence")
    assert float(said.group(2)) == demo.params["confidence"]
    assert int(said.group(3)) == len(demo.rounds)
    assert int(said.group(4)) == sum(round_counts(r).nodes for r in demo.rounds)
    assert said.group(5) == f"{demo.stats.acceptance_rate:.2f}"
    assert said.group(6) == f"{demo.stats.tau:.2f}"


def test_a_sampled_beam_runs_summary_says_why_its_text_has_more_accepted_tokens():
    """dsbd / atspeed_relaxed test every draft of a step: a step that did not pass keeps its
    accepted drafts, so the text can colour more tokens accepted than steps passed; the
    summary says how the two relate (issue 57, point 4)."""
    step = BeamStep(1, "drafted", accepted=False, reason="only 1 of 4 drafts accepted")
    r = RoundTrace(0, beam_steps=(step,), drafted=1, accepted=0,
                   committed=(CommittedToken(5, "a", "accepted"),))
    t = RunTrace("dsbd", {}, "t", "d", "cpu", "", (), (r,), (5,), "a", (),
                 RunSummary(drafted=1, accepted=0, acceptance_rate=0.0),
                 token_origins=("accepted",), token_rounds=(0,))
    said = round_panel.acceptance_text(t)
    assert said.startswith("acceptance 0 (0 of 1 drafted steps passed); the text's 1 accepted")
    strict = replace(t, token_origins=("target",))
    assert round_panel.acceptance_text(strict) == "acceptance 0 (0 of 1 drafted steps passed)"


def test_a_round_planned_in_a_context_says_which_and_the_chart_counts_the_lookups():
    """The hybrid drafter's rounds are planned in the lookup's context or the feature
    drafter's: the panel says which and what it means, the chart counts the lookup's."""
    lookup = replace(_switch_plan(2, 1.41), context="lookup")
    feature = replace(_switch_plan(0, 1.0), context="feature")
    rounds = (RoundTrace(0, drafted=2, accepted=2, switch=lookup), RoundTrace(1, switch=feature))
    t = RunTrace("sd", {}, "t", "d", "cpu", "", (), rounds, (), "", (), RunSummary())
    md = round_panel.extras_markdown(t, 0)
    assert ("Context `lookup`: the committed text ends in a suffix that occurred before, so "
            "the drafts copy what followed it") in md
    assert "this context's own acceptance posterior" in md
    assert "Context `feature`: no recurring suffix" in round_panel.extras_markdown(t, 1)
    assert "Context" not in round_panel.extras_markdown(
        replace(t, rounds=(RoundTrace(0, switch=_switch_plan(0, 1.0)),)), 0)
    assert ("1 of 2 rounds planned plain, 1 in the lookup's context"
            in charts.posterior_figure(t, 1).layout.title.text)


def test_a_resting_context_says_its_rest_is_its_contexts_alone():
    """Where the switch plans contexts apart, a rest (held or at the prior) holds its own
    context's later rounds: the panel says so and does not claim that no drafter runs."""
    for rec in (replace(_switch_plan(0, 1.0), rest=True, context="feature"),
                replace(_switch_plan(0, 1.0), rest=True, held=True, catch_up=2.0,
                        context="feature")):
        t = RunTrace("sd", {}, "t", "d", "cpu", "", (), (RoundTrace(0, switch=rec),), (), "",
                     (), RunSummary())
        md = round_panel.extras_markdown(t, 0)
        assert "every later round in the `feature` context (the other context plans its " \
               "own)" in md
        assert "no drafter runs" not in md and "nothing is drafted" not in md


def test_a_never_round_in_a_context_leaves_the_other_context_drafting():
    """A lookup's calls may pay where the model's never can (CostController.can_draft): a
    "never" round of the feature context says its context alone is plain for good, not that
    no drafter runs; without contexts it still says so."""
    def md(context):
        rec = replace(_switch_plan(0, 1.0), never=True, context=context)
        t = RunTrace("sd", {}, "t", "d", "cpu", "", (), (RoundTrace(0, switch=rec),), (), "",
                     (), RunSummary())
        return round_panel.extras_markdown(t, 0)

    assert "every later round in the `feature` context" in md("feature")
    assert "no drafter runs" not in md("feature")
    assert "so no drafter runs" in md(None) and "context (the other" not in md(None)


def test_the_compare_time_line_draws_every_phase_a_round_timed():
    """Its engine-time axis is the rounds' recorded time, observe (the controller's update)
    included: the bars of a run add up to the sum of its rounds' timings."""
    trace = demo_state().trace
    fig = charts.timeline_figure([("demo", trace)])
    drawn = sum(sum(bar.x) for bar in fig.data)
    timed = 1000.0 * sum(sum(r.timings.values()) for r in trace.rounds)
    assert any(r.timings.get("observe", 0) > 0 for r in trace.rounds)
    assert drawn == pytest.approx(timed, rel=1e-9)


def test_a_bench_row_or_a_tuners_best_without_a_measure_shows_a_dash_not_zero():
    from specviz import bench_tab, tune_tab

    cells = bench_tab.row_cells({"prompt_id": "a", "case": "sd", "tau": None, "speedup": None})
    assert cells[3] == cells[4] == "—"
    assert bench_tab.row_cells({"tau": 1.5, "speedup": 2.0})[3:5] == ["2.00", "1.50"]
    best = tune_tab.best_so_far([{"method": "sd", "label": "gamma=2", "speedup": None}])
    assert best.iloc[0, 2] == "—"
    best = tune_tab.best_so_far([{"method": "sd", "label": "gamma=2", "speedup": 1.2}])
    assert best.iloc[0, 2] == "1.20"


def test_an_extras_cell_says_what_it_leaves_out():
    assert round_panel._cell([0.5] * 8) == "[0.5, 0.5, 0.5, 0.5, 0.5, 0.5, … 2 more]"
    assert round_panel._cell([0.5, 1]) == "[0.5, 1]"
    assert round_panel._cell({"a": 1, "b": [2]}) == "{2 keys}"
    assert round_panel._cell([[1], [2], [3]]) == "[3 items]"


def test_a_beam_runs_charts_say_they_count_steps_and_beam_0s_tokens(trace):
    beam = replace(trace, rounds=(_beam_round(),))
    titles = [a.text for a in charts.progress_figure(beam, 0).layout.annotations]
    assert "acceptance (steps passed / drafted)" in titles
    assert "tau (beam 0's tokens per target call)" in titles
    plain = replace(trace, rounds=(_baseline_round(),))
    titles = [a.text for a in charts.progress_figure(plain, 0).layout.annotations]
    assert {"acceptance (accepted / drafted)", "tau (tokens per target call)"} <= set(titles)


def test_a_beam_rounds_header_says_its_committed_tokens_are_beam_0s(trace):
    """The text shows the final best hypothesis, which may come from another row."""
    md = round_panel.round_markdown(replace(trace, rounds=(_beam_round(),)), 0)
    assert "beam 0 committed 1 token (1 accepted)" in md
    md = round_panel.round_markdown(replace(trace, rounds=(_baseline_round(),)), 0)
    assert " · committed 1 token (1 target)" in md
