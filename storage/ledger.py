"""The mask ledger: one row per (study, mask), so no mask is ever evaluated twice.

A driver *claims* a mask before evaluating it. The unique key makes the claim atomic across drivers and
machines; a completed row is a cache hit, and a failed row can be claimed again. Lookups are indexed, so
their cost does not grow with the number of trials (unlike scanning Optuna's trial list).
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass
from datetime import datetime, timezone

import optuna
from sqlalchemy import (
    DateTime,
    Float,
    Integer,
    String,
    Text,
    UniqueConstraint,
    Update,
    and_,
    bindparam,
    delete,
    func,
    insert,
    inspect,
    literal,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError, ProgrammingError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from storage.optuna_compat import models
from storage.rdb import reader


class _Base(DeclarativeBase):
    pass


class MaskRow(_Base):
    __tablename__ = "dimr_masks"
    __table_args__ = (UniqueConstraint("study_id", "mask_key", name="uq_dimr_masks_study_mask"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    study_id: Mapped[int] = mapped_column(Integer, index=True)
    mask_key: Mapped[str] = mapped_column(String(512))
    state: Mapped[str] = mapped_column(String(16))  # running | complete | failed | retry
    trial_number: Mapped[int] = mapped_column(Integer)
    owner: Mapped[str] = mapped_column(String(128))
    cost: Mapped[float | None] = mapped_column(Float, nullable=True)
    metrics: Mapped[str | None] = mapped_column(Text, nullable=True)
    updated: Mapped[datetime] = mapped_column(DateTime)


@dataclass(frozen=True)
class Claim:
    """Outcome of claiming a mask: ``won`` (evaluate it), or the row that already holds it."""

    won: bool
    state: str
    trial_number: int
    cost: float | None = None
    held: int | None = None  # with a limit: complete + running masks of the study after this claim


def _now() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


def delete_rows(engine, study_id: int) -> int:
    """Delete every ledger row of ``study_id``: its study is being deleted, or is new and got the id of a
    deleted one (SQLite and MySQL reuse ids), whose rows must not count as its own. Returns the rows deleted."""
    if not inspect(engine).has_table(MaskRow.__tablename__):
        return 0
    with Session(engine) as s:
        n = s.execute(delete(MaskRow).where(MaskRow.study_id == study_id)).rowcount
        s.commit()
    return n


class MaskLedger:
    """dimr's table beside Optuna's, on the same engine."""

    def __init__(self, storage: optuna.storages.RDBStorage, study_id: int):
        self.engine = storage.engine
        self._reader = reader(self.engine)  # single-statement reads
        self.study_id = study_id
        for attempt in range(3):
            try:
                _Base.metadata.create_all(self.engine)
                break
            except (IntegrityError, ProgrammingError):  # another driver created the table at the same time
                if attempt == 2:
                    raise
                time.sleep(0.5 + random.random())
        self._build_statements()

    def claim(self, mask_key: str, trial_number: int, owner: str, limit: int) -> Claim:
        """Claim a mask for evaluation, refused (state ``full``) once complete + running masks reach ``limit``:
        checked and claimed under a lock on the study's row (`claim_in`), so concurrent drivers never evaluate
        more masks than a study asks for. A refused ``retry`` mask goes back to ``failed``."""
        with Session(self.engine) as s:
            claim, _ = self.claim_in(s, mask_key, owner, limit, trial_number)
            s.commit()
            return claim

    def _build_statements(self) -> None:
        """The statements of every ask, built once: building one costs more than running it."""
        sid, key, masks = self.study_id, bindparam("key"), MaskRow.__table__
        study = models.StudyModel.__table__
        if self.engine.dialect.name == "sqlite":  # no row locks: a write takes the database's write lock
            self._study_lock = update(study).where(study.c.study_id == sid).values(study_name=study.c.study_name)
        else:
            self._study_lock = select(study.c.study_id).where(study.c.study_id == sid).with_for_update()
        held = (select(func.count()).select_from(masks)
                .where(masks.c.study_id == sid, masks.c.state.in_(("complete", "running")))
                .correlate(None).scalar_subquery())
        trials = models.TrialModel.__table__
        count = select(func.count()).select_from(trials).where(trials.c.study_id == sid).scalar_subquery()
        one = select(literal(1).label("one")).subquery()  # one row, whether the mask has a row or not
        row = one.outerjoin(masks, and_(masks.c.study_id == sid, masks.c.mask_key == key))
        columns = (masks.c.state, masks.c.trial_number, masks.c.cost)
        self._peek = select(held, bindparam("number", type_=Integer), *columns).select_from(row)
        self._peek_new = select(held, count, *columns).select_from(row)
        self._insert = insert(masks)
        self._retake = (update(masks).where(masks.c.study_id == sid, masks.c.mask_key == key)
                        .values(state="running", trial_number=bindparam("number"), owner=bindparam("by"),
                                updated=bindparam("at")))
        self._state = select(masks.c.state).where(masks.c.study_id == sid, masks.c.mask_key == key)
        self._counts = (select(masks.c.state, func.count()).where(masks.c.study_id == sid)
                        .group_by(masks.c.state))

    def lock_study(self, s: Session) -> None:
        """Serialise with every limited claim and every trial creation of the study until ``s`` ends: a lock
        on the study's row, as Optuna's `create_new_trial` takes. SQLite has no row locks: a write to the
        row takes its database-wide write lock instead, so what ``s`` reads next is current."""
        s.execute(self._study_lock)

    def claim_in(self, s: Session, mask_key: str, owner: str, limit: int,
                 trial_number: int | None = None, locked: bool = False) -> tuple[Claim, int]:
        """The limited `claim`, in the caller's transaction (nothing committed), and the trial number it
        recorded. Without ``trial_number`` the claim is for a trial about to be created, whose number is the
        study's trial count, read under the same lock (`storage.trials.start_trial`). One lock and one read.
        ``locked``: ``s`` already holds the study's lock (an earlier claim in it took it)."""
        if not locked:
            self.lock_study(s)
        if trial_number is None:
            row = s.execute(self._peek_new, {"key": mask_key}).one()
        else:
            row = s.execute(self._peek, {"key": mask_key, "number": trial_number}).one()
        n_held, number, state, holder, cost = row
        if n_held >= limit:
            if state == "retry":
                s.execute(self._update(mask_key, state="failed"))
            return Claim(False, "full", holder if state is not None else -1, held=n_held), number
        if state is None:
            s.execute(self._insert, {"study_id": self.study_id, "mask_key": mask_key, "state": "running",
                                     "trial_number": number, "owner": owner, "updated": _now()})
        elif state in ("failed", "retry"):
            s.execute(self._retake, {"key": mask_key, "number": number, "by": owner, "at": _now()})
        else:
            return Claim(False, state, holder, cost, held=n_held), number
        return Claim(True, "running", number, held=n_held + 1), number

    def complete(self, mask_key: str, cost: float, metrics: dict) -> None:
        with Session(self.engine) as s:
            s.execute(self.complete_statement(mask_key, cost, metrics))
            s.commit()

    def complete_statement(self, mask_key: str, cost: float, metrics: dict) -> Update:
        """The statement that records a mask as complete, to run in another transaction of this database
        (`storage.trials.finish_trial` commits it with the trial's result)."""
        return self._update(mask_key, state="complete", cost=cost, metrics=json.dumps(metrics))

    def fail_statement(self, mask_key: str) -> Update:
        """The statement that releases a mask whose evaluation failed, to run in another transaction of this
        database (`storage.trials.finish_trial` commits it with the trial's FAIL)."""
        return self._update(mask_key, state="failed")

    def fail_trial(self, trial_number: int) -> None:
        """Release the mask a dead trial held, so it can be claimed and evaluated again."""
        with Session(self.engine) as s:
            s.execute(update(MaskRow).where(MaskRow.study_id == self.study_id,
                                            MaskRow.trial_number == trial_number, MaskRow.state == "running")
                      .values(state="failed", updated=_now()))
            s.commit()

    def state(self, mask_key: str) -> str | None:
        with self._reader.connect() as c:
            return c.execute(self._state, {"key": mask_key}).scalar_one_or_none()

    def is_taken(self, mask_key: str) -> bool:
        """True if the mask is complete, being evaluated, or queued for a retry."""
        return self.state(mask_key) in ("complete", "running", "retry")

    def counts(self) -> dict[str, int]:
        with self._reader.connect() as c:
            return {state: n for state, n in c.execute(self._counts).all()}

    def running(self) -> list[tuple[str, int]]:
        """(mask_key, trial_number) of every mask being evaluated now, by any driver."""
        with self._reader.connect() as c:
            return [tuple(r) for r in c.execute(select(MaskRow.mask_key, MaskRow.trial_number).where(
                MaskRow.study_id == self.study_id, MaskRow.state == "running")).all()]

    def take_for_retry(self) -> list[tuple[str, int]]:
        """Move failed masks to ``retry`` (compare-and-set, so one driver wins each) and return them."""
        won = []
        with Session(self.engine) as s:
            failed = s.execute(select(MaskRow.mask_key, MaskRow.trial_number).where(
                MaskRow.study_id == self.study_id, MaskRow.state == "failed")).all()
            for key, number in failed:
                r = s.execute(update(MaskRow).where(MaskRow.study_id == self.study_id,
                                                    MaskRow.mask_key == key, MaskRow.state == "failed")
                              .values(state="retry", updated=_now()))
                s.commit()
                if r.rowcount == 1:
                    won.append((key, number))
        return won

    def _update(self, mask_key: str, **values) -> Update:
        masks = MaskRow.__table__  # a Core statement: no ORM session synchronisation when it runs
        return (update(masks).where(masks.c.study_id == self.study_id, masks.c.mask_key == mask_key)
                .values(updated=_now(), **values))
