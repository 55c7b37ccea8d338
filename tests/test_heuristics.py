"""The heuristic seed masks, each against an independent computation."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from dimr.masks import Budget
from dimr.search import heuristics

INFLUENCE = [0.9, 0.30, 0.05, 0.06, 0.07, 0.5, 0.02, 0.4, 0.8, 0.95]


def skipped(mask) -> set[int]:
    return {i for i, keep in enumerate(mask) if not keep}


def test_skip_last_and_block_influence():
    b = Budget(10, 3)
    assert skipped(heuristics.skip_last(b)) == {7, 8, 9}
    assert skipped(heuristics.least_influential(b, INFLUENCE)) == set(np.argsort(INFLUENCE)[:3].tolist())


def test_spaced_influence_never_skips_neighbours_while_it_can():
    mask = heuristics.spaced_least_influential(Budget(10, 3), INFLUENCE)
    s = sorted(skipped(mask))
    assert len(s) == 3 and all(b - a > 1 for a, b in itertools.pairwise(s))
    assert s == [2, 4, 6]  # 6, then 2; 3 is next to 2, so 4


@pytest.mark.parametrize("k", [1, 3, 4, 9])
def test_influence_window_is_the_cheapest_contiguous_run(k):
    mask = heuristics.least_influential_window(Budget(10, k), INFLUENCE)
    s = sorted(skipped(mask))
    assert s == list(range(s[0], s[0] + k))
    sums = np.convolve(INFLUENCE, np.ones(k), mode="valid")  # every window's total, computed apart
    assert sum(INFLUENCE[i] for i in s) == pytest.approx(sums.min())


def test_seed_masks_are_distinct_and_on_the_budget():
    b = Budget(10, 3)
    seeds = heuristics.seed_masks(b, INFLUENCE)
    masks = [m for _, m in seeds]
    assert len(set(masks)) == len(masks) and all(b.admits(m) for m in masks)
    assert [n for n, _ in seeds][0] == "skip-last" and "influence-window" in dict(seeds)
