"""What defines a study (`StudySettings`), how to search it (`SearchOptions`), and the checks made before
anything is written: the mask space, the study name, resuming with the stored settings."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import optuna

from dimr.errors import DimrError
from dimr.masks import Budget, CostBudget

SETTINGS_ATTR = "dimr_settings"
SEEDS_ATTR = "dimr_seeds"
PROFILE_ATTR = "dimr_profile"  # the single-skip profile: the cost of skipping bit i (a layer, or a sublayer) alone
OBJECTIVES = ("cost", "pareto")
INFO_KEYS = frozenset({"commit"})  # settings recorded but not compared on resume
# Settings added with sublayer studies: a study stored without them is a whole-layer study, and compares so.
LAYER_DEFAULTS = {"granularity": "layer", "max_cost": None, "cost_model": None, "cost_weights": None,
                  "cost_fixed": None}


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
    objective: str = "cost"  # or "pareto": cost vs kept fraction, skipping 1..skip layers (`dimr.search.pareto`)
    # Added later: a study stored without them resumes (only stored keys are compared).
    revision: str | None = None  # the pair's revision as asked (a branch, tag or commit)
    commit: str | None = None  # the verifier's resolved commit (informational: `weights` is what is compared)
    weights: str | None = None  # `dimr.hub.checkpoint_digest` of the verifier's files
    # Sublayer studies (`granularity = "sublayer"`, skip 0): the budget is a cost fraction of the full verifier,
    # each attention's and MLP's weight in it (`cost_weights`, in `dimr.masks.sublayer_space` order, plus the
    # mask-independent `cost_fixed`), and where the weights came from (`cost_model`: measured or FLOPs).
    granularity: str = "layer"
    max_cost: float | None = None
    cost_model: str | None = None
    cost_weights: list[float] | None = None
    cost_fixed: float | None = None

    @classmethod
    def for_pair(cls, pair, budget: Budget | CostBudget, calibration, cost: str = "kl", objective: str = "cost",
                 fingerprint: str | None = None, commit: str | None = None,
                 weights: str | None = None) -> StudySettings:
        """The settings of a study of ``pair`` (a `dimr.pairs.Pair`) on ``calibration`` (`dimr.calibration`).
        ``fingerprint``: the verifier's, if known (else computed from its config, no weights)."""
        from dimr.pairs import verifier_fingerprint

        if objective not in OBJECTIVES:
            raise DimrError(f"objective {objective!r} is unknown; use {' or '.join(OBJECTIVES)}")
        if isinstance(budget, CostBudget) and objective == "pareto":
            raise DimrError("--objective pareto searches whole-layer masks only; drop it, or drop "
                            "--granularity sublayer")
        sub = dict(granularity="sublayer", max_cost=budget.max_cost, cost_model=budget.source,
                   cost_weights=list(budget.weights), cost_fixed=budget.fixed) if isinstance(budget, CostBudget) else {}
        return cls(pair=pair.name, verifier=pair.verifier, fingerprint=fingerprint or verifier_fingerprint(pair),
                   num_layers=budget.num_layers, skip=getattr(budget, "skip", 0), cost=cost,
                   calibration=calibration.spec, calibration_hash=calibration.hash,
                   num_sequences=calibration.num_sequences, seq_len=calibration.seq_len, objective=objective,
                   revision=pair.revision, commit=commit, weights=weights, **sub)

    @property
    def budget(self) -> Budget | CostBudget:
        if self.granularity == "sublayer":
            return CostBudget(self.num_layers, self.max_cost, tuple(self.cost_weights), self.cost_fixed,
                              self.cost_model or "")
        return Budget(self.num_layers, self.skip)

    @property
    def skips(self) -> tuple[int, ...]:
        """The skip counts a trial may have: exactly ``skip``, or 1..skip in a Pareto study."""
        return tuple(range(1, self.skip + 1)) if self.objective == "pareto" else (self.skip,)

    def default_study_name(self) -> str:
        if self.granularity == "sublayer":
            return f"{self.pair}-sublayer{self.max_cost:g}-{self.cost}"
        return f"{self.pair}-skip{self.skip}-{self.cost}" + ("-pareto" if self.objective == "pareto" else "")

@dataclass(frozen=True)
class SearchOptions:
    """How to search; these may change between runs of one study."""

    trials: int = 50
    startup_trials: int = 0  # the swap proposer needs no random phase (docs/search.md); tpe/gp want ~10
    sampler: str = "swap"
    seed: int | None = 0
    profile: bool = True  # score each single-layer (or sublayer) skip once per study: a seed and the model's baseline


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
    profiled: int = 0  # single-skip evaluations of the profile this run paid for (not trials)


def check_mask_space(budget: Budget | CostBudget, objective: str, trials: int) -> None:
    """Refuse a target of more trials than the mask space holds (exactly ``budget.skip`` skipped layers, or 1 to
    ``budget.skip`` in a Pareto study; the masks within a cost budget)."""
    if isinstance(budget, CostBudget):
        n = budget.count(cap=trials)
        if n < trials:
            raise DimrError(f"only {n} sublayer masks fit {budget.describe()}; ask for at most that many "
                            "--trials, or raise --max-cost")
        return
    skips = range(1, budget.skip + 1) if objective == "pareto" else (budget.skip,)
    n = sum(math.comb(budget.num_layers, k) for k in skips)
    if n < trials:
        what = f"skipping 1 to {budget.skip} layers" if objective == "pareto" else budget.describe()
        raise DimrError(f"only {n} masks {what}; ask for at most that many --trials")


def stored_settings(storage: optuna.storages.BaseStorage, study_name: str) -> dict | None:
    """The settings of an existing study ({} if dimr did not make it), or None if there is no such study.
    Writes nothing. A dimr study is created with its settings in one transaction, so there is nothing to wait for."""
    try:
        study_id = storage.get_study_id_from_name(study_name)
    except KeyError:
        return None
    return storage.get_study_user_attrs(study_id).get(SETTINGS_ATTR, {})


def check_resume(stored: dict | None, settings: StudySettings, study_name: str) -> None:
    """Refuse to resume a study with settings that conflict with the stored ones."""
    if stored is None:
        return
    new = asdict(settings)
    stored = {**LAYER_DEFAULTS, **stored} if stored else stored
    diff = [k for k in new if k in stored and stored[k] != new[k] and k not in INFO_KEYS]
    if not stored:
        raise DimrError(f"study {study_name!r} exists but was not made by dimr; pick another --study name")
    if "granularity" in diff:  # every budget setting differs too: name the one that explains them
        diff = ["granularity"]
    if diff:
        def short(v) -> str:
            return f"[{len(v)} values]" if isinstance(v, list) else repr(v)[:80]

        details = "; ".join(f"{k}: stored {short(stored[k])}, asked {short(new[k])}" for k in diff)
        raise DimrError(f"study {study_name!r} was made with other settings ({details}); "
                        "use the stored settings or a new --study name")
