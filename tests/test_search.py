"""The search driver on a real tiny verifier, real Optuna studies, SQLite and PostgreSQL."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import optuna
import pytest
from optuna.trial import TrialState
from sqlalchemy import event

from dimr.calibration import load_calibration
from dimr.errors import DimrError
from dimr.masks import Budget, parse_budget
from dimr.pairs import load_tokenizer
from dimr.search import Search, SearchOptions, StudySettings, heuristics
from storage import open_storage
from workers import EvalSpec
from workers.local import LocalEvaluator

SKIP = 3


class CountingEvaluator(LocalEvaluator):
    """The real in-process evaluator, counting what it is asked to score."""

    def __init__(self, spec):
        super().__init__(spec)
        self.scored: list[tuple[bool, ...]] = []

    def submit(self, ticket, mask):
        self.scored.append(tuple(mask))
        super().submit(ticket, mask)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from dimr.pairs import get_pair

    pair = get_pair("tiny-random")
    calib = load_calibration(pair.calibration, load_tokenizer(pair), num_sequences=4, seq_len=32)
    settings = StudySettings.for_pair(pair, Budget(8, SKIP), calib)
    spec = EvalSpec(pair=pair, input_ids=calib.input_ids, cost="kl")
    return settings, spec


def run(url, setup, study="s", trials=12, startup=4, seed=0, sampler="tpe", evaluator=None, profile=False):
    """A search; without the single-skip profile unless asked (its own tests: test_profile.py), so that every
    evaluation is a trial."""
    settings, spec = setup
    ev = evaluator or CountingEvaluator(spec)
    result = Search(open_storage(url), study, settings, SearchOptions(trials, startup, sampler, seed, profile),
                    ev).run()
    return result, ev


def complete_trials(url, study="s"):
    s = optuna.load_study(study_name=study, storage=open_storage(url))
    return sorted((t for t in s.get_trials() if t.state == TrialState.COMPLETE), key=lambda t: t.number)


def test_budget_unique_masks_and_phase_order(storage_url, setup):
    result, ev = run(storage_url, setup, trials=14, startup=4)
    trials = complete_trials(storage_url)
    assert len(trials) == 14 == result.complete == len(ev.scored)
    budget = Budget(8, SKIP)
    masks = [t.user_attrs["mask"] for t in trials]
    assert all(m.count("0") == SKIP for m in masks)
    assert len(set(masks)) == len(masks), "a mask was evaluated twice"
    assert len(set(ev.scored)) == len(ev.scored)
    # heuristic seeds first, then the random phase, then the Bayesian phase
    phases = [t.user_attrs["phase"] for t in trials]
    seeds = heuristics.seed_masks(budget, ev.block_influence())
    assert [t.user_attrs["mask"] for t in trials[: len(seeds)]] == [
        "".join("1" if b else "0" for b in m) for _, m in seeds]
    assert phases == ["seed"] * len(seeds) + ["random"] * 4 + ["bayes"] * (14 - len(seeds) - 4)
    for t in trials:
        assert 0 <= t.user_attrs["top1_agreement"] <= 1 and 0 <= t.user_attrs["expected_acceptance"] <= 1
        assert t.value >= 0


def test_same_seed_same_study(tmp_path, setup):
    a = [(t.user_attrs["mask"], t.value) for t in (run(f"sqlite:///{tmp_path}/a.db", setup, seed=7)[0] and
                                                    complete_trials(f"sqlite:///{tmp_path}/a.db"))]
    b = [(t.user_attrs["mask"], t.value) for t in (run(f"sqlite:///{tmp_path}/b.db", setup, seed=7)[0] and
                                                    complete_trials(f"sqlite:///{tmp_path}/b.db"))]
    c = [t.user_attrs["mask"] for t in (run(f"sqlite:///{tmp_path}/c.db", setup, seed=8)[0] and
                                        complete_trials(f"sqlite:///{tmp_path}/c.db"))]
    assert a == b
    assert [m for m, _ in a] != c


def test_resume_never_reevaluates(storage_url, setup):
    first, ev1 = run(storage_url, setup, trials=8)
    second, ev2 = run(storage_url, setup, trials=13)
    assert first.complete == 8 and second.complete == 13
    assert len(ev2.scored) == 5
    assert not set(ev1.scored) & set(ev2.scored)
    third, ev3 = run(storage_url, setup, trials=13)
    assert ev3.scored == [] and third.complete == 13


def test_resume_with_other_settings_is_refused(tmp_path, setup):
    from dataclasses import replace

    url = f"sqlite:///{tmp_path}/r.db"
    run(url, setup, trials=3, startup=1)
    settings, spec = setup
    before = len(optuna.load_study(study_name="s", storage=open_storage(url)).trials)
    for change in ({"cost": "js"}, {"skip": 2}, {"calibration_hash": "0" * 16}, {"pair": "other"}):
        with pytest.raises(DimrError, match="other settings"):
            Search(open_storage(url), "s", replace(settings, **change), SearchOptions(5, 1), LocalEvaluator(spec))
    assert len(optuna.load_study(study_name="s", storage=open_storage(url)).trials) == before


KILLED_DRIVER = textwrap.dedent("""
    import sys, time, pathlib, pickle
    from storage import open_storage
    from dimr.search import Search, SearchOptions
    from workers.local import LocalEvaluator
    url, marker, blob = sys.argv[1], pathlib.Path(sys.argv[2]), sys.argv[3]
    settings, spec = pickle.load(open(blob, "rb"))

    class HangOnFifth(LocalEvaluator):
        def wait(self, timeout=None):
            if self._queue and self._queue[0][0] == 4:
                marker.write_text("hanging")
                time.sleep(600)
            return super().wait(timeout)

    Search(open_storage(url), "s", settings, SearchOptions(10, 2, "tpe", 0), HangOnFifth(spec)).run()
