"""Search quality: how fast each mask-search strategy approaches the exhaustive optimum.

    python benchmarks/search_quality.py --pair mini --skips 3,4,6 --seeds 0,1,2,3,4

1. **The cost table.** The verifier and a fixed calibration block (the pair's default, ``--num-sequences`` ×
   ``--seq-len`` tokens) are loaded once. For every budget small enough to enumerate (C(L, k) ≤
   ``--enumerate-limit``) every budget mask is scored once; the table (every mask's cost, plus the off-budget
   masks the heuristics ask for) is cached in ``--cache`` under a key made of the verifier's fingerprint, a hash
   of its weights, the calibration hash and the cost, so the heavy part runs once per model and calibration.
2. **Replay.** Every strategy runs against the table: evaluating a mask is a look-up. For a deterministic cost
   this is exactly what a real evaluation would return, so the trajectories are the real ones. Wall-clock is
   reported as the strategy's own measured overhead + evaluations × the measured mean evaluation time.
3. **Report.** Best cost after 10/20/50/100/200 evaluations (median over seeds), evaluations to come within 1%
   and 5% of the optimum (median and worst), wall-clock; a JSON file and a convergence plot.

Budgets too large to enumerate are compared with a *reference*: the best mask any strategy found with
``--reference-multiplier`` (10) times the evaluations, or in any of the runs, then improved by a local search
(every swap of one skipped and one kept layer around the best mask, repeated until no swap improves it). All of
it is scored for real, lazily, and cached in the one table every strategy reads, so each mask costs one
evaluation. ``--reference-multiplier 0`` skips the long runs (the runs + the local search only). The GP-based
strategies (``gp``, ``self-sd``) are left out of the long runs: an ask of Optuna's GPSampler grows past several
seconds at that many trials on one CPU thread.

``--rank-check N`` scores N random budget masks on the benchmark's calibration and on a larger one
(``--rank-num-sequences`` × ``--rank-seq-len``) and reports Spearman's ρ between the two rankings: whether the
small calibration that makes the reference affordable ranks masks as a larger one would.

Outputs (the table cache, the JSON and the plot) go to ``$DIMR_HOME/bench/search_quality/`` unless
``--cache``/``--out``/``--plot`` say otherwise.

Strategies (an *evaluation* is one distinct mask scored; a strategy that proposes a mask again gets the
remembered cost for free):

- ``dimr``: the real `dimr.search.Search` driver with its default options, on a temporary SQLite study (its
  single-skip profile's L evaluations count, as everything the driver scores);
- ``random``: uniform masks under the budget, without repetition;
- ``tpe``: dimr's budget sampler around Optuna's TPE (multivariate, constant liar), no heuristic seeds;
- ``gp``: dimr's budget sampler around Optuna's GPSampler, no heuristic seeds;
- ``self-sd``: Draft & Verify (Zhang et al., ACL 2024) as described: GP-BO over a continuous relaxation
  x ∈ [0, 1]^L, layer i skipped iff x_i > 0.5; a thresholded mask with the wrong count is moved onto the
  budget with the fewest flips (the paper has no exact-k budget; it scored speed);
- ``swift``: SWIFT (Xia et al., ICLR 2025) as described: random candidates, and every 25th step a BO
  suggestion (GP over the same relaxation) projected onto the budget by skipping the top-k x_i (its stop
  after 300 steps without improvement never triggers within 200 evaluations);
- heuristics, deterministic (one run, repeated for every seed): ``skip-last``; ``shortgpt`` (block
  influence; the hidden states come with the reference forward, no evaluation); ``single-rank`` (score the L
  single-layer skips, skip the k cheapest: L + 1 evaluations); ``greedy`` (forward selection: add to the
  skipped set the layer with the smallest marginal cost, k times: L + (L−1) + … evaluations).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from itertools import combinations
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import optuna  # noqa: E402
import torch  # noqa: E402

from dimr.masks import (  # noqa: E402
    Budget,
    Mask,
    mask_from_key,
    mask_key,
    mask_to_params,
    params_to_mask,
    project,
    random_mask,
)
from dimr.paths import dimr_home  # noqa: E402
from dimr.search import heuristics  # noqa: E402
from dimr.search.proposers import make_proposer  # noqa: E402
from dimr.search.sampler import BudgetSampler  # noqa: E402
from dimr.search.settings import SearchOptions  # noqa: E402

CHECKPOINTS = (10, 20, 50, 100, 200)
STRATEGIES = ("dimr", "random", "tpe", "gp", "self-sd", "swift", "skip-last", "shortgpt", "single-rank", "greedy")
SLOW = {"gp", "self-sd"}  # an ask of Optuna's GPSampler takes about a second at 100+ trials on one CPU thread
DETERMINISTIC = {"skip-last", "shortgpt", "single-rank", "greedy"}
SWIFT_BO_EVERY = 25
RUN_FIELDS = ("curve", "overhead_s", "limit")  # what the result file keeps of each run
optuna.logging.set_verbosity(optuna.logging.WARNING)


# --- the cost table ------------------------------------------------------------------------------------------

def weights_hash(model: torch.nn.Module) -> str:
    """sha256 over every parameter's name and bytes: two checkpoints of one architecture differ here."""
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


