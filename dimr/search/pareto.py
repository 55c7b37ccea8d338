"""Pareto studies: cost against kept compute in one multi-objective study, and picking a budget from its front.

A Pareto study (``objective = "pareto"``) has two objectives, both minimised: the cost, and the fraction of
the verifier's layers the mask keeps. Its budget bounds the skipped count: ``--budget 4`` searches masks
that skip 1 to 4 layers, so the front spans every budget up to it and `pick` can choose one at export time
without searching again.
"""

from __future__ import annotations

import optuna
from optuna.trial import FrozenTrial, TrialState

from dimr.errors import DimrError
from dimr.masks import mask_from_key, parse_budget

OBJECTIVES = ("cost", "pareto")


def directions(objective: str) -> list[optuna.study.StudyDirection]:
    if objective not in OBJECTIVES:
        raise ValueError(f"unknown objective {objective!r}")
    return [optuna.study.StudyDirection.MINIMIZE] * (2 if objective == "pareto" else 1)


def metric_names(objective: str) -> list[str]:
    """The objectives' names, as the study records them (`optuna.Study.set_metric_names`)."""
    return ["cost", "kept_fraction"] if objective == "pareto" else ["cost"]


def kept_fraction(mask) -> float:
    return sum(bool(b) for b in mask) / len(mask)


def objective_values(objective: str, cost: float, mask) -> float | list[float]:
    """What the study is told: the cost, or [cost, kept fraction]."""
    return [cost, kept_fraction(mask)] if objective == "pareto" else cost


def cost_of(t: FrozenTrial) -> float:
    """The cost of a complete trial, in a single- or multi-objective study."""
    return t.values[0]


def _point(t: FrozenTrial) -> tuple[float, float]:
    return cost_of(t), kept_fraction(mask_from_key(t.user_attrs["mask"]))


def front(study: optuna.Study) -> list[FrozenTrial]:
    """The complete trials no other complete trial dominates on (cost, kept fraction), by kept fraction."""
    trials = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if "mask" in t.user_attrs]
    points = {t.number: _point(t) for t in trials}

    def dominated(p: tuple[float, float]) -> bool:
        return any(q[0] <= p[0] and q[1] <= p[1] and q != p for q in points.values())

    out = [t for t in trials if not dominated(points[t.number])]
    return sorted(out, key=lambda t: (points[t.number][1], points[t.number][0], t.number))


def pick(study: optuna.Study, budget: str, num_layers: int) -> FrozenTrial:
    """The lowest-cost point of the front whose mask skips at least what ``budget`` asks (keeps no more)."""
    b = parse_budget(budget, num_layers)
    fitting = [t for t in front(study) if mask_from_key(t.user_attrs["mask"]).count(False) >= b.skip]
    if not fitting:
        most = max((mask_from_key(t.user_attrs["mask"]).count(False) for t in front(study)), default=0)
        raise DimrError(f"no mask of study {study.study_name!r} fits budget {budget!r} ({b.describe()}); "
                        f"its front skips at most {most} layers: search with a larger --budget")
    return min(fitting, key=lambda t: (cost_of(t), t.number))


def knee(study: optuna.Study) -> FrozenTrial:
    """The front's knee: the point nearest the ideal (lowest cost, fewest layers) once both axes are scaled to
    the front's range (the cost on a log scale when all costs are positive: they span decades)."""
    import math

    points = front(study)
    if not points:
        raise DimrError(f"study {study.study_name!r} has no completed trial yet; run `dimr search` first")
    costs = [cost_of(t) for t in points]
    if all(c > 0 and math.isfinite(c) for c in costs):
        costs = [math.log(c) for c in costs]
    kept = [kept_fraction(mask_from_key(t.user_attrs["mask"])) for t in points]

    def scaled(v: float, vs: list[float]) -> float:
        finite = [x for x in vs if math.isfinite(x)]
        if not math.isfinite(v):
            return 1.0
        lo, hi = min(finite), max(finite)
        return 0.0 if hi == lo else (v - lo) / (hi - lo)

    dist = [math.hypot(scaled(c, costs), scaled(k, kept)) for c, k in zip(costs, kept, strict=True)]
    return points[min(range(len(points)), key=lambda i: (dist[i], points[i].number))]