""")


def test_killed_driver_trials_fail_and_are_retried(storage_url, setup, tmp_path):
    import pickle

    blob = tmp_path / "setup.pkl"
    blob.write_bytes(pickle.dumps(setup))
    marker = tmp_path / "marker"
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    proc = subprocess.Popen([sys.executable, "-c", KILLED_DRIVER, storage_url, str(marker), str(blob)], env=env)
    deadline = time.monotonic() + 180
    while not marker.exists():
        assert proc.poll() is None, "the driver died before reaching trial 4"
        assert time.monotonic() < deadline, "the driver never reached trial 4"
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    storage = open_storage(storage_url)
    stuck = optuna.load_study(study_name="s", storage=storage).trials[4]
    assert stuck.state == TrialState.RUNNING  # what a killed process leaves behind
    result, ev = run(storage_url, setup, trials=10)
    trials = optuna.load_study(study_name="s", storage=storage).trials
    assert trials[4].state == TrialState.FAIL
    assert result.retried == [4]
    retry = [t for t in trials if t.user_attrs.get("retry_of") == 4]
    assert len(retry) == 1 and retry[0].state == TrialState.COMPLETE
    assert retry[0].user_attrs["mask"] == stuck.user_attrs["mask"]
    assert len(complete_trials(storage_url)) == 10
    assert len(ev.scored) == 10 - 4  # trials 0-3 were complete and are not evaluated again


def test_random_sampler_and_gp(tmp_path, setup):
    for sampler in ("random", "gp"):
        url = f"sqlite:///{tmp_path}/{sampler}.db"
        result, ev = run(url, setup, trials=9, startup=3, sampler=sampler)
        masks = [t.user_attrs["mask"] for t in complete_trials(url)]
        assert len(set(masks)) == 9 and all(m.count("0") == SKIP for m in masks)


def test_parse_budget():
    assert parse_budget("4", 16).skip == 4
    assert parse_budget("0.25", 16).skip == 4
    for bad in ("0", "16", "1.5", "abc", "-2", "0.0"):
        with pytest.raises(DimrError):
            parse_budget(bad, 16)


def test_small_space_is_exhausted_without_duplicates(tmp_path, setup):
    from dataclasses import replace

    settings, spec = setup
    small = (replace(settings, skip=1), spec)
    url = f"sqlite:///{tmp_path}/x.db"
    result, ev = run(url, small, trials=math.comb(8, 1), startup=2)
    assert sorted(t.user_attrs["mask"] for t in complete_trials(url)) == sorted(
        "".join("0" if j == i else "1" for j in range(8)) for i in range(8))


def test_resume_on_mysql(mysql_url, setup):
    """MySQL/MariaDB is the third supported server: the same resume guarantees hold there."""
    first, _ = run(mysql_url, setup, trials=5, startup=2)
    second, ev = run(mysql_url, setup, trials=7, startup=2)
    assert second.complete == 7 and len(ev.scored) == 2
    masks = [t.user_attrs["mask"] for t in complete_trials(mysql_url)]
    assert len(set(masks)) == 7


def test_history_keeps_the_best_and_the_recent_single_and_multi_objective():
    """The capped view the Bayesian sampler sees: best trials (or the Pareto front) plus the latest."""
    import optuna
    from optuna.distributions import FloatDistribution
    from optuna.trial import create_trial

    from storage.optuna_compat import BEST_KEPT, CappedStudy

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    rng = np.random.default_rng(0)
    dist = {"x": FloatDistribution(0, 1)}
    single = optuna.create_study()
    costs = rng.permutation(200).astype(float)
    for c in costs:
        single.add_trial(create_trial(value=c, params={"x": 0.5}, distributions=dist))
    seen = CappedStudy(single, history=60).get_trials(deepcopy=False)
    assert len(seen) <= 60
    assert {t.value for t in seen} >= set(range(BEST_KEPT))  # the 25 lowest costs
    assert {t.number for t in seen} >= set(range(165, 200))    # and the most recent 35

    multi = optuna.create_study(directions=["minimize", "maximize"])
    values = rng.random((200, 2))
    for v in values:
        multi.add_trial(create_trial(values=list(v), params={"x": 0.5}, distributions=dist))
    seen = CappedStudy(multi, history=60).get_trials(deepcopy=False)
    # Independent check of the front: no other point is <= in cost and >= in the maximised value.
    front = [i for i, (a, b) in enumerate(values)
             if not any((values[:, 0] <= a) & (values[:, 1] >= b) & ((values[:, 0] < a) | (values[:, 1] > b)))]
    assert 0 < len(front) <= BEST_KEPT
    assert {t.number for t in seen} >= set(front)
    assert len(seen) <= 60


def test_swap_model_sees_the_capped_history():
    """The swap proposer fits the best and the most recent masks (its fit is O(n²) in them), like TPE."""
    import optuna
    from optuna.trial import create_trial

    from dimr.masks import Budget, mask_space, mask_to_params, random_mask
    from dimr.search.proposers import make_proposer
    from dimr.search.sampler import BudgetSampler
    from storage.optuna_compat import BEST_KEPT

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    budget = Budget(10, 3)
    rng = np.random.default_rng(0)
    study = optuna.create_study()
    masks = [random_mask(budget, rng) for _ in range(150)]
    costs = rng.permutation(150).astype(float)
    for m, c in zip(masks, costs, strict=True):
        study.add_trial(create_trial(value=c, params=mask_to_params(m), distributions=mask_space(10)))
    s = BudgetSampler(budget, make_proposer("swap"), startup=0, seed=0, history=50)
    seen = s._evaluated(study)
    assert len(seen) <= 50  # best ∪ most recent (they may overlap)
    assert {c for _, c in seen} >= set(range(BEST_KEPT))  # the best masks, whose swaps are proposed
    assert seen[-1] == (masks[-1], costs[-1])  # and the latest
    assert all(masks[int(np.flatnonzero(costs == c)[0])] == m for m, c in seen)


class CountingSearch(Search):
    """The real driver, counting the SQL statements and commits of each ask and each tell (main thread)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.asks: list[list[str]] = []
        self.tells: list[list[str]] = []
        self._log: list[str] | None = None
        main = threading.get_ident()

        def note(what: str) -> None:
            if self._log is not None and threading.get_ident() == main:
                self._log.append(what)

        engine = self.store.storage.engine
        event.listen(engine, "before_cursor_execute", lambda conn, cursor, statement, *a: note(statement))
        event.listen(engine, "commit", lambda conn: note("COMMIT"))

    def _counted(self, into: list[list[str]], step, *args):
        self._log = []
        try:
            return step(*args)
        finally:
            into.append(self._log)
            self._log = None

    def _ask(self, want: int = 1) -> int:
        return self._counted(self.asks, super()._ask, want)

    def _tell(self, ticket, outcome) -> None:
        self._counted(self.tells, super()._tell, ticket, outcome)


