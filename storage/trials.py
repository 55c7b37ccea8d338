"""Writes of one trial in one transaction.

Optuna's trial API commits every ``suggest_*`` and every ``set_user_attr`` on its own: for a mask of 32
layers that is ~40 transactions per trial, and the driver (one thread for every worker) spends most of
its time waiting for commits. These helpers write the same rows, through Optuna's own models and upsert,
in one transaction. `start_trial` goes further: creating the trial, its params and attributes, its first
heartbeat and the mask ledger's claim are one transaction, so a trial is never seen without its params and
a crash never leaves the trial and the ledger disagreeing.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from types import ModuleType
from typing import Any

import optuna
import sqlalchemy
from optuna.distributions import BaseDistribution, distribution_to_json
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy import Executable, bindparam, func, insert, select, update
from sqlalchemy.dialects import mysql, postgresql, sqlite
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from storage import crash
from storage import optuna_compat as compat
from storage.ledger import Claim, MaskLedger
from storage.optuna_compat import models

_TRIALS = models.TrialModel.__table__
_UNFINISHED = (TrialState.RUNNING, TrialState.WAITING)  # what Optuna lets a trial update from
# Statements of every trial, built once (building one costs more than running it).
_INSERT_TRIAL = insert(_TRIALS)
_INSERT_PARAM = insert(models.TrialParamModel.__table__)
_INSERT_USER_ATTR = insert(models.TrialUserAttributeModel.__table__)
_INSERT_SYSTEM_ATTR = insert(models.TrialSystemAttributeModel.__table__)
_INSERT_HEARTBEAT = insert(models.TrialHeartbeatModel.__table__)
_INSERT_VALUE = insert(models.TrialValueModel.__table__)
_FINISH = (update(_TRIALS).where(_TRIALS.c.trial_id == bindparam("id"), _TRIALS.c.state.in_(_UNFINISHED))
           .values(state=bindparam("to"), datetime_complete=bindparam("at")))


def stored_now(engine: sqlalchemy.Engine) -> tuple[datetime, datetime]:
    """Now as Optuna's RDB storage stores a trial's datetimes (naive UTC) and as a `FrozenTrial` shows them
    (naive local time). Whole seconds on MySQL, whose DATETIME column would round the fraction."""
    utc = datetime.now(timezone.utc)
    if engine.dialect.name == "mysql":
        utc = utc.replace(microsecond=0)
    return utc.replace(tzinfo=None), utc.astimezone().replace(tzinfo=None)


def _as_read(attrs: dict[str, Any] | None) -> dict[str, Any]:
    """Attribute values as a read gives them back (through JSON)."""
    return {k: json.loads(json.dumps(v)) for k, v in (attrs or {}).items()}


def write_trial(storage: optuna.storages.BaseStorage, trial_id: int, params: dict[str, Any] | None = None,
                distributions: dict[str, BaseDistribution] | None = None, user_attrs: dict[str, Any] | None = None,
                heartbeat: bool = False) -> None:
    """Set params (external values), user attributes and, if asked, a first heartbeat of a RUNNING trial
    that has none of these params yet. Raises `optuna.exceptions.UpdateFinishedTrialError` if finished."""
    rdb = compat.backend(storage)
    with Session(rdb.engine) as s:
        state = s.execute(select(models.TrialModel.state).where(models.TrialModel.trial_id == trial_id)).scalar_one()
        rdb.check_trial_is_updatable(trial_id, TrialState(state) if not isinstance(state, TrialState) else state)
        if params:
            _insert_params(s, trial_id, params, distributions)
        if user_attrs:
            _upsert_user_attrs(s, rdb, trial_id, user_attrs)
        if heartbeat:
            s.add(models.TrialHeartbeatModel(trial_id=trial_id))
        s.commit()


def _insert_params(s: Session, trial_id: int, params: dict[str, Any],
                   distributions: dict[str, BaseDistribution]) -> None:
    as_json: dict[int, str] = {}  # every layer has the same distribution: serialise it once
    s.execute(_INSERT_PARAM, [
        {"trial_id": trial_id, "param_name": name, "param_value": dist.to_internal_repr(params[name]),
         "distribution_json": as_json.get(id(dist)) or as_json.setdefault(id(dist), distribution_to_json(dist))}
        for name, dist in distributions.items()])


def _upsert_user_attrs(s: Session, rdb: optuna.storages.RDBStorage, trial_id: int, attrs: dict[str, Any],
                       model: type = models.TrialUserAttributeModel) -> None:
    """One INSERT ... ON CONFLICT (PostgreSQL, SQLite) or ON DUPLICATE KEY (MySQL) for all attributes; Optuna's
    per-key upsert elsewhere. ``model``: user (default) or system attributes."""
    dialect = {"postgresql": postgresql, "sqlite": sqlite, "mysql": mysql}.get(rdb.engine.name)
    if dialect is None:
        for key, value in attrs.items():
            compat.set_trial_attr_without_commit(rdb, s, model, trial_id, key, value)
        return
    s.execute(_upsert(dialect, model), [{"trial_id": trial_id, "key": k, "value_json": json.dumps(v)}
                                        for k, v in attrs.items()])


@functools.cache
def _upsert(dialect: ModuleType, model: type) -> Executable:
    stmt = dialect.insert(model.__table__)
    if dialect is mysql:
        return stmt.on_duplicate_key_update(value_json=stmt.inserted.value_json)
    return stmt.on_conflict_do_update(index_elements=["trial_id", "key"], set_={"value_json": stmt.excluded.value_json})


def beat(storage: optuna.storages.BaseStorage, trial_ids: list[int]) -> None:
    """Heartbeats of many running trials in one UPDATE (Optuna's `record_heartbeat` is a transaction per
    trial). Their rows exist: `start_trial` (or `write_trial(..., heartbeat=True)`) made them."""
    if not trial_ids:
        return
    rdb = compat.backend(storage)
    model = models.TrialHeartbeatModel
    with Session(rdb.engine) as s:
        now = s.execute(select(func.now())).scalar()  # the database's clock, as Optuna's own heartbeat
        s.execute(update(model).where(model.trial_id.in_(trial_ids)).values(heartbeat=now))
        s.commit()


@dataclass(frozen=True)
class Started:
    """What `start_trial` wrote: the trial as a read would give it back, and the ledger's answer."""

    trial: FrozenTrial  # RUNNING if the claim was won, else PRUNED
    claim: Claim