@dataclass
class CostTable:
    """Every scored mask's cost for one (verifier weights, calibration, cost); ``score`` fills the gaps."""

    key: str
    num_layers: int
    costs: dict[str, float] = field(default_factory=dict)
    eval_seconds: list[float] = field(default_factory=list)
    block_influence: list[float] = field(default_factory=list)
    score: Callable[[Mask], tuple[float, float]] | None = None  # mask -> (cost, seconds)

    def cost(self, mask: Mask) -> float:
        k = mask_key(mask)
        if k not in self.costs:
            if self.score is None:
                raise KeyError(f"mask {k} is not in the table and no scorer is loaded")
            self.costs[k], seconds = self.score(mask)
            self.eval_seconds.append(seconds)
        return self.costs[k]

    @property
    def mean_eval_s(self) -> float:
        return statistics.fmean(self.eval_seconds) if self.eval_seconds else float("nan")

    def enumerate(self, budget: Budget) -> tuple[float, str]:
        """Score every mask of ``budget`` (cached ones are free); return the optimum (cost, mask key)."""
        best = (math.inf, "")
        for skipped in combinations(range(budget.num_layers), budget.skip):
            mask = tuple(i not in skipped for i in range(budget.num_layers))
            best = min(best, (self.cost(mask), mask_key(mask)))
        return best

    def to_json(self) -> dict:
        return {"num_layers": self.num_layers, "costs": self.costs, "eval_seconds": self.eval_seconds,
                "block_influence": self.block_influence}


def load_tables(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def save_table(path: Path, table: CostTable) -> None:
    """Merge ``table`` into the cache file (atomically; other keys, and masks another run added, are kept)."""
    data = load_tables(path)
    mine = table.to_json()
    if table.key in data:
        mine["costs"] = {**data[table.key]["costs"], **mine["costs"]}
        if len(data[table.key]["eval_seconds"]) > len(mine["eval_seconds"]):
            mine["eval_seconds"] = data[table.key]["eval_seconds"]
    data[table.key] = mine
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, sort_keys=True))
    tmp.replace(path)


def open_table(pair_name: str, num_sequences: int, seq_len: int, cost: str, cache: Path,
               calibration: str | None = None, pairs_file: Path | None = None) -> CostTable:
    """The cached table for this verifier and calibration, with a live scorer behind it for missing masks."""
    from dimr.calibration import load_calibration
    from dimr.pairs import get_pair, load_tokenizer
    from dimr.slim_config import fingerprint
    from workers import EvalSpec
    from workers.local import MaskScorer

    pair = get_pair(pair_name, pairs_file)
    calib = load_calibration(calibration or pair.calibration, load_tokenizer(pair), num_sequences, seq_len)
    scorer = MaskScorer(EvalSpec(pair=pair, input_ids=calib.input_ids, cost=cost, device="cpu"))
    key = f"{fingerprint(scorer.verifier)[:16]}-{weights_hash(scorer.verifier)}-{calib.hash}-{cost}"
    stored = load_tables(cache).get(key, {})
    table = CostTable(key, scorer.num_layers, dict(stored.get("costs", {})), list(stored.get("eval_seconds", [])),
                      stored.get("block_influence") or scorer.block_influence())

    def score(mask: Mask) -> tuple[float, float]:
        e = scorer.score(mask)
        return e.cost, e.seconds

    table.score = score
    return table


# --- replaying strategies ------------------------------------------------------------------------------------

class Exhausted(Exception):
    """The strategy used up its evaluations."""


