"""Optuna's TPE (multivariate, constant liar) behind the budget; several idle slots share one fit."""

from __future__ import annotations

from dimr.search.proposers.optuna_sampler import OptunaProposer
from storage.optuna_compat import BatchTPESampler, CappedStudy


class TPEProposer(OptunaProposer):
    name = "tpe"
    batches = True

    def __init__(self, seed: int | None, startup: int):
        super().__init__(BatchTPESampler(seed=seed, multivariate=True, constant_liar=True,
                                         n_startup_trials=max(1, startup)))

    def suggest(self, ctx, trials, budgets, rngs):
        if len(trials) == 1:
            return super().suggest(ctx, trials, budgets, rngs)
        # k proposals from one fit (`BatchTPESampler.sample_batch`); its system-attribute writes for the first
        # trial are dropped: every trial has params.
        proposals = self.sampler.sample_batch(CappedStudy(ctx.study, self.history, {}), trials[0],
                                              budgets[0].space(), len(trials))
        return [self._project(p, b, rng) for p, b, rng in zip(proposals, budgets, rngs, strict=True)]
