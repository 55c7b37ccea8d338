"""Optuna's Gaussian-process sampler behind the budget (one proposal per fit)."""

from __future__ import annotations

import optuna

from dimr.search.proposers.optuna_sampler import OptunaProposer


class GPProposer(OptunaProposer):
    name = "gp"

    def __init__(self, seed: int | None, startup: int):
        super().__init__(optuna.samplers.GPSampler(seed=seed, n_startup_trials=max(1, startup)))