class Oracle:
    """Evaluations by look-up, counted: the ``limit``-th distinct mask is the last one scored."""

    def __init__(self, table: CostTable, budget: Budget, limit: int):
        self.table, self.budget, self.limit = table, budget, limit
        self.seen: dict[Mask, float] = {}
        self.trace: list[tuple[Mask, float]] = []
        self.lookup_s = 0.0

    def __call__(self, mask: Mask) -> float:
        mask = tuple(bool(b) for b in mask)
        if mask in self.seen:
            return self.seen[mask]
        if len(self.trace) >= self.limit:
            raise Exhausted
        t0 = time.perf_counter()
        c = self.table.cost(mask)
        self.lookup_s += time.perf_counter() - t0
        self.seen[mask] = c
        self.trace.append((mask, c))
        return c

    def best_curve(self) -> list[float | None]:
        """Best cost among the budget masks after each evaluation (None before the first one)."""
        out, best = [], None
        for mask, c in self.trace:
            if self.budget.admits(mask) and (best is None or c < best):
                best = c
            out.append(best)
        return out


class LookupEvaluator:
    """The `workers.Evaluator` interface over an Oracle: what the real driver talks to in the benchmark."""

    slots = 1

    def __init__(self, oracle: Oracle, influence: list[float]):
        self.oracle, self.influence = oracle, influence
        self.num_layers = oracle.budget.num_layers
        self._queue: list[tuple[int, Mask]] = []

    def submit(self, ticket: int, mask: Mask) -> None:
        self._queue.append((ticket, mask))

    def wait(self, timeout: float | None = None):
        from workers.base import Evaluation

        if not self._queue:
            return []
        ticket, mask = self._queue.pop(0)
        c = self.oracle(mask)
        return [(ticket, Evaluation(mask=mask, cost=c, top1_agreement=0.0, expected_acceptance=0.0, tokens=0,
                                    seconds=0.0, worker="lookup"))]

    def block_influence(self) -> list[float]:
        return self.influence

    def close(self) -> None:
        self._queue.clear()


def run_dimr(oracle: Oracle, influence: list[float], seed: int) -> None:
    """The real driver with its default options (`SearchOptions()`) on a temporary SQLite study."""
    from dimr.search import Search, SearchOptions, StudySettings
    from storage import open_storage

    b = oracle.budget
    settings = StudySettings(pair="bench", verifier="bench", fingerprint="bench", num_layers=b.num_layers,
                             skip=b.skip, cost="kl", calibration="bench", calibration_hash="bench",
                             num_sequences=0, seq_len=0)
    options = replace(SearchOptions(seed=seed), trials=min(oracle.limit, math.comb(b.num_layers, b.skip)))
    with tempfile.TemporaryDirectory() as d:
        storage = open_storage(f"sqlite:///{d}/bench.db")
        Search(storage, "bench", settings, options, LookupEvaluator(oracle, influence)).run()
        storage.engine.dispose()


def _ask_tell(oracle: Oracle, sampler: optuna.samplers.BaseSampler) -> None:
    study = optuna.create_study(sampler=sampler)
    names = list(mask_to_params((True,) * oracle.budget.num_layers))
    while True:
        trial = study.ask()
        mask = params_to_mask({n: trial.suggest_categorical(n, (0, 1)) for n in names}, oracle.budget.num_layers)
        study.tell(trial, oracle(mask))


def run_budget_sampler(oracle: Oracle, name: str, seed: int, startup: int = 10) -> None:
    """dimr's budget sampler around ``name`` (tpe or gp) with its random phase, and no heuristic seeds."""
    sampler = BudgetSampler(oracle.budget, make_proposer(name, seed, startup), startup=startup, seed=seed,
                            is_taken=lambda m: tuple(m) in oracle.seen)
    _ask_tell(oracle, sampler)


def run_random(oracle: Oracle, seed: int) -> None:
    rng = np.random.default_rng(seed)
    while True:
        mask = random_mask(oracle.budget, rng)
        if mask not in oracle.seen:
            oracle(mask)


def _relaxed_study(oracle: Oracle, seed: int, startup: int) -> tuple[optuna.Study, dict]:
    dists = {f"x_{i:02d}": optuna.distributions.FloatDistribution(0.0, 1.0) for i in range(oracle.budget.num_layers)}
    sampler = optuna.samplers.GPSampler(seed=seed, n_startup_trials=startup)
    return optuna.create_study(sampler=sampler), dists


def _top_k(x: list[float], budget: Budget) -> Mask:
    skipped = set(np.argsort(-np.asarray(x), kind="stable")[: budget.skip].tolist())
    return tuple(i not in skipped for i in range(budget.num_layers))


def run_self_sd(oracle: Oracle, seed: int, startup: int = 10) -> None:
    """GP-BO over x ∈ [0, 1]^L; skip layer i iff x_i > 0.5; wrong counts projected with the fewest flips."""
    study, dists = _relaxed_study(oracle, seed, startup)
    rng = np.random.default_rng(seed)
    for _ in range(50 * oracle.limit):  # a GP stuck on known masks would otherwise never use up its evaluations
        trial = study.ask(dists)
        x = [trial.params[n] for n in dists]
        mask = project(tuple(v <= 0.5 for v in x), oracle.budget, rng)
        study.tell(trial, oracle(mask))


