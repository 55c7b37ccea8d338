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
from optuna.storages._rdb import models
from sqlalchemy import DateTime, Float, Integer, String, Text, UniqueConstraint, Update, func, select, update
from sqlalchemy.exc import IntegrityError, ProgrammingError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column


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


class MaskLedger:
    """dimr's table beside Optuna's, on the same engine."""

    def __init__(self, storage: optuna.storages.RDBStorage, study_id: int):
        self.engine = storage.engine
        self.study_id = study_id
        for attempt in range(3):
            try:
                _Base.metadata.create_all(self.engine)
                break
            except (IntegrityError, ProgrammingError):  # another driver created the table at the same time
                if attempt == 2:
                    raise
                time.sleep(0.5 + random.random())

    def claim(self, mask_key: str, trial_number: int, owner: str, limit: int | None = None) -> Claim:
        """Claim a mask for evaluation. With ``limit``, refuse (state ``full``) once complete + running
        masks reach it: checked and claimed under a lock on the study's row, so concurrent drivers never
        evaluate more masks than a study asks for. A refused ``retry`` mask goes back to ``failed``."""
        if limit is not None:
            return self._claim_within(mask_key, trial_number, owner, limit)
        with Session(self.engine) as s:
            try:
                s.add(MaskRow(study_id=self.study_id, mask_key=mask_key, state="running",
                              trial_number=trial_number, owner=owner, updated=_now()))
                s.commit()
                return Claim(True, "running", trial_number)
            except IntegrityError:
                s.rollback()
            # Someone holds it. Retake it only if it failed, with a compare-and-set on the state.
            taken = s.execute(
                update(MaskRow).where(MaskRow.study_id == self.study_id, MaskRow.mask_key == mask_key,
                                      MaskRow.state.in_(("failed", "retry")))
                .values(state="running", trial_number=trial_number, owner=owner, updated=_now())
            )
            s.commit()
            if taken.rowcount == 1:
                return Claim(True, "running", trial_number)
            row = self._row(s, mask_key)
            return Claim(False, row.state, row.trial_number, row.cost)

    def _claim_within(self, mask_key: str, trial_number: int, owner: str, limit: int) -> Claim:
        with Session(self.engine) as s:
            # Every limited claim takes this lock first (SQLite: its single writer), so they are serialised.
            s.execute(select(models.StudyModel.study_id).where(models.StudyModel.study_id == self.study_id)
                      .with_for_update())
            held = s.execute(select(func.count()).select_from(MaskRow).where(
                MaskRow.study_id == self.study_id, MaskRow.state.in_(("complete", "running")))).scalar_one()
            row = self._row(s, mask_key)
            if held >= limit:
                if row is not None and row.state == "retry":
                    row.state, row.updated = "failed", _now()
                s.commit()
                return Claim(False, "full", row.trial_number if row else -1, held=held)
            if row is None:
                s.add(MaskRow(study_id=self.study_id, mask_key=mask_key, state="running",
                              trial_number=trial_number, owner=owner, updated=_now()))
            elif row.state in ("failed", "retry"):
                row.state, row.trial_number, row.owner, row.updated = "running", trial_number, owner, _now()
            else:
                return Claim(False, row.state, row.trial_number, row.cost, held=held)
            try:
                s.commit()
            except IntegrityError:  # an unlimited claim of the same mask got in first
                s.rollback()
                row = self._row(s, mask_key)
                return Claim(False, row.state, row.trial_number, row.cost, held=held)
            return Claim(True, "running", trial_number, held=held + 1)

    def complete(self, mask_key: str, cost: float, metrics: dict) -> None:
        with Session(self.engine) as s:
            s.execute(self.complete_statement(mask_key, cost, metrics))
            s.commit()

    def complete_statement(self, mask_key: str, cost: float, metrics: dict) -> Update:
        """The statement that records a mask as complete, to run in another transaction of this database
        (`storage.batch.finish_trial` commits it with the trial's result)."""
        return self._update(mask_key, state="complete", cost=cost, metrics=json.dumps(metrics))

    def fail(self, mask_key: str) -> None:
        self._set(mask_key, state="failed")

    def fail_trial(self, trial_number: int) -> None:
        """Release the mask a dead trial held, so it can be claimed and evaluated again."""
        with Session(self.engine) as s:
            s.execute(update(MaskRow).where(MaskRow.study_id == self.study_id,
                                            MaskRow.trial_number == trial_number, MaskRow.state == "running")
                      .values(state="failed", updated=_now()))
            s.commit()

    def state(self, mask_key: str) -> str | None:
        with Session(self.engine) as s:
            row = self._row(s, mask_key)
            return row.state if row else None

    def is_taken(self, mask_key: str) -> bool:
        """True if the mask is complete, being evaluated, or queued for a retry."""
        return self.state(mask_key) in ("complete", "running", "retry")

    def counts(self) -> dict[str, int]:
        with Session(self.engine) as s:
            rows = s.execute(select(MaskRow.state, func.count()).where(MaskRow.study_id == self.study_id)
                             .group_by(MaskRow.state)).all()
            return {state: n for state, n in rows}

    def running(self) -> list[tuple[str, int]]:
        """(mask_key, trial_number) of every mask being evaluated now, by any driver."""
        with Session(self.engine) as s:
            return [tuple(r) for r in s.execute(select(MaskRow.mask_key, MaskRow.trial_number).where(
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

    def _row(self, s: Session, mask_key: str) -> MaskRow | None:
        return s.execute(select(MaskRow).where(MaskRow.study_id == self.study_id,
                                               MaskRow.mask_key == mask_key)).scalar_one_or_none()

    def _update(self, mask_key: str, **values) -> Update:
        return (update(MaskRow).where(MaskRow.study_id == self.study_id, MaskRow.mask_key == mask_key)
                .values(updated=_now(), **values))

    def _set(self, mask_key: str, **values) -> None:
        with Session(self.engine) as s:
            s.execute(self._update(mask_key, **values))
            s.commit()
