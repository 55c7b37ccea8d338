"""The search driver: heuristic seeds, then random, then Bayesian masks, persisted trial by trial.

The driver keeps ``evaluator.slots`` (+ ``ahead``) trials in flight with Optuna's ask/tell and records each
result the moment it arrives. It talks to persistence through `storage` (Optuna's RDB storage + the mask ledger)
and to workers through the `workers.Evaluator` interface: it never imports SQLAlchemy or Ray.

Resuming is running the same search again: completed masks are never evaluated again, trials a dead
driver left RUNNING become FAIL (at once for a dead process on this host, after the heartbeat grace
period elsewhere) and their masks are retried.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime

import optuna
from optuna.trial import FrozenTrial, TrialState

from dimr import heuristics, pareto
from dimr.budget import Budget
from dimr.errors import DimrError
from dimr.routing import mask_from_key, mask_key
from dimr.sampler import BudgetSampler, make_base_sampler, mask_space, mask_to_params, params_to_mask
from storage import MaskLedger
from storage.batch import Started, as_finished, beat, finish_trial, start_trial, start_trials, write_trial
from storage.cache import StudyCache
from storage.rdb import GRACE_S, HEARTBEAT_S
from workers.base import Evaluation, Evaluator

SETTINGS_ATTR = "dimr_settings"
SEEDS_ATTR = "dimr_seeds"
SETUP_WAIT_S = 30.0  # how long a driver waits for a concurrent driver to finish creating the study
METRICS = ("top1_agreement", "expected_acceptance", "tokens", "seconds", "worker")  # Evaluation.metrics()
BATCH_MAX = 8  # the most trials one sampler fit proposes when that many slots are idle (swap's Bayesian phase)
CHECK_EVERY_S = 2.0  # how often a busy driver looks for dead drivers' trials and failed masks
optuna.logging.set_verbosity(optuna.logging.WARNING)
# dimr drives heartbeats itself (ask/tell, not Study.optimize) and relies on fail_stale_trials on purpose.
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")


@dataclass(frozen=True)
class StudySettings:
    """What defines a study. Resuming with any of these changed is refused."""

    pair: str
    verifier: str
    fingerprint: str
    num_layers: int
    skip: int
    cost: str
    calibration: str
    calibration_hash: str
    num_sequences: int
    seq_len: int
    objective: str = "cost"  # or "pareto": cost vs kept fraction, skipping 1..skip layers (`dimr.pareto`)

    @property
    def budget(self) -> Budget:
        return Budget(self.num_layers, self.skip)

    @property
    def skips(self) -> tuple[int, ...]:
        """The skip counts a trial may have: exactly ``skip``, or 1..skip in a Pareto study."""
        return tuple(range(1, self.skip + 1)) if self.objective == "pareto" else (self.skip,)


@dataclass(frozen=True)
class SearchOptions:
    """How to search; these may change between runs of one study."""

    trials: int = 50
    startup_trials: int = 0  # the swap proposer needs no random phase (README, "Search quality"); tpe/gp want ~10
    sampler: str = "swap"
    seed: int | None = 0


@dataclass
class SearchResult:
    study: str
    complete: int
    evaluated: int  # evaluations this run paid for
    best_cost: float | None
    best_mask: str | None
    best_trial: int | None
    pruned_duplicates: int = 0
    retried: list[int] = field(default_factory=list)


def _new_trial(number: int) -> FrozenTrial:
    """The trial ``number`` as the sampler sees it before it exists (`Search._ask` creates it after sampling)."""
    return FrozenTrial(number=number, state=TrialState.RUNNING, value=None, datetime_start=datetime.now(),
                       datetime_complete=None, params={}, distributions={}, user_attrs={}, system_attrs={},
                       intermediate_values={}, trial_id=-1)


def owner_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stored_settings(storage: optuna.storages.BaseStorage, study_name: str,
                    wait_s: float = SETUP_WAIT_S) -> dict | None:
    """The settings of an existing study, or None if there is no such study. Writes nothing.

    A study that another driver is setting up right now (created, seeds not yet recorded) is waited for,
    up to ``wait_s``: concurrent drivers started on a new study must all see its settings.
    """
    try:
        study_id = storage.get_study_id_from_name(study_name)
    except KeyError:
        return None
    deadline = time.monotonic() + wait_s
    while True:
        attrs = storage.get_study_user_attrs(study_id)
        if SEEDS_ATTR in attrs or time.monotonic() >= deadline:
            return attrs.get(SETTINGS_ATTR, {})
        time.sleep(0.2)


def check_resume(stored: dict | None, settings: StudySettings, study_name: str) -> None:
    """Refuse to resume a study with settings that conflict with the stored ones."""
    if stored is None:
        return
    new = asdict(settings)
    diff = [k for k in new if k in stored and stored[k] != new[k]]
    if not stored:
        raise DimrError(f"study {study_name!r} exists but was not made by dimr; pick another --study name")
    if diff:
        details = "; ".join(f"{k}: stored {stored[k]!r}, asked {new[k]!r}" for k in diff)
        raise DimrError(f"study {study_name!r} was made with other settings ({details}); "
                        "use the stored settings or a new --study name")


class Search:
    """One run of the driver over one study."""

    def __init__(self, storage: optuna.storages.RDBStorage, study_name: str, settings: StudySettings,
                 options: SearchOptions, evaluator: Evaluator,
                 on_result: Callable[[int, int, float | None], None] | None = None):
        if evaluator.num_layers != settings.num_layers:
            raise ValueError("evaluator and settings disagree on the number of layers")
        self.settings, self.options, self.evaluator = settings, options, evaluator
        self.on_result = on_result or (lambda done, total, best: None)
        self.owner = owner_id()
        stored = stored_settings(storage, study_name)
        check_resume(stored, settings, study_name)
        self.sampler = BudgetSampler(settings.budget, make_base_sampler(options.sampler, options.seed,
                                                                         options.startup_trials),
                                     startup=options.startup_trials, seed=options.seed,
                                     skips=settings.skips if settings.objective == "pareto" else ())
        created = False
        if stored is None:
            # Seeds first, then an atomic create: exactly one of several concurrent drivers creates the
            # study and records settings and seeds within milliseconds; the others wait for them.
            influence = evaluator.block_influence()
            seeds = list({m: (n, m) for k in settings.skips
                          for n, m in heuristics.seed_masks(Budget(settings.num_layers, k), influence)}.values())
            try:
                storage.create_new_study(pareto.directions(settings.objective), study_name)
                created = True
            except optuna.exceptions.DuplicatedStudyError:
                check_resume(stored_settings(storage, study_name), settings, study_name)
        view = StudyCache(storage) if isinstance(storage, optuna.storages.RDBStorage) else storage
        self._one_read = view.one_read if isinstance(view, StudyCache) else contextlib.nullcontext
        self._remember = view.remember if isinstance(view, StudyCache) else lambda study_id, trial: None
        self.study = optuna.create_study(storage=view, study_name=study_name, sampler=self.sampler,
                                         directions=pareto.directions(settings.objective), load_if_exists=True)
        self.ledger = MaskLedger(storage, self.study._study_id)
        self._taken: dict[str, bool] = {}  # the ledger's answers during one ask (the claim has the last word)
        self.sampler.is_taken = self._is_taken
        if created:
            self.study.set_user_attr(SETTINGS_ATTR, asdict(settings))
            self._enqueue_seeds(seeds)
        self.sampler.first_search_trial = self.study.user_attrs.get(SEEDS_ATTR, 0)
        self._inflight: dict[int, tuple[FrozenTrial, tuple[bool, ...]]] = {}
        self._lock = threading.Lock()
        self._next_check = 0.0
        self._best_cost: float | None = None
        self.result = SearchResult(study_name, 0, 0, None, None, None)

    # -- study set-up -------------------------------------------------------------------------------
    def _enqueue_seeds(self, seeds: list[tuple[str, tuple[bool, ...]]]) -> None:
        for name, mask in seeds:
            self.study.enqueue_trial(mask_to_params(mask), user_attrs={"phase": "seed", "heuristic": name})
        self.study.set_user_attr(SEEDS_ATTR, len(seeds))

    def _fail_dead_trials(self) -> None:
        """FAIL the RUNNING trials of dead drivers, release their masks, and queue those masks again."""
        self._next_check = time.monotonic() + CHECK_EVERY_S
        self._note_best(self._best())
        storage = self.study._storage
        host = socket.gethostname()
        now = datetime.now()  # Optuna's datetime_start is naive local time
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            owner = t.user_attrs.get("owner", "")
            o_host, _, o_pid = owner.rpartition(":")
            if t.number in self._inflight:
                continue
            if not owner:  # no claim (plain Optuna's ask, or an older driver killed before its claim): no beat
                if t.datetime_start is None or (now - t.datetime_start).total_seconds() < GRACE_S:
                    continue
            elif o_host != host or not o_pid.isdigit() or _pid_alive(int(o_pid)):
                continue
            try:
                storage.set_trial_state_values(t._trial_id, state=TrialState.FAIL)
            except optuna.exceptions.UpdateFinishedTrialError:
                pass
        optuna.storages.fail_stale_trials(self.study)  # other hosts: by heartbeat
        running = self.ledger.running()
        if running:  # one (cached) read of the finished trials, not one query per running mask
            done = {t.number: t for t in self.study.get_trials(deepcopy=False,
                                                               states=(TrialState.FAIL, TrialState.COMPLETE))}
            for key, number in running:
                t = done.get(number)
                if t is None:
                    continue
                if t.state == TrialState.FAIL:
                    self.ledger.fail_trial(number)
                else:  # told COMPLETE by a driver killed before it updated the ledger: finish the record
                    self.ledger.complete(key, t.value, {k: t.user_attrs[k] for k in METRICS if k in t.user_attrs})
        for key, number in self.ledger.take_for_retry():
            self.study.enqueue_trial(mask_to_params(mask_from_key(key)),
                                     user_attrs={"phase": "retry", "retry_of": number})
            self.result.retried.append(number)

    # -- the loop -----------------------------------------------------------------------------------
    def _counts(self) -> tuple[int, int]:
        c = self.ledger.counts()
        # Masks queued for a retry are not held by anyone: their WAITING trials go to the next ask.
        return c.get("complete", 0), c.get("running", 0)

    def _is_taken(self, mask: tuple[bool, ...]) -> bool:
        key = mask_key(mask)
        taken = self._taken.get(key)
        if taken is None:
            taken = self._taken[key] = self.ledger.is_taken(key)
        return taken

    def _ask(self, want: int = 1) -> int:
        """Start one trial, or up to ``want`` from one sampler fit; return the study's complete + running masks
        after them (all drivers).

        Optuna's `Study.ask` creates the trial (its own transaction) before the sampler runs; here the sampler
        runs first, for the next trial number, and `start_trial` creates the trial with its params and
        attributes and claims its mask in one transaction. An enqueued (WAITING) trial is taken first, as
        `Study.ask` takes it, and alone. Another driver may number a trial first: this one then gets the next
        number (its mask was drawn for the number before, its phase is the one it was drawn in).

        Batch: with no trial enqueued, ``want`` > 1 and a sampler that `batches` (swap, Bayesian phase), the
        masks of the next ``want`` numbers come from one fit (distinct, none taken) and are started together by
        `start_trials` (one transaction, claimed and numbered in order, up to the study's target)."""
        self._taken.clear()
        skip: set[int] = set()
        while True:
            with self._one_read():
                self.study._thread_local.cached_all_trials = None  # one read of the study per ask, as Study.ask
                trials = self.study._get_trials(deepcopy=False, use_cache=True)
                waiting = next((t for t in trials if t.state == TrialState.WAITING and t._trial_id not in skip), None)
                number = waiting.number if waiting else (trials[-1].number + 1 if trials else 0)
                if waiting is None and want > 1 and self.sampler.batches(number):
                    batch = self.sampler.sample_batch(self.study, [_new_trial(number + j) for j in range(want)])
                    break
                trial = waiting or _new_trial(number)
                self.sampler.system_attrs = system = {}
                try:
                    self.sampler.before_trial(self.study, trial)
                    space = self.sampler.infer_relative_search_space(self.study, trial)
                    # What suggest_categorical would return per layer: an enqueued mask, else the sampler's.
                    params = {**self.sampler.sample_relative(self.study, trial, space),
                              **trial.system_attrs.get("fixed_params", {})}
                finally:
                    self.sampler.system_attrs = None
            phase = trial.user_attrs.get("phase") or self.sampler.phase(number)
            started = self._start(params, phase, system, waiting)
            if started is not None:
                return self._launch(*started)
            skip.add(waiting._trial_id)  # another driver took this enqueued trial first
        masks = [self._check_budget(params) for params in batch]
        items = [(mask_key(m), params, {"mask": mask_key(m), "phase": self.sampler.phase(number + j)})
                 for j, (m, params) in enumerate(zip(masks, batch, strict=True))]
        started = start_trials(self.study._storage, self.ledger, items, mask_space(self.settings.num_layers),
                               self.owner, self.options.trials)
        held = 0
        for one, mask in zip(started, masks, strict=False):  # fewer started than drawn: the study is full
            held = self._launch(one, mask)
        return held

    def _check_budget(self, params: dict) -> tuple[bool, ...]:
        mask = params_to_mask(params, self.settings.num_layers)
        if mask.count(False) not in self.settings.skips:
            raise RuntimeError(f"mask {mask_key(mask)} breaks the budget")
        return mask

    def _start(self, params: dict, phase: str, system: dict,
               waiting: FrozenTrial | None) -> tuple[Started, tuple[bool, ...]] | None:
        """`start_trial` for one sampled mask (None: another driver took the enqueued trial ``waiting``)."""
        mask = self._check_budget(params)
        key = mask_key(mask)
        started = start_trial(self.study._storage, self.ledger, key, params, mask_space(self.settings.num_layers),
                              {"mask": key, "phase": phase}, self.owner, self.options.trials, system_attrs=system,
                              waiting=waiting)
        return None if started is None else (started, mask)

    def _launch(self, started: Started, mask: tuple[bool, ...]) -> int:
        """Submit a started trial whose claim was won (else tell the sampler it was pruned); return held."""
        trial, claim = started.trial, started.claim
        self._remember(self.study._study_id, trial)
        if not claim.won:
            # Full: other drivers claimed the last trials between our count and our claim (no evaluation).
            # Otherwise another trial holds this mask (e.g. a concurrent driver enqueued the same seed).
            if claim.state != "full":
                self.result.pruned_duplicates += 1
            self.sampler.after_trial(self.study, trial, TrialState.PRUNED, None)  # as Study.tell would
            return claim.held
        with self._lock:
            self._inflight[trial.number] = (trial, mask)
        self.evaluator.submit(trial.number, mask)
        return claim.held

    def _tell(self, ticket: int, outcome: Evaluation | BaseException) -> None:
        with self._lock:
            trial, mask = self._inflight.pop(ticket)
        key = mask_key(mask)
        storage, study_id = self.study._storage, self.study._study_id
        if isinstance(outcome, BaseException):  # FAIL, with the error, and the mask released: one transaction
            attrs = {"error": f"{type(outcome).__name__}: {outcome}"[:500]}
            when = finish_trial(storage, trial._trial_id, None, attrs, also=[self.ledger.fail_statement(key)],
                                state=TrialState.FAIL)
            self.sampler.after_trial(self.study, trial, TrialState.FAIL, None)
            self._remember(study_id, as_finished(trial, TrialState.FAIL, None, attrs, when))
            self._next_check = 0.0  # queue the mask again before the next ask takes a new one
            return
        told = pareto.objective_values(self.settings.objective, outcome.cost, mask)
        values = told if isinstance(told, list) else [told]
        if all(math.isfinite(v) for v in values):  # the common case: one transaction, no read-back
            metrics = outcome.metrics()
            when = finish_trial(storage, trial._trial_id, values, metrics,
                                also=[self.ledger.complete_statement(key, outcome.cost, metrics)])
            self.sampler.after_trial(self.study, trial, TrialState.COMPLETE, values)
            self._remember(study_id, as_finished(trial, TrialState.COMPLETE, values, metrics, when))
        else:  # Optuna's tell records a non-finite value as a FAIL (with its warning)
            write_trial(storage, trial._trial_id, user_attrs=outcome.metrics())
            self.study.tell(trial.number, told)
            self.ledger.complete(key, outcome.cost, outcome.metrics())
        self._note_best(outcome.cost)
        self.result.evaluated += 1

    def _heartbeat(self, stop: threading.Event) -> None:
        storage = self.study._storage
        while not stop.wait(HEARTBEAT_S / 2):
            with self._lock:
                ids = [t._trial_id for t, _ in self._inflight.values()]
            try:
                beat(storage, ids)  # one statement for every trial in flight
            except Exception:  # noqa: BLE001 - a missed beat is retried at the next tick
                pass

    def run(self) -> SearchResult:
        target = self.options.trials
        stop = threading.Event()
        beat = threading.Thread(target=self._heartbeat, args=(stop,), daemon=True)
        beat.start()
        try:
            self._fail_dead_trials()
            while True:
                if self.evaluator.slots < 1:
                    raise DimrError("every evaluation worker is gone; check the workers' logs and run again")
                complete, elsewhere = self._counts()
                self.on_result(complete, target, self._best_cost)
                held = complete + elsewhere
                # Slots, plus the masks an evaluator wants queued behind them (`Evaluator.ahead`): a freed worker
                # then starts its next mask at once instead of waiting for this loop.
                cap = self.evaluator.slots + getattr(self.evaluator, "ahead", 0)
                while len(self._inflight) < cap and held < target:
                    # Idle slots share one sampler fit (at most BATCH_MAX); one idle slot: one mask per fit, as ever.
                    want = min(cap - len(self._inflight), target - held, BATCH_MAX)
                    held = self._ask(want)  # the claim counts the study's masks: no extra query per ask
                if not self._inflight:
                    if complete >= target:
                        break
                    time.sleep(1.0)  # other drivers hold the remaining trials: wait for them or their death
                    self._fail_dead_trials()
                    continue
                for ticket, outcome in self.evaluator.wait(timeout=HEARTBEAT_S):
                    if ticket in self._inflight:  # else a mask an interrupted earlier run left in a reused pool
                        self._tell(ticket, outcome)
                if time.monotonic() >= self._next_check:  # scans every RUNNING trial: not after every result
                    self._fail_dead_trials()
        finally:
            stop.set()
            with self._lock:
                leftovers = list(self._inflight.values())
                self._inflight.clear()
            for trial, mask in leftovers:  # interrupted: hand the masks back for the next run
                try:
                    finish_trial(self.study._storage, trial._trial_id, None,
                                 also=[self.ledger.fail_statement(mask_key(mask))], state=TrialState.FAIL)
                except optuna.exceptions.UpdateFinishedTrialError:
                    continue  # another driver failed it (its ledger row is released by the next check)
                self.sampler.after_trial(self.study, trial, TrialState.FAIL, None)
        complete, _ = self._counts()
        best = self._best_trial()
        self.result.complete = complete
        if best is not None:
            self.result.best_cost, self.result.best_trial = pareto.cost_of(best), best.number
            self.result.best_mask = best.user_attrs.get("mask")
        return self.result

    def _best_trial(self) -> optuna.trial.FrozenTrial | None:
        """The lowest-cost complete trial (in a Pareto study: of the front)."""
        if self.settings.objective == "pareto":
            return min(self.study.best_trials, key=pareto.cost_of, default=None)
        try:
            return self.study.best_trial
        except ValueError:
            return None

    def _best(self) -> float | None:
        best = self._best_trial()
        return None if best is None else pareto.cost_of(best)

    def _note_best(self, cost: float | None) -> None:
        """The best cost shown while searching: this driver's results at once, other drivers' at each check."""
        if cost is not None and (self._best_cost is None or cost < self._best_cost):
            self._best_cost = cost