def start_trial(storage: optuna.storages.BaseStorage, ledger: MaskLedger, mask_key: str, params: dict[str, Any],
                distributions: dict[str, BaseDistribution], user_attrs: dict[str, Any], owner: str, limit: int,
                system_attrs: dict[str, Any] | None = None, waiting: FrozenTrial | None = None) -> Started | None:
    """Claim ``mask_key`` (`MaskLedger.claim` with ``limit``) and start the trial that evaluates it, in one
    transaction: a new trial numbered under the claim's lock on the study (as Optuna's `create_new_trial`
    numbers it), or the enqueued trial ``waiting`` (compare-and-set from WAITING, as `Study.ask` takes one).

    The trial gets ``params`` (external values) and ``user_attrs``/``system_attrs``. Claim won: RUNNING with
    the ``owner`` attribute and a first heartbeat (Optuna fails no RUNNING trial that has no heartbeat row).
    Refused: PRUNED at once, with ``over_target`` (the study holds ``limit`` masks) or ``duplicate_of`` (the
    trial that holds the mask). Returns None, having written nothing, if another driver started ``waiting``."""
    rdb = compat.backend(storage)
    with Session(rdb.engine) as s:
        claim, number = ledger.claim_in(s, mask_key, owner, limit, None if waiting is None else waiting.number)
        state, attrs = _claimed(claim, {**user_attrs, "owner": owner} if claim.won else user_attrs)
        utc, local = stored_now(rdb.engine)
        times = {"state": state, "datetime_start": utc, "datetime_complete": None if claim.won else utc}
        if waiting is None:
            trial_id = s.execute(_INSERT_TRIAL, {"number": number, "study_id": ledger.study_id, **times}
                                 ).inserted_primary_key[0]
            for stmt, values in ((_INSERT_USER_ATTR, attrs), (_INSERT_SYSTEM_ATTR, system_attrs)):
                if values:
                    s.execute(stmt, [{"trial_id": trial_id, "key": k, "value_json": json.dumps(v)}
                                     for k, v in values.items()])
        else:
            trial_id = compat.trial_id(waiting)
            taken = s.execute(update(_TRIALS).where(_TRIALS.c.trial_id == trial_id,
                                                    _TRIALS.c.state == TrialState.WAITING).values(**times))
            if taken.rowcount != 1:
                s.rollback()
                return None
            _upsert_user_attrs(s, rdb, trial_id, attrs)
            if system_attrs:
                _upsert_user_attrs(s, rdb, trial_id, system_attrs, models.TrialSystemAttributeModel)
        _insert_params(s, trial_id, params, distributions)
        if claim.won:
            s.execute(_INSERT_HEARTBEAT, {"trial_id": trial_id})
        s.commit()
    return _started(trial_id, number, claim, local, params, distributions, attrs, system_attrs, waiting)


