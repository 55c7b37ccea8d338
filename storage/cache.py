"""The driver's view of a study's trials: Optuna's RDB cache, without re-reading every running trial.

Optuna wraps an RDB storage in `_CachedStorage`, which keeps finished trials but reads every unfinished
trial again, with all its params and attributes, on every `get_all_trials`: at least twice per ask (the
waiting-trial queue and the sampler). With N trials in flight that is N × layers rows per ask, N asks per
evaluation round: the driver's cost grows with the square of the worker count.

dimr writes a running trial's params and attributes once, in one transaction (`storage.batch`), and then
only its state changes until it finishes. So this cache asks the database for the *state* of the
unfinished trials (one small query) and reads in full only the trials that are new, changed state, or
had no params yet when last read.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import optuna
from optuna.storages._cached_storage import _CachedStorage, _StudyInfo
from optuna.storages._rdb import models
from sqlalchemy import select
from sqlalchemy.orm import Session


class StudyCache(_CachedStorage):
    """`_CachedStorage` with an incremental refresh of unfinished trials (see the module docstring)."""

    def __init__(self, backend: optuna.storages.RDBStorage):
        super().__init__(backend)
        self._seen: dict[int, int] = {}  # study id -> highest trial id read so far
        self._held: set[int] | None = None  # inside `one_read`: the studies already read

    @contextmanager
    def one_read(self) -> Iterator[None]:
        """Read each study from the database at most once in this block. One ask reads the trials twice
        (Optuna's waiting-trial queue, then the sampler); the second read would only find what other
        drivers did in the milliseconds between, which the next ask sees anyway."""
        self._held = set()
        try:
            yield
        finally:
            self._held = None

    def get_trial(self, trial_id: int) -> optuna.trial.FrozenTrial:
        """Inside `one_read`, an unfinished trial comes from the cache too: `Study.ask` reads the trial it
        has just created (or taken from the queue) back from the database, six queries, to build its
        `Trial` from the same params and attributes the cache already holds."""
        if self._held is not None:
            with self._lock:
                where = self._trial_id_to_study_id_and_number.get(trial_id)
                if where is not None:
                    return self._studies[where[0]].trials[where[1]]
        return super().get_trial(trial_id)

    def _read_trials_from_remote_storage(self, study_id: int) -> None:
        held = self._held
        if held is not None:
            if study_id in held:
                return
            held.add(study_id)
        with self._lock:
            study = self._studies.setdefault(study_id, _StudyInfo())
            stale: set[int] = set()
            if study.unfinished_trial_ids:
                with Session(self._backend.engine) as s:
                    rows = s.execute(select(models.TrialModel.trial_id, models.TrialModel.state).where(
                        models.TrialModel.trial_id.in_(study.unfinished_trial_ids))).all()
                for trial_id, state in rows:
                    cached = study.trials[self._trial_id_to_study_id_and_number[trial_id][1]]
                    if state != cached.state or not cached.params:
                        stale.add(trial_id)
            seen = self._seen.get(study_id, -1)
            trials = self._backend._get_trials(study_id, states=None, included_trial_ids=stale,
                                               trial_id_greater_than=seen)
            if not trials:
                return
            self._add_trials_to_cache(study_id, trials)
            for trial in trials:
                self._seen[study_id] = max(self._seen.get(study_id, -1), trial._trial_id)
                if trial.state.is_finished():
                    study.unfinished_trial_ids.discard(trial._trial_id)
                    study.last_finished_trial_id = max(study.last_finished_trial_id, trial._trial_id)
                else:
                    study.unfinished_trial_ids.add(trial._trial_id)
