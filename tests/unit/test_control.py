"""Draft-length controllers (engine/control/controllers.py) and their math
(engine/control/posterior.py): EESD Beta-TS / Cali-TS, fixed and heuristic."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, fields, replace

import pytest
import torch

from engine.contract.records import ControllerState
from engine.contract.trace import _build
from engine.control.controllers import (
    CONTROL_PARAMS,
    BetaTSController,
    CaliTSController,
    ConfidenceController,
    ConstantPredictor,
    ControlConfig,
    FixedController,
    HeuristicController,
    control_config,
    make_controller,
)
from engine.control.posterior import (
    BETA_RULES,
    THETA_HAT_RULES,
    beta_pdf,
    beta_update,
    cali_posterior,
    gaussian_pdf,
    sample_beta,
    sample_normal,
    theta_hat_update,
)
from engine.core.config import layered, validate_params
from engine.core.errors import ConfigError
from engine.core.sampling import TorchChooser, make_generator
from engine.methods import METHODS
from tests.choosers import ScriptedChooser

KINDS = ["fixed", "heuristic", "beta_ts", "cali_ts"]


def always_continue(kind: str):
    """A controller of this kind that would draft far past cap = 3 (fixed: gamma = 3)."""
    cfg = control_config(controller=kind, cap=3, alpha0=1e4, beta0=1e-2, theta_m=1.0,
                         sigma_m=1e-6)
    return make_controller(cfg, gamma=3)


def default_controller(kind: str, gamma: int = 5):
    """A controller of this kind with the CONTROL_PARAMS defaults."""
    return make_controller(control_config(controller=kind), gamma=gamma)


def draft_round(controller, rng, accepted_of=lambda k: k, features=None) -> tuple[int, int]:
    """Drive one round as the loop does: draft, ask, ..., then observe. Returns (k, a)."""
    controller.begin_round()
    drafted = 1
    while controller.should_continue(drafted, rng, features):
        drafted += 1
    accepted = accepted_of(drafted)
    controller.observe(drafted, accepted)
    return drafted, accepted


def beta_cdf_integer(x: float, a: int, b: int) -> float:
    """Exact Beta CDF for integer shapes: P(Binomial(a + b - 1, x) >= a)."""
    n = a + b - 1
    return sum(math.comb(n, j) * x**j * (1 - x) ** (n - j) for j in range(a, n + 1))


def ks_statistic(samples: list[float], cdf) -> float:
    xs = sorted(samples)
    n = len(xs)
    return max(max((i + 1) / n - cdf(x), cdf(x) - i / n) for i, x in enumerate(xs))


# ------------------------------------------------------------------------ Beta-TS update rules


@pytest.mark.parametrize(
    "drafted, accepted, d_alpha, d_beta",
    [(4, 2, 2, 2), (4, 4, 4, 0), (4, 3, 3, 1), (4, 0, 0, 2), (5, 1, 1, 2), (1, 0, 0, 1)],
)
def test_paper_update_follows_eq_3_4_with_q_v_equal_accepted_plus_one(
    drafted, accepted, d_alpha, d_beta
):
    assert beta_update(1.0, 1.0, drafted, accepted, "paper") == (1.0 + d_alpha, 1.0 + d_beta)


@pytest.mark.parametrize(
    "drafted, accepted, d_alpha, d_beta",
    [(4, 2, 2, 1), (4, 4, 4, 0), (4, 3, 3, 1), (4, 0, 0, 1), (1, 1, 1, 0), (1, 0, 0, 1)],
)
def test_clean_update_counts_trials_until_first_rejection(drafted, accepted, d_alpha, d_beta):
    assert beta_update(1.0, 1.0, drafted, accepted, "clean") == (1.0 + d_alpha, 1.0 + d_beta)


def test_beta_ts_default_update_is_the_papers():
    assert default_controller("beta_ts").config.update == "paper"


def test_beta_ts_posterior_accumulates_over_rounds_and_state_shows_before_and_after():
    ctl = BetaTSController(control_config(alpha0=1.0, beta0=1.0, update="paper"))
    ctl.begin_round()
    ctl.observe(4, 2)
    s = ctl.state()
    assert (s.before["alpha"], s.before["beta"]) == (1.0, 1.0)
    assert (s.after["alpha"], s.after["beta"]) == (3.0, 3.0)
    assert s.update == {
        "drafted": 4,
        "accepted": 2,
        "rule": "paper",
        "d_alpha": 2.0,
        "d_beta": 2.0,
    }
    ctl.begin_round()
    ctl.observe(3, 3)
    s = ctl.state()
    assert (s.before["alpha"], s.before["beta"]) == (3.0, 3.0)
    assert (s.after["alpha"], s.after["beta"], s.after["mean"]) == (6.0, 3.0, 6.0 / 9.0)


def test_clean_controller_update_on_drafted_4_accepted_2():
    ctl = BetaTSController(control_config(alpha0=2.0, beta0=3.0, update="clean"))
    ctl.observe(4, 2)
    assert (ctl.alpha, ctl.beta) == (4.0, 4.0)


# ------------------------------------------------------------------------- fixed and heuristic


def test_fixed_drafts_exactly_gamma_every_round():
    ctl = FixedController(gamma=3)
    g = make_generator(0)
    assert [draft_round(ctl, g, lambda k: 0)[0] for _ in range(4)] == [3, 3, 3, 3]
    assert ctl.max_len() == 3
    assert [s["continue"] for s in ctl.state().steps] == [True, True, False]


def test_heuristic_adds_two_after_full_acceptance_else_subtracts_one_within_1_and_cap():
    ctl = HeuristicController(control_config(cap=10), start=5)
    g = make_generator(0)
    accepted = [5, 7, 9, 3, 0]  # all, all, all (11 clamps to 10), partial, none
    lengths = [draft_round(ctl, g, lambda k, a=a: a)[0] for a in accepted]
    assert lengths == [5, 7, 9, 10, 9]
    assert ctl.max_len() == 8

    ctl = HeuristicController(control_config(cap=10), start=2)
    lengths = [draft_round(ctl, g, lambda k, a=a: a)[0] for a in [1, 0, 1, 3]]
    assert lengths == [2, 1, 1, 3]  # 2 -> 1 -> max(1, 0) = 1 -> 1 + 2 = 3
    assert ctl.max_len() == 5


# --------------------------------------------------------------------------------- hard cap


@pytest.mark.parametrize("kind", KINDS)
def test_hard_cap_always_stops_the_round(kind):
    ctl = always_continue(kind)
    g = make_generator(1)
    assert [draft_round(ctl, g)[0] for _ in range(20)] == [3] * 20
    assert ctl.max_len() == 3
    for drafted in (3, 4, 100):
        ctl.begin_round()
        assert ctl.should_continue(drafted, g) is False


@pytest.mark.parametrize("kind", ["beta_ts", "cali_ts"])
def test_cap_stop_is_recorded_without_sampling(kind):
    ctl = always_continue(kind)
    draft_round(ctl, make_generator(2))
    s = ctl.state()
    assert (s.cap, s.cap_hit, s.stop_reason) == (3, True, "cap")
    assert [st["continue"] for st in s.steps] == [True, True, False]
    assert s.steps[-1]["theta"] is None


# ------------------------------------------------------------------------------ determinism


@pytest.mark.parametrize("kind", ["beta_ts", "cali_ts"])
def test_same_seed_reproduces_every_theta_and_decision(kind):
    def run(seed: int) -> list[dict]:
        ctl, g = default_controller(kind), make_generator(seed)
        out = []
        for _ in range(10):
            draft_round(ctl, g, lambda k: min(k, 2))
            out.append(ctl.state())
        return out

    assert run(7) == run(7)
    assert run(7) != run(8)


def test_generator_and_torch_chooser_draw_the_same_stream():
    a = [sample_beta(2.0, 3.0, make_generator(3)) for _ in range(1)]
    b = [sample_beta(2.0, 3.0, TorchChooser(make_generator(3))) for _ in range(1)]
    assert a == b


# ------------------------------------------------------------------------ samplers, densities


@pytest.mark.parametrize(
    "a, b, cdf",
    [
        (2.0, 5.0, lambda x: beta_cdf_integer(x, 2, 5)),
        (3.0, 3.0, lambda x: beta_cdf_integer(x, 3, 3)),
        (0.5, 1.0, lambda x: math.sqrt(x)),  # shape < 1 boost on X
        (1.0, 0.3, lambda x: 1.0 - (1.0 - x) ** 0.3),  # shape < 1 boost on Y
    ],
)
def test_beta_sampler_matches_exact_cdf_mean_and_variance(a, b, cdf):
    chooser = TorchChooser(make_generator(11))
    xs = [sample_beta(a, b, chooser) for _ in range(4000)]
    mean = sum(xs) / len(xs)
    var = sum((x - mean) ** 2 for x in xs) / len(xs)
    exact_mean, exact_var = a / (a + b), a * b / ((a + b) ** 2 * (a + b + 1))
    assert abs(mean - exact_mean) < 4.5 * math.sqrt(exact_var / 4000)
    assert abs(var - exact_var) < 0.1 * exact_var
    assert ks_statistic(xs, cdf) < 0.0308  # KS critical value at p = 0.001, n = 4000


def test_beta_sampler_stays_finite_in_0_1_for_tiny_shapes():
    chooser = TorchChooser(make_generator(5))
    xs = [sample_beta(0.01, 0.02, chooser) for _ in range(500)]
    assert all(0.0 <= x <= 1.0 for x in xs)
    assert min(xs) < 1e-6 and max(xs) > 1 - 1e-6  # mass piles at both ends


def test_beta_sampler_rejects_non_positive_shapes():
    with pytest.raises(ConfigError):
        sample_beta(0.0, 1.0, make_generator(0))


def test_box_muller_normal_has_unit_moments():
    chooser = TorchChooser(make_generator(6))
    zs = [sample_normal(chooser) for _ in range(20000)]
    mean = sum(zs) / len(zs)
    var = sum((z - mean) ** 2 for z in zs) / len(zs)
    assert abs(mean) < 0.03 and abs(var - 1.0) < 0.04


def test_beta_pdf_matches_closed_forms():
    x = torch.tensor([-0.1, 0.0, 0.25, 0.5, 1.0, 1.1])
    torch.testing.assert_close(  # Beta(2, 3) = 12 x (1 - x)^2
        beta_pdf(x, 2.0, 3.0),
        torch.tensor([0.0, 0.0, 1.6875, 1.5, 0.0, 0.0], dtype=torch.float64),
    )
    torch.testing.assert_close(
        beta_pdf(x, 1.0, 1.0), torch.tensor([0.0, 1.0, 1.0, 1.0, 1.0, 0.0], dtype=torch.float64)
    )
    assert beta_pdf(torch.tensor([0.5]), 0.5, 0.5).item() == pytest.approx(2.0 / math.pi)
    grid = torch.linspace(0, 1, 20001, dtype=torch.float64)
    assert torch.trapezoid(beta_pdf(grid, 2.5, 1.5), grid).item() == pytest.approx(1.0, abs=1e-4)


def test_gaussian_pdf_matches_closed_form():
    x = torch.tensor([0.3, 0.8, -0.2])
    torch.testing.assert_close(
        gaussian_pdf(x, 0.3, 0.5),
        torch.tensor(
            [0.7978845608028654, 0.48394144903828673, 0.48394144903828673], dtype=torch.float64
        ),
    )


# ------------------------------------------------------------- Beta-TS sampling behaviour


def test_beta_ts_continue_rate_equals_posterior_mean():
    ctl, g = BetaTSController(control_config(alpha0=3.0, beta0=2.0, cap=2)), make_generator(12)
    decisions = []
    for _ in range(20000):
        ctl.begin_round()
        decisions.append(ctl.should_continue(1, g))
    # 0.6 +- 0.015 is 4.3 standard errors (sqrt(0.24 / 20000) = 0.0035)
    assert abs(sum(decisions) / len(decisions) - 0.6) < 0.015


def test_beta_ts_draft_length_is_geometric_with_mean_alpha_plus_beta_over_beta():
    ctl = BetaTSController(control_config(alpha0=3.0, beta0=2.0, cap=64))
    g = make_generator(13)
    lengths = []
    for _ in range(5000):  # no observe: the posterior stays Beta(3, 2)
        ctl.begin_round()
        k = 1
        while ctl.should_continue(k, g):
            k += 1
        lengths.append(k)
    # E[k] = 5 / 2; sd of the mean = sqrt(3.75 / 5000) = 0.027
    assert abs(sum(lengths) / len(lengths) - 2.5) < 0.12


def test_beta_ts_records_every_theta_and_decision():
    ctl = BetaTSController(control_config(cap=16))
    k, _ = draft_round(ctl, make_generator(4), lambda k: 0)
    steps = ctl.state().steps
    assert len(steps) == k and [s["step"] for s in steps] == list(range(1, k + 1))
    assert all(s["continue"] == (s["uniform"] < s["theta"]) for s in steps)
    assert ctl.state().stop_reason in ("chi0", "cap")


# ---------------------------------------------------------------------------------- Cali-TS


@pytest.mark.parametrize(
    "n, mu, sigma, w_model",
    [
        (0, 0.3, 0.2, 1.0),
        (1, 0.365, 0.17888543819998318, 0.8),
        (4, 0.4625, 0.1414213562373095, 0.5),  # n* = sigma_S^2 / sigma_M^2 = 4
    ],
)
def test_cali_posterior_moves_from_theta_m_to_theta_hat_per_eq_6_7(n, mu, sigma, w_model):
    got = cali_posterior(0.3, 0.625, n, sigma_m=0.2, sigma_s=0.4)
    torch.testing.assert_close(got, (mu, sigma, w_model))


def test_cali_posterior_tends_to_theta_hat_for_many_verifications():
    mu, sigma, _ = cali_posterior(0.3, 0.625, 10**6, sigma_m=0.2, sigma_s=0.4)
    assert abs(mu - 0.625) < 1e-5 and sigma < 1e-3


@pytest.mark.parametrize(
    "rule, expected",
    [("accepted", [0.25, 1 / 6, 0.125, 0.1]), ("paper", [0.75, 5 / 6, 0.875, 0.9])],
)
def test_theta_hat_rules_on_rounds_with_no_acceptance(rule, expected):
    theta_hat, t, got = 0.5, 0, []
    for _ in range(4):
        theta_hat, t = theta_hat_update(theta_hat, t, accepted=0, rule=rule)
        got.append(theta_hat)
    torch.testing.assert_close(got, expected)  # paper: (0.5 + t) / (t + 1) climbs to 1
    assert t == 4


def test_cali_controller_uses_eq_6_7_and_the_fixed_theta_hat_over_rounds():
    ctl = CaliTSController(control_config(sigma_m=0.2, sigma_s=0.4, theta_hat0=0.5),
                           ConstantPredictor(0.3))
    g = make_generator(9)
    expected = [  # (mu, sigma) at n = 0, 1, 2
        (0.3, 0.2),
        (0.365, 0.17888543819998318),
        (0.2 + 0.6875 / 3, 0.16329931618554522),
    ]
    for (mu, sigma), (drafted, accepted) in zip(expected, [(4, 2), (3, 3), (1, 0)]):
        ctl.begin_round()
        ctl.should_continue(1, g)
        step = ctl.state().steps[0]
        torch.testing.assert_close((step["mu"], step["sigma"], step["theta_M"]), (mu, sigma, 0.3))
        ctl.observe(drafted, accepted)
    # theta_hat: (0.5 * 1 + 2) / 4 = 0.625, then (0.625 * 4 + 3) / 8 = 0.6875, t = 3, 7, 8
    s = ctl.state()
    assert (s.before["n"], s.before["t"], s.before["theta_hat"]) == (2, 7, 0.6875)
    assert (s.after["n"], s.after["t"]) == (3, 8)
    assert s.after["theta_hat"] == pytest.approx(0.6875 * 8 / 9)


def test_cali_draws_go_through_the_chooser_and_theta_is_clipped():
    ctl = CaliTSController(control_config(sigma_m=0.2, sigma_s=0.4), ConstantPredictor(0.3))
    r1 = 1.0 - math.exp(-0.5)  # Box-Muller radius 1
    r4 = 1.0 - math.exp(-8.0)  # Box-Muller radius 4
    # step 1: z = +1 -> theta 0.5, u 0.4 -> go; step 2: z = -1 -> theta 0.1, u 0.2 -> stop
    chooser = ScriptedChooser([r1, 0.0, 0.4, r1, 0.5, 0.2], allow_categorical=False)
    assert ctl.should_continue(1, chooser) is True
    assert ctl.should_continue(2, chooser) is False
    steps = ctl.state().steps
    torch.testing.assert_close([s["theta"] for s in steps], [0.5, 0.1])
    assert ctl.state().stop_reason == "chi0"
    # z = +4 -> raw 1.1 -> clipped to 1; z = -4 -> raw -0.5 -> clipped to 0
    ctl.begin_round()
    chooser = ScriptedChooser([r4, 0.0, 0.999, r4, 0.5, 0.0], allow_categorical=False)
    assert ctl.should_continue(1, chooser) is True
    assert ctl.should_continue(2, chooser) is False
    first, second = ctl.state().steps
    assert (first["theta"], first["clipped"]) == (1.0, True)
    assert first["theta_raw"] == pytest.approx(1.1)
    assert (second["theta"], second["clipped"]) == (0.0, True)
    assert second["theta_raw"] == pytest.approx(-0.5)


def test_cali_thetas_stay_in_0_1_under_a_wide_posterior():
    ctl = CaliTSController(control_config(sigma_m=1.0, cap=4, theta_m=1.0))
    g = make_generator(10)
    steps = []
    for _ in range(100):  # no observe: the posterior stays N(1, 1)
        ctl.begin_round()
        ctl.should_continue(1, g)
        steps += ctl.state().steps
    assert all(0.0 <= s["theta"] <= 1.0 for s in steps)
    assert all(s["clipped"] == (s["theta_raw"] > 1.0 or s["theta_raw"] < 0.0) for s in steps)
    assert sum(s["theta_raw"] > 1.0 for s in steps) > 30 and any(s["theta"] == 1.0 for s in steps)
    assert all(s["continue"] for s in steps if s["theta"] == 1.0)


def test_cali_rejects_a_predictor_outside_0_1():
    ctl = CaliTSController(control_config(), lambda features: 1.5)
    with pytest.raises(ValueError):
        ctl.should_continue(1, make_generator(0))


def test_cali_passes_features_to_the_predictor():
    seen = []
    ctl = CaliTSController(control_config(), lambda f: seen.append(f) or 0.5)
    feats = torch.ones(3)
    ctl.should_continue(1, make_generator(0), feats)
    assert seen == [feats]


# -------------------------------------------------------------------- state, factory, errors


@pytest.mark.parametrize("kind", KINDS)
def test_state_is_json_serialisable_before_during_and_after_a_round(kind):
    ctl, g = default_controller(kind), make_generator(0)
    snapshots = [ctl.state()]
    ctl.begin_round()
    ctl.should_continue(1, g)
    snapshots.append(ctl.state())
    ctl.observe(1, 1)
    snapshots.append(ctl.state())
    for s in snapshots:  # JSON values that the trace's reader takes back unchanged
        assert _build(ControllerState, json.loads(json.dumps(asdict(s), allow_nan=False))) == s
    assert snapshots[-1].kind == kind and snapshots[-1].after is not None


def test_control_params_declare_every_control_config_field_once():
    rows = {p.name: p for p in CONTROL_PARAMS}
    assert len(rows) == len(CONTROL_PARAMS)
    assert list(rows) == [f.name for f in fields(ControlConfig)]
    assert rows["controller"].choices == (*KINDS, "confidence")  # KINDS: feature-free
    assert rows["switch"].choices == ("off", "cost") and rows["switch"].default == "off"
    assert rows["update"].choices == BETA_RULES and rows["update"].default == "paper"
    assert rows["theta_hat_rule"].choices == THETA_HAT_RULES
    assert rows["theta_hat_rule"].default == "accepted"
    assert control_config() == ControlConfig(**{p.name: p.default for p in CONTROL_PARAMS})


@pytest.mark.parametrize("kind", KINDS)
def test_defaults_build_every_kind_and_its_state_names_its_parameters(kind):
    ctl = default_controller(kind)
    assert ctl.name == kind
    config = ctl.state().config
    if kind == "fixed":
        assert config == {"gamma": 5}
    else:
        assert set(config) <= {"start"} | {p.name for p in CONTROL_PARAMS}
        assert config["cap"] == 16


def test_make_controller_builds_the_kind_the_config_names():
    assert make_controller(control_config(controller="beta_ts", alpha0=2.0, update="clean"),
                           gamma=4).config.alpha0 == 2.0
    assert make_controller(control_config(controller="cali_ts", theta_m=0.7),
                           gamma=4).predictor(None) == 0.7
    assert make_controller(control_config(controller="heuristic", cap=3), gamma=5).start == 3
    assert make_controller(control_config(), gamma=6).max_len() == 6
    bad = replace(control_config(), controller="nope")  # past validation
    with pytest.raises(ConfigError, match="unknown controller 'nope'"):
        make_controller(bad, gamma=3)


@pytest.mark.parametrize(
    "values",
    [
        {"controller": "nope"},
        {"gamma": 3},  # not a controller parameter
        {"alpha0": 0.0},
        {"update": "literal"},
        {"cap": 0},
        {"sigma_s": 0.0},
        {"theta_hat_rule": "x"},
        {"theta_m": 1.2},
    ],
)
def test_invalid_parameters_raise_config_error(values):
    with pytest.raises(ConfigError):
        control_config(**values)


def test_fixed_and_heuristic_lengths_are_checked():
    with pytest.raises(ConfigError):
        FixedController(gamma=0)
    with pytest.raises(ConfigError):
        HeuristicController(control_config(), start=0)
    with pytest.raises(ConfigError):
        HeuristicController(control_config(cap=4), start=9)


# -------------------------------------------------------- from a method's parameters

NOT_DEFAULT = {  # a value other than the default for every controller parameter
    "cap": 3, "alpha0": 2.5, "beta0": 0.5, "update": "clean", "sigma_m": 0.3, "sigma_s": 0.2,
    "theta_hat0": 0.7, "theta_hat_rule": "paper", "theta_m": 0.8, "confidence": 0.6,
    "costs": "h100", "discount": 0.7, "plan": "thompson", "guard": "timed",
}


def _method(name: str, **given):
    spec = METHODS[name]
    return spec.make(validate_params(spec.all_params, given, name))


@pytest.mark.parametrize("method", ["sd", "mcsd", "eesd"])
@pytest.mark.parametrize("kind", ["heuristic", "beta_ts", "cali_ts", "confidence", "cost"])
def test_every_controller_parameter_reaches_the_controller_unchanged(method, kind):
    rows = {p.name: p for p in METHODS[method].params}
    assert all(rows[p.name] == p or p.name == "controller" for p in CONTROL_PARAMS)
    assert all(rows[name].default != value for name, value in NOT_DEFAULT.items())
    given = {**NOT_DEFAULT, **({"switch": "cost"} if kind == "cost" else {"controller": kind})}
    ctl = _method(method, **given).controller  # mcsd's default 4x2x2 is 3 deep: cap 3 stays
    assert ctl.name == kind
    want = {"controller": "fixed", "switch": "off", **given}  # switch=cost: controller fixed
    assert {p.name: getattr(ctl.config, p.name) for p in CONTROL_PARAMS} == want
    assert ctl.state().config == {
        **({"start": 3} if kind == "heuristic" else {}),
        **{name: given[name] for name in ctl.reads},
    }
    if kind == "cali_ts":
        assert ctl.predictor(None) == 0.8


def test_chain_lengths_come_from_gamma_and_a_trees_cap_from_its_depth():
    assert _method("sd", gamma=7).controller.max_len() == 7
    assert _method("eesd", gamma=2, controller="heuristic").controller.start == 2
    assert _method("mcsd", k_config="2x2", controller="beta_ts", cap=16).controller.max_len() == 2


def test_observe_rejects_impossible_counts_and_should_continue_needs_a_drafted_token():
    ctl = BetaTSController(control_config())
    with pytest.raises(ValueError):
        ctl.observe(2, 3)
    with pytest.raises(ValueError):
        ctl.observe(2, -1)
    with pytest.raises(ValueError):
        ctl.should_continue(0, make_generator(0))


# ------------------------------------------------------------------------ confidence


def test_confidence_controller_drafts_on_while_the_newest_token_is_likely_enough():
    ctl = ConfidenceController(control_config(controller="confidence", confidence=0.4, cap=4))
    rng = make_generator(0)
    ctl.begin_round()
    assert ctl.should_continue(1, rng, 0.9)
    assert ctl.should_continue(2, rng, 0.4)  # at the threshold: go on
    assert not ctl.should_continue(3, rng, 0.39)
    st = ctl.state()
    assert [s["q"] for s in st.steps] == [0.9, 0.4, 0.39]
    assert [s["continue"] for s in st.steps] == [True, True, False]
    assert st.stop_reason == "confidence" and not st.cap_hit
    ctl.observe(3, 1)
    ctl.begin_round()  # a sure drafter still stops at the cap
    assert all(ctl.should_continue(k, rng, 1.0) for k in (1, 2, 3))
    assert not ctl.should_continue(4, rng, 1.0)
    assert ctl.state().cap_hit
    with pytest.raises(ValueError, match="probability"):
        ctl.should_continue(1, rng, None)


def test_confidence_is_the_controller_the_config_names():
    ctl = make_controller(control_config(controller="confidence", confidence=0.25), gamma=3)
    assert isinstance(ctl, ConfidenceController) and ctl.max_len() == 16
    assert ctl.state().config == {"confidence": 0.25, "cap": 16}
    with pytest.raises(ConfigError, match="confidence"):
        control_config(confidence=1.5)


# ------------------------------------------- the cost switch: one name, switch, in every family

TOKEN_SWITCHED = ["sd", "mcsd", "greedy_drafts", "eesd"]


@pytest.mark.parametrize("method", sorted(m for m, s in METHODS.items()
                                          if s.family in ("token", "beam")))
def test_every_speculative_family_turns_the_cost_switch_on_with_switch(method):
    spec = METHODS[method]
    rows = {p.name: p for p in spec.params}
    assert (rows["switch"].choices, rows["switch"].default) == (("off", "cost"), "off")
    if "controller" in rows:  # token methods: the alias is no controller kind on show
        assert "cost" not in rows["controller"].choices
        assert "cost" not in rows["controller"].help
    full = validate_params(spec.all_params, {"switch": "cost", "temperature": 1.0}, method)
    assert full["switch"] == "cost"
    assert spec.make(full).costs_wanted() == "measured"  # the switch plans: it wants costs
    off = validate_params(spec.all_params, {"temperature": 1.0}, method)
    assert off["switch"] == "off" and spec.make(off).costs_wanted() is None


@pytest.mark.parametrize("method", TOKEN_SWITCHED)
def test_controller_cost_is_a_deprecated_alias_that_validates_to_switch_cost(method):
    specs = METHODS[method].all_params
    canonical = validate_params(specs, {"switch": "cost"}, method)
    assert (canonical["switch"], canonical["controller"]) == ("cost", "fixed")
    assert validate_params(specs, {"controller": "cost"}, method) == canonical
    assert validate_params(specs, {"controller": "cost", "switch": "cost"}, method) == canonical
    assert validate_params(specs, {"switch": "cost", "controller": "fixed"}, method) == canonical
    assert validate_params(specs, canonical, method) == canonical  # a trace's params again
    built = METHODS[method].make(validate_params(specs, {"controller": "cost"}, method))
    assert built.controller.name == "cost"
    assert control_config(controller="cost") == control_config(switch="cost")
    assert "controller=cost: deprecated" in {p.name: p for p in specs}["switch"].help


@pytest.mark.parametrize("method", TOKEN_SWITCHED)
@pytest.mark.parametrize("given,message", [
    ({"switch": "cost", "controller": "beta_ts"},
     "switch=cost plans the draft depth itself and cannot combine with controller=beta_ts "
     "(use controller=fixed or switch=off)"),
    ({"switch": "cost", "controller": "confidence"},
     "switch=cost plans the draft depth itself and cannot combine with controller=confidence "
     "(use controller=fixed or switch=off)"),
    ({"controller": "cost", "switch": "off"},
     "controller=cost (deprecated: use switch=cost) conflicts with switch=off"),
])
def test_a_switch_that_conflicts_with_the_controller_is_one_config_error(method, given,
                                                                          message):
    with pytest.raises(ConfigError) as err:
        validate_params(METHODS[method].all_params, given, method)
    assert str(err.value) == message  # one line, naming both values


def test_a_given_controller_sets_a_tuned_switch_aside_and_a_given_switch_a_tuned_controller():
    sd, eesd = METHODS["sd"].all_params, METHODS["eesd"].all_params
    tuned = {"switch": "cost"}  # read in full: with controller=fixed
    assert layered(sd, tuned, {}) == ({"switch": "cost", "controller": "fixed"}, {})
    assert layered(sd, tuned, {"controller": "beta_ts"}) == ({}, {"controller": "beta_ts"})
    # controller=fixed turns the switch off, as it did when the switch was controller=cost
    assert layered(sd, tuned, {"controller": "fixed", "gamma": None}) == (
        {}, {"controller": "fixed"})
    assert layered(sd, {"controller": "cost"}, {"controller": "fixed"}) == (
        {}, {"controller": "fixed"})
    assert layered(sd, tuned, {"controller": "cost"}) == (
        {}, {"controller": "fixed", "switch": "cost"})
    # switch=off takes the controller=fixed the tuned switch implied with it: eesd's default
    assert layered(eesd, tuned, {"switch": "off"}) == ({}, {"switch": "off"})
    assert layered(eesd, {**tuned, "gamma": 3}, {"switch": "off"}) == (
        {"gamma": 3}, {"switch": "off"})
    assert layered(sd, {"controller": "confidence", "cap": 8}, {"switch": "cost"}) == (
        {"cap": 8}, {"switch": "cost", "controller": "fixed"})
    with pytest.raises(ConfigError, match="cannot combine with controller=heuristic"):
        layered(sd, tuned, {"switch": "cost", "controller": "heuristic"})  # one layer: an error
