"""`storage.trials.start_trial`: a trial, its params and attributes, its first heartbeat and the mask ledger's
claim in one transaction; and the driver's cache holding what it wrote without reading it back."""

from __future__ import annotations

import threading

import optuna
import pytest
from optuna.storages._rdb import models
from optuna.trial import TrialState
from sqlalchemy import func, select
from sqlalchemy.orm import Session

import storage.optuna_compat as cache
import storage.trials as batch
from dimr.masks import mask_space
from storage import MaskLedger, open_storage
from storage.ledger import MaskRow
from storage.optuna_compat import StudyCache
from storage.trials import as_finished, finish_trial, start_trial, write_trial

SPACE = mask_space(4)


def _params(key: str, space=SPACE) -> dict[str, int]:
    return {name: int(c) for name, c in zip(space, key, strict=True)}


def _study(url: str, name: str = "s") -> tuple[optuna.storages.RDBStorage, optuna.Study, MaskLedger]:
    storage = open_storage(url)
    study = optuna.create_study(storage=StudyCache(storage), study_name=name, load_if_exists=True)
    return storage, study, MaskLedger(storage, study._study_id)


def _start(study: optuna.Study, ledger: MaskLedger, key: str, limit: int = 10, **kw) -> batch.Started | None:
    return start_trial(study._storage, ledger, key, _params(key), SPACE, {"mask": key, "phase": "random"}, "me",
                       limit, **kw)


def _read(url: str, name: str = "s") -> list[optuna.trial.FrozenTrial]:
    """The study as plain Optuna reads it."""
    return optuna.load_study(study_name=name, storage=open_storage(url)).trials


def _rows(storage: optuna.storages.RDBStorage, model) -> int:
    with Session(storage.engine) as s:
        return s.execute(select(func.count()).select_from(model)).scalar_one()


@pytest.fixture(params=["sqlite", "postgres", "mysql"])
def any_url(request, tmp_path):
    """SQLite, PostgreSQL and MySQL (whose DATETIME keeps no fraction of a second)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'dimr.db'}"
    return request.getfixturevalue("pg_url" if request.param == "postgres" else "mysql_url")


def test_start_trial_writes_what_plain_optuna_reads_back(any_url):
    storage, study, ledger = _study(any_url)
    won = _start(study, ledger, "1010", system_attrs={"tpe:relative_params:0": '{"layer_00": 1}'})
    assert won.claim.won and won.claim.held == 1
    assert won.trial.state == TrialState.RUNNING and won.trial.number == 0
    assert won.trial.user_attrs == {"mask": "1010", "phase": "random", "owner": "me"}
    dup = _start(study, ledger, "1010")  # the mask is held: PRUNED at once, saying by whom
    assert not dup.claim.won and dup.trial.state == TrialState.PRUNED and dup.trial.number == 1
    assert dup.trial.user_attrs["duplicate_of"] == 0 and "owner" not in dup.trial.user_attrs
    full = _start(study, ledger, "0110", limit=1)  # the study holds its limit: PRUNED, nothing claimed
    assert full.claim.state == "full" and full.trial.user_attrs["over_target"] is True
    assert ledger.state("0110") is None and ledger.counts() == {"running": 1}
    assert _read(any_url) == [won.trial, dup.trial, full.trial]  # FrozenTrial compares every field
    assert _rows(storage, models.TrialHeartbeatModel) == 1  # only the running trial beats
    when = finish_trial(study._storage, won.trial._trial_id, [0.25], {"tokens": 7},
                        also=[ledger.complete_statement("1010", 0.25, {"tokens": 7})])
    done = as_finished(won.trial, TrialState.COMPLETE, [0.25], {"tokens": 7}, when)
    assert _read(any_url)[0] == done and ledger.counts() == {"complete": 1}


def test_start_trial_commits_all_rows_or_none(storage_url, monkeypatch):
    """A crash after every row but the last (here: the params) leaves no trial, no attribute, no heartbeat
    and no claim, for a new trial and for an enqueued one."""
    storage, study, ledger = _study(storage_url)
    study.enqueue_trial(_params("0011"), user_attrs={"phase": "seed"})
    waiting = study.get_trials()[0]
    insert_params = batch._insert_params

    def crash(*args):
        insert_params(*args)
        raise RuntimeError("killed mid-transaction")

    monkeypatch.setattr(batch, "_insert_params", crash)
    for kw in ({}, {"waiting": waiting}):
        with pytest.raises(RuntimeError, match="killed"):
            _start(study, ledger, "0011", system_attrs={"k": "v"}, **kw)
    trials = _read(storage_url)
    assert [(t.state, t.params, t.user_attrs) for t in trials] == [(TrialState.WAITING, {}, {"phase": "seed"})]
    assert ledger.counts() == {}
    for model in (models.TrialParamModel, models.TrialHeartbeatModel):
        assert _rows(storage, model) == 0
    monkeypatch.setattr(batch, "_insert_params", insert_params)
    started = _start(study, ledger, "0011", waiting=waiting)
    assert started.claim.won and _read(storage_url) == [started.trial]


def test_an_enqueued_trial_is_started_once(storage_url):
    _, a, ledger_a = _study(storage_url)
    _, b, ledger_b = _study(storage_url)
    a.enqueue_trial(_params("0011"), user_attrs={"phase": "seed", "heuristic": "h"})
    waiting = b.get_trials()[0]
    first = start_trial(a._storage, ledger_a, "0011", _params("0011"), SPACE, {"mask": "0011", "phase": "seed"}, "a",
                        10, waiting=a.get_trials()[0])
    assert first.trial.number == 0 and first.trial.state == TrialState.RUNNING
    assert first.trial.user_attrs == {"phase": "seed", "heuristic": "h", "mask": "0011", "owner": "a"}
    assert first.trial.system_attrs == {"fixed_params": _params("0011")}
    assert _start(b, ledger_b, "0101", waiting=waiting) is None  # b lost the race: it wrote nothing
    assert ledger_b.state("0101") is None and _read(storage_url) == [first.trial]


def test_concurrent_drivers_number_trials_consecutively(storage_url):
    """Trials started by two drivers at once, and enqueued by Optuna's own `create_new_trial` meanwhile, get
    the numbers 0..n-1 in the order they were committed, and each claim records its trial's number."""
    space = mask_space(8)
    masks = [format(i, "08b") for i in range(256) if format(i, "08b").count("0") == 4]  # 70 masks
    _, setup, _ = _study(storage_url)
    errors: list[BaseException] = []

    def driver(part: list[str]) -> None:
        try:
            _, study, ledger = _study(storage_url)
            for key in part:
                start_trial(study._storage, ledger, key, _params(key, space), space, {"mask": key}, "me", 1000)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    def enqueue() -> None:
        for key in masks[-6:]:
            setup.enqueue_trial(_params(key, space))

    threads = [threading.Thread(target=driver, args=(masks[i:40:2],)) for i in (0, 1)]
    threads.append(threading.Thread(target=enqueue))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    trials = _read(storage_url)
    assert [t.number for t in trials] == list(range(46))
    assert [t._trial_id for t in trials] == sorted(t._trial_id for t in trials)
    _, study, ledger = _study(storage_url)
    with Session(ledger.engine) as s:
        claimed = dict(s.execute(select(MaskRow.mask_key, MaskRow.trial_number)).all())
    assert claimed == {t.user_attrs["mask"]: t.number for t in trials if t.state == TrialState.RUNNING}
    assert len(claimed) == 40


