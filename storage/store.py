"""`TrialStore`: the search driver's one door to persistence, for one study.

It starts trials (claiming their masks in the same transaction), finishes and fails them (releasing the
mask with it), beats for the trials in flight, counts the study's masks, lists what other drivers hold,
and gives the study view the sampler reads (`StudyCache`). Behind it: Optuna's RDB storage, dimr's mask
ledger and the one-transaction writes of `storage.trials`; the driver never sees any of them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, TrialState

from storage import optuna_compat as compat
from storage.ledger import MaskLedger, delete_rows
from storage.optuna_compat import StudyCache
from storage.trials import Started, as_finished, beat, finish_trial, start_trial, start_trials, write_trial


class TrialStore:
    """Trials and mask ledger of one study on one RDB storage, written by one driver (``owner``)."""

    def __init__(self, storage: optuna.storages.RDBStorage, distributions: dict[str, BaseDistribution], owner: str):
        self.storage, self.distributions, self.owner = storage, distributions, owner
        self.view = StudyCache(storage)  # what the study (and so the sampler) reads through
        self.ledger: MaskLedger | None = None
        self.study_id: int | None = None

    def attach(self, study: optuna.Study, new: bool = False) -> None:
        """Bind to ``study`` (opened on `view`). ``new``: this driver just created it, so ledger rows under its
        id are a deleted study's and are dropped."""
        self.study_id = compat.study_id(study)
        self.ledger = MaskLedger(self.storage, self.study_id)
        if new:
            delete_rows(self.storage.engine, self.study_id)

    # -- reads ---------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def one_read(self) -> Iterator[None]:
        """Read the study from the database at most once in this block (one ask)."""
        with self.view.one_read():
            yield

    def trials(self, study: optuna.Study) -> list[FrozenTrial]:
        """Every trial of the study, read now (inside `one_read`: once per block)."""
        return compat.read_trials(study)

    def counts(self) -> tuple[int, int]:
        """(complete, running) masks of the study, all drivers. Masks queued for a retry are held by nobody."""
        c = self.ledger.counts()
        return c.get("complete", 0), c.get("running", 0)

    def is_taken(self, key: str) -> bool:
        return self.ledger.is_taken(key)

    def running_masks(self) -> list[tuple[str, int]]:
        """(mask key, trial number) of every mask being evaluated now, by any driver."""
        return self.ledger.running()

    # -- writes --------------------------------------------------------------------------------------
    def start(self, key: str, params: dict[str, Any], user_attrs: dict[str, Any], limit: int,
              system_attrs: dict[str, Any] | None = None, waiting: FrozenTrial | None = None) -> Started | None:
        """Claim ``key`` and start its trial in one transaction (`storage.trials.start_trial`)."""
        started = start_trial(self.storage, self.ledger, key, params, self.distributions, user_attrs, self.owner,
                              limit, system_attrs=system_attrs, waiting=waiting)
        if started is not None:
            self.view.remember(self.study_id, started.trial)
        return started

    def start_many(self, items: Sequence[tuple[str, dict[str, Any], dict[str, Any]]], limit: int) -> list[Started]:
        """Several new trials in one transaction (`storage.trials.start_trials`)."""
        started = start_trials(self.storage, self.ledger, items, self.distributions, self.owner, limit)
        for one in started:
            self.view.remember(self.study_id, one.trial)
        return started

    def finish(self, trial: FrozenTrial, key: str, values: Sequence[float],
               metrics: dict[str, Any]) -> FrozenTrial | None:
        """COMPLETE with ``values`` and the mask's ledger row, in one transaction. None: the trial was already
        finished (failed by a recovery while this driver could not beat, or this write committed by a try whose
        answer was lost)."""
        try:
            when = finish_trial(self.storage, compat.trial_id(trial), values, metrics,
                                also=[self.ledger.complete_statement(key, values[0], metrics)])
        except optuna.exceptions.UpdateFinishedTrialError:
            return None
        done = as_finished(trial, TrialState.COMPLETE, values, metrics, when)
        self.view.remember(self.study_id, done)
        return done

    def fail(self, trial: FrozenTrial, key: str, attrs: dict[str, Any] | None = None) -> FrozenTrial | None:
        """FAIL (with ``attrs``, e.g. the error) and release the mask, in one transaction. None: the trial was
        already finished (another driver failed it; its ledger row is released by the next recovery)."""
        try:
            when = finish_trial(self.storage, compat.trial_id(trial), None, attrs,
                                also=[self.ledger.fail_statement(key)], state=TrialState.FAIL)
        except optuna.exceptions.UpdateFinishedTrialError:
            return None
        done = as_finished(trial, TrialState.FAIL, None, attrs, when)
        self.view.remember(self.study_id, done)
        return done

    def beat(self, trials: Sequence[FrozenTrial]) -> None:
        """One heartbeat statement for every trial in ``trials``."""
        beat(self.storage, [compat.trial_id(t) for t in trials])

    def fail_trial(self, trial: FrozenTrial) -> None:
        """FAIL a RUNNING trial of a dead driver (its mask is released by `release_failed`)."""
        try:
            self.storage.set_trial_state_values(compat.trial_id(trial), state=TrialState.FAIL)
        except optuna.exceptions.UpdateFinishedTrialError:
            pass

    def release_failed(self, trial_number: int) -> None:
        self.ledger.fail_trial(trial_number)

    def complete_mask(self, key: str, cost: float, metrics: dict[str, Any]) -> None:
        """Record a mask complete whose trial was told COMPLETE by a driver that died before the ledger."""
        self.ledger.complete(key, cost, metrics)

    def take_for_retry(self) -> list[tuple[str, int]]:
        return self.ledger.take_for_retry()

    def finish_non_finite(self, study: optuna.Study, trial: FrozenTrial, key: str, told, cost: float,
                          metrics: dict[str, Any]) -> None:
        """A non-finite cost: Optuna's own `tell` records it (as a FAIL, with its warning); the mask is
        complete all the same (evaluating it again would give the same)."""
        write_trial(self.storage, compat.trial_id(trial), user_attrs=metrics)
        study.tell(trial.number, told)
        self.ledger.complete(key, cost, metrics)