def run_swift(oracle: Oracle, seed: int) -> None:
    """Random masks, and every 25th step a GP-BO suggestion over the relaxation, skipping its top-k x_i."""
    study, dists = _relaxed_study(oracle, seed, startup=1)
    rng = np.random.default_rng(seed)
    for step in range(50 * oracle.limit):
        if step % SWIFT_BO_EVERY == SWIFT_BO_EVERY - 1:
            trial = study.ask(dists)
            x = [trial.params[n] for n in dists]
            study.tell(trial, oracle(_top_k(x, oracle.budget)))
        else:
            mask = random_mask(oracle.budget, rng)
            params = {n: 0.0 if keep else 1.0 for n, keep in zip(dists, mask, strict=True)}
            study.add_trial(optuna.trial.create_trial(params=params, distributions=dists, value=oracle(mask)))


def local_search(table: CostTable, budget: Budget, start: Mask, max_rounds: int = 100) -> tuple[float, Mask, int]:
    """Swap descent from ``start``: score every mask one swap away (one skipped layer kept, one kept layer
    skipped), move to the cheapest if it improves, until none does. Returns (cost, mask, rounds)."""
    from dimr.search.proposers.swap import swaps

    best, cost = start, table.cost(start)
    for rounds in range(1, max_rounds + 1):
        c, m = min((table.cost(n), n) for n in swaps(best))
        if c >= cost:
            return cost, best, rounds
        cost, best = c, m
    return cost, best, max_rounds


def _with_skipped(n: int, skipped: set[int]) -> Mask:
    return tuple(i not in skipped for i in range(n))


def run_heuristic(oracle: Oracle, name: str, influence: list[float]) -> None:
    b = oracle.budget
    if name == "skip-last":
        oracle(heuristics.skip_last(b))
    elif name == "shortgpt":
        oracle(heuristics.least_influential(b, influence))
    elif name == "single-rank":
        oracle(heuristics.single_skip_rank(b, [oracle(m) for m in heuristics.single_skip_masks(b.num_layers)]))
    elif name == "greedy":
        skipped: set[int] = set()
        for _ in range(b.skip):
            options = [i for i in range(b.num_layers) if i not in skipped]
            skipped.add(min(options, key=lambda i: (oracle(_with_skipped(b.num_layers, skipped | {i})), i)))
    else:
        raise ValueError(name)


def run_strategy(name: str, table: CostTable, budget: Budget, seed: int, limit: int) -> dict:
    """One run: the best-cost curve, the masks in order, and the strategy's own overhead in seconds."""
    oracle = Oracle(table, budget, limit)
    t0 = time.perf_counter()
    try:
        if name == "dimr":
            run_dimr(oracle, table.block_influence, seed)
        elif name == "random":
            run_random(oracle, seed)
        elif name in ("tpe", "gp"):
            run_budget_sampler(oracle, name, seed)
        elif name == "self-sd":
            run_self_sd(oracle, seed)
        elif name == "swift":
            run_swift(oracle, seed)
        else:
            run_heuristic(oracle, name, table.block_influence)
    except Exhausted:
        pass
    overhead = time.perf_counter() - t0 - oracle.lookup_s
    return {"curve": oracle.best_curve(), "masks": [mask_key(m) for m, _ in oracle.trace],
            "overhead_s": overhead, "limit": limit}


# --- the report ----------------------------------------------------------------------------------------------

def evals_to_within(curve: list[float | None], target: float) -> int | None:
    return next((i + 1 for i, c in enumerate(curve) if c is not None and c <= target), None)


def best_after(curve: list[float | None], n: int, limit: int | None = None) -> float | None:
    """The best cost after ``n`` evaluations; None if a run cut off at ``limit`` < n never got there."""
    if not curve or (limit is not None and limit < n and len(curve) >= limit):
        return None
    return curve[min(n, len(curve)) - 1]


def _median(xs: list[float | None]) -> float | None:
    """Median where None (not reached / no budget mask yet) counts as +infinity."""
    v = statistics.median([math.inf if x is None else x for x in xs])
    return None if math.isinf(v) else v


