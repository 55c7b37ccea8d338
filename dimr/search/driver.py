"""The search driver: the loop that keeps ``evaluator.slots`` (+ ``ahead``) trials in flight.

It asks the sampler for masks, starts their trials through the `TrialStore` (one transaction each: trial,
params, attributes, heartbeat and the mask's claim), hands them to the `Evaluator`, and records each result
the moment it arrives. It never imports SQLAlchemy or Ray. Study set-up and seeds: `dimr.search.study`;
dead drivers and retries: `dimr.search.recovery`.

Once every seed has started, a study without a profile gets one (`SearchOptions.profile`): the driver scores
each single-bit skip (the L layers; in a sublayer search the 2L attentions and MLPs) on the same evaluator
(not as trials: they are outside the budget, and no best-trial query must see them), stores their costs in the
study (``dimr_profile``), and enqueues the profile's seed (`heuristics.profile_seed`; per skip count in a Pareto
study). Drivers that start together may each pay for the profile; the ledger drops the duplicate seed. A
driver stopped during the profile leaves no trace of it, and the next run starts it again.
"""

from __future__ import annotations

import math
import sys
import threading
import time
import uuid
from collections.abc import Callable
from datetime import datetime

import optuna
from optuna.trial import FrozenTrial, TrialState

from dimr.errors import DimrError
from dimr.masks import Budget, CostBudget, Mask
from dimr.search import heuristics, pareto
from dimr.search.recovery import recover
from dimr.search.sampler import BudgetSampler
from dimr.search.settings import PROFILE_ATTR, SearchOptions, SearchResult, StudySettings
from storage import crash
from storage.rdb import HEARTBEAT_S, StorageLost, fault_of, retrying
from storage.store import TrialStore
from storage.trials import Started
from workers.base import Evaluation, Evaluator

BATCH_MAX = 8  # the most trials one sampler fit proposes when that many slots are idle
CHECK_EVERY_S = 2.0  # how often a busy driver looks for dead drivers' trials and failed masks
WORKERS_GONE = "every evaluation worker is gone; check the workers' logs and run again"
MAX_CONSECUTIVE_FAILURES = 5  # failed evaluations in a row that stop the run (the cause is not the mask)


def is_out_of_memory(error: BaseException) -> bool:
    """An out-of-memory error of torch (CUDA or host), Python, or Ray's memory monitor, however wrapped."""
    seen = error
    while seen is not None:
        if isinstance(seen, MemoryError) or "OutOfMemory" in type(seen).__name__ or "out of memory" in str(seen):
            return True
        seen = seen.__cause__ or getattr(seen, "cause", None)
    return False


def stop_for(error: BaseException, consecutive: int) -> DimrError | None:
    """The error that stops the run after this failed evaluation, or None to fail the trial and go on."""
    what = f"{type(error).__name__}: {' '.join(str(error).split())}"[:300]
    if is_out_of_memory(error):
        return DimrError(f"an evaluation ran out of memory ({what}); lower --batch-size (or --num-sequences / "
                         "--seq-len), or add --gpus-per-worker, and run again: the study resumes")
    if consecutive >= MAX_CONSECUTIVE_FAILURES:
        return DimrError(f"{consecutive} evaluations in a row failed, the last with {what}; fix the cause "
                         "and run again: the study resumes")
    return None


def new_trial(number: int) -> FrozenTrial:
    """The trial ``number`` as the sampler sees it before it exists (the driver creates it after sampling)."""
    return FrozenTrial(number=number, state=TrialState.RUNNING, value=None, datetime_start=datetime.now(),
                       datetime_complete=None, params={}, distributions={}, user_attrs={}, system_attrs={},
                       intermediate_values={}, trial_id=-1)


class SearchInterrupted(KeyboardInterrupt):
    """Ctrl-C during a search, after the trials in flight were handed back: ``result`` says what is saved."""

    def __init__(self, result: SearchResult):
        super().__init__(f"interrupted; study {result.study} keeps {result.complete} complete trials")
        self.result = result


