"""Opening a study for a search: the creation race between drivers, the settings, the heuristic seeds.

Seeds are computed first, then the study, its settings and its seeds are written in one transaction
(`storage.trials.create_study`): a driver killed at any point of the set-up leaves either no study or all of
it, so a rerun never waits for a set-up nobody will finish. Of several concurrent drivers exactly one
creates the study; the others read its settings and check them.
"""

from __future__ import annotations

import warnings

import optuna

from dimr.masks import Budget, CostBudget
from dimr.search import heuristics, pareto
from dimr.search.proposers import make_proposer
from dimr.search.recovery import owner_id
from dimr.search.sampler import BudgetSampler
from dimr.search.settings import SEEDS_ATTR, SETTINGS_ATTR, SearchOptions, StudySettings, check_resume, stored_settings
from storage import crash
from storage.store import TrialStore
from storage.trials import create_study
from workers.base import Evaluator

optuna.logging.set_verbosity(optuna.logging.WARNING)
# dimr drives heartbeats itself (ask/tell, not Study.optimize) and relies on fail_stale_trials on purpose.
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")


def open_study(storage: optuna.storages.RDBStorage, study_name: str, settings: StudySettings,
               options: SearchOptions, evaluator: Evaluator) -> tuple[optuna.Study, TrialStore, BudgetSampler]:
    """Create (with settings and seeds) or resume the study; refuse conflicting settings before writing."""
    stored = stored_settings(storage, study_name)
    check_resume(stored, settings, study_name)
    budget = settings.budget
    sampler = BudgetSampler(budget, make_proposer(options.sampler, options.seed, options.startup_trials),
                            startup=options.startup_trials, seed=options.seed,
                            skips=settings.skips if settings.objective == "pareto" else ())
    directions = pareto.directions(settings.objective)
    created = None
    if stored is None:
        from dataclasses import asdict

        influence = evaluator.block_influence()
        if isinstance(budget, CostBudget):
            seeds = heuristics.sublayer_seed_masks(budget, influence, evaluator.sublayer_influence())
        else:
            seeds = list({m: (n, m) for k in settings.skips
                          for n, m in heuristics.seed_masks(Budget(settings.num_layers, k), influence)}.values())
        crash.point("setup:before-create")
        # Each setting is also its own attribute, for optuna-dashboard; SETTINGS_ATTR is what dimr reads back.
        attrs = {**asdict(settings), SETTINGS_ATTR: asdict(settings), SEEDS_ATTR: len(seeds)}
        created = create_study(storage, study_name, directions, attrs,
                               [(budget.to_params(m), {"phase": "seed", "heuristic": n}) for n, m in seeds])
        if created is None:  # another driver created it first
            check_resume(stored_settings(storage, study_name), settings, study_name)
    store = TrialStore(storage, budget.space(), owner_id())
    study = optuna.load_study(storage=store.view, study_name=study_name, sampler=sampler)
    store.attach(study, new=created is not None)
    for trial in created[1] if created else ():  # the seeds as written: the driver never reads them back
        store.view.remember(store.study_id, trial)
    if created:  # for optuna-dashboard (cosmetic: a crash before it only leaves the objectives unnamed)
        study.set_metric_names(pareto.metric_names(settings.objective))
    sampler.first_search_trial = study.user_attrs.get(SEEDS_ATTR, 0)
    return study, store, sampler