def summarise(runs: dict[str, list[dict]], optimum: float, eval_s: float, limit: int) -> dict:
    out = {}
    for name, rs in runs.items():
        row: dict = {"best_after": {}, "worst_after": {}}
        for n in CHECKPOINTS:
            if n <= limit:
                row["best_after"][n] = _median([best_after(r["curve"], n, r.get("limit")) for r in rs])
                worst = [best_after(r["curve"], n, r.get("limit")) for r in rs]
                row["worst_after"][n] = None if None in worst else max(worst)
        for pct in (1, 5):
            hits = [evals_to_within(r["curve"], optimum * (1 + pct / 100)) for r in rs]
            row[f"to{pct}_median"] = _median(hits)
            row[f"to{pct}_worst"] = None if None in hits else max(hits)
        overhead = statistics.fmean(r["overhead_s"] / max(1, len(r["curve"])) for r in rs)
        row["overhead_ms_per_eval"] = 1000 * overhead
        row["evaluations"] = max(len(r["curve"]) for r in rs)
        to1 = row["to1_median"]
        row["wall_s_to1"] = None if to1 is None else to1 * (eval_s + overhead)
        row["wall_s_all"] = row["evaluations"] * (eval_s + overhead)
        row["best"] = min((r["curve"][-1] for r in rs if r["curve"] and r["curve"][-1] is not None), default=None)
        out[name] = row
    return out


def goal_check(summary: dict, total: int, optimum: float | None = None, seed_best: float | None = None) -> dict:
    """dimr within 1% in ≤ 10% of C(L, k) evaluations and in ≤ 100 (median), at least as good as every other
    strategy at every checkpoint, and (given the reference ``optimum`` and the best seed's cost ``seed_best``)
    closing at least half the gap between the seed and the reference by 50 evaluations."""
    d = summary["dimr"]
    fast = d["to1_median"] is not None and d["to1_median"] <= 0.1 * total
    behind = []
    for n, mine in d["best_after"].items():
        for name, row in summary.items():
            other = row["best_after"].get(n)
            if name != "dimr" and other is not None and (mine is None or mine > other):
                behind.append(f"{name}@{n}")
    out = {"within_1pct_in_10pct": fast, "within_1pct_in_100": d["to1_median"] is not None and d["to1_median"] <= 100,
           "never_behind": not behind, "behind": behind}
    if optimum is not None and seed_best is not None:
        at50 = d["best_after"].get(50)
        gap = seed_best - optimum
        out["seed_within_1pct"] = seed_best <= optimum * 1.01
        out["gap_closed_at_50"] = None if at50 is None or gap <= 0 else (seed_best - at50) / gap
        out["closes_half_the_gap"] = out["seed_within_1pct"] or (out["gap_closed_at_50"] or 0) >= 0.5
    return out


def _fmt(x, spec=".4f") -> str:
    return "-" if x is None else format(x, spec)


