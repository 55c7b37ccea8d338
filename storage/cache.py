"""The driver's view of a study's trials: Optuna's RDB cache, without re-reading every running trial.

Optuna wraps an RDB storage in `_CachedStorage`, which keeps finished trials but reads every unfinished
trial again, with all its params and attributes, on every `get_all_trials`: at least twice per ask (the
waiting-trial queue and the sampler). With N trials in flight that is N × layers rows per ask, N asks per
evaluation round: the driver's cost grows with the square of the worker count.

dimr writes a running trial's params and attributes once, in one transaction (`storage.batch`), and then
only its state changes until it finishes. So this cache asks the database for the id and *state* of the
new and the unfinished trials (one small query) and reads in full only the trials that are new to it,
changed state, or had no params yet when last read. What the driver itself writes it hands to the cache
(`remember`), so its own trials are never read back at all.
"""

from __future__ import annotations

import functools
import json
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone

import optuna
from optuna.distributions import BaseDistribution, json_to_distribution
from optuna.storages._cached_storage import _CachedStorage, _StudyInfo
from optuna.storages._rdb import models
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy import Connection, bindparam, or_, select

from storage.rdb import reader

_TRIALS = models.TrialModel.__table__
_NEW = select(_TRIALS.c.trial_id, _TRIALS.c.state).where(_TRIALS.c.study_id == bindparam("study"),
                                                         _TRIALS.c.trial_id > bindparam("seen"))
_NEW_OR_UNFINISHED = select(_TRIALS.c.trial_id, _TRIALS.c.state).where(
    _TRIALS.c.study_id == bindparam("study"),
    or_(_TRIALS.c.trial_id > bindparam("seen"), _TRIALS.c.trial_id.in_(bindparam("unfinished", expanding=True))))
CHUNK = 500  # trial ids per IN list when reading trials in full (SQLite's old limit is 999 variables)


class StudyCache(_CachedStorage):
    """`_CachedStorage` with an incremental refresh of unfinished trials (see the module docstring)."""

    def __init__(self, backend: optuna.storages.RDBStorage):
        super().__init__(backend)
        self._reader = reader(backend.engine)
        self._seen: dict[int, int] = {}  # study id -> highest trial id such that every trial up to it is cached
        self._held: set[int] | None = None  # inside `one_read`: the studies already read

    @contextmanager
    def one_read(self) -> Iterator[None]:
        """Read each study from the database at most once in this block. One ask reads the trials more than
        once (the waiting-trial queue, then the sampler, which may ask again); a second read would only find
        what other drivers did in the milliseconds between, which the next ask sees anyway."""
        self._held = set()
        try:
            yield
        finally:
            self._held = None

    def remember(self, study_id: int, trial: FrozenTrial) -> None:
        """Cache a trial exactly as the caller has just committed it (`storage.batch.start_trial`,
        `storage.batch.as_finished`): the next read then finds it unchanged and does not read it back. If
        another driver changes it later (a dead driver's trial failed), its state differs and it is read."""
        with self._lock:
            self._studies.setdefault(study_id, _StudyInfo())
            self._store(study_id, [trial])

    def _read_trials_from_remote_storage(self, study_id: int) -> None:
        held = self._held
        if held is not None:
            if study_id in held:
                return
            held.add(study_id)
        with self._lock:
            study = self._studies.setdefault(study_id, _StudyInfo())
            seen = self._seen.get(study_id, -1)
            # New trials, and the unfinished ones (whose state may have changed). Trials of a study are
            # created under a lock on its row, so their ids are committed in order: every trial up to the
            # highest id read is now known.
            unfinished = sorted(study.unfinished_trial_ids)
            with self._reader.connect() as c:
                rows = c.execute(_NEW_OR_UNFINISHED if unfinished else _NEW,
                                 {"study": study_id, "seen": seen, "unfinished": unfinished}).all()
                stale = [trial_id for trial_id, state in rows if self._stale(study, trial_id, state)]
                trials = _read_trials(c, stale) if stale else []
            # A trial cached as it is (this driver wrote it, or Optuna's `create_new_trial` cached it) is
            # still watched while unfinished.
            for trial_id, state in rows:
                if not state.is_finished():
                    study.unfinished_trial_ids.add(trial_id)
            self._store(study_id, trials)
            if rows:
                self._seen[study_id] = max(seen, max(trial_id for trial_id, _ in rows))

    def _stale(self, study: _StudyInfo, trial_id: int, state: TrialState) -> bool:
        where = self._trial_id_to_study_id_and_number.get(trial_id)
        cached = None if where is None else study.trials.get(where[1])
        return cached is None or cached.state != state or (state == TrialState.RUNNING and not cached.params)

    def _store(self, study_id: int, trials: list[FrozenTrial]) -> None:
        study = self._studies[study_id]
        self._add_trials_to_cache(study_id, trials)
        for trial in trials:
            if trial.state.is_finished():
                study.unfinished_trial_ids.discard(trial._trial_id)
                study.last_finished_trial_id = max(study.last_finished_trial_id, trial._trial_id)
            else:
                study.unfinished_trial_ids.add(trial._trial_id)


