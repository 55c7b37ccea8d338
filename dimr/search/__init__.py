"""The search for a slim verifier: heuristic seeds, then random, then Bayesian masks, persisted trial by trial.

    from dimr.search import run_search
    result = run_search("mini", budget=4, trials=40, storage="sqlite:///dimr.db")

Modules: `settings` (what defines a study, the checks made before writing), `study` (creation race, seeds),
`driver` (the loop), `recovery` (dead drivers, retries), `sampler` (phases and novelty around one
`proposers.MaskProposer`: swap, tpe, gp, random), `heuristics` (seed masks), `pareto` (cost vs kept layers).

Resuming is running the same search again: completed masks are never evaluated again, trials a dead
driver left RUNNING become FAIL (at once for a dead process on this host, after the heartbeat grace
period elsewhere) and their masks are retried.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import optuna

from dimr.errors import DimrError
from dimr.search.driver import BATCH_MAX, Driver, SearchInterrupted
from dimr.search.settings import (
    SEEDS_ATTR,
    SETTINGS_ATTR,
    SearchOptions,
    SearchResult,
    StudySettings,
    check_mask_space,
    check_resume,
    stored_settings,
)
from dimr.search.study import open_study
from workers.base import Evaluator

__all__ = ["BATCH_MAX", "SEEDS_ATTR", "SETTINGS_ATTR", "Search", "SearchInterrupted", "SearchOptions",
           "SearchResult", "StudySettings",
           "check_mask_space", "check_resume", "run_search", "stored_settings"]


class Search(Driver):
    """Open (create or resume) ``study_name`` on ``storage`` and drive it: ``Search(...).run()``."""

    def __init__(self, storage: optuna.storages.RDBStorage, study_name: str, settings: StudySettings,
                 options: SearchOptions, evaluator: Evaluator,
                 on_result: Callable[[int, int, float | None], None] | None = None):
        if evaluator.num_layers != settings.num_layers:
            raise ValueError("evaluator and settings disagree on the number of layers")
        check_mask_space(settings.budget, settings.objective, options.trials)  # else it would prune forever
        from storage.rdb import StorageLost, retrying

        try:
            study, store, sampler = retrying(open_study, storage, study_name, settings, options, evaluator)
        except StorageLost as e:
            raise DimrError(str(e)) from None
        super().__init__(study, store, sampler, settings, options, evaluator, on_result)


def run_search(pair: str, budget: str | float | int | None = None, *, granularity: str = "layer",
               max_cost: float | str | None = None, costs: Path | None = None, trials: int = 50, storage: str = "sqlite:///dimr.db",
               study: str | None = None, cost: str = "kl", objective: str = "cost", sampler: str = "swap",
               startup_trials: int = 0, seed: int | None = 0, profile: bool = True, calibration: str | None = None,
               num_sequences: int = 16, seq_len: int = 128, workers: int = 1, ray_address: str | None = None,
               device: str | None = None, batch_size: int = 4, pairs_file: Path | None = None,
               gpus_per_worker: int = 1, prefix_reuse: bool = True,
               on_result: Callable[[int, int, float | None], None] | None = None) -> SearchResult:
    """Search (or resume) a mask for ``pair``'s verifier; every trial is stored in ``storage``.

    Everything that can be wrong (pair, budget, mask space, calibration, storage URL, resumed settings) is
    checked before anything is written, and before any weight is downloaded or loaded: the memory a worker
    needs is estimated from the configs (`dimr.memory`). Hub models are downloaded once here, before the
    workers start (`dimr.hub.fetch`). ``budget``: layers to skip (4) or a fraction of the layers (0.25, the
    default). ``granularity="sublayer"`` searches attentions and MLPs apart under ``max_cost``, a fraction of the
    full verifier's cost, measured (``costs``: a `dimr bench-forward --sublayers` table) or by FLOPs
    (`dimr.search.budget`). ``study`` defaults to ``PAIR-skipK-COST`` (``PAIR-sublayerF-COST``). See
    `dimr search --help` for the rest."""
    from dimr.calibration import load_calibration
    from dimr.hub import checkpoint_digest, fetch
    from dimr.masks import parse_budget
    from dimr.pairs import (
        get_pair,
        load_tokenizer,
        num_verifier_layers,
        pick_device,
        verifier_config,
        verifier_fingerprint,
    )
    from dimr.search.budget import GRANULARITIES, cost_budget
    from dimr.slim import check_family
    from storage import StorageError, open_storage
    from workers import EvalSpec, make_evaluator
    from workers.local import worker_plan

    if granularity not in GRANULARITIES:
        raise DimrError(f"--granularity {granularity!r} is unknown; use {' or '.join(GRANULARITIES)}")
    if granularity == "sublayer" and budget is not None:
        raise DimrError("--budget counts whole layers; with --granularity sublayer give --max-cost (a fraction "
                        "of the full verifier's cost) instead")
    if granularity == "sublayer" and max_cost is None:
        raise DimrError("--granularity sublayer needs --max-cost, the slim's cost as a fraction of the full "
                        "verifier's (e.g. 0.8)")
    if granularity == "layer" and (max_cost is not None or costs is not None):
        raise DimrError("--max-cost and --costs budget sublayer searches; add --granularity sublayer, or give "
                        "--budget (layers to skip)")
    if study is not None and not study.strip():
        raise DimrError("--study is empty; give a study name, or leave it out for PAIR-skipK-COST")
    p = get_pair(pair, pairs_file)
    local = fetch(p, configs_only=True).pair
    check_family(verifier_config(local), f" (verifier of pair {p.name!r})")
    if device is not None:
        pick_device(device)
    if ray_address is not None:
        from workers.ray_pool import check_address

        check_address(ray_address)
    if granularity == "sublayer":
        b = cost_budget(p.name, verifier_config(local), max_cost, costs, seq_len)
    else:
        b = parse_budget(0.25 if budget is None else budget, num_verifier_layers(local))
    if objective == "pareto" and granularity == "sublayer":
        raise DimrError("--objective pareto searches whole-layer masks only; drop it, or drop "
                        "--granularity sublayer")
    check_mask_space(b, objective, trials)
    calib = load_calibration(calibration or p.calibration, load_tokenizer(local), num_sequences, seq_len)
    spec = EvalSpec(pair=local, input_ids=calib.input_ids, cost=cost, device=device, batch_size=batch_size,
                    prefix_reuse=prefix_reuse, gpus_per_worker=gpus_per_worker)
    if ray_address is None:  # this machine's devices; a cluster's workers check theirs before loading
        worker_plan(spec, pick_device(device))
    fetched = fetch(p)  # the weights, once, before any worker starts
    spec = dataclasses.replace(spec, pair=fetched.pair)
    settings = StudySettings.for_pair(p, b, calib, cost=cost, objective=objective,
                                      fingerprint=verifier_fingerprint(local), commit=fetched.verifier_commit,
                                      weights=checkpoint_digest(fetched.pair.verifier))
    try:
        st = open_storage(storage)
    except StorageError as e:
        raise DimrError(str(e)) from None
    name = study or settings.default_study_name()
    check_resume(stored_settings(st, name), settings, name)
    evaluator = make_evaluator(spec, workers=workers, ray_address=ray_address)
    try:
        return Search(st, name, settings, SearchOptions(trials, startup_trials, sampler, seed, profile), evaluator,
                      on_result=on_result).run()
    finally:
        evaluator.close()