def markdown(result: dict) -> str:
    lines = []
    for b in result["budgets"]:
        opt, total = b["optimum"], b["masks"]
        r = b.get("reference") or {}
        ref = "exhaustive optimum" if b["exhaustive"] else (
            f"reference (best of {r.get('multiplier', 10)}× runs + {r.get('local_search_rounds', 0)} rounds of "
            "swap descent)")
        lines.append(f"\n#### skip {b['skip']} of {result['num_layers']} layers: C = {total} masks, {ref} "
                     f"{opt:.4g} (mask `{b['optimum_mask']}`), 10% of C = {0.1 * total:.0f} evaluations\n")
        cps = [n for n in CHECKPOINTS if n <= result["limit"]]
        head = ["strategy", *[f"best@{n}" for n in cps], "to 1% med/worst", "to 5% med/worst",
                "overhead ms/eval", "wall to 1%"]
        lines.append("| " + " | ".join(head) + " |")
        lines.append("|" + "---|" * len(head))
        for name, row in b["summary"].items():
            cells = [name]
            for n in cps:
                v = row["best_after"].get(n)
                cells.append("-" if v is None else f"{v:.4g} ({100 * (v / opt - 1):+.1f}%)")
            for pct in (1, 5):
                m, w = row[f"to{pct}_median"], row[f"to{pct}_worst"]
                never = f">{row['evaluations']}"
                cells.append(f"{never if m is None else int(m)} / {never if w is None else w}")
            cells.append(f"{row['overhead_ms_per_eval']:.1f}")
            cells.append("-" if row["wall_s_to1"] is None else f"{row['wall_s_to1']:.1f} s")
            lines.append("| " + " | ".join(cells) + " |")
        g = b["goal"]
        lines.append(f"\nGoal: within 1% in ≤ 10% of C: **{'yes' if g['within_1pct_in_10pct'] else 'no'}**; "
                     f"never behind another strategy: **{'yes' if g['never_behind'] else 'no'}**"
                     + (f" (behind: {', '.join(g['behind'])})" if g["behind"] else "")
                     + f"; within 1% in ≤ 100: **{'yes' if g.get('within_1pct_in_100') else 'no'}**"
                     + ("" if g.get("gap_closed_at_50") is None else
                        f"; gap between the best seed and the reference closed by 50: {g['gap_closed_at_50']:.0%}"))
    for sens in result.get("sensitivity", []):
        labels = list(sens["rows"][0]["costs"])
        lines.append(f"\nCalibration sensitivity, skip {sens['skip']} (benchmark: {result['num_sequences']}×"
                     f"{result['seq_len']} tokens):\n")
        lines.append("| mask | " + " | ".join(labels) + " |")
        lines.append("|" + "---|" * (len(labels) + 1))
        for row in sens["rows"]:
            ranks = [1 + sorted(r["costs"][lab] for r in sens["rows"]).index(row["costs"][lab]) for lab in labels]
            lines.append(f"| {row['name']} `{row['mask']}` | "
                         + " | ".join(f"{row['costs'][lab]:.4g} (#{k})" for lab, k in zip(labels, ranks, strict=True))
                         + " |")
    return "\n".join(lines)


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    budgets = result["budgets"]
    fig, axes = plt.subplots(1, len(budgets), figsize=(5.5 * len(budgets), 4.2), squeeze=False)
    for ax, b in zip(axes[0], budgets, strict=True):
        for name in b["summary"]:
            curves = b["curves"][name]
            n = max(len(c) for c in curves)
            med = []
            for i in range(n):
                v = _median([c[min(i, len(c) - 1)] if c else None for c in curves])
                med.append(np.nan if v is None else 100 * (v / b["optimum"] - 1))
            style = "-" if name not in DETERMINISTIC else "--"
            ax.plot(range(1, n + 1), med, style, label=name, lw=2.2 if name == "dimr" else 1.2,
                    marker="o" if n == 1 else None)
        ax.axhline(1.0, color="grey", lw=0.8, ls=":")
        ax.axvline(0.1 * b["masks"], color="grey", lw=0.8, ls=":")
        ax.set_xscale("log")
        ax.set_yscale("symlog", linthresh=1.0)
        ax.set_ylim(bottom=0.0)
        ax.set_xlabel("evaluations")
        ax.set_ylabel("median gap to the optimum (%)")
        ax.set_title(f"{result['pair']}: skip {b['skip']} of {result['num_layers']} (C = {b['masks']})")
        ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_budget(table: CostTable, budget: Budget, strategies: list[str], seeds: list[int], limit: int,
               enumerate_limit: int, log: Callable[[str], None] = print, previous: dict | None = None,
               gp_limit: int | None = None, multiplier: int = 10, local: bool = True) -> dict:
    """Every strategy on one budget; ``previous`` (this budget's earlier result) supplies the runs of the
    strategies not in ``strategies``."""
    gp_limit = gp_limit or limit
    total = math.comb(budget.num_layers, budget.skip)
    exhaustive = total <= enumerate_limit
    if exhaustive:
        optimum, opt_mask = table.enumerate(budget)
    runs: dict[str, list[dict]] = {n: rs for n, rs in (previous or {}).get("runs", {}).items() if n not in strategies}
    for name in strategies:
        rs = []
        for seed in seeds[:1] if name in DETERMINISTIC else seeds:
            rs.append(run_strategy(name, table, budget, seed, gp_limit if name in SLOW else limit))
        runs[name] = rs * (len(seeds) if name in DETERMINISTIC else 1)
        finals = [r["curve"][-1] for r in rs if r["curve"] and r["curve"][-1] is not None]
        overhead = statistics.fmean(r["overhead_s"] for r in rs)
        log(f"  {name}: best {min(finals, default=None)} overhead {overhead:.1f} s/run")
    reference = None
    if not exhaustive:  # the reference: the best mask found with `multiplier` x the evaluations, then swap descent
        ref = [run_strategy(name, table, budget, seeds[0], multiplier * limit)
               for name in (strategies if multiplier else []) if name not in SLOW]
        ref += [r for rs in runs.values() for r in rs]
        found = [(table.costs[m], m) for r in ref for m in r.get("masks", ()) if budget.admits(mask_from_key(m))]
        if previous:  # a --merge run: the earlier runs' reference counts too
            found.append((previous["optimum"], previous["optimum_mask"]))
        optimum, opt_mask = min(found)
        reference = {"long_runs_best": optimum, "multiplier": multiplier, "local_search_rounds": 0}
        if local:
            optimum, best, rounds = local_search(table, budget, mask_from_key(opt_mask))
            opt_mask = mask_key(best)
            reference["local_search_rounds"] = rounds
        log(f"  reference: {optimum:.4g} ({reference})")
    seed_costs = [table.costs[k] for k in (mask_key(m) for _, m in dimr_seeds(table, budget)) if k in table.costs]
    runs = {n: runs[n] for n in STRATEGIES if n in runs} | runs
    summary = summarise(runs, optimum, table.mean_eval_s, limit)
    seed_best = min(seed_costs, default=None)
    return {"skip": budget.skip, "masks": total, "exhaustive": exhaustive, "optimum": optimum,
            "optimum_mask": opt_mask, "reference": reference, "seed_best": seed_best, "summary": summary,
            "goal": goal_check(summary, total, optimum, seed_best),
            "curves": {n: [r["curve"] for r in rs] for n, rs in runs.items()},
            "runs": {n: [{k: r.get(k) for k in RUN_FIELDS} for r in rs] for n, rs in runs.items()}}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", default="mini")
    ap.add_argument("--skips", default="3,4", help="comma-separated numbers of layers to skip")
    ap.add_argument("--seeds", default="0,1,2,3,4")
    ap.add_argument("--strategies", default=",".join(STRATEGIES))
    ap.add_argument("--evaluations", type=int, default=200, help="evaluations per run")
    ap.add_argument("--gp-evaluations", type=int, default=100,
                    help="evaluations per run of the GP-based strategies (gp, self-sd), whose asks are slow")
    ap.add_argument("--num-sequences", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--cost", default="kl")
    ap.add_argument("--enumerate-limit", type=int, default=5000)
    out_dir = dimr_home() / "bench" / "search_quality"
    ap.add_argument("--cache", type=Path, default=out_dir / "table.json")
    ap.add_argument("--out", type=Path, default=out_dir / "search_quality.json")
    ap.add_argument("--plot", type=Path, default=out_dir / "search_quality.png")
    ap.add_argument("--reference-multiplier", type=int, default=10,
                    help="long runs for the reference of budgets too large to enumerate (0: none)")
    ap.add_argument("--no-local-search", action="store_true", help="no swap descent from the reference")
    ap.add_argument("--rank-check", type=int, default=0, help="masks scored on a larger calibration too (Spearman)")
    ap.add_argument("--sensitivity", default="",
                    help="calibrations (SEQUENCESxLENGTH, comma-separated, e.g. 8x128,16x128) on which to score the "
                    "seeds and the reference mask too")
    ap.add_argument("--rank-num-sequences", type=int, default=32)
    ap.add_argument("--rank-seq-len", type=int, default=128)
    ap.add_argument("--pairs-file", type=Path, default=None, help="TOML file with extra pairs")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--combine", type=Path, nargs="+", default=None,
                    help="no runs: merge these result files (same table and seeds; per budget, later files' "
                    "strategies win) into --out, then print the table and draw the plot")
    ap.add_argument("--merge", action="store_true",
                    help="rerun only --strategies; take the other strategies' runs from --out")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.combine:
        return write_result(combine([json.loads(p.read_text()) for p in args.combine]), args.out, args.plot)

    table = open_table(args.pair, args.num_sequences, args.seq_len, args.cost, args.cache,
                       pairs_file=args.pairs_file)
    seeds = [int(s) for s in args.seeds.split(",")]
    strategies = [s for s in args.strategies.split(",") if s]
    result = {"pair": args.pair, "num_layers": table.num_layers, "table_key": table.key, "seeds": seeds,
              "limit": args.evaluations, "gp_limit": args.gp_evaluations, "num_sequences": args.num_sequences,
              "seq_len": args.seq_len, "cost": args.cost, "budgets": []}
    before = json.loads(args.out.read_text()) if args.merge and args.out.exists() else {}
    if before and (before["table_key"], before["seeds"], before["limit"]) != (table.key, seeds, args.evaluations):
        raise SystemExit(f"--merge: {args.out} was made with another table, seed list or --evaluations")
    for skip in (int(s) for s in args.skips.split(",")):
        budget = Budget(table.num_layers, skip)
        print(f"{budget.describe()}: {math.comb(table.num_layers, skip)} masks")
        previous = next((b for b in before.get("budgets", []) if b["skip"] == skip), None)
        try:
            result["budgets"].append(run_budget(table, budget, strategies, seeds, args.evaluations,
                                                args.enumerate_limit, previous=previous, gp_limit=args.gp_evaluations,
                                                multiplier=args.reference_multiplier,
                                                local=not args.no_local_search))
        finally:  # what was scored is kept, even if the run stops
            save_table(args.cache, table)
    result["mean_eval_s"] = table.mean_eval_s
    if args.rank_check:
        large = open_table(args.pair, args.rank_num_sequences, args.rank_seq_len, args.cost, args.cache,
                           pairs_file=args.pairs_file)
        result["rank_check"] = [rank_check(table, large, Budget(table.num_layers, int(k)), args.rank_check)
                                for k in args.skips.split(",")]
        save_table(args.cache, large)
        print("rank check:", result["rank_check"])
    if args.sensitivity:
        larger = {}
        for label in args.sensitivity.split(","):
            n, length = (int(x) for x in label.split("x"))
            larger[label] = open_table(args.pair, n, length, args.cost, args.cache, pairs_file=args.pairs_file)
        try:
            result["sensitivity"] = [calibration_sensitivity(table, larger, b) for b in result["budgets"]]
        finally:
            for t in larger.values():
                save_table(args.cache, t)
    return write_result(result, args.out, args.plot)


