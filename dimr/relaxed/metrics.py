"""Per-prompt metrics of ``dimr bench-relaxed`` and their 95% intervals over the prompt sample.

- :func:`repetition`: the repeated-n-gram rate of one output, the rambling score: the share of its n-grams
  that already occurred earlier in the same output (0 for a text without repeats, → 1 for a loop).
- :func:`mean_interval`: the Student-t interval of a mean over prompts, x̄ ± t_{0.975, n−1}·s/√n.
- :func:`ratio_interval`: the interval of a ratio of totals Σa/Σb over the same prompts (speed-up = Σ t_ar / Σ
  t_method) by the delta method: R ± t·√(Σ(a_i − R·b_i)² / (n − 1)) / (√n·b̄), the standard ratio-estimator
  interval; with every b_i equal it is the t-interval of a_i / b.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence

import numpy as np
from scipy import stats as st

LEVEL = 0.95


def repetition(tokens: Sequence[Hashable], n: int = 4) -> float:
    """Share of the n-grams of ``tokens`` (ids or words) that occurred earlier in them; 0 if there are none."""
    grams = [tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]
    return 1 - len(set(grams)) / len(grams) if grams else 0.0


def _t(n: int, level: float) -> float:
    return float(st.t.ppf(0.5 + level / 2, n - 1))


def mean_interval(values: Sequence[float], level: float = LEVEL) -> tuple[float, float]:
    """(low, high) of the t-interval of the mean; (x, x) for one value or none that is not NaN."""
    x = np.asarray([v for v in values if not math.isnan(v)], dtype=float)
    if x.size == 0:
        return math.nan, math.nan
    m = float(x.mean())
    if x.size == 1:
        return m, m
    half = _t(x.size, level) * float(x.std(ddof=1)) / math.sqrt(x.size)
    return m - half, m + half


def ratio_interval(num: Sequence[float], den: Sequence[float], level: float = LEVEL) -> tuple[float, float]:
    """(low, high) for Σ num / Σ den, paired by prompt (delta method, t quantile)."""
    a, b = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
    if a.size != b.size or a.size == 0 or b.sum() <= 0:
        return math.nan, math.nan
    r = float(a.sum() / b.sum())
    if a.size == 1:
        return r, r
    resid = a - r * b
    half = _t(a.size, level) * math.sqrt(float((resid ** 2).sum()) / (a.size - 1)) / (math.sqrt(a.size) * b.mean())
    return r - half, r + half
