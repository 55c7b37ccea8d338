"""Reading studies back: list them, summarise one, pick the trial to export."""

from __future__ import annotations

import statistics

import optuna
from optuna.trial import FrozenTrial, TrialState

from dimr.errors import DimrError
from dimr.masks import mask_from_key
from dimr.search import SEEDS_ATTR, SETTINGS_ATTR, pareto


def list_studies(storage: optuna.storages.BaseStorage) -> list[dict]:
    """One row per study. A Pareto study has no single best trial: its row gives the front's size and its
    lowest cost instead (``front_size`` is None for a single-objective study)."""
    out = []
    for s in optuna.get_all_study_summaries(storage, include_best_trial=True):
        settings = s.user_attrs.get(SETTINGS_ATTR, {})
        best, front_size = s.best_trial, None
        if len(s.directions) > 1:
            front = pareto.front(optuna.load_study(study_name=s.study_name, storage=storage))
            front_size = len(front)
            best = min(front, key=lambda t: (pareto.cost_of(t), t.number)) if front else None
        out.append({
            "study": s.study_name, "pair": settings.get("pair"), "cost": settings.get("cost"),
            "objective": settings.get("objective", "cost"), "skip": settings.get("skip"),
            "granularity": settings.get("granularity", "layer"), "max_cost": settings.get("max_cost"),
            "num_layers": settings.get("num_layers"), "trials": s.n_trials,
            "best_cost": pareto.cost_of(best) if best else None,
            "best_mask": best.user_attrs.get("mask") if best and front_size is None else None,
            "front_size": front_size,
            "started": s.datetime_start.isoformat(timespec="seconds") if s.datetime_start else None,
        })
    return out


def delete_study(storage: optuna.storages.RDBStorage, name: str) -> int:
    """Delete study ``name`` and its mask-ledger rows in one go; returns how many trials it had."""
    from storage.ledger import delete_rows

    try:
        study_id = storage.get_study_id_from_name(name)
    except KeyError:
        load_study(storage, name)  # raises the one-line "no study" error, with the known names
        raise
    n = storage.get_n_trials(study_id)
    delete_rows(storage.engine, study_id)
    optuna.delete_study(study_name=name, storage=storage)
    return n


def load_study(storage: optuna.storages.BaseStorage, name: str) -> optuna.Study:
    try:
        return optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        known = ", ".join(s.study_name for s in optuna.get_all_study_summaries(storage, False)) or "none"
        raise DimrError(f"no study {name!r} in this storage (studies: {known}); check --study/--storage") from None


def _row(t: FrozenTrial) -> dict:
    return {"trial": t.number, "mask": t.user_attrs.get("mask"), "cost": pareto.cost_of(t),
            "top1_agreement": t.user_attrs.get("top1_agreement"),
            "expected_acceptance": t.user_attrs.get("expected_acceptance"),
            "phase": t.user_attrs.get("phase"), "seconds": t.user_attrs.get("seconds")}


def summarize(study: optuna.Study, top: int = 5) -> dict:
    trials = study.get_trials(deepcopy=False)
    complete = sorted((t for t in trials if t.state == TrialState.COMPLETE), key=pareto.cost_of)
    counts = {s.name.lower(): 0 for s in TrialState}
    phases: dict[str, int] = {}
    for t in trials:
        counts[t.state.name.lower()] += 1
        if t.state == TrialState.COMPLETE:
            phases[t.user_attrs.get("phase", "?")] = phases.get(t.user_attrs.get("phase", "?"), 0) + 1
    evals = [t.user_attrs["seconds"] for t in complete if "seconds" in t.user_attrs]
    starts = [t.datetime_start for t in trials if t.datetime_start]
    ends = [t.datetime_complete for t in trials if t.datetime_complete]
    return {
        "study": study.study_name,
        "settings": study.user_attrs.get(SETTINGS_ATTR, {}),
        "seeds": study.user_attrs.get(SEEDS_ATTR, 0),
        "counts": {k: v for k, v in counts.items() if v},
        "phases": phases,
        "best": [_row(t) for t in complete[:top]],
        "timings": {
            "evaluations": len(evals),
            "mean_eval_s": statistics.fmean(evals) if evals else None,
            "total_eval_s": sum(evals),
            "wall_s": (max(ends) - min(starts)).total_seconds() if starts and ends else None,
        },
    }