def dimr_seeds(table: CostTable, budget: Budget) -> list[tuple[str, Mask]]:
    """dimr's heuristic seeds for ``budget``, named, and its profile's seed once the table holds every single
    skip (the driver adds it after scoring them, `SearchOptions.profile`)."""
    seeds = heuristics.seed_masks(budget, table.block_influence)
    profile = [table.costs.get(mask_key(m)) for m in heuristics.single_skip_masks(budget.num_layers)]
    if SearchOptions().profile and None not in profile:
        seeds.append(("single-skip-rank", heuristics.single_skip_rank(budget, profile)))
    return seeds


def calibration_sensitivity(small: CostTable, larger: dict[str, CostTable], budget_result: dict) -> dict:
    """The heuristic seeds' and the reference mask's costs on the benchmark's calibration and on each of
    ``larger`` (label -> table): whether a larger calibration would have ranked them, and picked the best, alike."""
    budget = Budget(small.num_layers, budget_result["skip"])
    named = [*dimr_seeds(small, budget), ("reference", mask_from_key(budget_result["optimum_mask"]))]
    names: dict[Mask, list[str]] = {}  # one row per mask, named by every heuristic that proposes it
    for n, m in named:
        names.setdefault(m, []).append(n)
    tables = {"benchmark": small, **larger}
    rows = [{"name": " = ".join(ns), "mask": mask_key(m), "costs": {label: t.cost(m) for label, t in tables.items()}}
            for m, ns in names.items()]
    best = {label: min(rows, key=lambda r: r["costs"][label])["name"] for label in tables}
    return {"skip": budget.skip, "rows": rows, "best": best}


