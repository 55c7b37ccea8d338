"""Mask proposers: what the search's Bayesian phase asks for its next masks, behind one interface.

A proposer gets the trials to propose for (new trials, in the Bayesian phase), each trial's budget and
random generator, and a `ProposalContext` (the study, the evaluated masks and their costs, the masks held by
any trial, the ledger's "is this mask taken?"). It returns one mask per trial, or None where it has nothing
to say; `dimr.search.sampler.BudgetSampler` then falls back to a random budget mask and makes every mask
novel. Add a proposer: a module here with a `MaskProposer` subclass, and a line in `PROPOSERS`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import optuna
from optuna.trial import FrozenTrial

from dimr.masks import Budget, Mask


@dataclass
class ProposalContext:
    """What a proposer may read while it proposes (all of it as of this ask)."""

    study: optuna.Study
    num_layers: int
    is_taken: Callable[[Mask], bool]  # complete, running or queued for a retry, by any driver (the ledger)
    evaluated: Callable[[], list[tuple[Mask, float]]]  # (mask, first objective) of the capped history
    held: Callable[[], set[Mask]]  # masks of every complete or running trial the study view holds
    system_attrs: dict | None = None  # where an Optuna sampler's system-attribute writes go (one trial)
    profile: list[float] | None = None  # the study's single-skip profile (cost of skipping bit i alone), if any


class MaskProposer:
    """The interface. ``bayesian``: False for a proposer that is a random search (no Bayesian phase);
    ``batches``: `suggest` can serve several trials from one fit."""

    name = ""
    bayesian = True
    batches = False

    def suggest(self, ctx: ProposalContext, trials: Sequence[FrozenTrial], budgets: Sequence[Budget],
                rngs: Sequence[np.random.Generator]) -> list[Mask | None]:
        raise NotImplementedError

    # Optuna's sampler hooks, forwarded by `BudgetSampler` (only proposers that wrap an Optuna sampler use them).
    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        pass

    def after_trial(self, study: optuna.Study, trial: FrozenTrial, state, values) -> None:
        pass

    def reseed_rng(self) -> None:
        pass


def make_proposer(name: str, seed: int | None = None, startup: int = 0) -> MaskProposer:
    """``swap`` (default), ``tpe``, ``gp`` or ``random``."""
    if name not in PROPOSERS:
        raise ValueError(f"unknown sampler {name!r}; choose one of {', '.join(PROPOSERS)}")
    return PROPOSERS[name](seed=seed, startup=startup)


def _swap(**_):
    from dimr.search.proposers.swap import SwapProposer

    return SwapProposer()


def _tpe(seed, startup):
    from dimr.search.proposers.tpe import TPEProposer

    return TPEProposer(seed, startup)


def _gp(seed, startup):
    from dimr.search.proposers.gp import GPProposer

    return GPProposer(seed, startup)


def _random(**_):
    from dimr.search.proposers.random import RandomProposer

    return RandomProposer()


PROPOSERS: dict[str, Callable[..., MaskProposer]] = {"swap": _swap, "tpe": _tpe, "gp": _gp, "random": _random}