def test_each_ask_and_each_tell_is_one_transaction(storage_url, setup):
    """An ask is one commit (trial, params, attributes, heartbeat and claim together) and a handful of
    statements; a tell is one commit of at most four statements. (Optuna's ask + separate writes and claim
    took ~21 statements and 4-5 commits per ask.)"""
    settings, spec = setup
    search = CountingSearch(open_storage(storage_url), "s", settings, SearchOptions(14, 4, "tpe", 0),
                            CountingEvaluator(spec))
    assert search.run().complete == 14
    assert len(search.asks) >= 14 and len(search.tells) == 14
    for log in search.asks:
        assert log.count("COMMIT") == 1, log
        # the ledger's is_taken lookups depend on how often the sampler hits a held mask; the rest is fixed
        rest = [s for s in log if s != "COMMIT" and not s.startswith("SELECT dimr_masks.state \nFROM dimr_masks")]
        assert len(rest) <= 9, rest
    for log in search.tells:
        assert log.count("COMMIT") == 1 and len(log) <= 5, log


def test_the_driver_view_is_what_optuna_reads_without_reading_back(storage_url, setup, monkeypatch):
    """The driver caches the trials it writes as it writes them: it never reads one back, and its view of the
    study equals a fresh read by plain Optuna, field by field."""
    import storage.optuna_compat as cache

    read: list[int] = []
    reader = cache._read_trials
    monkeypatch.setattr(cache, "_read_trials", lambda c, ids: read.extend(ids) or reader(c, ids))
    settings, spec = setup
    search = Search(open_storage(storage_url), "s", settings, SearchOptions(10, 3, "tpe", 0), CountingEvaluator(spec))
    assert search.run().complete == 10
    assert read == []
    fresh = optuna.load_study(study_name="s", storage=open_storage(storage_url)).trials
    assert search.study.get_trials() == fresh
    assert read == []
    assert any(t.system_attrs for t in fresh if t.user_attrs["phase"] == "bayes")  # TPE's relative params, too


