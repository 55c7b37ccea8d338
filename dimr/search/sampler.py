"""`BudgetSampler`: an Optuna sampler over layer masks that respects the budget by construction.

One categorical parameter per layer (``layer_07`` = 1 keeps layer 7, `dimr.masks.mask_space`), or under a cost
budget two per layer (``attn_07``, ``mlp_07``: `dimr.masks.CostBudget`, whose masks are bit tuples); the
budget object owns the codec, random masks and moves, so the sampler and proposers work on bits. The sampler
owns the phases and novelty; what to propose in the Bayesian phase is the `MaskProposer`'s business:

1. seeds: trials before ``first_search_trial`` are enqueued heuristic masks (nothing to sample);
2. random phase: for the next ``startup`` trials, a mask drawn uniformly among the budget's masks (not
   per-layer coin flips, which would almost never hit an exact budget);
3. Bayesian phase: the proposer's masks (``swap`` by default), a random one where it has none.

Either way, a mask already complete or in flight is replaced by a budget-preserving neighbour, so the
study never spends an evaluation twice. Every trial's params *are* its mask, so the Bayesian model
learns from exactly what was evaluated.

The driver's contract with the sampler: it sets ``first_search_trial`` (the study's seed count), ``profile``
(the study's single-skip profile, once known),
``is_taken`` (the ledger's answer) and, around one ask, ``system_attrs`` (where a wrapped Optuna sampler's
system-attribute writes go, to be written with the trial); it asks `phase` and `batches` of a trial number,
and draws with `propose` (one trial, or a batch from one fit).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from optuna.samplers import BaseSampler
from optuna.trial import FrozenTrial, TrialState

from dimr.masks import Budget, CostBudget, Mask
from dimr.search.proposers import MaskProposer, ProposalContext
from storage.optuna_compat import HISTORY, CappedStudy

NOVELTY_TRIES = 64
ENUMERATE_LIMIT = 5000


class BudgetSampler(BaseSampler):
    """Random-then-Bayesian sampling over masks that skip exactly ``budget.skip`` layers (or, in a Pareto
    study, each of the counts ``skips`` in turn; or, under a `CostBudget`, sublayer masks within its cost)."""

    def __init__(self, budget: Budget | CostBudget, proposer: MaskProposer, startup: int, seed: int | None = None,
                 first_search_trial: int = 0, is_taken: Callable[[Mask], bool] = lambda m: False,
                 history: int = HISTORY, skips: tuple[int, ...] = ()):
        self.budget, self.proposer, self.startup, self.seed = budget, proposer, startup, seed
        self.skips = skips  # a Pareto study's skip counts, used in turn; empty: exactly budget.skip
        self.history = history
        self.first_search_trial = first_search_trial  # trials before it are the heuristic seeds
        self.is_taken = is_taken
        self.system_attrs: dict | None = None
        self._masks: dict[int, Mask] = {}  # trial number -> mask (params, once written, never change)
        self.profile: list[float] | None = None  # the study's single-skip profile (the driver sets it)

    def _rng(self, trial: FrozenTrial) -> np.random.Generator:
        return np.random.default_rng([self.seed if self.seed is not None else 0, trial.number])

    def phase(self, trial_number: int) -> str:
        if trial_number < self.first_search_trial:
            return "seed"
        if not self.proposer.bayesian or trial_number < self.first_search_trial + self.startup:
            return "random"
        return "bayes"

    def batches(self, trial_number: int) -> bool:
        """Whether `propose` may draw several masks from one fit for trials from ``trial_number`` on."""
        return self.proposer.batches and self.phase(trial_number) == "bayes"

    def trial_budget(self, trial_number: int) -> Budget | CostBudget:
        """The budget of one trial: ``budget``, or in a Pareto study the skip counts ``skips`` in turn."""
        if not self.skips:
            return self.budget
        return Budget(self.budget.num_layers, self.skips[trial_number % len(self.skips)])

    def _context(self, study) -> ProposalContext:
        return ProposalContext(study=study, num_layers=self.budget.num_layers, is_taken=self.is_taken,
                               evaluated=lambda: self._evaluated(study), held=lambda: self._held(study),
                               system_attrs=self.system_attrs, profile=self.profile)

    # -- Optuna's sampler interface (what `Study.ask` would call) --------------------------------------
    def infer_relative_search_space(self, study, trial):
        return self.budget.space()

    def sample_relative(self, study, trial, search_space):
        if "fixed_params" in trial.system_attrs:  # an enqueued mask (seed or retry): nothing to sample
            return {}
        rng = self._rng(trial)
        budget = self.trial_budget(trial.number)
        mask = None
        if self.phase(trial.number) == "bayes":
            mask = self.proposer.suggest(self._context(study), [trial], [budget], [rng])[0]
        if mask is None:
            mask = budget.random(rng)
        return budget.to_params(self._novel(mask, budget, rng, self.is_taken))

    def sample_independent(self, study, trial, param_name, param_distribution):
        # Only reached for enqueued params that are missing, which dimr never creates.
        return param_distribution.choices[0]

    def before_trial(self, study, trial):
        self.proposer.before_trial(study, trial)

    def after_trial(self, study, trial, state, values):
        self.proposer.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self.proposer.reseed_rng()

    # -- the driver's interface --------------------------------------------------------------------------
    def propose(self, study, trials: Sequence[FrozenTrial]) -> list[dict[str, int]]:
        """Params for each of ``trials``. One trial: what `Study.ask` would sample for it (an enqueued trial
        gets its fixed params). Several (new trials, none enqueued, all in the Bayesian phase of a proposer
        that `batches`): one fit, one draw per trial seeded by its number as `sample_relative` seeds it, then
        the same novelty fallback: the masks are distinct and not taken. With one trial both are the same."""
        if len(trials) == 1:
            trial = trials[0]
            self.before_trial(study, trial)
            return [{**self.sample_relative(study, trial, self.budget.space()),
                     **trial.system_attrs.get("fixed_params", {})}]
        if not all(self.batches(t.number) and "fixed_params" not in t.system_attrs for t in trials):
            raise ValueError("a batch takes new trials in the Bayesian phase")
        rngs = [self._rng(t) for t in trials]
        budgets = [self.trial_budget(t.number) for t in trials]
        proposed = self.proposer.suggest(self._context(study), trials, budgets, rngs)
        chosen: set[Mask] = set()
        out = []
        for mask, budget, rng in zip(proposed, budgets, rngs, strict=True):
            mask = self._novel(mask if mask is not None else budget.random(rng), budget, rng,
                               lambda m: m in chosen or self.is_taken(m))
            chosen.add(mask)
            out.append(budget.to_params(mask))
        return out

    # -- novelty -------------------------------------------------------------------------------------
    def _novel(self, mask: Mask, budget: Budget | CostBudget, rng: np.random.Generator,
               is_taken: Callable[[Mask], bool]) -> Mask:
        """``mask``, or if taken a nearby untaken one (budget-preserving moves, then a scan of a small space)."""
        for _ in range(NOVELTY_TRIES):
            if not is_taken(mask):
                return mask
            mask = budget.neighbour(mask, rng)
        return self._any_untaken(budget, rng, is_taken) or mask

    def _any_untaken(self, budget: Budget | CostBudget, rng: np.random.Generator,
                     is_taken: Callable[[Mask], bool] | None = None) -> Mask | None:
        """Nearly exhausted small spaces: scan every budget mask in random order."""
        masks = budget.all_masks(ENUMERATE_LIMIT)
        if masks is None:
            return None
        for j in rng.permutation(len(masks)):
            mask = masks[j]
            if not (is_taken or self.is_taken)(mask):
                return mask
        return None

    # -- what the proposers read ---------------------------------------------------------------------
    def _evaluated(self, study) -> list[tuple[Mask, float]]:
        """(mask, cost) of the complete trials the capped history shows (the best and the most recent, like
        the wrapped samplers': the swap model's fit is O(n²) in them); the cost is the first objective."""
        out = []
        complete = CappedStudy(study, self.history).get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        for t in complete:
            if t.number not in self._masks:  # a complete trial never changes: parse its params once
                self._masks[t.number] = self.budget.from_params(t.params)
            out.append((self._masks[t.number], t.values[0]))
        return out

    def _held(self, study) -> set[Mask]:
        """The masks of every complete or running trial this view holds (their params are written once)."""
        n, out = self.budget.bits, set()
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.RUNNING)):
            mask = self._masks.get(t.number)
            if mask is None and len(t.params) == n:
                mask = self._masks[t.number] = self.budget.from_params(t.params)
            if mask is not None:
                out.add(mask)
        return out
