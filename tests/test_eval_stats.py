"""Confidence intervals, McNemar's exact test and paired flips, against hand-computed values."""

from __future__ import annotations

import pytest

from headstart.eval.stats import mcnemar_exact, paired_comparison, quantile_interval, wilson_interval


@pytest.mark.parametrize(
    ("k", "n", "rate", "lo", "hi"),
    [
        (70, 100, 0.7, 0.604151, 0.781051),
        (10, 10, 1.0, 0.722467, 1.0),
        (0, 10, 0.0, 0.0, 0.277533),
        (972, 972, 1.0, 0.996063, 1.0),
        (1, 2, 0.5, 0.094531, 0.905469),
    ],
)
def test_wilson_interval(k: int, n: int, rate: float, lo: float, hi: float) -> None:
    got = wilson_interval(k, n)
    assert (got.k, got.n, got.rate) == (k, n, rate)
    assert got.lo == pytest.approx(lo, abs=1e-6)
    assert got.hi == pytest.approx(hi, abs=1e-6)


def test_wilson_interval_without_data() -> None:
    got = wilson_interval(0, 0)
    assert (got.rate, got.lo, got.hi) == (None, None, None)


@pytest.mark.parametrize(("k", "n"), [(-1, 3), (4, 3), (0, -1)])
def test_wilson_interval_rejects_impossible_counts(k: int, n: int) -> None:
    with pytest.raises(ValueError, match="0 <= k <= n"):
        wilson_interval(k, n)


@pytest.mark.parametrize(
    ("b", "c", "p"),
    [
        (0, 0, 1.0),
        (3, 10, 378 * 2 / 8192),  # 2 * P(X <= 3), X ~ Bin(13, 1/2)
        (0, 5, 2 / 32),
        (5, 5, 1.0),
        (1, 0, 1.0),
        (0, 20, 2 / 2**20),
    ],
)
def test_mcnemar_exact(b: int, c: int, p: float) -> None:
    assert mcnemar_exact(b, c) == pytest.approx(p)
    assert mcnemar_exact(c, b) == pytest.approx(p)


def test_mcnemar_large_counts_do_not_underflow() -> None:
    assert 0.0 < mcnemar_exact(900, 1000) < 0.05
    assert mcnemar_exact(1000, 1000) == 1.0


@pytest.mark.parametrize(
    ("values", "q", "value", "lo", "hi"),
    [
        (list(range(1, 101)), 0.5, 50.5, 40, 61),
        (list(range(1, 11)), 0.5, 5.5, 2, 9),
        ([5.0], 0.5, 5.0, 5.0, 5.0),
        ([3, 1, 2], 0.5, 2.0, 1, 3),
        (list(range(1, 101)), 0.9, 90.1, 84, 96),
    ],
)
def test_quantile_interval(values: list[float], q: float, value: float, lo: float, hi: float) -> None:
    got = quantile_interval(values, q)
    assert got.value == pytest.approx(value)
    assert (got.lo, got.hi) == (lo, hi)


def test_quantile_interval_without_data() -> None:
    got = quantile_interval([], 0.5)
    assert (got.n, got.value, got.lo, got.hi) == (0, None, None, None)


def test_paired_comparison_counts_flips_on_common_questions() -> None:
    a = {0: True, 1: True, 2: False, 3: False, 4: True, 5: True}
    b = {0: True, 1: False, 2: True, 3: False, 4: False, 6: True}  # 5 and 6 are not paired
    got = paired_comparison(a, b)
    assert (got.n, got.both_right, got.both_wrong, got.right_to_wrong, got.wrong_to_right) == (5, 1, 1, 2, 1)
    assert got.delta == pytest.approx(-1 / 5)
    assert got.p_value == pytest.approx(1.0)
