"""The single-skip profile: the driver scores each single-layer skip once per study and seeds the k cheapest."""

from __future__ import annotations

import numpy as np
import optuna
import pytest
from optuna.trial import TrialState
from test_search import CountingEvaluator  # the real in-process evaluator, recording what it scores

from dimr.calibration import load_calibration
from dimr.masks import Budget, CostBudget, mask_key
from dimr.pairs import get_pair, load_tokenizer
from dimr.search import Search, SearchOptions, StudySettings, heuristics
from dimr.search.settings import PROFILE_ATTR
from storage import open_storage
from workers import EvalSpec
from workers.local import MaskScorer

L, SKIP = 8, 3


@pytest.fixture(scope="module")
def setup():
    pair = get_pair("tiny-random")
    calib = load_calibration(pair.calibration, load_tokenizer(pair), num_sequences=4, seq_len=32)
    spec = EvalSpec(pair=pair, input_ids=calib.input_ids, cost="kl")
    return pair, calib, spec


def search(url, setup, trials, profile=True, objective="cost", skip=SKIP):
    pair, calib, spec = setup
    settings = StudySettings.for_pair(pair, Budget(L, skip), calib, objective=objective)
    ev = CountingEvaluator(spec)
    result = Search(open_storage(url), "s", settings, SearchOptions(trials, 0, "swap", 0, profile), ev).run()
    study = optuna.load_study(study_name="s", storage=open_storage(url))
    return result, ev, study


def test_single_skip_rank_skips_the_k_cheapest_single_skips():
    profile = [0.5, 0.1, 0.9, 0.1, 0.3, 2.0]
    assert heuristics.single_skip_rank(Budget(6, 3), profile) == (True, False, True, False, False, True)
    assert heuristics.single_skip_rank(Budget(6, 1), profile) == (True, False, True, True, True, True)  # tie: lower
    assert heuristics.single_skip_masks(3) == [(False, True, True), (True, False, True), (True, True, False)]


def test_under_a_cost_budget_the_seed_skips_the_cheapest_per_cost_saved_until_it_fits():
    budget = CostBudget(2, 0.6, (0.2, 0.3, 0.1, 0.3), 0.1)  # attn0, mlp0, attn1, mlp1; full = 1.0
    profile = [0.4, 0.3, 0.05, 0.9]  # per cost saved: 2.0, 1.0, 0.5, 3.0
    # skip attn1 (cost 0.9), then mlp0 (0.6): fits; attn0 and mlp1 run
    assert heuristics.profile_seed(budget, profile) == (True, False, False, True)
    assert heuristics.profile_seed(Budget(4, 2), profile) == heuristics.single_skip_rank(Budget(4, 2), profile)


def test_profile_is_the_single_skip_costs_and_seeds_their_k_cheapest(tmp_path, setup):
    url = f"sqlite:///{tmp_path}/p.db"
    result, ev, study = search(url, setup, trials=10)
    profile = study.user_attrs[PROFILE_ATTR]
    singles = heuristics.single_skip_masks(L)
    # Independently: the scorer's cost of each single skip.
    scorer = MaskScorer(setup[2])
    expected = [scorer.score(m).cost for m in singles]
    np.testing.assert_allclose(profile, expected, rtol=1e-6)
    assert result.profiled == L and all(ev.scored.count(m) == 1 for m in singles)
    trials = [t for t in study.get_trials() if t.state == TrialState.COMPLETE]
    assert len(trials) == 10 == result.complete == result.evaluated
    assert all(t.user_attrs["mask"].count("0") == SKIP for t in trials), "a profile mask became a trial"
    (seeded,) = [t for t in trials if t.user_attrs.get("heuristic") == "single-skip-rank"]
    cheapest = set(np.argsort(expected, kind="stable")[:SKIP].tolist())
    assert seeded.user_attrs["mask"] == mask_key(tuple(i not in cheapest for i in range(L)))
    assert seeded.user_attrs["phase"] == "seed"
    # The profile runs after the heuristic seeds, and its seed right after it.
    first = study.user_attrs["dimr_seeds"]
    assert all(m.count(False) == SKIP for m in ev.scored[:first])
    assert sorted(ev.scored[first:first + L]) == sorted(singles)
    assert mask_key(ev.scored[first + L]) == seeded.user_attrs["mask"]


def test_a_resumed_study_keeps_its_profile(tmp_path, setup):
    url = f"sqlite:///{tmp_path}/r.db"
    search(url, setup, trials=8)
    pair, calib, spec = setup
    resumed = Search(open_storage(url), "s", StudySettings.for_pair(pair, Budget(L, SKIP), calib),
                     SearchOptions(14, 0, "swap", 0), ev := CountingEvaluator(spec))
    stored = optuna.load_study(study_name="s", storage=open_storage(url)).user_attrs[PROFILE_ATTR]
    assert resumed.sampler.profile == stored  # the swap model's baseline, from the study
    result = resumed.run()
    study = optuna.load_study(study_name="s", storage=open_storage(url))
    assert result.profiled == 0 and result.evaluated == 6 == len(ev.scored)
    assert not any(m.count(False) == 1 for m in ev.scored)
    assert sum(t.user_attrs.get("heuristic") == "single-skip-rank" for t in study.get_trials()) == 1


def test_no_profile(tmp_path, setup):
    result, ev, study = search(f"sqlite:///{tmp_path}/n.db", setup, trials=8, profile=False)
    assert result.profiled == 0 and PROFILE_ATTR not in study.user_attrs
    assert all(m.count(False) == SKIP for m in ev.scored)
    assert not any(t.user_attrs.get("heuristic") == "single-skip-rank" for t in study.get_trials())


def test_a_pareto_study_seeds_every_skip_count_from_one_profile(tmp_path, setup):
    result, ev, study = search(f"sqlite:///{tmp_path}/f.db", setup, trials=16, objective="pareto")
    profile = study.user_attrs[PROFILE_ATTR]
    seeded = sorted(t.user_attrs["mask"] for t in study.get_trials()
                    if t.user_attrs.get("heuristic") == "single-skip-rank")
    expected = sorted(mask_key(heuristics.single_skip_rank(Budget(L, k), profile)) for k in (2, 3))
    assert result.profiled == L and seeded == expected
