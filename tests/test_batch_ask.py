"""Batch asks: idle workers share one fit of the swap proposer (batch Thompson sampling), on SQLite and PostgreSQL,
with one driver and with two drivers on one study."""

from __future__ import annotations

import threading
import time

import numpy as np
import optuna
import pytest
from optuna.trial import TrialState
from sqlalchemy import select

from dimr.masks import Budget, mask_to_params, params_to_mask, random_mask
from dimr.search import SEEDS_ATTR, Search, SearchOptions, StudySettings, heuristics
from dimr.search import driver as driver_mod
from dimr.search.proposers.swap import SwapProposer
from dimr.search.sampler import BudgetSampler
from dimr.search.settings import PROFILE_ATTR
from storage import open_storage
from storage.ledger import MaskRow

LAYERS, SKIP = 12, 3
SETTINGS = StudySettings(pair="synthetic", verifier="synthetic", fingerprint="-", num_layers=LAYERS, skip=SKIP,
                         cost="kl", calibration="-", calibration_hash="-", num_sequences=0, seq_len=0)


class SyntheticEvaluator:
    """``slots`` places, results in submission order, a cost with layer and adjacent-pair terms (no model)."""

    num_layers = LAYERS

    def __init__(self, slots: int, per_wait: int | None = None, delay_s: float = 0.0):
        self.slots, self.per_wait, self.delay_s = slots, per_wait, delay_s
        self.weights = np.random.default_rng(0).random(LAYERS) + np.eye(LAYERS)[0] + np.eye(LAYERS)[-1]
        self.queue: list[tuple[int, tuple[bool, ...]]] = []
        self.scored: list[tuple[bool, ...]] = []

    def submit(self, ticket: int, mask: tuple[bool, ...]) -> None:
        self.queue.append((ticket, mask))
        self.scored.append(tuple(mask))

    def wait(self, timeout: float | None = None):
        from workers.base import Evaluation

        time.sleep(self.delay_s)
        done, self.queue = self.queue[:self.per_wait], self.queue[self.per_wait:] if self.per_wait else []
        out = []
        for ticket, mask in done:
            z = 1.0 - np.asarray(mask, dtype=float)
            cost = float(z @ self.weights + 0.3 * (z[1:] * z[:-1]).sum())
            out.append((ticket, Evaluation(mask=mask, cost=cost, top1_agreement=1.0, expected_acceptance=1.0,
                                           tokens=0, seconds=0.0, worker="synthetic")))
        return out

    def block_influence(self) -> list[float]:
        return list(self.weights)

    def close(self) -> None:
        pass


class CountingFits(Search):
    """The real driver, counting the sampler's Bayesian fits (one per call) and the size of every batch."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fits = 0
        self.batches: list[int] = []
        single, propose = self.sampler.sample_relative, self.sampler.propose

        def count_single(study, trial, space):
            if "fixed_params" not in trial.system_attrs and self.sampler.phase(trial.number) == "bayes":
                self.fits += 1
            return single(study, trial, space)

        def count_propose(study, trials):
            if len(trials) > 1:
                self.fits += 1
                self.batches.append(len(trials))
            return propose(study, trials)

        self.sampler.sample_relative, self.sampler.propose = count_single, count_propose


def _check_study(url: str, trials: int) -> list[optuna.trial.FrozenTrial]:
    """Every complete trial's mask is on the budget and evaluated once, and the ledger says exactly that."""
    storage = open_storage(url)
    study = optuna.load_study(study_name="s", storage=storage)
    complete = [t for t in study.trials if t.state == TrialState.COMPLETE]
    masks = [t.user_attrs["mask"] for t in complete]
    assert len(masks) == trials and len(set(masks)) == trials
    assert all(m.count("0") == SKIP for m in masks)
    with storage.engine.connect() as c:
        rows = c.execute(select(MaskRow.mask_key, MaskRow.state, MaskRow.trial_number)).all()
    assert {(k, n) for k, s, n in rows if s == "complete"} == {(t.user_attrs["mask"], t.number) for t in complete}
    assert not [r for r in rows if r.state == "running"]
    return complete


def test_idle_slots_share_one_fit(storage_url):
    ev = SyntheticEvaluator(slots=8)
    # Without the single-skip profile: every evaluation is then a trial (the profile beside batches: below).
    search = CountingFits(open_storage(storage_url), "s", SETTINGS, SearchOptions(48, 0, "swap", 0, False), ev)
    assert search.run().complete == 48
    complete = _check_study(storage_url, 48)
    assert len(set(ev.scored)) == len(ev.scored) == 48
    seeds = search.study.user_attrs[SEEDS_ATTR]
    assert [t.user_attrs["phase"] for t in complete] == ["seed"] * seeds + ["bayes"] * (48 - seeds)
    assert search.batches and max(search.batches) == min(8, driver_mod.BATCH_MAX)
    assert search.fits <= (48 - seeds) / 4  # 8 idle slots at a time: about one fit per 8 Bayesian trials


