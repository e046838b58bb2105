"""tests/stats.py: the chi-square test and the power calculation that sizes it."""

import pytest

from tests.stats import (
    ALPHA,
    POWER,
    chi_square,
    merged_cells,
    mixture_at_tv,
    power,
    sample_size,
    simulated_power,
    tv,
)


def test_the_power_calculation_is_right_about_a_known_case():
    """Uniform law on 4 cells against a wrong law at chi2 distance 0.02: the noncentral and the
    simulated power agree, sample_size reaches POWER by both, and the right law is rejected
    at the false-alarm rate ALPHA."""
    law = {i: 0.25 for i in range(4)}
    wrong = {0: 0.30, 1: 0.20, 2: 0.25, 3: 0.25}
    n = sample_size(law, wrong)
    assert power(law, wrong, n) >= POWER and simulated_power(law, wrong, n) >= POWER
    assert power(law, wrong, n - 500) < POWER
    assert abs(power(law, wrong, n) - simulated_power(law, wrong, n)) < 0.01
    assert power(law, law, n) == pytest.approx(ALPHA)  # the right law: the false-alarm rate
    assert simulated_power(law, law, n) <= 0.001


def test_rare_cells_are_merged_and_the_statistic_is_pearsons():
    law = {"a": 0.5, "b": 0.49, "c": 0.006, "d": 0.004}
    assert merged_cells(law, 1000) == [("a",), ("b",), ("c",), ("d",)]
    assert merged_cells(law, 600) == [("a",), ("b",), ("c", "d")]
    stat, threshold = chi_square({"a": 310, "b": 284, "d": 6}, law, 600)
    assert abs(stat - (10**2 / 300 + 10**2 / 294 + 0**2 / 6)) < 1e-9
    assert abs(threshold - 18.421) < 1e-3  # chi2(2).isf(1e-4): 2 dof, 1e-4 false alarms


def test_a_mixture_sits_at_the_asked_distance():
    law, other = {0: 0.5, 1: 0.5}, {0: 0.9, 1: 0.1}
    mixed = mixture_at_tv(law, other, 0.05)
    assert abs(tv(law, mixed) - 0.05) < 1e-12 and abs(sum(mixed.values()) - 1) < 1e-12


def test_exactness_tests_are_sized_against_the_harder_of_two_deviations():
    """q concentrated where p is small (a lookup drafter): the mixture towards q is easy to
    detect, the spread one is not, and N is the one that detects both."""
    from tests.stats import exactness_size

    law = {i: 0.96 / 4 for i in range(4)} | {4: 0.02, 5: 0.02}
    q_law = {5: 1.0}
    n, note = exactness_size(law, q_law)
    uniform = {c: 1 / 6 for c in law}
    spread = sample_size(law, mixture_at_tv(law, uniform, 0.05))
    towards_q = sample_size(law, mixture_at_tv(law, q_law, 0.05))
    assert towards_q < spread == n
    assert note.startswith(f"N={n}, ")
