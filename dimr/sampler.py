"""`BudgetSampler`: an Optuna sampler over layer masks that respects the budget by construction.

One categorical parameter per layer (``layer_07`` = 1 keeps layer 7). The sampler:

1. random phase: for the first ``startup`` trials (after the seeds), a mask drawn uniformly among the
   budget's masks (not per-layer coin flips, which would almost never hit an exact budget);
2. Bayesian phase: with ``swap`` (the default), `dimr.swap.SwapProposer`: a second-order surrogate of
   log(cost) and Thompson-sampled swap moves around the best masks, on the budget by construction; with ``tpe`` or
   ``gp``, the wrapped Optuna sampler's joint proposal (TPE multivariate with constant liar, or GP),
   projected onto the budget with the fewest flips.

Either way, a mask already complete or in flight is replaced by a budget-preserving neighbour, so the
study never spends an evaluation twice. Every trial's params *are* its mask, so the Bayesian model
learns from exactly what was evaluated.
"""

from __future__ import annotations

import copy
import itertools
import math
from collections.abc import Callable, Sequence

import numpy as np
import optuna
from optuna.distributions import CategoricalDistribution
from optuna.samplers import BaseSampler
from optuna.trial import FrozenTrial

from dimr.budget import Budget, Mask, neighbour, project, random_mask
from dimr.swap import SwapProposer

PARAM = "layer_{:02d}"
BIT = CategoricalDistribution((0, 1))
NOVELTY_TRIES = 64
ENUMERATE_LIMIT = 5000
HISTORY = 300  # finished trials the Bayesian sampler sees: the best BEST_KEPT and the most recent rest
BEST_KEPT = 25  # TPE's "good" group is at most its 25 best trials, so it stays exact


class _History:
    """A study as the wrapped Bayesian sampler sees it: every unfinished trial (constant liar), the
    ``BEST_KEPT`` best complete trials and the most recent finished ones, ``history`` in all.

    TPE's and GP's cost per ask grows with the trials they are shown; capped, an ask costs the same at
    trial 1000 as at trial 300, and TPE's good group (the best ``min(0.1 n, 25)``) is unchanged.
    """

    def __init__(self, study: optuna.Study, history: int, system_attrs: dict | None = None):
        self._study, self._history = study, history
        self._trials: list[FrozenTrial] | None = None  # one read per ask (TPE asks up to three times)
        if system_attrs is not None:  # the trial's system attributes go there, not to the storage
            self._storage = _SystemAttrs(study._storage, system_attrs)

    def __getattr__(self, name):
        return getattr(self._study, name)

    def _get_trials(self, deepcopy: bool = True, states=None, use_cache: bool = False) -> list[FrozenTrial]:
        if self._trials is None:
            self._trials = self._study._get_trials(deepcopy=False, states=None, use_cache=use_cache)
        trials = [copy.deepcopy(t) if deepcopy else t for t in self._trials if states is None or t.state in states]
        finished = [t for t in trials if t.state.is_finished()]
        if len(finished) <= self._history:
            return trials
        complete = [t for t in finished if t.state == optuna.trial.TrialState.COMPLETE and t.values]
        best = _best(complete, self._study.directions)
        keep = {t.number for t in best} | {t.number for t in finished[-(self._history - len(best)):]}
        return [t for t in trials if not t.state.is_finished() or t.number in keep]

    def get_trials(self, deepcopy: bool = True, states=None) -> list[FrozenTrial]:
        return self._get_trials(deepcopy=deepcopy, states=states, use_cache=True)


class _SystemAttrs:
    """A study's storage whose `set_trial_system_attr` only collects (TPE's constant liar records its proposal
    there): the driver writes them with the trial, which may not exist yet (`storage.batch.start_trial`)."""

    def __init__(self, storage, attrs: dict):
        self._storage_, self.attrs = storage, attrs

    def __getattr__(self, name):
        return getattr(self._storage_, name)

    def set_trial_system_attr(self, trial_id: int, key: str, value) -> None:
        self.attrs[key] = value


