"""Dead drivers and failed masks: trials a dead driver left RUNNING become FAIL, and their masks are queued again.

A trial's owner is ``host:pid``. On this host a dead pid is failed at once; on other hosts Optuna's heartbeat
fails the trial after its grace period. A FAIL releases the mask in the ledger; released masks are enqueued
again as ``retry`` trials, one driver winning each.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Container
from datetime import datetime

import optuna
from optuna.trial import TrialState

from dimr.masks import Budget, CostBudget
from storage.rdb import GRACE_S
from storage.store import TrialStore

METRICS = ("top1_agreement", "expected_acceptance", "tokens", "seconds", "worker")  # Evaluation.metrics()


def owner_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _dead(trial: optuna.trial.FrozenTrial, host: str, now: datetime) -> bool:
    owner = trial.user_attrs.get("owner", "")
    o_host, _, o_pid = owner.rpartition(":")
    if not owner:  # no claim (plain Optuna's ask, or an older driver killed before its claim): no beat
        return trial.datetime_start is not None and (now - trial.datetime_start).total_seconds() >= GRACE_S
    return o_host == host and o_pid.isdigit() and not pid_alive(int(o_pid))


def recover(study: optuna.Study, store: TrialStore, mine: Container[int], budget: Budget | CostBudget) -> list[int]:
    """FAIL the RUNNING trials of dead drivers (not ``mine``, the numbers in flight here), release their masks,
    and queue those masks again (``budget``: their codec). Returns the numbers of the trials whose masks were
    queued for a retry."""
    host, now = socket.gethostname(), datetime.now()  # Optuna's datetime_start is naive local time
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if t.number not in mine and _dead(t, host, now):
            store.fail_trial(t)
    optuna.storages.fail_stale_trials(study)  # other hosts: by heartbeat
    running = store.running_masks()
    if running:  # one (cached) read of the finished trials, not one query per running mask
        done = {t.number: t for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL, TrialState.COMPLETE))}
        for key, number in running:
            t = done.get(number)
            if t is None:
                continue
            if t.state == TrialState.FAIL:
                store.release_failed(number)
            else:  # told COMPLETE by a driver killed before it updated the ledger: finish the record
                store.complete_mask(key, t.value, {k: t.user_attrs[k] for k in METRICS if k in t.user_attrs})
    retried = []
    for key, number in store.take_for_retry():
        study.enqueue_trial(budget.to_params(budget.from_key(key)), user_attrs={"phase": "retry", "retry_of": number})
        retried.append(number)
    return retried
