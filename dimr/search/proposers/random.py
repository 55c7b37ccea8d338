"""Random search: no Bayesian phase; every mask is drawn uniformly among the budget's masks."""

from __future__ import annotations

from dimr.search.proposers import MaskProposer


class RandomProposer(MaskProposer):
    name = "random"
    bayesian = False

    def suggest(self, ctx, trials, budgets, rngs):
        return [b.random(rng) for b, rng in zip(budgets, rngs, strict=True)]
