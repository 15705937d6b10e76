"""Statistics the report needs so that "within noise" is shown, not said.

- `wilson_interval`: a 95% interval for an accuracy (k right of n), good at
  small n and near 0% / 100%, where the normal approximation is not.
- `quantile_interval`: a distribution-free 95% interval for a latency
  percentile from order statistics (no resampling, so it is deterministic).
- `paired_comparison`: two modes on the same questions: how many flip
  right→wrong and wrong→right, and McNemar's exact test on those flips.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Hashable, Mapping, Sequence

Z_95 = 1.959963984540054


@dataclass(frozen=True)
class Proportion:
    """k of n, the rate, and its 95% Wilson interval (rate/lo/hi are None when n == 0)."""

    k: int
    n: int
    rate: float | None
    lo: float | None
    hi: float | None


@dataclass(frozen=True)
class Quantile:
    """A percentile of n values with a 95% order-statistic interval (None when n == 0)."""

    q: float
    n: int
    value: float | None
    lo: float | None
    hi: float | None


@dataclass(frozen=True)
class PairedComparison:
    """Mode A vs mode B on the questions both scored.

    `right_to_wrong` were right in A and wrong in B; `delta` is B's accuracy
    minus A's; `p_value` is McNemar's exact two-sided test of "no difference".
    """

    n: int
    both_right: int
    both_wrong: int
    right_to_wrong: int
    wrong_to_right: int
    delta: float | None
    p_value: float


def wilson_interval(k: int, n: int, z: float = Z_95) -> Proportion:
    """Wilson score interval for k successes in n trials."""
    if n < 0 or not 0 <= k <= max(n, 0):
        raise ValueError(f"need 0 <= k <= n, got k={k}, n={n}")
    if n == 0:
        return Proportion(k, n, None, None, None)
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    lo = 0.0 if k == 0 else max(0.0, centre - half)
    hi = 1.0 if k == n else min(1.0, centre + half)  # exact ends: no float dust at 0% / 100%
    return Proportion(k, n, p, lo, hi)


def quantile_interval(values: Sequence[float], q: float = 0.5, confidence: float = 0.95) -> Quantile:
    """The q-quantile (linear interpolation) and a distribution-free interval.

    The interval is [x_(l), x_(u)] with the ranks chosen so that
    P(x_(l) <= true quantile <= x_(u)) >= `confidence` (binomial order
    statistics); with too few values it widens to [min, max].
    """
    if not 0 < q < 1:
        raise ValueError(f"q must be in (0, 1), got {q}")
    xs = sorted(float(v) for v in values)
    n = len(xs)
    if n == 0:
        return Quantile(q, 0, None, None, None)
    pos = q * (n - 1)
    low, frac = int(math.floor(pos)), pos - math.floor(pos)
    value = xs[low] + (xs[min(low + 1, n - 1)] - xs[low]) * frac
    tail = (1 - confidence) / 2
    cdf, lower_rank, upper_rank = 0.0, 0, n - 1
    for j in range(n + 1):  # cdf = P(B <= j - 1), B ~ Binomial(n, q)
        if cdf <= tail:
            lower_rank = max(j - 1, 0)
        cdf += _binom_pmf(j, n, q)
        if cdf >= 1 - tail:
            upper_rank = min(j, n - 1)
            break
    return Quantile(q, n, value, xs[lower_rank], xs[upper_rank])


def mcnemar_exact(right_to_wrong: int, wrong_to_right: int) -> float:
    """Two-sided exact McNemar p-value: a binomial test of the discordant pairs at 1/2."""
    if right_to_wrong < 0 or wrong_to_right < 0:
        raise ValueError("flip counts must be non-negative")
    n = right_to_wrong + wrong_to_right
    if n == 0:
        return 1.0
    k = min(right_to_wrong, wrong_to_right)
    tail = sum(math.comb(n, i) for i in range(k + 1))
    return min(1.0, 2 * tail / 2**n)  # exact integers: no underflow at large n


def paired_comparison(a: Mapping[Hashable, bool], b: Mapping[Hashable, bool]) -> PairedComparison:
    """Compare two modes on the keys both scored (keys: question index)."""
    common = sorted(set(a) & set(b), key=repr)
    both_right = sum(a[key] and b[key] for key in common)
    both_wrong = sum(not a[key] and not b[key] for key in common)
    r2w = sum(a[key] and not b[key] for key in common)
    w2r = sum(not a[key] and b[key] for key in common)
    n = len(common)
    delta = (w2r - r2w) / n if n else None
    return PairedComparison(n, both_right, both_wrong, r2w, w2r, delta, mcnemar_exact(r2w, w2r))


def _binom_pmf(j: int, n: int, q: float) -> float:
    if j < 0 or j > n:
        return 0.0
    log = math.lgamma(n + 1) - math.lgamma(j + 1) - math.lgamma(n - j + 1)
    return math.exp(log + j * math.log(q) + (n - j) * math.log1p(-q))