def rank_check(small: CostTable, large: CostTable, budget: Budget, n: int, seed: int = 0) -> dict:
    """Spearman's ρ between two calibrations' costs of ``n`` random ``budget`` masks."""
    from scipy.stats import spearmanr

    rng = np.random.default_rng(seed)
    masks = list(dict.fromkeys(random_mask(budget, rng) for _ in range(4 * n)))[:n]
    a, b = [small.cost(m) for m in masks], [large.cost(m) for m in masks]
    return {"skip": budget.skip, "masks": len(masks), "spearman_rho": float(spearmanr(a, b).statistic)}


def write_result(result: dict, out: Path, plot_path: Path) -> dict:
    print(markdown(result))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, default=str))
    plot(result, plot_path)
    return result


def combine(results: list[dict]) -> dict:
    """One result from several runs of the benchmark (e.g. one per budget, run in parallel)."""
    first = results[0]
    if any(r["table_key"] != first["table_key"] or r["seeds"] != first["seeds"] for r in results):
        raise SystemExit("--combine: the results come from other tables or seed lists")
    budgets: dict[int, dict] = {}
    for r in results:
        for b in r["budgets"]:
            runs = {**budgets.get(b["skip"], {}).get("runs", {}), **b["runs"]}
            runs = {n: runs[n] for n in STRATEGIES if n in runs} | runs
            summary = summarise(runs, b["optimum"], r["mean_eval_s"], r["limit"])
            goal = goal_check(summary, b["masks"], b["optimum"], b.get("seed_best"))
            budgets[b["skip"]] = {**b, "runs": runs, "summary": summary, "goal": goal,
                                  "curves": {n: [x["curve"] for x in rs] for n, rs in runs.items()}}
    sensitivity = {x["skip"]: x for r in results for x in r.get("sensitivity", [])}
    return {**first, "gp_limit": max(r["gp_limit"] for r in results),
            "sensitivity": [sensitivity[k] for k in sorted(sensitivity)],
            "mean_eval_s": statistics.fmean(r["mean_eval_s"] for r in results),
            "budgets": [budgets[k] for k in sorted(budgets)]}


if __name__ == "__main__":
    main()
