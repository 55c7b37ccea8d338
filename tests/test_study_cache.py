"""`storage.optuna_compat.StudyCache` and `storage.trials.write_trial`: what two drivers see of each other's trials."""

from __future__ import annotations

from datetime import timedelta

import optuna
from optuna.trial import TrialState

from dimr.masks import BIT, mask_space
from storage import open_storage
from storage.optuna_compat import StudyCache
from storage.trials import beat, write_trial


def test_two_views_see_new_params_states_and_values(storage_url):
    a_storage, b_storage = open_storage(storage_url), open_storage(storage_url)
    a = optuna.create_study(storage=StudyCache(a_storage), study_name="c")
    b = optuna.load_study(storage=StudyCache(b_storage), study_name="c")
    space = mask_space(4)
    params = {name: i % 2 for i, name in enumerate(space)}
    ta = a.ask()
    assert [t.state for t in b.get_trials()] == [TrialState.RUNNING]  # seen before it has params
    assert b.get_trials()[0].params == {}
    write_trial(a._storage, ta._trial_id, params, space, {"mask": "1010", "owner": "x"}, heartbeat=True)
    seen = b.get_trials()[0]  # the same RUNNING trial, now read again because it had no params
    assert seen.params == params and seen.user_attrs == {"mask": "1010", "owner": "x"}
    assert seen.distributions == dict.fromkeys(space, BIT)
    write_trial(a._storage, ta._trial_id, user_attrs={"tokens": 3, "mask": "1010"})
    a.tell(ta, 0.5)
    done = b.get_trials()[0]
    assert done.state == TrialState.COMPLETE and done.value == 0.5 and done.user_attrs["tokens"] == 3
    tb = b.ask()
    b.tell(tb, state=TrialState.FAIL)
    assert [t.state for t in a.get_trials()] == [TrialState.COMPLETE, TrialState.FAIL]
    # the views agree with Optuna's own cache
    plain = optuna.load_study(storage=open_storage(storage_url), study_name="c").get_trials()
    assert [(t.number, t.state, t.params, t.user_attrs) for t in plain] == [
        (t.number, t.state, t.params, t.user_attrs) for t in b.get_trials()]


def test_write_trial_refuses_a_finished_trial(tmp_path):
    study = optuna.create_study(storage=StudyCache(open_storage(f"sqlite:///{tmp_path}/w.db")))
    t = study.ask()
    study.tell(t, state=TrialState.FAIL)
    try:
        write_trial(study._storage, t._trial_id, user_attrs={"a": 1})
    except optuna.exceptions.UpdateFinishedTrialError:
        return
    raise AssertionError("a finished trial was written")


def test_batched_heartbeat_keeps_trials_fresh(storage_url):
    """`beat` writes what Optuna's `record_heartbeat` writes: a beaten trial is not stale, an old one is."""
    storage = open_storage(storage_url)
    study = optuna.create_study(storage=StudyCache(storage), study_name="h")
    old, fresh = study.ask(), study.ask()
    for t in (old, fresh):
        write_trial(study._storage, t._trial_id, user_attrs={"owner": "x"}, heartbeat=True)
    from optuna.storages._rdb import models
    from sqlalchemy import update
    from sqlalchemy.orm import Session

    with Session(storage.engine) as s:  # both beats an hour old
        for t in (old, fresh):
            row = s.query(models.TrialHeartbeatModel).filter_by(trial_id=t._trial_id).one()
            s.execute(update(models.TrialHeartbeatModel).where(models.TrialHeartbeatModel.trial_id == t._trial_id)
                      .values(heartbeat=row.heartbeat - timedelta(hours=1)))
        s.commit()
    assert set(storage._get_stale_trial_ids(study._study_id)) == {old._trial_id, fresh._trial_id}
    beat(study._storage, [fresh._trial_id])
    assert storage._get_stale_trial_ids(study._study_id) == [old._trial_id]


def test_finish_trial_commits_the_result_and_the_ledger_row_together(storage_url):
    """`finish_trial` leaves what `Study.tell` leaves (values, state, attributes), with the ledger row in
    the same transaction: a refused finish changes neither."""
    from storage import MaskLedger
    from storage.trials import finish_trial

    storage = open_storage(storage_url)
    study = optuna.create_study(storage=StudyCache(storage), study_name="f", directions=["minimize", "maximize"])
    ledger = MaskLedger(storage, study._study_id)
    t = study.ask()
    write_trial(study._storage, t._trial_id, {"layer_00": 1}, {"layer_00": BIT}, {"mask": "1"})
    assert ledger.claim("1", t.number, "me", limit=5).won
    finish_trial(study._storage, t._trial_id, [0.25, 0.5], {"tokens": 7},
                 also=[ledger.complete_statement("1", 0.25, {"tokens": 7})])
    plain = optuna.load_study(storage=open_storage(storage_url), study_name="f").get_trials()[0]
    assert plain.state == TrialState.COMPLETE and plain.values == [0.25, 0.5]
    assert plain.user_attrs == {"mask": "1", "tokens": 7} and plain.datetime_complete is not None
    assert ledger.state("1") == "complete" and ledger.counts() == {"complete": 1}
    try:
        finish_trial(study._storage, t._trial_id, [9.0, 9.0], also=[ledger.complete_statement("1", 9.0, {})])
    except optuna.exceptions.UpdateFinishedTrialError:
        pass
    else:
        raise AssertionError("a finished trial was finished again")
    from sqlalchemy import select
    from sqlalchemy.orm import Session

    from storage.ledger import MaskRow

    with Session(storage.engine) as s:
        assert s.execute(select(MaskRow.cost)).scalar_one() == 0.25
    again = optuna.load_study(storage=open_storage(storage_url), study_name="f").get_trials()[0]
    assert again.values == [0.25, 0.5]