def _best(trials: list[FrozenTrial], directions) -> list[FrozenTrial]:
    """The ``BEST_KEPT`` best trials: by value, or in a multi-objective study the non-dominated ones
    (Pareto rank 1, then rank 2, ...), each rank ordered by its first objective."""
    signs = np.array([-1.0 if d == optuna.study.StudyDirection.MAXIMIZE else 1.0 for d in directions])
    values = np.array([t.values for t in trials], dtype=float).reshape(len(trials), len(signs)) * signs
    order = np.lexsort(values.T[::-1])  # by the first objective, ties by the next
    if len(signs) == 1:  # Pareto ranks of one objective are the sorted order: skip the O(n²) peeling per ask
        return [trials[i] for i in order[:BEST_KEPT]]
    left, best = list(order), []
    while left and len(best) < BEST_KEPT:
        v = values[left]
        dominated = ((v[None, :, :] <= v[:, None, :]).all(-1) & (v[None, :, :] < v[:, None, :]).any(-1)).any(1)
        best += [trials[i] for i, d in zip(left, dominated, strict=True) if not d]
        left = [i for i, d in zip(left, dominated, strict=True) if d]
    return best[:BEST_KEPT]


def mask_space(num_layers: int) -> dict[str, CategoricalDistribution]:
    return {PARAM.format(i): BIT for i in range(num_layers)}


def params_to_mask(params: dict, num_layers: int) -> Mask:
    return tuple(bool(params[PARAM.format(i)]) for i in range(num_layers))


def mask_to_params(mask: Mask) -> dict[str, int]:
    return {PARAM.format(i): int(b) for i, b in enumerate(mask)}


class BatchTPESampler(optuna.samplers.TPESampler):
    """Optuna's TPE that can also propose several candidates from one fit of its two densities (`sample_batch`).

    One ask of TPE draws ``n_ei_candidates`` (24) candidates from the good trials' density l and keeps the one
    with the highest l/g. `sample_batch` runs TPE's own ask once with k times as many candidates and keeps the
    best of each consecutive group of ``n_ei_candidates`` that no earlier group picked: k TPE proposals from one
    fit, distinct. The trials in flight are in that fit as constant liar puts them there; the batch's own
    proposals do not lie to each other (distinctness stands in for that). Outside `sample_batch` it is plain
    TPE."""

    _batch: tuple[dict[str, np.ndarray], np.ndarray] | None = None
    _batching = False

    def sample_batch(self, study, trial: FrozenTrial, search_space: dict, k: int) -> list[dict]:
        """k proposals (each a params dict, empty while TPE is in its startup phase) from one fit."""
        if k == 1:
            return [self.sample_relative(study, trial, search_space)]
        n = self._n_ei_candidates
        self._n_ei_candidates, self._batching, self._batch = n * k, True, None
        try:
            best = self.sample_relative(study, trial, search_space)
            batch = self._batch
        finally:
            self._n_ei_candidates, self._batching, self._batch = n, False, None
        if not best:  # no fit (too few trials): nothing to propose
            return [{} for _ in range(k)]
        if batch is None:  # loud, not k random masks: this Optuna's TPE no longer scores candidates there
            raise RuntimeError("TPESampler._compute_acquisition_func was not called: update BatchTPESampler")
        samples, acquisition = batch
        names = list(search_space)
        rows = np.stack([np.asarray(samples[name], dtype=float) for name in names], axis=1)
        picked: set[bytes] = set()
        out = []
        for j in range(k):  # the group's best candidate that no earlier group picked (its best, if all were)
            group = j * n + np.argsort(-acquisition[j * n:(j + 1) * n], kind="stable")
            i = next((int(i) for i in group if rows[i].tobytes() not in picked), int(group[0]))
            picked.add(rows[i].tobytes())
            out.append({name: search_space[name].to_external_repr(samples[name][i].item()) for name in names})
        return out

    def _compute_acquisition_func(self, samples, mpe_below, mpe_above) -> np.ndarray:
        values = super()._compute_acquisition_func(samples, mpe_below, mpe_above)
        if self._batching:
            self._batch = (samples, values)
        return values


