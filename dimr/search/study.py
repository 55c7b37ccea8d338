"""Opening a study for a search: the creation race between drivers, the settings, the heuristic seeds.

Seeds are computed first, then the study is created atomically: exactly one of several concurrent drivers
creates it and records settings and seeds; the others wait for them (`stored_settings`) and check them.
"""

from __future__ import annotations

import warnings

import optuna

from dimr.masks import Budget, mask_space, mask_to_params
from dimr.search import heuristics, pareto
from dimr.search.proposers import make_proposer
from dimr.search.recovery import owner_id
from dimr.search.sampler import BudgetSampler
from dimr.search.settings import SEEDS_ATTR, SETTINGS_ATTR, SearchOptions, StudySettings, check_resume, stored_settings
from storage.store import TrialStore
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
    sampler = BudgetSampler(settings.budget, make_proposer(options.sampler, options.seed, options.startup_trials),
                            startup=options.startup_trials, seed=options.seed,
                            skips=settings.skips if settings.objective == "pareto" else ())
    directions = pareto.directions(settings.objective)
    created = False
    if stored is None:
        influence = evaluator.block_influence()
        seeds = list({m: (n, m) for k in settings.skips
                      for n, m in heuristics.seed_masks(Budget(settings.num_layers, k), influence)}.values())
        try:
            storage.create_new_study(directions, study_name)
            created = True
        except optuna.exceptions.DuplicatedStudyError:
            check_resume(stored_settings(storage, study_name), settings, study_name)
    store = TrialStore(storage, mask_space(settings.num_layers), owner_id())
    study = optuna.create_study(storage=store.view, study_name=study_name, sampler=sampler, directions=directions,
                                load_if_exists=True)
    store.attach(study)
    if created:
        from dataclasses import asdict

        study.set_user_attr(SETTINGS_ATTR, asdict(settings))
        for name, mask in seeds:
            study.enqueue_trial(mask_to_params(mask), user_attrs={"phase": "seed", "heuristic": name})
        study.set_user_attr(SEEDS_ATTR, len(seeds))
    sampler.first_search_trial = study.user_attrs.get(SEEDS_ATTR, 0)
    return study, store, sampler