def test_cache_rereads_only_what_others_changed(storage_url, monkeypatch):
    """A view never reads back the trials it `remember`s, and does read them when another process changes them."""
    _, a, ledger = _study(storage_url)
    b_storage = open_storage(storage_url)
    b = optuna.load_study(study_name="s", storage=b_storage)  # another process, with Optuna's own cache
    read: list[int] = []
    reader = cache._read_trials

    def counting(c, ids):
        read.extend(ids)
        return reader(c, ids)

    monkeypatch.setattr(cache, "_read_trials", counting)
    mine = _start(a, ledger, "1100").trial
    a._storage.remember(a._study_id, mine)
    assert a.get_trials() == [mine] and read == []
    other = b.ask()  # another process's trial, with its params: read once, when new
    write_trial(b._storage, other._trial_id, _params("0101"), SPACE, {"mask": "0101"})
    assert [t.number for t in a.get_trials()] == [0, 1] and read == [other._trial_id]
    a.get_trials()
    assert read == [other._trial_id]
    b_storage.set_trial_state_values(mine._trial_id, TrialState.FAIL)  # e.g. failed as a dead driver's
    assert a.get_trials()[0].state == TrialState.FAIL and read == [other._trial_id, mine._trial_id]
    assert a.get_trials() == _read(storage_url)


def _start_many(study: optuna.Study, ledger: MaskLedger, keys: list[str], limit: int = 10) -> list[batch.Started]:
    return batch.start_trials(study._storage, ledger, [(k, _params(k), {"mask": k, "phase": "bayes"}) for k in keys],
                              SPACE, "me", limit)


def test_start_trials_writes_a_batch_as_start_trial_writes_each(any_url):
    """Numbered in order under one lock, won/duplicate as `start_trial` would answer each, stopping at the first
    claim refused as full; plain Optuna reads back exactly the returned trials, and the ledger agrees."""
    storage, study, ledger = _study(any_url)
    first = _start(study, ledger, "1100")
    started = _start_many(study, ledger, ["1010", "1100", "0110", "0101", "0011", "1001"], limit=4)
    assert [s.trial.number for s in started] == [1, 2, 3, 4, 5]  # "1001" is never tried: full at "0011"
    assert [s.claim.won for s in started] == [True, False, True, True, False]
    assert started[1].trial.user_attrs["duplicate_of"] == 0 and started[1].trial.state == TrialState.PRUNED
    assert started[4].claim.state == "full" and started[4].trial.user_attrs["over_target"] is True
    assert started[0].trial.user_attrs == {"mask": "1010", "phase": "bayes", "owner": "me"}
    assert [s.claim.held for s in started] == [2, 2, 3, 4, 4]
    assert _read(any_url) == [first.trial] + [s.trial for s in started]
    assert _rows(storage, models.TrialHeartbeatModel) == 4 and _rows(storage, models.TrialParamModel) == 6 * 4
    assert ledger.counts() == {"running": 4} and ledger.state("0011") is None and ledger.state("1001") is None


def test_start_trials_commits_all_rows_or_none(storage_url, monkeypatch):
    storage, study, ledger = _study(storage_url)
    real = ledger.claim_in
    calls = []

    def crash(*args, **kw):
        calls.append(args)
        if len(calls) == 3:
            raise RuntimeError("killed mid-transaction")
        return real(*args, **kw)

    monkeypatch.setattr(ledger, "claim_in", crash)
    with pytest.raises(RuntimeError, match="killed"):
        _start_many(study, ledger, ["1010", "0110", "0101"])
    assert _read(storage_url) == [] and ledger.counts() == {}
    for model in (models.TrialParamModel, models.TrialHeartbeatModel, models.TrialUserAttributeModel):
        assert _rows(storage, model) == 0
    monkeypatch.setattr(ledger, "claim_in", real)
    started = _start_many(study, ledger, ["1010", "0110", "0101"])
    assert [s.trial.number for s in started] == [0, 1, 2] and _read(storage_url) == [s.trial for s in started]