@functools.lru_cache(maxsize=256)
def _distribution(distribution_json: str) -> BaseDistribution:
    return json_to_distribution(distribution_json)  # every layer of every trial has the same one: parse it once


def _local(utc: datetime | None) -> datetime | None:
    """A stored datetime (naive UTC) as a `FrozenTrial` shows it (naive local time), as Optuna converts it."""
    return None if utc is None else utc.replace(tzinfo=timezone.utc).astimezone().replace(tzinfo=None)


def _read_trials(c: Connection, trial_ids: list[int]) -> list[FrozenTrial]:
    """Trials in full, as Optuna's `RDBStorage._get_trials` builds them, with plain queries (one per table)."""
    out: list[FrozenTrial] = []
    for i in range(0, len(trial_ids), CHUNK):
        out += _read_chunk(c, trial_ids[i:i + CHUNK])
    return out


def _read_chunk(c: Connection, ids: list[int]) -> list[FrozenTrial]:
    param, value = models.TrialParamModel.__table__, models.TrialValueModel.__table__
    user, system = models.TrialUserAttributeModel.__table__, models.TrialSystemAttributeModel.__table__
    inter = models.TrialIntermediateValueModel.__table__
    trials = c.execute(select(_TRIALS.c.trial_id, _TRIALS.c.number, _TRIALS.c.state, _TRIALS.c.datetime_start,
                              _TRIALS.c.datetime_complete).where(_TRIALS.c.trial_id.in_(ids))).all()
    params: dict[int, dict] = defaultdict(dict)
    dists: dict[int, dict] = defaultdict(dict)
    for trial_id, name, internal, dist_json in c.execute(
            select(param.c.trial_id, param.c.param_name, param.c.param_value, param.c.distribution_json)
            .where(param.c.trial_id.in_(ids)).order_by(param.c.param_id)):
        dist = dists[trial_id][name] = _distribution(dist_json)
        params[trial_id][name] = dist.to_external_repr(internal)
    values: dict[int, dict[int, float]] = defaultdict(dict)
    for trial_id, objective, v, kind in c.execute(
            select(value.c.trial_id, value.c.objective, value.c.value, value.c.value_type)
            .where(value.c.trial_id.in_(ids))):
        values[trial_id][objective] = models.TrialValueModel.stored_repr_to_value(v, kind)
    attrs: dict[tuple[bool, int], dict] = defaultdict(dict)  # (system?, trial id) -> attributes
    for table in (user, system):
        for trial_id, key, value_json in c.execute(select(table.c.trial_id, table.c.key, table.c.value_json)
                                                   .where(table.c.trial_id.in_(ids))):
            attrs[(table is system, trial_id)][key] = json.loads(value_json)
    steps: dict[int, dict] = defaultdict(dict)
    for trial_id, step, v, kind in c.execute(
            select(inter.c.trial_id, inter.c.step, inter.c.intermediate_value, inter.c.intermediate_value_type)
            .where(inter.c.trial_id.in_(ids))):
        steps[trial_id][step] = models.TrialIntermediateValueModel.stored_repr_to_intermediate_value(v, kind)
    return [FrozenTrial(number=number, state=state, value=None,
                        values=[values[trial_id][k] for k in sorted(values[trial_id])] or None,
                        datetime_start=_local(start), datetime_complete=_local(complete),
                        params=params[trial_id], distributions=dists[trial_id],
                        user_attrs=attrs[(False, trial_id)], system_attrs=attrs[(True, trial_id)],
                        intermediate_values=steps[trial_id], trial_id=trial_id)
            for trial_id, number, state, start, complete in sorted(trials)]
