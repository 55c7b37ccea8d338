"""Surrogate-guided swap search: the Bayesian phase of dimr's default sampler (``--sampler swap``).

The proposer fits a second-order model of log(cost) to the evaluated masks by Bayesian linear regression:
one weight per skipped layer, one per pair of skipped layers (the pair terms catch that skipping a run
of adjacent layers compounds the damage), and one shared *run* weight on the number of skipped layers whose
two neighbours are skipped too (a contiguity feature: the third-order damage of long runs, learnt from every
mask at once), with a Gaussian prior on every weight. It proposes, among the masks
one *swap* away from the best mask so far (one skipped layer kept, one kept layer skipped: the budget holds by
construction), the untaken mask the posterior mean predicts cheapest (`EXPLORE` = 0; at 1 it would be Thompson
sampling, a posterior draw). The trust region explores: proposals walk the incumbent's neighbourhood in
predicted order, and move with the incumbent.

When several workers are idle at once, `propose_batch` fits the posterior once and serves every idle worker from
it (each its cheapest untaken mask, none twice; with ``EXPLORE`` > 0, one draw per worker).

With the study's single-skip profile (`dimr.search.driver`: p_i, the cost of skipping layer i alone), the
model starts from the additive guess: it fits log(cost) − log(Σ_{i skipped} p_i), the log of the cost's ratio
to the sum of its layers' single-skip costs. On smollm2 at skip 8 that guess alone ranks the profile seed's
swap neighbours at Spearman 0.89; fit to 30 of them, the model ranks the others at 0.92 with it and 0.65
without (`benchmarks/swap_model_fit.py`).

This is BOCS (Baptista & Poloczek, ICML 2018) with an exact-k budget and the mean as its acquisition,
optimised over swap neighbourhoods (a trust region around the incumbent). Under a cost budget
(`dimr.masks.CostBudget`, a sublayer search) the bits are attentions and MLPs and a move runs one skipped bit
again and skips none, one or two others, whatever keeps the mask within the budget (`CostBudget.moves`).
On the ``mini`` verifier (docs/search.md), searching only near the best masks beats proposing the model's
global optimum: with a few dozen evaluations the model ranks masks near the data well and far from it poorly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from dimr.masks import Budget, CostBudget, Mask, swaps  # noqa: F401 - swaps: re-exported
from dimr.search.proposers import MaskProposer

LAYER_PRIOR_VAR = 1.0  # prior variance of each layer's weight on log(cost)
PAIR_PRIOR_VAR = 1.0  # prior variance of each pair's interaction weight
RUN_PRIOR_VAR = 1.0  # prior variance of the shared run weight (on smollm2 at skip 12 it took the search from a
# local optimum 4.4% above the reference to 0.5%; skip 4 and 8 unchanged: docs/search.md)
NOISE_VAR = 0.01  # residual variance of log(cost) the model cannot explain
TOP_MASKS = 1  # proposals come from the swap neighbourhoods of this many best masks (a trust region:
# on smollm2 at skip 8 the incumbent's alone beat the 3 best masks' by 3.5% → 0.8% at 100 evaluations)
EXPLORE = 0.0  # acquisition: the posterior mean plus this fraction of a Thompson draw's deviation from it (1:
# Thompson sampling). With 466 weights and ~50 masks a draw's deviations swamp the differences between swap
# neighbours: on smollm2 at skip 8 the mean's pick among them costs 1.15-1.23, a draw's 1.37-1.43
# (`benchmarks/swap_model_fit.py`).
RANDOM_CANDIDATES = 512  # when those are all taken: this many random budget masks instead
EPS = 1e-12


def features(masks: Sequence[Mask]) -> np.ndarray:
    """[skipped_i for each layer] + [skipped_i · skipped_j for each pair i < j] + [run] + [1]: one row per mask.
    run: Σ_i skipped_{i-1} · skipped_i · skipped_{i+1}, that is Σ over runs of skipped bits of max(0, length − 2)."""
    z = 1.0 - np.asarray(masks, dtype=float)
    i, j = np.triu_indices(z.shape[1], k=1)
    run = (z[:, :-2] * z[:, 1:-1] * z[:, 2:]).sum(axis=1, keepdims=True)
    return np.hstack([z, z[:, i] * z[:, j], run, np.ones((len(z), 1))])


def baseline(masks: Sequence[Mask], profile: Sequence[float] | None) -> np.ndarray:
    """log(Σ_{i skipped} p_i), the additive guess the model corrects; 0 without a profile (one value per mask).
    A non-finite single-skip cost counts as 10× the largest finite one."""
    if profile is None or not len(masks):
        return np.zeros(len(masks))
    p = np.asarray(profile, dtype=float)
    finite = p[np.isfinite(p)]
    p = np.where(np.isfinite(p), np.maximum(p, 0.0), 10.0 * (finite.max() if finite.size else 1.0))
    return np.log((1.0 - np.asarray(masks, dtype=float)) @ p + EPS)


def prior_variances(num_layers: int) -> np.ndarray:
    n_pairs = num_layers * (num_layers - 1) // 2
    return np.concatenate([np.full(num_layers, LAYER_PRIOR_VAR), np.full(n_pairs, PAIR_PRIOR_VAR), [RUN_PRIOR_VAR],
                           [1.0]])


class SwapProposer(MaskProposer):
    """Proposes the next exact-k mask from the evaluated ones (see the module docstring)."""

    name = "swap"
    batches = True

    def suggest(self, ctx, trials, budgets, rngs):
        if len(trials) == 1:
            return [self.propose(budgets[0], ctx.evaluated(), ctx.is_taken, rngs[0], ctx.held(), ctx.profile)]
        return self.propose_batch(budgets, ctx.evaluated(), ctx.is_taken, rngs, ctx.held(), ctx.profile)

    def posterior(self, masks: Sequence[Mask], costs: Sequence[float],
                  profile: Sequence[float] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Mean and covariance of the weights given log(cost) − `baseline` of ``masks`` (the intercept's prior:
        the mean). The proposer draws with `sample_weights`; this closed form is what the draws are checked
        against."""
        x = features(masks)
        y = _target(masks, costs, profile)
        y0 = y.mean()
        precision = x.T @ x / NOISE_VAR + np.diag(1.0 / prior_variances(len(masks[0])))
        cov = np.linalg.inv(precision)
        mean = cov @ (x.T @ (y - y0)) / NOISE_VAR
        mean[-1] += y0
        return mean, (cov + cov.T) / 2

    def sample_weights(self, masks: Sequence[Mask], costs: Sequence[float], rng: np.random.Generator,
                       profile: Sequence[float] | None = None) -> np.ndarray:
        """One draw of the weights from the posterior, without forming the posterior covariance.

        Matheron's rule: a prior draw w0 and noise e, corrected by the data, w = w0 + D Xᵀ (X D Xᵀ + σ²I)⁻¹
        (y − X w0 − e), is an exact posterior draw. It costs O(n² d) with n evaluated masks, against O(d³) for
        `posterior` with d = L(L+1)/2 + 2 features (3,242 for an 80-layer verifier). With more masks than
        features it draws through the Cholesky factor of the precision instead."""
        return self.sample_weights_batch(masks, costs, [rng], profile)[:, 0]

    def sample_weights_batch(self, masks: Sequence[Mask], costs: Sequence[float],
                             rngs: Sequence[np.random.Generator], profile: Sequence[float] | None = None,
                             explore: float = 1.0) -> np.ndarray:
        """One posterior draw of the weights per generator in ``rngs``, from one fit: a [features, len(rngs)] array.

        Column j is one `sample_weights` draw from ``rngs[j]``; the kernel (or the precision's Cholesky factor)
        is formed and factorised once for every column. ``explore`` scales each draw's distance from the posterior
        mean (1: a posterior draw; 0: the mean; both parts of a draw's randomness are linear in it)."""
        x = features(masks)
        y = _target(masks, costs, profile)
        y0 = y.mean()
        d = prior_variances(len(masks[0]))
        n, dim = x.shape
        if n < dim:
            w0 = np.empty((dim, len(rngs)))
            e = np.empty((n, len(rngs)))
            for j, rng in enumerate(rngs):  # per draw: its prior weights, then its noise, as `sample_weights`
                w0[:, j] = explore * np.sqrt(d) * rng.standard_normal(dim)
                e[:, j] = explore * np.sqrt(NOISE_VAR) * rng.standard_normal(n)
            k = (x * d) @ x.T + NOISE_VAR * np.eye(n)
            w = w0 + d[:, None] * (x.T @ np.linalg.solve(k, (y - y0)[:, None] - x @ w0 - e))
        else:
            chol = np.linalg.cholesky(x.T @ x / NOISE_VAR + np.diag(1.0 / d))
            mean = np.linalg.solve(chol.T, np.linalg.solve(chol, x.T @ (y - y0) / NOISE_VAR))
            z = np.stack([rng.standard_normal(dim) for rng in rngs], axis=1)
            w = mean[:, None] + explore * np.linalg.solve(chol.T, z)
        w[-1] += y0
        return w

    def propose(self, budget: Budget | CostBudget, history: list[tuple[Mask, float]], is_taken: Callable[[Mask], bool],
                rng: np.random.Generator, held: set[Mask] | None = None,
                profile: Sequence[float] | None = None) -> Mask | None:
        """The untaken ``budget`` mask the model predicts cheapest (None: no data yet; see `EXPLORE`).

        The model learns from every mask in ``history``, whatever its skip count (a Pareto study mixes them).
        ``held``: masks known to be taken (evaluated or running), skipped without asking ``is_taken``.
        ``profile``: the single-skip profile (the model's `baseline`), or None.
        """
        history = [(m, c) for m, c in history if len(m) == budget.bits and np.isfinite(c)]
        if not history:
            return None
        weights = self.sample_weights_batch([m for m, _ in history], [c for _, c in history], [rng], profile,
                                            EXPLORE)[:, 0]
        seen = {m for m, _ in history} | (held or set())
        best = sorted((mc for mc in history if budget.admits(mc[0])), key=lambda mc: mc[1])[:TOP_MASKS]
        near = [m for m in dict.fromkeys(n for b, _ in best for n in budget.moves(b, rng)) if m not in seen]
        choice = _cheapest_untaken(near, weights, is_taken, profile=profile)
        if choice is None:  # the neighbourhoods are used up (or no mask on this budget yet): look further afield
            far = dict.fromkeys(budget.random(rng) for _ in range(RANDOM_CANDIDATES))
            far = [m for m in far if m not in seen]
            choice = _cheapest_untaken(far, weights, is_taken, profile=profile)
        return choice

    def propose_batch(self, budgets: Sequence[Budget | CostBudget], history: list[tuple[Mask, float]],
                      is_taken: Callable[[Mask], bool], rngs: Sequence[np.random.Generator],
                      held: set[Mask] | None = None, profile: Sequence[float] | None = None) -> list[Mask | None]:
        """One mask per draw, from one fit of the posterior: draw j (the mean, or with `EXPLORE` > 0 a tempered
        posterior draw) proposes, as `propose` with ``budgets[j]`` and ``rngs[j]`` would, the untaken mask it
        predicts cheapest, among those no earlier draw of the batch proposed. A draw that finds none gives None
        (so does every draw without data)."""
        if len(budgets) != len(rngs):
            raise ValueError("one budget per draw")
        history = [(m, c) for m, c in history if len(m) == budgets[0].bits and np.isfinite(c)]
        if not history:
            return [None] * len(rngs)
        weights = self.sample_weights_batch([m for m, _ in history], [c for _, c in history], rngs, profile, EXPLORE)
        seen = {m for m, _ in history} | (held or set())
        chosen: set[Mask] = set()

        def taken(m: Mask) -> bool:
            return m in chosen or is_taken(m)

        # The swap neighbourhoods by budget, with their features and baselines.
        pools: dict[Budget | CostBudget, tuple[list[Mask], np.ndarray | None, np.ndarray]] = {}
        out: list[Mask | None] = []
        for j, (budget, rng) in enumerate(zip(budgets, rngs, strict=True)):
            if budget not in pools:
                best = sorted((mc for mc in history if budget.admits(mc[0])), key=lambda mc: mc[1])[:TOP_MASKS]
                moved = dict.fromkeys(n for b, _ in best for n in budget.moves(b, rng))
                near = [m for m in moved if m not in seen]
                pools[budget] = (near, features(near) if near else None, baseline(near, profile))
            near, f, base = pools[budget]
            choice = None if f is None else _cheapest_untaken(near, weights[:, j], taken, f, base=base)
            if choice is None:
                far = dict.fromkeys(budget.random(rng) for _ in range(RANDOM_CANDIDATES))
                far = [m for m in far if m not in seen]
                choice = _cheapest_untaken(far, weights[:, j], taken, profile=profile)
            if choice is not None:
                chosen.add(choice)
            out.append(choice)
        return out


def _target(masks: Sequence[Mask], costs: Sequence[float], profile: Sequence[float] | None) -> np.ndarray:
    """What the model fits: log(cost) − `baseline`."""
    return np.log(np.maximum(np.asarray(costs, dtype=float), 0.0) + EPS) - baseline(masks, profile)


def _cheapest_untaken(pool: list[Mask], weights: np.ndarray, is_taken: Callable[[Mask], bool],
                      pool_features: np.ndarray | None = None, profile: Sequence[float] | None = None,
                      base: np.ndarray | None = None) -> Mask | None:
    """The pool's mask with the lowest predicted cost that no trial holds. ``is_taken`` is asked in order of
    prediction, so it runs about once (it is a database query in the driver), not once per candidate.
    ``pool_features`` and ``base``: `features` and `baseline` of ``pool``, if already computed."""
    if not pool:
        return None
    f = features(pool) if pool_features is None else pool_features
    base = baseline(pool, profile) if base is None else base
    for i in np.argsort(f @ weights + base, kind="stable"):
        if not is_taken(pool[i]):
            return pool[i]
    return None
