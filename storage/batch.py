"""Writes of one running trial in one transaction.

Optuna's trial API commits every ``suggest_*`` and every ``set_user_attr`` on its own: for a mask of 32
layers that is ~40 transactions per trial, and the driver (one thread for every worker) spends most of
its time waiting for commits. These helpers write the same rows, through Optuna's own models and upsert,
in one transaction.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, distribution_to_json
from optuna.storages._rdb import models
from optuna.trial import TrialState
from sqlalchemy import Executable, func, insert, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session


def _backend(storage: optuna.storages.BaseStorage) -> optuna.storages.RDBStorage:
    return getattr(storage, "_backend", storage)  # a study's storage is Optuna's cache around the RDB one


def write_trial(storage: optuna.storages.BaseStorage, trial_id: int, params: dict[str, Any] | None = None,
                distributions: dict[str, BaseDistribution] | None = None, user_attrs: dict[str, Any] | None = None,
                heartbeat: bool = False) -> None:
    """Set params (external values), user attributes and, if asked, a first heartbeat of a RUNNING trial
    that has none of these params yet. Raises `optuna.exceptions.UpdateFinishedTrialError` if finished."""
    rdb = _backend(storage)
    with Session(rdb.engine) as s:
        state = s.execute(select(models.TrialModel.state).where(models.TrialModel.trial_id == trial_id)).scalar_one()
        rdb.check_trial_is_updatable(trial_id, TrialState(state) if not isinstance(state, TrialState) else state)
        if params:
            s.execute(insert(models.TrialParamModel), [
                {"trial_id": trial_id, "param_name": name, "distribution_json": distribution_to_json(dist),
                 "param_value": dist.to_internal_repr(params[name])} for name, dist in distributions.items()])
        if user_attrs:
            _upsert_user_attrs(s, rdb, trial_id, user_attrs)
        if heartbeat:
            s.add(models.TrialHeartbeatModel(trial_id=trial_id))
        s.commit()


def _upsert_user_attrs(s: Session, rdb: optuna.storages.RDBStorage, trial_id: int, attrs: dict[str, Any]) -> None:
    """One INSERT ... ON CONFLICT for all attributes (PostgreSQL, SQLite); Optuna's per-key upsert elsewhere."""
    model = models.TrialUserAttributeModel
    dialect = {"postgresql": postgresql, "sqlite": sqlite}.get(rdb.engine.name)
    if dialect is None:
        for key, value in attrs.items():
            rdb._set_trial_attr_without_commit(s, model, trial_id, key, value)
        return
    stmt = dialect.insert(model)
    stmt = stmt.on_conflict_do_update(index_elements=[model.trial_id, model.key],
                                      set_={"value_json": stmt.excluded.value_json})
    s.execute(stmt, [{"trial_id": trial_id, "key": k, "value_json": json.dumps(v)} for k, v in attrs.items()])


def beat(storage: optuna.storages.BaseStorage, trial_ids: list[int]) -> None:
    """Heartbeats of many running trials in one UPDATE (Optuna's `record_heartbeat` is a transaction per
    trial). Their rows exist: `write_trial(..., heartbeat=True)` made them."""
    if not trial_ids:
        return
    rdb = _backend(storage)
    model = models.TrialHeartbeatModel
    with Session(rdb.engine) as s:
        now = s.execute(select(func.now())).scalar()  # the database's clock, as Optuna's own heartbeat
        s.execute(update(model).where(model.trial_id.in_(trial_ids)).values(heartbeat=now))
        s.commit()


def finish_trial(storage: optuna.storages.BaseStorage, trial_id: int, values: Sequence[float],
                 user_attrs: dict[str, Any] | None = None, also: Sequence[Executable] = ()) -> None:
    """Complete a RUNNING trial in one transaction: user attributes, objective values, state, and ``also``
    (statements on the same database, e.g. the mask ledger's row), so the two can never disagree.

    Optuna's `Study.tell` reads the trial back twice and commits values and state on their own; the caller
    keeps what `tell` checks (finite values, one per objective). Raises
    `optuna.exceptions.UpdateFinishedTrialError` if the trial is already finished."""
    rdb = _backend(storage)
    with Session(rdb.engine) as s:
        trial = s.execute(select(models.TrialModel).where(models.TrialModel.trial_id == trial_id)
                          .with_for_update()).scalar_one()
        rdb.check_trial_is_updatable(trial_id, trial.state)
        if user_attrs:
            _upsert_user_attrs(s, rdb, trial_id, user_attrs)
        rows = []
        for objective, v in enumerate(values):
            stored, kind = models.TrialValueModel.value_to_stored_repr(v)
            rows.append({"trial_id": trial_id, "objective": objective, "value": stored, "value_type": kind})
        s.execute(insert(models.TrialValueModel), rows)
        trial.state = TrialState.COMPLETE
        trial.datetime_complete = datetime.now()  # naive local time, as Optuna writes it
        for statement in also:
            s.execute(statement)
        s.commit()