class Driver:
    """One run of the loop over one opened study (`dimr.search.study.open_study`)."""

    def __init__(self, study: optuna.Study, store: TrialStore, sampler: BudgetSampler, settings: StudySettings,
                 options: SearchOptions, evaluator: Evaluator,
                 on_result: Callable[[int, int, float | None], None] | None = None):
        if evaluator.num_layers != settings.num_layers:
            raise ValueError("evaluator and settings disagree on the number of layers")
        self.study, self.store, self.sampler = study, store, sampler
        self.budget = sampler.budget  # the mask codec (keys, params) and, under a cost budget, admission
        self.settings, self.options, self.evaluator = settings, options, evaluator
        self.on_result = on_result or (lambda done, total, best: None)
        self._taken: dict[str, bool] = {}  # the ledger's answers during one ask (the claim has the last word)
        sampler.is_taken = self._is_taken
        self._inflight: dict[int, tuple[FrozenTrial, Mask]] = {}
        # Tags this run's trials: Ctrl-C can land after a start committed and before the trial is in flight.
        self.run_id = uuid.uuid4().hex[:12]
        self._lock = threading.Lock()
        self._next_check = 0.0
        self._best_cost: float | None = None
        self._failed_in_a_row = 0
        self.result = SearchResult(study.study_name, 0, 0, None, None, None)
        sampler.profile = study.user_attrs.get(PROFILE_ATTR)
        self._profile_due = options.profile and sampler.profile is None and (
            isinstance(self.budget, CostBudget) or max(settings.skips) >= 2)

    def _is_taken(self, mask: Mask) -> bool:
        key = self.budget.key(mask)
        if key not in self._taken:
            self._taken[key] = self.store.is_taken(key)
        return self._taken[key]

    def _check(self) -> None:
        self._next_check = time.monotonic() + CHECK_EVERY_S
        with self._lock:
            mine = [t for t, _ in self._inflight.values()]
        self.store.beat(mine)  # first: after an outage, our own trials must not look stale to the recovery
        self._note_best(self._best())
        self.result.retried += recover(self.study, self.store, self._inflight, self.budget)

    def _ask(self, want: int = 1) -> int:
        """Start one trial, or up to ``want`` from one sampler fit; return the study's complete + running masks
        after them (all drivers).

        The sampler runs first, for the next trial number, then the store creates the trial and claims its mask
        in one transaction. An enqueued (WAITING) trial is taken first, as `Study.ask` takes it, and alone.
        Another driver may number a trial first: this one then gets the next number (its mask was drawn for the
        number before). With no trial enqueued, ``want`` > 1 and a batching sampler, the next ``want`` numbers'
        masks come from one fit and start together (claimed and numbered in order, up to the target)."""
        self._taken.clear()
        skip: set[int] = set()
        while True:
            with self.store.one_read():
                trials = self.store.trials(self.study)
                waiting = next((t for t in trials if t.state == TrialState.WAITING and t.number not in skip), None)
                number = waiting.number if waiting else (trials[-1].number + 1 if trials else 0)
                if waiting is None and want > 1 and self.sampler.batches(number):
                    batch = self.sampler.propose(self.study, [new_trial(number + j) for j in range(want)])
                    break
                trial = waiting or new_trial(number)
                self.sampler.system_attrs = system = {}
                try:
                    params = self.sampler.propose(self.study, [trial])[0]
                finally:
                    self.sampler.system_attrs = None
            mask = self._check_budget(params)
            phase = trial.user_attrs.get("phase") or self.sampler.phase(number)
            key = self.budget.key(mask)
            started = self.store.start(key, params, {"mask": key, "phase": phase, "run": self.run_id},
                                       self.options.trials, system_attrs=system, waiting=waiting)
            if started is not None:
                return self._launch(started, mask)
            skip.add(waiting.number)  # another driver took this enqueued trial first
        masks = [self._check_budget(params) for params in batch]
        items = [(self.budget.key(m), params, {"mask": self.budget.key(m), "phase": self.sampler.phase(number + j),
                   "run": self.run_id})
                 for j, (m, params) in enumerate(zip(masks, batch, strict=True))]
        held = 0
        for one, mask in zip(self.store.start_many(items, self.options.trials), masks, strict=False):
            held = self._launch(one, mask)  # fewer started than drawn: the study is full
        return held

    def _check_budget(self, params: dict) -> Mask:
        mask = self.budget.from_params(params)
        if not (self.budget.admits(mask) if isinstance(self.budget, CostBudget)
                else mask.count(False) in self.settings.skips):
            raise RuntimeError(f"mask {self.budget.key(mask)} breaks the budget")
        return mask

    def _launch(self, started: Started, mask: Mask) -> int:
        """Submit a started trial whose claim was won (else tell the sampler it was pruned); return held."""
        trial, claim = started.trial, started.claim
        if not claim.won:
            # Full: other drivers claimed the last trials between our count and our claim (no evaluation).
            # Otherwise another trial holds this mask (e.g. a concurrent driver enqueued the same seed).
            if claim.state != "full":
                self.result.pruned_duplicates += 1
            self.sampler.after_trial(self.study, trial, TrialState.PRUNED, None)  # as Study.tell would
            return claim.held
        with self._lock:
            self._inflight[trial.number] = (trial, mask)
        self.evaluator.submit(trial.number, self.budget.routed(mask))
        return claim.held

    def _tell(self, ticket: int, outcome: Evaluation | BaseException) -> None:
        """Record one result; safe to call again after a database fault (the trial leaves ``_inflight`` only
        once written, and a trial found finished, by an earlier try or another driver, is not written twice)."""
        trial, mask = self._inflight[ticket]
        key = self.budget.key(mask)
        if isinstance(outcome, BaseException):  # FAIL with the error, the mask released: one transaction
            self.store.fail(trial, key, {"error": f"{type(outcome).__name__}: {outcome}"[:500]})
            self._forget(ticket)
            self.sampler.after_trial(self.study, trial, TrialState.FAIL, None)
            self._next_check = 0.0  # queue the mask again before the next ask takes a new one
            self._failed_in_a_row += 1
            stop = stop_for(outcome, self._failed_in_a_row)
            if stop is not None:
                raise stop
            return
        self._failed_in_a_row = 0
        told = pareto.objective_values(self.settings.objective, outcome.cost, mask)
        values = told if isinstance(told, list) else [told]
        if all(math.isfinite(v) for v in values):  # the common case: one transaction, no read-back
            done = self.store.finish(trial, key, values, outcome.metrics())
            self._forget(ticket)
            if done is None:  # failed meanwhile (stale heartbeat during an outage): its mask is retried
                return
            self.sampler.after_trial(self.study, trial, TrialState.COMPLETE, values)
        else:
            self.store.finish_non_finite(self.study, trial, key, told, outcome.cost, outcome.metrics())
            self._forget(ticket)
        self._note_best(outcome.cost)
        self.result.evaluated += 1

    def _forget(self, ticket: int) -> None:
        with self._lock:
            self._inflight.pop(ticket, None)

    def _heartbeat(self, stop: threading.Event) -> None:
        while not stop.wait(HEARTBEAT_S / 2):
            with self._lock:
                trials = [t for t, _ in self._inflight.values()]
            try:
                self.store.beat(trials)
            except Exception:  # noqa: BLE001 - a missed beat is retried at the next tick
                pass

    def run(self) -> SearchResult:
        """Drive the study to ``options.trials`` complete masks. A database fault is retried for a bounded
        time (`storage.rdb.retrying`); then one line (DimrError), the trials in flight left to the next run."""
        try:
            try:
                self._loop()
            except KeyboardInterrupt:
                raise SearchInterrupted(retrying(self._summary)) from None
            return retrying(self._summary)
        except StorageLost as e:
            raise DimrError(str(e)) from None

    def _loop(self) -> None:
        target = self.options.trials
        stop = threading.Event()
        threading.Thread(target=self._heartbeat, args=(stop,), daemon=True).start()
        try:
            retrying(self._check)
            while True:
                if self.evaluator.slots < 1:
                    raise DimrError(WORKERS_GONE)
                complete, elsewhere = retrying(self.store.counts)
                self.on_result(complete, target, self._best_cost)
                held = complete + elsewhere
                # Slots, plus the masks an evaluator wants queued behind them (`Evaluator.ahead`): a freed worker
                # then starts its next mask at once instead of waiting for this loop.
                cap = self.evaluator.slots + getattr(self.evaluator, "ahead", 0)
                while len(self._inflight) < cap and held < target:
                    if self._profile_due and held >= self.sampler.first_search_trial:
                        self._profile(cap)  # its seeds are enqueued: the next asks take them
                        continue
                    held = retrying(self._ask, min(cap - len(self._inflight), target - held, BATCH_MAX))
                if not self._inflight:
                    if complete >= target:
                        break
                    time.sleep(1.0)  # other drivers hold the remaining trials: wait for them or their death
                    retrying(self._check)
                    continue
                for ticket, outcome in self.evaluator.wait(timeout=HEARTBEAT_S):
                    if ticket in self._inflight:  # else a mask an interrupted earlier run left in a reused pool
                        retrying(self._tell, ticket, outcome)
                if time.monotonic() >= self._next_check:  # scans every RUNNING trial: not after every result
                    retrying(self._check)
        finally:
            stop.set()
            self._hand_back(interrupted=isinstance(sys.exc_info()[1], KeyboardInterrupt))

    def _profile(self, cap: int) -> None:
        """Score every single-bit skip beside the trials in flight (``cap`` evaluations at a time), then store
        the profile and enqueue its seeds (see the module docstring)."""
        n = self.budget.bits
        masks = heuristics.single_skip_masks(n)
        todo, running, costs = list(range(n)), set(), {}
        while len(costs) < n:
            if self.evaluator.slots < 1:
                raise DimrError(WORKERS_GONE)
            while todo and len(self._inflight) + len(running) < cap:
                i = todo.pop(0)
                running.add(i)
                self.evaluator.submit(-1 - i, self.budget.routed(masks[i]))  # trial tickets are >= 0
            for ticket, outcome in self.evaluator.wait(timeout=HEARTBEAT_S):
                if ticket >= 0:
                    if ticket in self._inflight:
                        retrying(self._tell, ticket, outcome)
                    continue
                i = -1 - ticket
                if i not in running:  # an interrupted earlier run's, in a reused pool
                    continue
                running.discard(i)
                if isinstance(outcome, BaseException):
                    self._failed_in_a_row += 1
                    stop = stop_for(outcome, self._failed_in_a_row)
                    if stop is not None:
                        raise stop
                    todo.append(i)
                    continue
                self._failed_in_a_row = 0
                costs[i] = outcome.cost if math.isfinite(outcome.cost) else math.inf
                self.result.profiled += 1
            if time.monotonic() >= self._next_check:
                retrying(self._check)
        profile = [costs[i] for i in range(n)]
        crash.point("profile:before-publish")

        def publish() -> None:
            budgets = ([self.budget] if isinstance(self.budget, CostBudget)
                       else [Budget(n, k) for k in sorted(set(self.settings.skips) - {1})])
            for budget in budgets:
                mask = heuristics.profile_seed(budget, profile)
                if not self.store.is_taken(self.budget.key(mask)):
                    self.study.enqueue_trial(self.budget.to_params(mask),
                                             user_attrs={"phase": "seed", "heuristic": "single-skip-rank"})
            self.study.set_user_attr(PROFILE_ATTR, profile)

        retrying(publish)
        self.sampler.profile, self._profile_due = profile, False

    def _hand_back(self, interrupted: bool) -> None:
        """Stopped: FAIL the trials in flight and release their masks for the next run; after Ctrl-C also any
        trial this run started but had not yet put in flight (only an asynchronous interrupt lands there). With
        the database gone, leave them: the next run fails them (their driver is dead) and retries their masks."""
        with self._lock:
            leftovers = [(t, self.budget.key(m)) for t, m in self._inflight.values()]
            self._inflight.clear()
        try:
            if interrupted:
                known = {t.number for t, _ in leftovers}
                leftovers += [(t, t.user_attrs["mask"]) for t in self.store.trials(self.study)
                              if t.state == TrialState.RUNNING and t.user_attrs.get("run") == self.run_id
                              and t.number not in known]
            for trial, key in leftovers:
                if self.store.fail(trial, key) is not None:
                    self.sampler.after_trial(self.study, trial, TrialState.FAIL, None)
        except Exception as e:  # noqa: BLE001 - only database faults are left to the next run
            if fault_of(e) is None:
                raise

    def _summary(self) -> SearchResult:
        self.result.complete, _ = self.store.counts()
        best = self._best_trial()
        if best is not None:
            self.result.best_cost, self.result.best_trial = pareto.cost_of(best), best.number
            self.result.best_mask = best.user_attrs.get("mask")
        return self.result

    def _best_trial(self) -> FrozenTrial | None:
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