def front_rows(study: optuna.Study) -> list[dict]:
    """The Pareto front of cost vs kept layers (`dimr.pareto.front`), fewest kept layers first."""
    return [{**_row(t), "skipped": mask_from_key(t.user_attrs["mask"]).count(False),
             "kept_fraction": pareto.kept_fraction(mask_from_key(t.user_attrs["mask"]))} for t in pareto.front(study)]


def pick_for_budget(study: optuna.Study, budget: str) -> FrozenTrial:
    """The lowest-cost front point that skips at least ``budget`` layers; DimrError if there is none."""
    settings = study.user_attrs.get(SETTINGS_ATTR)
    if not settings:
        raise DimrError(f"study {study.study_name!r} was not made by dimr; nothing to export")
    return pareto.pick(study, budget, settings["num_layers"])


def pick_trial(study: optuna.Study, trial: int | None = None) -> FrozenTrial:
    """The best complete trial (lowest cost), or trial number ``trial`` (which must be complete)."""
    if trial is None:
        complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if len(study.directions) > 1 and complete:  # a Pareto study: the lowest cost (the most layers kept)
            return min(complete, key=lambda t: (pareto.cost_of(t), t.number))
        try:
            return study.best_trial
        except (ValueError, RuntimeError):
            raise DimrError(f"study {study.study_name!r} has no completed trial yet; run `dimr search` first") from None
    trials = {t.number: t for t in study.get_trials(deepcopy=False)}
    if trial not in trials:
        raise DimrError(f"study {study.study_name!r} has no trial {trial}; see `dimr show {study.study_name}`")
    if trials[trial].state != TrialState.COMPLETE:
        raise DimrError(f"trial {trial} of {study.study_name!r} is {trials[trial].state.name}, not COMPLETE; "
                        "export a completed trial")
    return trials[trial]


def export_slim_config(study: optuna.Study, output, trial: int | None = None):
    """Write the slim config of the best trial (or trial ``trial``) to ``output``; returns it."""
    from pathlib import Path

    output = Path(output)
    if not output.parent.resolve().is_dir():
        raise DimrError(f"cannot write {output}: directory {output.parent} does not exist; create it")
    cfg = slim_config_for(study, trial)
    cfg.save(output)
    return cfg


def slim_config_for(study: optuna.Study, trial: int | None = None):
    """The `SlimConfig` of the best trial (or trial ``trial``), written nowhere."""
    from dimr.slim_config import SlimConfig, mask_fields

    t = pick_trial(study, trial)
    settings = study.user_attrs.get(SETTINGS_ATTR)
    if not settings:
        raise DimrError(f"study {study.study_name!r} was not made by dimr; nothing to export")
    metrics = {"cost": pareto.cost_of(t), **{k: t.user_attrs[k] for k in ("top1_agreement", "expected_acceptance")
                                   if k in t.user_attrs}}
    key = t.user_attrs["mask"]
    if settings.get("granularity", "layer") == "sublayer":  # the mask's share of a full forward, as budgeted
        from dimr.search import StudySettings

        budget = StudySettings(**settings).budget
        metrics["cost_fraction"] = budget.cost(budget.from_key(key))
        fields = mask_fields(key)
    else:
        fields = mask_fields(mask_from_key(key))
    from dimr.pairs import list_pairs

    revision = settings["revision"] if "revision" in settings else getattr(
        list_pairs().get(settings["pair"]), "revision", None)  # studies made before settings held it
    cfg = SlimConfig(pair=settings["pair"], verifier=settings["verifier"], fingerprint=settings["fingerprint"],
                     num_layers=settings["num_layers"], **fields, cost=settings["cost"], metrics=metrics,
                     calibration=settings["calibration"],
                     calibration_hash=settings["calibration_hash"], revision=revision,
                     commit=settings.get("commit"), weights=settings.get("weights"),
                     study=study.study_name, trial=t.number)
    return cfg
