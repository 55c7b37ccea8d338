"""The swap proposer's model: its posterior against an independent computation, its posterior draws in
distribution, and its proposals on the budget."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import scipy.linalg

from dimr.masks import Budget, random_mask
from dimr.search.proposers import swap


def _independent_features(mask: tuple[bool, ...]) -> list[float]:
    z = [0.0 if keep else 1.0 for keep in mask]
    # the run feature by walking the runs: a run of n skipped layers adds max(0, n − 2)
    runs, n = 0, 0
    for skipped in z + [0.0]:
        n = n + 1 if skipped else 0
        runs += skipped and n >= 3
    return z + [z[i] * z[j] for i, j in itertools.combinations(range(len(z)), 2)] + [float(runs), 1.0]


def _data(n: int, layers: int, seed: int):
    rng = np.random.default_rng(seed)
    masks = [random_mask(Budget(layers, 2), rng) for _ in range(n)]
    costs = list(rng.lognormal(-3.0, 1.0, n))
    return masks, costs


def _reference_posterior(masks, costs, profile=None):
    x = np.array([_independent_features(m) for m in masks])
    y = np.log(np.asarray(costs) + swap.EPS)
    if profile is not None:  # the ratio to the additive guess: the sum of the skipped layers' single-skip costs
        y = y - np.log([sum(p for keep, p in zip(m, profile, strict=True) if not keep) + swap.EPS for m in masks])
    layers = len(masks[0])
    prior = np.array([swap.LAYER_PRIOR_VAR] * layers + [swap.PAIR_PRIOR_VAR] * (layers * (layers - 1) // 2)
                     + [swap.RUN_PRIOR_VAR, 1.0])
    precision = x.T @ x / swap.NOISE_VAR + np.diag(1.0 / prior)
    cov = scipy.linalg.inv(precision)
    mean = scipy.linalg.solve(precision, x.T @ (y - y.mean()) / swap.NOISE_VAR, assume_a="pos")
    mean[-1] += y.mean()
    return mean, cov


def test_the_run_feature_counts_skipped_layers_inside_runs():
    """Σ over runs of skipped layers of max(0, length − 2): 0 for isolated skips and pairs."""
    def runs(key):
        return swap.features([tuple(c == "1" for c in key)])[0, -2]
    assert runs("1111111111") == 0
    assert runs("0101010101") == 0
    assert runs("1001100111") == 0
    assert runs("1000011111") == 2  # one run of 4
    assert runs("0001000001") == 1 + 3  # runs of 3 and 5
    assert runs("0000000000") == 8
    rng = np.random.default_rng(3)
    masks = [random_mask(Budget(9, 6), rng) for _ in range(30)]
    x = swap.features(masks)
    assert x[:, -2].max() >= 2
    np.testing.assert_array_equal(x, np.array([_independent_features(m) for m in masks]))


def test_posterior_matches_an_independent_computation():
    masks, costs = _data(12, 6, seed=0)
    mean, cov = swap.SwapProposer().posterior(masks, costs)
    ref_mean, ref_cov = _reference_posterior(masks, costs)
    np.testing.assert_allclose(mean, ref_mean, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(cov, ref_cov, rtol=1e-8, atol=1e-12)


def test_a_profile_makes_the_model_fit_the_ratio_to_the_additive_guess():
    masks, costs = _data(12, 6, seed=0)
    profile = [0.3, 0.05, 1.2, 0.7, 0.01, 2.0]
    mean, cov = swap.SwapProposer().posterior(masks, costs, profile)
    ref_mean, ref_cov = _reference_posterior(masks, costs, profile)
    np.testing.assert_allclose(mean, ref_mean, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(cov, ref_cov, rtol=1e-8, atol=1e-12)
    assert not np.allclose(mean, swap.SwapProposer().posterior(masks, costs)[0])


def test_baseline_is_the_log_of_the_summed_single_skip_costs():
    masks = [(False, True, False), (True, True, False)]
    np.testing.assert_allclose(swap.baseline(masks, [0.5, 1.0, 2.0]), np.log([2.5 + swap.EPS, 2.0 + swap.EPS]))
    inf = float("inf")  # counts as 10× the largest finite single-skip cost
    np.testing.assert_allclose(swap.baseline(masks, [inf, 1.0, 2.0]), np.log([22.0 + swap.EPS, 2.0 + swap.EPS]))
    assert not swap.baseline(masks, None).any()


@pytest.mark.parametrize("n", [5, 40], ids=["fewer-masks-than-features", "more-masks-than-features"])
def test_explore_zero_is_the_posterior_mean(n):
    masks, costs = _data(n, 4, seed=n)
    profile = [0.2, 0.4, 0.1, 0.9]
    mean, _ = _reference_posterior(masks, costs, profile)
    w = swap.SwapProposer().sample_weights_batch(masks, costs, [np.random.default_rng(j) for j in range(3)], profile,
                                                 explore=0.0)
    np.testing.assert_allclose(w, np.stack([mean] * 3, axis=1), rtol=1e-7, atol=1e-9)


def test_on_an_additive_landscape_the_profile_picks_the_cheapest_swap():
    """Cost = the sum of the skipped layers' single-skip costs: from one evaluated mask, the proposal is the
    neighbour with the smallest sum (the model has nothing to correct), not whatever the prior says."""
    rng = np.random.default_rng(2)
    profile = list(rng.lognormal(-2.0, 1.0, 10))
    budget = Budget(10, 3)
    start = random_mask(budget, rng)

    def cost(m):
        return sum(p for keep, p in zip(m, profile, strict=True) if not keep)

    best = min(swap.swaps(start), key=cost)
    got = swap.SwapProposer().propose(budget, [(start, cost(start))], lambda m: False, rng, profile=profile)
    assert got == best


def test_on_a_landscape_that_punishes_long_runs_the_proposal_splits_the_run():
    """Cost = the additive guess × e^(runs): after a few masks the shared run weight has learnt the penalty, so
    from a mask skipping one run of 5 the proposal restores a layer inside it and leaves no run of 3 or more,
    although every single skip costs the same (the additive guess ties all swaps)."""
    profile = [0.1] * 12
    budget = Budget(12, 5)

    def cost(m):
        return sum(p for keep, p in zip(m, profile, strict=True) if not keep) * np.exp(swap.features([m])[0, -2])

    def skipping(*layers):
        return tuple(i not in layers for i in range(12))

    start = skipping(3, 4, 5, 6, 7)  # the one mask on the budget: a run of 5 (3 layers inside a run)
    others = [skipping(0, 1, 2), skipping(8, 9, 10, 11), skipping(1, 3), skipping(2, 3, 4, 5, 6, 7), skipping(0, 5, 10)]
    history = [(m, cost(m)) for m in [start, *others]]  # the others teach the model; off the budget
    got = swap.SwapProposer().propose(budget, history, lambda m: False, np.random.default_rng(0), profile=profile)
    assert got in swap.swaps(start)
    assert swap.features([got])[0, -2] == 0
    assert cost(got) == min(cost(m) for m in swap.swaps(start))


@pytest.mark.parametrize("n", [5, 40], ids=["fewer-masks-than-features", "more-masks-than-features"])
def test_weight_draws_follow_the_posterior(n):
    """5 masks of 4 layers (12 features): Matheron's rule; 40 masks: the precision's Cholesky factor."""
    masks, costs = _data(n, 4, seed=n)
    mean, cov = _reference_posterior(masks, costs)
    rng = np.random.default_rng(1)
    draws = np.array([swap.SwapProposer().sample_weights(masks, costs, rng) for _ in range(6000)])
    se = np.sqrt(np.diag(cov) / len(draws))
    assert np.all(np.abs(draws.mean(0) - mean) < 5 * se)
    emp = np.cov(draws.T)
    assert np.linalg.norm(emp - cov) / np.linalg.norm(cov) < 0.08


def test_a_wrong_draw_is_caught():
    """The same check fails a draw that forgets to correct the prior sample (w0 enters, X w0 is not taken off):
    right mean, far too wide."""
    masks, costs = _data(5, 4, seed=5)
    mean, cov = _reference_posterior(masks, costs)
    rng = np.random.default_rng(1)
    x = np.array([_independent_features(m) for m in masks])
    y = np.log(np.asarray(costs) + swap.EPS)
    d = np.ones(x.shape[1])  # the prior variances (all 1.0)
    k = (x * d) @ x.T + swap.NOISE_VAR * np.eye(len(x))
    draws = []
    for _ in range(3000):
        w0 = np.sqrt(d) * rng.standard_normal(len(d))
        e = np.sqrt(swap.NOISE_VAR) * rng.standard_normal(len(x))
        w = w0 + d * (x.T @ np.linalg.solve(k, y - y.mean() - e))
        w[-1] += y.mean()
        draws.append(w)
    emp = np.cov(np.array(draws).T)
    assert np.linalg.norm(emp - cov) / np.linalg.norm(cov) > 0.08


def test_proposals_are_untaken_budget_masks_and_ask_the_ledger_little():
    budget = Budget(10, 3)
    _, costs = _data(15, 10, seed=3)
    masks = [random_mask(budget, np.random.default_rng(i)) for i in range(15)]
    history = list(zip(masks, costs, strict=True))
    asked: list = []
    first = swap.SwapProposer().propose(budget, history, lambda m: False, np.random.default_rng(7))
    assert budget.admits(first) and first not in masks

    def taken(m):
        asked.append(m)
        return m == first

    second = swap.SwapProposer().propose(budget, history, taken, np.random.default_rng(7))
    assert budget.admits(second) and second not in masks and second != first
    assert asked[0] == first and len(asked) == 2  # the same draw: its favourite is taken, the runner-up is not


def test_held_masks_are_skipped_without_asking():
    budget = Budget(10, 3)
    _, costs = _data(15, 10, seed=3)
    history = [(random_mask(budget, np.random.default_rng(i)), c) for i, c in enumerate(costs)]
    first = swap.SwapProposer().propose(budget, history, lambda m: False, np.random.default_rng(7))
    asked: list = []
    second = swap.SwapProposer().propose(budget, history, lambda m: asked.append(m) or False,
                                         np.random.default_rng(7), held={first})
    assert second != first and first not in asked and asked == [second]


@pytest.mark.parametrize("n", [5, 40], ids=["fewer-masks-than-features", "more-masks-than-features"])
def test_a_batch_of_draws_is_the_single_draws_from_one_fit(n):
    """Column j of one batched fit is what `sample_weights` draws from the same generator."""
    masks, costs = _data(n, 4, seed=n)
    p = swap.SwapProposer()
    batch = p.sample_weights_batch(masks, costs, [np.random.default_rng([3, j]) for j in range(5)])
    singles = np.stack([p.sample_weights(masks, costs, np.random.default_rng([3, j])) for j in range(5)], axis=1)
    np.testing.assert_allclose(batch, singles, rtol=1e-9, atol=1e-9)
    assert np.linalg.matrix_rank(batch) == 5  # independent draws, not one draw repeated


@pytest.mark.parametrize("n", [5, 40], ids=["fewer-masks-than-features", "more-masks-than-features"])
def test_batched_draws_follow_the_posterior(n):
    """Every column of batched draws is a posterior draw (mean and covariance against scipy), and the columns of
    one batch are uncorrelated with each other (independent draws from the one fitted posterior)."""
    masks, costs = _data(n, 4, seed=n)
    mean, cov = _reference_posterior(masks, costs)
    rng = np.random.default_rng(11)
    w = np.stack([swap.SwapProposer().sample_weights_batch(masks, costs, [rng, rng, rng]) for _ in range(3000)])
    se = np.sqrt(np.diag(cov) / len(w))
    for j in range(3):
        assert np.all(np.abs(w[:, :, j].mean(0) - mean) < 5 * se)
        assert np.linalg.norm(np.cov(w[:, :, j].T) - cov) / np.linalg.norm(cov) < 0.1
    cross = (w[:, :, 0] - mean).T @ (w[:, :, 1] - mean) / len(w)
    assert np.linalg.norm(cross) / np.linalg.norm(cov) < 0.1


def test_a_batch_of_proposals_is_distinct_on_the_budget_and_untaken():
    budget = Budget(10, 3)
    _, costs = _data(15, 10, seed=3)
    history = [(random_mask(budget, np.random.default_rng(i)), c) for i, c in enumerate(costs)]
    first = swap.SwapProposer().propose(budget, history, lambda m: False, np.random.default_rng([7, 0]))
    taken = {first}
    rngs = [np.random.default_rng([7, j]) for j in range(12)]
    out = swap.SwapProposer().propose_batch([budget] * 12, history, taken.__contains__, rngs)
    assert len(out) == 12 and len(set(out)) == 12
    assert all(budget.admits(m) and m not in taken and m not in dict(history) for m in out)
    # with nothing taken, the first draw of the batch is exactly `propose` with its generator
    again = swap.SwapProposer().propose_batch([budget] * 3, history, lambda m: False,
                                              [np.random.default_rng([7, j]) for j in range(3)])
    assert again[0] == first


def test_a_batch_larger_than_the_neighbourhoods_looks_further_afield():
    """4 layers, skip 2 (6 masks), 2 evaluated: the swaps of the best cover what is left; a batch of 4 takes every
    untaken mask once, and a fifth draw finds none."""
    budget = Budget(4, 2)
    history = [((False, False, True, True), 0.1), ((True, True, False, False), 0.5)]
    rngs = [np.random.default_rng(j) for j in range(5)]
    out = swap.SwapProposer().propose_batch([budget] * 5, history, lambda m: False, rngs)
    assert sorted(out[:4]) == sorted(m for m in itertools.product([False, True], repeat=4)
                                     if budget.admits(m) and m not in dict(history))
    assert out[4] is None