def make_base_sampler(name: str, seed: int | None, startup: int) -> BaseSampler | SwapProposer | None:
    """The Bayesian sampler behind the budget: ``swap`` (default), ``tpe``, ``gp``, or ``random`` (none)."""
    if name == "swap":
        return SwapProposer()  # needs no random phase: startup 0 goes from the seeds straight to it
    if name == "tpe":
        return BatchTPESampler(seed=seed, multivariate=True, constant_liar=True, n_startup_trials=max(1, startup))
    if name == "gp":
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=max(1, startup))
    if name == "random":
        return None
    raise ValueError(f"unknown sampler {name!r}")


class BudgetSampler(BaseSampler):
    """Random-then-Bayesian sampling over masks that skip exactly ``budget.skip`` layers (or, in a Pareto
    study, each of the counts ``skips`` in turn)."""

    def __init__(self, budget: Budget, base: BaseSampler | SwapProposer | None, startup: int,
                 seed: int | None = None,
                 first_search_trial: int = 0, is_taken: Callable[[Mask], bool] = lambda m: False,
                 history: int = HISTORY, skips: tuple[int, ...] = ()):
        self.budget, self.base, self.startup, self.seed = budget, base, startup, seed
        self.skips = skips  # a Pareto study's skip counts, used in turn; empty: exactly budget.skip
        self.history = history
        self.first_search_trial = first_search_trial  # trials before it are the heuristic seeds
        self.is_taken = is_taken
        # Not None: where the wrapped sampler's writes of the trial's system attributes go instead of the
        # storage, for the caller to write with the trial (the driver creates the trial after sampling it).
        self.system_attrs: dict | None = None
        self._masks: dict[int, Mask] = {}  # trial number -> mask (params, once written, never change)

    def _rng(self, trial: FrozenTrial) -> np.random.Generator:
        return np.random.default_rng([self.seed if self.seed is not None else 0, trial.number])

    def phase(self, trial_number: int) -> str:
        if trial_number < self.first_search_trial:
            return "seed"
        if self.base is None or trial_number < self.first_search_trial + self.startup:
            return "random"
        return "bayes"

    def infer_relative_search_space(self, study, trial):
        return mask_space(self.budget.num_layers)

    def trial_budget(self, trial_number: int) -> Budget:
        """The budget of one trial: ``budget``, or in a Pareto study the skip counts ``skips`` in turn."""
        if not self.skips:
            return self.budget
        return Budget(self.budget.num_layers, self.skips[trial_number % len(self.skips)])

    def sample_relative(self, study, trial, search_space):
        if "fixed_params" in trial.system_attrs:  # an enqueued mask (seed or retry): nothing to sample
            return {}
        rng = self._rng(trial)
        budget = self.trial_budget(trial.number)
        mask: Mask | None = None
        if self.phase(trial.number) == "bayes" and isinstance(self.base, SwapProposer):
            mask = self.base.propose(budget, self._evaluated(study), self.is_taken, rng, self._held(study))
        elif self.phase(trial.number) == "bayes":
            # The space is known (every trial holds every layer's bit): Optuna's own inference compares
            # every trial's distributions on every ask, which grows with the study.
            proposal = self.base.sample_relative(_History(study, self.history, self.system_attrs), trial,
                                                 mask_space(self.budget.num_layers))
            if len(proposal) == self.budget.num_layers:
                mask = project(params_to_mask(proposal, self.budget.num_layers), budget, rng)
        if mask is None:
            mask = random_mask(budget, rng)
        return mask_to_params(self._novel(mask, budget, rng, self.is_taken))

    def batches(self, trial_number: int) -> bool:
        """Whether `sample_batch` draws several masks from one fit for trials from ``trial_number`` on: the
        Bayesian phase of the swap proposer or of TPE. (Random draws cost nothing; GP asks one at a time.)"""
        return isinstance(self.base, SwapProposer | BatchTPESampler) and self.phase(trial_number) == "bayes"

    def sample_batch(self, study, trials: Sequence[FrozenTrial]) -> list[dict[str, int]]:
        """Params for each of ``trials`` (new trials, none enqueued, all in the Bayesian phase) from one fit:
        swap: `SwapProposer.propose_batch`, one posterior draw per trial seeded by its number as
        `sample_relative` seeds it; TPE: `BatchTPESampler.sample_batch`, each proposal projected onto its
        trial's budget. Then the same novelty fallback: the masks are distinct and not taken. With one trial
        this is exactly `sample_relative`."""
        if not all(self.batches(t.number) and "fixed_params" not in t.system_attrs for t in trials):
            raise ValueError("sample_batch takes new trials in the Bayesian phase")
        space = mask_space(self.budget.num_layers)
        if len(trials) == 1:
            return [self.sample_relative(study, trials[0], space)]
        rngs = [self._rng(t) for t in trials]
        budgets = [self.trial_budget(t.number) for t in trials]
        if isinstance(self.base, SwapProposer):
            proposed = self.base.propose_batch(budgets, self._evaluated(study), self.is_taken, rngs, self._held(study))
        else:  # TPE's proposals (its system-attribute writes for the first trial are dropped: every trial has params)
            proposed = [project(params_to_mask(p, self.budget.num_layers), b, rng) if len(p) == len(space) else None
                        for p, b, rng in zip(self.base.sample_batch(_History(study, self.history, {}), trials[0],
                                                                   space, len(trials)), budgets, rngs, strict=True)]
        chosen: set[Mask] = set()
        out = []
        for mask, budget, rng in zip(proposed, budgets, rngs, strict=True):
            mask = self._novel(mask if mask is not None else random_mask(budget, rng), budget, rng,
                               lambda m: m in chosen or self.is_taken(m))
            chosen.add(mask)
            out.append(mask_to_params(mask))
        return out

    def _novel(self, mask: Mask, budget: Budget, rng: np.random.Generator, is_taken: Callable[[Mask], bool]) -> Mask:
        """``mask``, or if taken a nearby untaken one (budget-preserving moves, then a scan of a small space)."""
        for _ in range(NOVELTY_TRIES):
            if not is_taken(mask):
                return mask
            mask = neighbour(mask, rng)
        return self._any_untaken(budget, rng, is_taken) or mask

    def _evaluated(self, study) -> list[tuple[Mask, float]]:
        """(mask, cost) of the complete trials the capped history shows (the best and the most recent, like
        the wrapped samplers': the swap model's fit is O(n²) in them); the cost is the first objective."""
        n, out = self.budget.num_layers, []
        complete = _History(study, self.history).get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        for t in complete:
            if t.number not in self._masks:  # a complete trial never changes: parse its params once
                self._masks[t.number] = params_to_mask(t.params, n)
            out.append((self._masks[t.number], t.values[0]))
        return out

    def _held(self, study) -> set[Mask]:
        """The masks of every complete or running trial this view holds (their params are written once)."""
        n, out = self.budget.num_layers, set()
        states = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.RUNNING)
        for t in study.get_trials(deepcopy=False, states=states):
            mask = self._masks.get(t.number)
            if mask is None and len(t.params) == n:
                mask = self._masks[t.number] = params_to_mask(t.params, n)
            if mask is not None:
                out.add(mask)
        return out

    def _any_untaken(self, budget: Budget, rng: np.random.Generator,
                     is_taken: Callable[[Mask], bool] | None = None) -> Mask | None:
        """Nearly exhausted small spaces: scan every budget mask in random order."""
        n, k = budget.num_layers, budget.skip
        if math.comb(n, k) > ENUMERATE_LIMIT:
            return None
        combos = list(itertools.combinations(range(n), k))
        for j in rng.permutation(len(combos)):
            mask = tuple(i not in combos[j] for i in range(n))
            if not (is_taken or self.is_taken)(mask):
                return mask
        return None

    def sample_independent(self, study, trial, param_name, param_distribution):
        # Only reached for enqueued params that are missing, which dimr never creates.
        return param_distribution.choices[0]

    def before_trial(self, study, trial):
        if isinstance(self.base, BaseSampler):
            self.base.before_trial(study, trial)

    def after_trial(self, study, trial, state, values):
        if isinstance(self.base, BaseSampler):
            self.base.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        if isinstance(self.base, BaseSampler):
            self.base.reseed_rng()