def test_one_idle_slot_is_one_mask_per_fit(tmp_path):
    """Results one at a time: one idle slot per ask, so no batch, the study of a one-worker run."""
    url = f"sqlite:///{tmp_path}/one.db"
    search = CountingFits(open_storage(url), "s", SETTINGS, SearchOptions(30, 0, "swap", 0),
                          SyntheticEvaluator(slots=1))
    assert search.run().complete == 30
    assert search.batches == [] and search.fits == 30 - search.study.user_attrs[SEEDS_ATTR]
    _check_study(url, 30)


def test_tpe_batches_too(tmp_path):
    """TPE's Bayesian phase: idle slots share one fit of its densities; the random phase asks one at a time."""
    url = f"sqlite:///{tmp_path}/tpe.db"
    search = CountingFits(open_storage(url), "s", SETTINGS, SearchOptions(48, 4, "tpe", 0),
                          SyntheticEvaluator(slots=8))
    assert search.run().complete == 48
    assert search.batches and max(search.batches) == 8
    assert search.fits <= 48 / 3
    complete = _check_study(url, 48)
    seeds = search.study.user_attrs[SEEDS_ATTR]
    assert [t.user_attrs["phase"] for t in complete] == ["seed"] * seeds + ["random"] * 4 + ["bayes"] * (44 - seeds)


def _tpe_study(layers: int = LAYERS) -> optuna.Study:
    """Layer 0 kept: cheap; layer 0 skipped: dear. 40 complete trials, 8 running (skipping layer 0)."""
    rng = np.random.default_rng(2)
    study = optuna.create_study()
    budget = Budget(layers, SKIP)
    for i in range(48):
        m = random_mask(budget, rng)
        value = 0.1 * rng.random() + (0.0 if m[0] else 1.0)
        state = TrialState.COMPLETE if i < 40 else TrialState.RUNNING
        study.add_trial(optuna.trial.create_trial(params=mask_to_params(m), distributions=_dists(layers), state=state,
                                                  value=value if state == TrialState.COMPLETE else None))
    return study


def test_tpe_batch_of_one_is_plain_tpe_and_a_batch_follows_the_good_density():
    from dimr.masks import mask_space
    from storage.optuna_compat import BatchTPESampler, CappedStudy

    study = CappedStudy(_tpe_study(), 300, {})  # TPE's writes to a trial that does not exist yet are collected
    trial = driver_mod.new_trial(48)
    kw = {"seed": 3, "multivariate": True, "constant_liar": True, "n_startup_trials": 4}
    plain = optuna.samplers.TPESampler(**kw).sample_relative(study, trial, mask_space(LAYERS))
    assert BatchTPESampler(**kw).sample_batch(study, trial, mask_space(LAYERS), 1) == [plain]
    tpe = BatchTPESampler(**kw)
    batch = tpe.sample_batch(study, trial, mask_space(LAYERS), 16)
    assert len(batch) == 16 and all(set(p) == set(mask_space(LAYERS)) for p in batch)
    assert len({tuple(p.values()) for p in batch}) == 16  # distinct proposals, not TPE's favourite repeated
    assert sum(p["layer_00"] for p in batch) >= 14  # each is TPE's pick: keep the layer the good trials keep
    assert tpe._n_ei_candidates == 24 and tpe._batch is None  # plain TPE again afterwards
    empty = CappedStudy(optuna.create_study(), 300, {})
    assert tpe.sample_batch(empty, trial, mask_space(LAYERS), 3) == [{}, {}, {}]  # startup: no fit


def test_two_batching_drivers_never_evaluate_a_mask_twice(pg_url):
    """Two drivers, 8 slots each, on one PostgreSQL study: each batches, neither completes a mask the other
    holds, and together they stop at the target."""
    searches, errors = [], []

    def drive() -> None:
        try:
            ev = SyntheticEvaluator(slots=8, per_wait=3, delay_s=0.05)
            s = CountingFits(open_storage(pg_url), "s", SETTINGS, SearchOptions(80, 0, "swap", 0), ev)
            searches.append((s, ev))
            s.run()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=drive) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    assert all(s.batches for s, _ in searches), [(s.batches, len(ev.scored), s.result) for s, ev in searches]
    # Each driver may pay for the single-skip profile once (both start before either stored it); the trials'
    # masks are all distinct.
    singles = set(heuristics.single_skip_masks(LAYERS))
    for _, ev in searches:
        assert all(ev.scored.count(m) <= 1 for m in singles)
    scored = [m for _, ev in searches for m in ev.scored if m not in singles]
    assert len(scored) == len(set(scored)) == 80
    _check_study(pg_url, 80)
    assert len(optuna.load_study(study_name="s", storage=open_storage(pg_url)).user_attrs[PROFILE_ATTR]) == LAYERS