def _claimed(claim: Claim, user_attrs: dict[str, Any]) -> tuple[TrialState, dict[str, Any]]:
    """The state of a trial started with ``claim`` and its user attributes (with the claim's owner or refusal)."""
    if claim.won:
        return TrialState.RUNNING, user_attrs
    why = {"over_target": True} if claim.state == "full" else {"duplicate_of": claim.trial_number}
    return TrialState.PRUNED, {**user_attrs, **why}


def _started(trial_id: int, number: int, claim: Claim, local: datetime, params: dict[str, Any],
             distributions: dict[str, BaseDistribution], attrs: dict[str, Any], system_attrs: dict[str, Any] | None,
             waiting: FrozenTrial | None = None) -> Started:
    """A started trial as a read would give it back."""
    user, system = (waiting.user_attrs, waiting.system_attrs) if waiting else ({}, {})
    trial = FrozenTrial(
        number=number, state=TrialState.RUNNING if claim.won else TrialState.PRUNED, value=None, values=None,
        datetime_start=local, datetime_complete=None if claim.won else local,
        params={name: d.to_external_repr(d.to_internal_repr(params[name])) for name, d in distributions.items()},
        distributions=dict(distributions), user_attrs={**user, **_as_read(attrs)},
        system_attrs={**system, **_as_read(system_attrs)}, intermediate_values={}, trial_id=trial_id)
    return Started(trial, claim)


def start_trials(storage: optuna.storages.BaseStorage, ledger: MaskLedger,
                 items: Sequence[tuple[str, dict[str, Any], dict[str, Any]]],
                 distributions: dict[str, BaseDistribution], owner: str, limit: int) -> list[Started]:
    """`start_trial` for several new trials, ``items`` of (mask key, params, user attributes), in one transaction:
    each claimed and numbered in order under one lock on the study, then every trial's attributes, params and
    first heartbeat in one statement each. All or nothing. Stops after the first claim refused as full (the
    study holds ``limit`` masks: the rest would be refused too), so it may return fewer than ``items``."""
    rdb = compat.backend(storage)
    out: list[tuple[int, int, Claim, datetime, dict[str, Any], dict[str, Any]]] = []
    with Session(rdb.engine) as s:
        for key, params, user_attrs in items:
            claim, number = ledger.claim_in(s, key, owner, limit, locked=bool(out))
            state, attrs = _claimed(claim, {**user_attrs, "owner": owner} if claim.won else user_attrs)
            utc, local = stored_now(rdb.engine)
            times = {"state": state, "datetime_start": utc, "datetime_complete": None if claim.won else utc}
            trial_id = s.execute(_INSERT_TRIAL, {"number": number, "study_id": ledger.study_id, **times}
                                 ).inserted_primary_key[0]
            out.append((trial_id, number, claim, local, params, attrs))
            if claim.state == "full":
                break
        s.execute(_INSERT_USER_ATTR, [{"trial_id": t, "key": k, "value_json": json.dumps(v)}
                                      for t, *_, attrs in out for k, v in attrs.items()])
        as_json = {id(d): distribution_to_json(d) for d in distributions.values()}
        s.execute(_INSERT_PARAM, [
            {"trial_id": t, "param_name": name, "param_value": d.to_internal_repr(params[name]),
             "distribution_json": as_json[id(d)]}
            for t, _, _, _, params, _ in out for name, d in distributions.items()])
        won = [{"trial_id": t} for t, _, claim, *_ in out if claim.won]
        if won:
            s.execute(_INSERT_HEARTBEAT, won)
        s.commit()
    return [_started(t, number, claim, local, params, distributions, attrs, None)
            for t, number, claim, local, params, attrs in out]


