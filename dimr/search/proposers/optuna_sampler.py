"""A proposer around an Optuna sampler: its joint proposal over the mask's bits, projected onto the budget."""

from __future__ import annotations

import optuna

from dimr.search.proposers import MaskProposer
from storage.optuna_compat import HISTORY, CappedStudy


class OptunaProposer(MaskProposer):
    """Optuna's ``sampler`` sees the capped history (`CappedStudy`) and proposes every layer's bit; the
    proposal is projected onto the trial's budget with the fewest flips."""

    def __init__(self, sampler: optuna.samplers.BaseSampler, history: int = HISTORY):
        self.sampler, self.history = sampler, history

    def suggest(self, ctx, trials, budgets, rngs):
        if len(trials) != 1:
            raise ValueError(f"{self.name} proposes one trial at a time")
        # The space is known (every trial holds every layer's bit): Optuna's own inference compares every
        # trial's distributions on every ask, which grows with the study.
        proposal = self.sampler.sample_relative(CappedStudy(ctx.study, self.history, ctx.system_attrs), trials[0],
                                                budgets[0].space())
        return [self._project(proposal, budgets[0], rngs[0])]

    @staticmethod
    def _project(proposal: dict, budget, rng):
        return budget.project(budget.from_params(proposal), rng) if len(proposal) == budget.bits else None

    def before_trial(self, study, trial):
        self.sampler.before_trial(study, trial)

    def after_trial(self, study, trial, state, values):
        self.sampler.after_trial(study, trial, state, values)

    def reseed_rng(self):
        self.sampler.reseed_rng()