def _history(budget: Budget, n: int) -> list:
    rng = np.random.default_rng(5)
    masks = list(dict.fromkeys(random_mask(budget, rng) for _ in range(n)))
    return [(m, float(rng.random())) for m in masks]


@pytest.mark.parametrize("k", [2, 8])
def test_sample_batch_is_distinct_on_the_budget_and_untaken(k):
    budget = Budget(LAYERS, SKIP)
    history = _history(budget, 20)
    taken = {m for m, _ in history}
    study = optuna.create_study()
    for m, c in history:
        study.add_trial(optuna.trial.create_trial(params=mask_to_params(m), value=c,
                                                  distributions=_dists()))
    sampler = BudgetSampler(budget, SwapProposer(), startup=0, seed=0, is_taken=lambda m: m in taken)
    trials = [driver_mod.new_trial(len(history) + j) for j in range(k)]
    out = [params_to_mask(p, LAYERS) for p in sampler.propose(study, trials)]
    assert len(set(out)) == k and all(budget.admits(m) and m not in taken for m in out)
    single = params_to_mask(sampler.sample_relative(study, trials[0], _dists()), LAYERS)
    assert out[0] == single  # the first draw is the trial's own Thompson draw


def test_sample_batch_exhausts_a_small_space_without_repeats():
    """4 of 6 masks evaluated, a batch of 2 takes the other 2 (novelty fallback in the batch)."""
    budget = Budget(4, 2)
    masks = [m for m in ((False, False, True, True), (True, True, False, False), (False, True, False, True),
                         (True, False, True, False))]
    study = optuna.create_study()
    for i, m in enumerate(masks):
        study.add_trial(optuna.trial.create_trial(params=mask_to_params(m), value=0.1 * (i + 1),
                                                  distributions=_dists(4)))
    sampler = BudgetSampler(budget, SwapProposer(), startup=0, seed=0, is_taken=lambda m: m in masks)
    out = [params_to_mask(p, 4) for p in sampler.propose(study, [driver_mod.new_trial(4 + j)
                                                                      for j in range(2)])]
    assert sorted(out) == sorted({(False, True, True, False), (True, False, False, True)})


def _dists(n: int = LAYERS):
    from dimr.masks import mask_space

    return mask_space(n)


def test_pareto_batches_keep_each_trials_skip_count(tmp_path):
    """In a Pareto study each trial's skip count is its number's (1..skip in turn): a batch drawn for the next
    numbers keeps them, as one ask per trial would."""
    from dataclasses import replace

    url = f"sqlite:///{tmp_path}/pareto.db"
    search = CountingFits(open_storage(url), "s", replace(SETTINGS, objective="pareto"),
                          SearchOptions(40, 0, "swap", 0), SyntheticEvaluator(slots=8))
    assert search.run().complete == 40
    assert search.batches
    trials = optuna.load_study(study_name="s", storage=open_storage(url)).trials
    bayes = [t for t in trials if t.user_attrs["phase"] == "bayes"]
    assert len(bayes) > 20
    assert all(t.user_attrs["mask"].count("0") == search.sampler.trial_budget(t.number).skip for t in bayes)
    masks = [t.user_attrs["mask"] for t in trials if t.state == TrialState.COMPLETE]
    assert len(masks) == len(set(masks)) == 40


def test_a_swap_batch_is_what_one_ask_per_slot_proposed(tmp_path, monkeypatch):
    """The driver fills every idle slot before it tells the next result, so one ask per slot fitted the same
    data: the batch (draw j seeded by its trial's number, earlier draws' masks excluded) proposes exactly the
    same masks, trial by trial, with fewer fits."""
    studies, fits = [], []
    for cap in (1, driver_mod.BATCH_MAX):
        monkeypatch.setattr(driver_mod, "BATCH_MAX", cap)
        url = f"sqlite:///{tmp_path}/cap{cap}.db"
        search = CountingFits(open_storage(url), "s", SETTINGS, SearchOptions(40, 0, "swap", 0),
                              SyntheticEvaluator(slots=8))
        assert search.run().complete == 40
        studies.append([(t.number, t.user_attrs["mask"], t.value) for t in _check_study(url, 40)])
        fits.append(search.fits)
    assert studies[0] == studies[1]
    assert fits[1] < fits[0] / 4