def create_study(storage: optuna.storages.BaseStorage, name: str, directions: Sequence[optuna.study.StudyDirection],
                 user_attrs: dict[str, Any], enqueued: Sequence[tuple[dict[str, Any], dict[str, Any]]]
                 ) -> tuple[int, list[FrozenTrial]] | None:
    """Create study ``name`` with its directions, user attributes and enqueued trials ((fixed params, user
    attributes), WAITING, as `Study.enqueue_trial` makes them), in one transaction: a crash leaves either no
    study or the whole set-up, never a study without its settings or seeds. Returns its id and the enqueued
    trials as a read would give them back, or None (nothing written) if a study of that name exists, e.g.
    another driver created it first."""
    waiting: list[FrozenTrial] = []
    rdb = compat.backend(storage)
    with Session(rdb.engine) as s:
        try:
            study_id = s.execute(insert(models.StudyModel.__table__), {"study_name": name}).inserted_primary_key[0]
            s.execute(insert(models.StudyDirectionModel.__table__),
                      [{"study_id": study_id, "objective": i, "direction": d} for i, d in enumerate(directions)])
            if user_attrs:
                s.execute(insert(models.StudyUserAttributeModel.__table__),
                          [{"study_id": study_id, "key": k, "value_json": json.dumps(v)}
                           for k, v in user_attrs.items()])
            for number, (params, attrs) in enumerate(enqueued):
                trial_id = s.execute(_INSERT_TRIAL, {"number": number, "study_id": study_id,
                                                     "state": TrialState.WAITING, "datetime_start": None,
                                                     "datetime_complete": None}).inserted_primary_key[0]
                s.execute(_INSERT_SYSTEM_ATTR, {"trial_id": trial_id, "key": "fixed_params",
                                                "value_json": json.dumps(params)})
                if attrs:
                    s.execute(_INSERT_USER_ATTR, [{"trial_id": trial_id, "key": k, "value_json": json.dumps(v)}
                                                  for k, v in attrs.items()])
                waiting.append(FrozenTrial(
                    number=number, state=TrialState.WAITING, value=None, values=None, datetime_start=None,
                    datetime_complete=None, params={}, distributions={}, user_attrs=_as_read(attrs),
                    system_attrs=_as_read({"fixed_params": params}), intermediate_values={}, trial_id=trial_id))
            crash.point("setup:before-commit")
            s.commit()
        except IntegrityError:  # the unique study name: another driver's study is there
            s.rollback()
            return None
    crash.point("setup:after-commit")
    return study_id, waiting


def finish_trial(storage: optuna.storages.BaseStorage, trial_id: int, values: Sequence[float] | None,
                 user_attrs: dict[str, Any] | None = None, also: Sequence[Executable] = (),
                 state: TrialState = TrialState.COMPLETE) -> datetime:
    """Finish a RUNNING trial in one transaction: state (COMPLETE with ``values``, or FAIL without), user
    attributes and ``also`` (statements on the same database, e.g. the mask ledger's row), so the two can never
    disagree. Returns the trial's ``datetime_complete`` as a `FrozenTrial` shows it (`as_finished`).

    Optuna's `Study.tell` reads the trial back twice and commits values and state on their own; the caller
    keeps what `tell` checks (finite values, one per objective). The state changes first, by a compare-and-set
    that locks the trial's row. Raises `optuna.exceptions.UpdateFinishedTrialError` if the trial is already
    finished (and writes nothing)."""
    rdb = compat.backend(storage)
    utc, local = stored_now(rdb.engine)
    with Session(rdb.engine) as s:
        done = s.execute(_FINISH, {"id": trial_id, "to": state, "at": utc})
        if done.rowcount != 1:
            s.rollback()
            rdb.check_trial_is_updatable(trial_id, rdb.get_trial(trial_id).state)  # raises (KeyError: no trial)
            raise RuntimeError(f"trial {trial_id} could not be finished")
        if user_attrs:
            _upsert_user_attrs(s, rdb, trial_id, user_attrs)
        if values:
            rows = []
            for objective, v in enumerate(values):
                stored, kind = models.TrialValueModel.value_to_stored_repr(v)
                rows.append({"trial_id": trial_id, "objective": objective, "value": stored, "value_type": kind})
            s.execute(_INSERT_VALUE, rows)
        for statement in also:
            s.execute(statement)
        s.commit()
    return local


def as_finished(trial: FrozenTrial, state: TrialState, values: Sequence[float] | None,
                user_attrs: dict[str, Any] | None, datetime_complete: datetime) -> FrozenTrial:
    """``trial`` as `finish_trial` left it, as a read would give it back."""
    return FrozenTrial(
        number=trial.number, state=state, value=None, values=None if values is None else [float(v) for v in values],
        datetime_start=trial.datetime_start, datetime_complete=datetime_complete, params=trial.params,
        distributions=trial.distributions, user_attrs={**trial.user_attrs, **_as_read(user_attrs)},
        system_attrs=trial.system_attrs, intermediate_values=trial.intermediate_values, trial_id=compat.trial_id(trial))