def test_run_search_is_the_python_api_and_resumes(tmp_path):
    """`run_search` from Python: a study, then a resume that pays only for the new trials; a request the mask
    space cannot hold is refused before any database exists."""
    from dimr.search import run_search

    url = f"sqlite:///{tmp_path}/api.db"
    kw = dict(storage=url, num_sequences=2, seq_len=16, sampler="random")
    first = run_search("tiny-random", 2, trials=6, **kw)
    assert (first.study, first.complete, first.evaluated) == ("tiny-random-skip2-kl", 6, 6)
    again = run_search("tiny-random", 2, trials=8, **kw)
    assert (again.complete, again.evaluated) == (8, 2)
    assert again.best_cost <= first.best_cost
    with pytest.raises(DimrError, match="only 8 masks"):
        run_search("tiny-random", 1, trials=9, **{**kw, "storage": f"sqlite:///{tmp_path}/never.db"})
    assert not (tmp_path / "never.db").exists()


def test_search_refuses_more_trials_than_masks_before_writing(tmp_path, setup):
    """`Search` from Python checks the mask space as `run_search` does (else it would prune forever)."""
    settings, spec = setup
    url = f"sqlite:///{tmp_path}/full.db"
    with pytest.raises(DimrError, match="only 56 masks"):
        Search(open_storage(url), "s", settings, SearchOptions(57, 0, "random", 0), CountingEvaluator(spec))
    assert optuna.get_all_study_summaries(open_storage(url)) == []
