"""Every private Optuna name dimr uses, in one module, checked when it is imported.

dimr writes trials in one transaction through Optuna's own schema, keeps its own incremental trial cache,
batches TPE's proposals, and shows the Bayesian samplers a capped history. Each of these reaches into
Optuna's internals; they all live here, so an Optuna upgrade is checked in one place. Importing this
module on an Optuna whose internals moved fails at once with the supported versions named.

- the RDB schema (``optuna.storages._rdb.models``, schema version `SCHEMA_VERSION`) and
  ``RDBStorage._set_trial_attr_without_commit``;
- ``_CachedStorage`` and its internals (`StudyCache`);
- ``Study._storage``, ``Study._study_id``, ``Study._get_trials``, ``FrozenTrial._trial_id``;
- ``TPESampler._n_ei_candidates`` and ``TPESampler._compute_acquisition_func`` (`BatchTPESampler`).

`StudyCache`: The driver's view of a study's trials: Optuna's RDB cache, without re-reading every running trial.

Optuna wraps an RDB storage in `_CachedStorage`, which keeps finished trials but reads every unfinished
trial again, with all its params and attributes, on every `get_all_trials`: at least twice per ask (the
waiting-trial queue and the sampler). With N trials in flight that is N × layers rows per ask, N asks per
evaluation round: the driver's cost grows with the square of the worker count.

dimr writes a running trial's params and attributes once, in one transaction (`storage.trials`), and then
only its state changes until it finishes. So this cache asks the database for the id and *state* of the
new and the unfinished trials (one small query) and reads in full only the trials that are new to it,
changed state, or had no params yet when last read. What the driver itself writes it hands to the cache
(`remember`), so its own trials are never read back at all.
"""

from __future__ import annotations

import copy
import functools
import json
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone

import numpy as np
import optuna
from optuna.distributions import BaseDistribution, json_to_distribution
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy import Connection, bindparam, or_, select

SUPPORTED = ">=4.2,<6"
SCHEMA_VERSION = 12  # Optuna's RDB schema this module writes (optuna.storages._rdb.models.SCHEMA_VERSION)
HISTORY = 300  # finished trials the Bayesian sampler sees: the best BEST_KEPT and the most recent rest
BEST_KEPT = 25  # TPE's "good" group is at most its 25 best trials, so it stays exact


def _check() -> None:
    """Fail loudly, naming the supported versions, if an Optuna internal dimr relies on has moved."""
    from optuna.storages._cached_storage import _CachedStorage, _StudyInfo  # noqa: F401
    from optuna.storages._rdb import models as m

    missing = [name for obj, name in (
        (optuna.Study, "_get_trials"), (optuna.storages.RDBStorage, "_set_trial_attr_without_commit"),
        (optuna.samplers.TPESampler, "_compute_acquisition_func"), (_CachedStorage, "_add_trials_to_cache"),
        (_CachedStorage, "_read_trials_from_remote_storage"), (_StudyInfo(), "unfinished_trial_ids"),
        (optuna.samplers.TPESampler(), "_n_ei_candidates"), (m, "TrialHeartbeatModel"),
    ) if not hasattr(obj, name)]
    if getattr(m, "SCHEMA_VERSION", None) != SCHEMA_VERSION:
        missing.append(f"RDB schema version {SCHEMA_VERSION} (found {getattr(m, 'SCHEMA_VERSION', None)})")
    if missing:
        raise ImportError(f"dimr supports optuna {SUPPORTED}; optuna {optuna.__version__} lacks "
                          f"{', '.join(missing)}: install a supported version (pip install 'optuna{SUPPORTED}')")


try:
    _check()
except (ImportError, AttributeError, TypeError) as e:
    moved = str(e) if isinstance(e, ImportError) else f"an internal moved ({e})"
    raise ImportError(moved if moved.startswith("dimr supports") else
                      f"dimr supports optuna {SUPPORTED}; in optuna {optuna.__version__} {moved}") from None

from optuna.storages._cached_storage import _CachedStorage, _StudyInfo  # noqa: E402
from optuna.storages._rdb import models  # noqa: E402, F401 - re-exported: the schema storage.trials writes

from storage.rdb import reader  # noqa: E402

# --- accessors -----------------------------------------------------------------------------------------

def backend(storage: optuna.storages.BaseStorage) -> optuna.storages.RDBStorage:
    """The RDB storage behind ``storage`` (a study's storage is Optuna's cache around the RDB one)."""
    return getattr(storage, "_backend", storage)


def study_storage(study: optuna.Study) -> optuna.storages.BaseStorage:
    return study._storage


def study_id(study: optuna.Study) -> int:
    return study._study_id


def trial_id(trial: FrozenTrial) -> int:
    return trial._trial_id


def read_trials(study: optuna.Study) -> list[FrozenTrial]:
    """Every trial of ``study`` through its storage's cache, read once now (what `Study.ask` reads)."""
    study._thread_local.cached_all_trials = None
    return study._get_trials(deepcopy=False, use_cache=True)


def set_trial_attr_without_commit(rdb: optuna.storages.RDBStorage, session, model: type, trial_id: int,
                                  key: str, value) -> None:
    rdb._set_trial_attr_without_commit(session, model, trial_id, key, value)


# --- the Bayesian samplers' view of a study ------------------------------------------------------------

class CappedStudy:
    """A study as the wrapped Bayesian sampler sees it: every unfinished trial (constant liar), the
    ``BEST_KEPT`` best complete trials and the most recent finished ones, ``history`` in all.

    TPE's and GP's cost per ask grows with the trials they are shown; capped, an ask costs the same at
    trial 1000 as at trial 300, and TPE's good group (the best ``min(0.1 n, 25)``) is unchanged.
    ``system_attrs``: where the sampler's writes of the trial's system attributes go instead of the storage
    (the driver writes them with the trial, which may not exist yet).
    """

    def __init__(self, study: optuna.Study, history: int = HISTORY, system_attrs: dict | None = None):
        self._study, self._history = study, history
        self._trials: list[FrozenTrial] | None = None  # one read per ask (TPE asks up to three times)
        if system_attrs is not None:
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
        complete = [t for t in finished if t.state == TrialState.COMPLETE and t.values]
        best = _best(complete, self._study.directions)
        keep = {t.number for t in best} | {t.number for t in finished[-(self._history - len(best)):]}
        return [t for t in trials if not t.state.is_finished() or t.number in keep]

    def get_trials(self, deepcopy: bool = True, states=None) -> list[FrozenTrial]:
        return self._get_trials(deepcopy=deepcopy, states=states, use_cache=True)


class _SystemAttrs:
    """A study's storage whose `set_trial_system_attr` only collects (TPE's constant liar records its proposal
    there): the driver writes them with the trial, which may not exist yet (`storage.trials.start_trial`)."""

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



# --- the driver's trial cache ------------------------------------------------------------------------

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
        """Cache a trial exactly as the caller has just committed it (`storage.trials.start_trial`,
        `storage.trials.as_finished`): the next read then finds it unchanged and does not read it back. If
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
