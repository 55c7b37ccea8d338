"""The search-quality benchmark (exhaustive optimum, strategies on the budget) and Pareto studies, on the tiny pair."""

from __future__ import annotations

import inspect
import itertools
import json
import math
import sys
from pathlib import Path

import optuna
import pytest
from cli_runner import cli
from optuna.trial import TrialState

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import search_quality as sq  # noqa: E402
from dimr.masks import (  # noqa: E402
    Budget,  # noqa: E402
    mask_from_key,
    mask_key,
)
from dimr.search import SearchOptions, heuristics  # noqa: E402
from storage import open_storage  # noqa: E402

SEQS, SEQ_LEN = 2, 16
LIMIT = 22  # greedy forward selection needs 8 + 7 + 6 evaluations to skip 3 of 8 layers


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    cache = tmp_path_factory.mktemp("sq") / "table.json"
    t = sq.open_table("tiny-random", SEQS, SEQ_LEN, "kl", cache)
    return t, cache


def test_exhaustive_optimum_matches_brute_force(table, tiny_pair):
    from dimr.calibration import load_calibration
    from dimr.pairs import load_tokenizer
    from workers import EvalSpec
    from workers.local import MaskScorer

    t, cache = table
    budget = Budget(8, 2)
    optimum, opt_mask = t.enumerate(budget)
    sq.save_table(cache, t)
    # brute force: an independent scorer, every mask that skips 2 of 8 layers
    calib = load_calibration(tiny_pair.calibration, load_tokenizer(tiny_pair), SEQS, SEQ_LEN)
    scorer = MaskScorer(EvalSpec(pair=tiny_pair, input_ids=calib.input_ids, cost="kl", device="cpu"))
    brute = min((scorer.score(m).cost, mask_key(m)) for m in (
        tuple(i not in s for i in range(8)) for s in itertools.combinations(range(8), 2)))
    assert (optimum, opt_mask) == pytest.approx(brute) and opt_mask == brute[1]
    # the cache answers by look-up alone: the same optimum with no scorer behind it
    cached = sq.CostTable(t.key, 8, json.loads(cache.read_text())[t.key]["costs"])
    assert cached.enumerate(budget) == (optimum, opt_mask)
    assert len([k for k in cached.costs if k.count("0") == 2]) == math.comb(8, 2)


@pytest.mark.parametrize("name", sq.STRATEGIES)
def test_every_strategy_respects_the_budget(table, name):
    t, _ = table
    budget = Budget(8, 3)
    run = sq.run_strategy(name, t, budget, seed=0, limit=LIMIT)
    masks = [mask_from_key(k) for k in run["masks"]]
    assert masks and len(set(masks)) == len(masks), "an evaluation was spent twice"
    assert len(masks) <= LIMIT and len(run["curve"]) == len(masks)
    answers = [m for m in masks if budget.admits(m)]
    assert answers, f"{name} never evaluated a mask on the budget"
    if name == "dimr":  # the driver's single-skip profile, once, and nothing else off the budget
        off = [m for m in masks if not budget.admits(m)]
        assert sorted(off) == sorted(heuristics.single_skip_masks(8))
    elif name in ("single-rank", "greedy"):  # the profile / partial sets on the way skip fewer layers
        assert all(m.count(False) <= budget.skip for m in masks)
    else:
        assert answers == masks, f"{name} evaluated masks off the budget"
    assert run["curve"][-1] == min(t.costs[mask_key(m)] for m in answers)


def test_budget_too_large_to_enumerate_uses_ten_times_the_evaluations(tmp_path):
    t = sq.open_table("tiny-random", SEQS, SEQ_LEN, "kl", tmp_path / "table.json")
    budget = Budget(8, 3)
    b = sq.run_budget(t, budget, ["dimr", "random", "gp"], seeds=[0, 1], limit=4, enumerate_limit=10,
                      log=lambda _: None)
    assert not b["exhaustive"] and b["masks"] == 56
    scored = {k: c for k, c in t.costs.items() if budget.admits(mask_from_key(k))}
    assert len(scored) >= 10 * 4  # random's 10x run scored 40 distinct budget masks, the gp runs 4 each
    assert (b["optimum"], b["optimum_mask"]) == min((c, k) for k, c in scored.items())
    assert b["optimum"] >= t.enumerate(budget)[0]


def test_report_metrics():
    curve = [None, 5.0, 3.0, 3.0, 1.02, 1.0]
    assert sq.evals_to_within(curve, 1.05) == 5 and sq.evals_to_within(curve, 0.5) is None
    assert sq.best_after(curve, 3) == 3.0 and sq.best_after(curve, 100) == 1.0
    runs = {"dimr": [{"curve": curve, "overhead_s": 0.0}] * 3, "other": [{"curve": [2.0] * 6, "overhead_s": 0.0}],
            "greedy": [{"curve": [None] * 6, "overhead_s": 0.0}]}  # never reached a mask on the budget
    s = sq.summarise(runs, 1.0, 1.0, 6)
    assert s["dimr"]["to1_median"] == 6 and s["other"]["to1_median"] is None
    assert s["greedy"]["best"] is None and s["greedy"]["to5_median"] is None
    budget = {"skip": 1, "masks": 60, "optimum": 1.0, "optimum_mask": "0", "exhaustive": True, "summary": s,
              "goal": sq.goal_check(s, 60)}
    table = sq.markdown({"budgets": [budget], "pair": "t", "num_layers": 6, "limit": 6, "gp_limit": 6})
    assert "| greedy | >6 / >6 |" in table
    goal = sq.goal_check({**s, "dimr": {**s["dimr"], "best_after": {2: 5.0, 5: 1.02}},
                          "other": {**s["other"], "best_after": {2: 2.0, 5: 2.0}}}, total=60)
    assert goal["behind"] == ["other@2"] and goal["within_1pct_in_10pct"]


def test_cli_defaults_are_the_search_defaults():
    from dimr.cli_search import search

    params = inspect.signature(search).parameters
    d = SearchOptions()
    assert params["trials"].default.default == d.trials
    assert params["startup_trials"].default.default == d.startup_trials
    assert params["sampler"].default.default.value == d.sampler


# --- Pareto studies ------------------------------------------------------------------------------------------



PARETO = ["search", "--pair", "tiny-random", "--objective", "pareto", "--budget", "3", "--trials", "16",
          "--num-sequences", "2", "--seq-len", "16", "--study", "p", "--json"]


def _dominated(p: tuple[float, float], points: list[tuple[float, float]]) -> bool:
    return any(q[0] <= p[0] and q[1] <= p[1] and q != p for q in points)


def test_pareto_search_show_export(capsys, tmp_path):
    url = f"sqlite:///{tmp_path}/p.db"
    code, out, err = cli(capsys, *PARETO, "--storage", url)
    assert code == 0, err
    study = optuna.load_study(study_name="p", storage=open_storage(url))
    assert len(study.directions) == 2
    complete = [t for t in study.get_trials() if t.state == TrialState.COMPLETE]
    assert len(complete) == 16
    skipped = [mask_from_key(t.user_attrs["mask"]).count(False) for t in complete]
    assert set(skipped) == {1, 2, 3}, "a Pareto study spans every skip count up to the budget"
    for t in complete:
        assert t.values[1] == pytest.approx(1 - mask_from_key(t.user_attrs["mask"]).count(False) / 8)
    points = [(t.values[0], t.values[1]) for t in complete]

    code, out, _ = cli(capsys, "show", "p", "--storage", url, "--pareto", "--json")
    front = json.loads(out)
    assert code == 0 and front
    assert all(not _dominated((r["cost"], r["kept_fraction"]), points) for r in front)
    assert {r["trial"] for r in front} == {t.number for t in complete if not _dominated(
        (t.values[0], t.values[1]), points)}
    code, out, _ = cli(capsys, "show", "p", "--storage", url, "--pareto")
    assert code == 0 and "Pareto front" in out

    for budget, skip in (("1", 1), ("2", 2), ("3", 3), ("0.25", 2)):
        slim = tmp_path / f"slim-{budget}.json"
        code, out, err = cli(capsys, "export", "p", "--storage", url, "--budget", budget, "-o", str(slim))
        assert code == 0, err
        cfg = json.loads(slim.read_text())
        mask = mask_from_key(cfg["mask"])
        assert mask.count(False) >= skip, "the exported mask keeps more than the budget allows"
        point = (cfg["metrics"]["cost"], sum(mask) / 8)
        assert not _dominated(point, points), "the exported mask is dominated"
        fitting = [c for (c, kept) in points if kept <= 1 - skip / 8]
        assert cfg["metrics"]["cost"] == pytest.approx(min(fitting)), "not the lowest cost within the budget"

    code, _, err = cli(capsys, "export", "p", "--storage", url, "--budget", "5", "-o", str(tmp_path / "x.json"))
    assert code == 2 and "fits budget" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "x.json").exists()


def test_single_objective_export_budget(capsys, tmp_path):
    url = f"sqlite:///{tmp_path}/s.db"
    args = [*PARETO[:3], *PARETO[5:], "--storage", url]
    args[args.index("--trials") + 1] = "6"
    code, out, err = cli(capsys, *args)
    assert code == 0, err
    best = json.loads(out)
    code, _, err = cli(capsys, "export", "p", "--storage", url, "--budget", "3", "-o", str(tmp_path / "a.json"))
    assert code == 0, err
    assert json.loads((tmp_path / "a.json").read_text())["mask"] == best["best_mask"]
    code, _, err = cli(capsys, "export", "p", "--storage", url, "--budget", "4", "-o", str(tmp_path / "b.json"))
    assert code == 2 and "fits budget" in err


def test_deepened_verifier_computes_the_same_function(tiny_pair):
    """benchmarks/deepen.py: every layer split into an attention layer and an MLP layer, same logits."""
    import torch
    from transformers import AutoModelForCausalLM

    from benchmarks.deepen import split_layers

    model = AutoModelForCausalLM.from_pretrained(tiny_pair.verifier, dtype=torch.float32).eval()
    deep = split_layers(model)
    assert len(deep.model.layers) == 2 * len(model.model.layers)
    ids = torch.randint(0, model.config.vocab_size, (2, 12))
    with torch.no_grad():
        torch.testing.assert_close(deep(input_ids=ids).logits, model(input_ids=ids).logits, rtol=1e-5, atol=1e-5)
        attn_only = deep.model.layers[0].mlp.down_proj.weight
        mlp_only = deep.model.layers[1].self_attn.o_proj.weight
    assert not attn_only.any() and not mlp_only.any()


def test_local_search_descends_to_the_optimum_of_a_separable_cost():
    """Swap descent on a table whose cost is a sum of per-layer costs ends at the exact optimum (the k cheapest
    layers skipped), from any start; it stops once no swap improves."""
    weights = [5.0, 0.1, 3.0, 0.2, 4.0, 0.3, 2.0, 1.0]
    budget = Budget(8, 3)
    t = sq.CostTable("sep", 8, {})
    t.score = lambda m: (sum(w for w, keep in zip(weights, m, strict=True) if not keep), 0.0)
    cost, mask, rounds = sq.local_search(t, budget, (False, False, False, True, True, True, True, True))
    assert mask == tuple(i not in (1, 3, 5) for i in range(8)) and cost == pytest.approx(0.6)
    assert 2 <= rounds <= 4  # each round fixes one layer, then one round finds no improvement


def test_reference_without_long_runs_and_the_gap_goal(tmp_path):
    """--reference-multiplier 0: the reference is the runs' best improved by swap descent, never worse than any
    run; the goal reports the share of the seed-to-reference gap dimr closed."""
    t = sq.open_table("tiny-random", SEQS, SEQ_LEN, "kl", tmp_path / "table.json")
    budget = Budget(8, 3)
    b = sq.run_budget(t, budget, ["dimr", "random"], seeds=[0], limit=6, enumerate_limit=10, log=lambda _: None,
                      multiplier=0)
    assert b["reference"]["multiplier"] == 0 and b["reference"]["local_search_rounds"] >= 1
    assert b["optimum"] <= min(c for c in b["curves"]["dimr"][0] + b["curves"]["random"][0] if c is not None)
    assert b["optimum"] >= t.enumerate(budget)[0]
    assert b["seed_best"] is not None and "closes_half_the_gap" in b["goal"]
    goal = sq.goal_check({"dimr": {"to1_median": 40, "best_after": {50: 1.5}}}, 1000, optimum=1.0, seed_best=2.0)
    assert goal["gap_closed_at_50"] == pytest.approx(0.5) and goal["closes_half_the_gap"]
    assert goal["within_1pct_in_100"] and not goal["seed_within_1pct"]


def test_outputs_default_outside_the_repository(monkeypatch, tmp_path):
    monkeypatch.setenv("DIMR_HOME", str(tmp_path))
    seen = {}
    monkeypatch.setattr(sq, "open_table", lambda *a, **k: (_ for _ in ()).throw(SystemExit(0)))
    monkeypatch.setattr(sq.argparse.ArgumentParser, "parse_args",
                        lambda self, argv=None: seen.setdefault("args", self.parse_known_args([])[0]))
    with pytest.raises(SystemExit):
        sq.main([])
    args = seen["args"]
    for path in (args.cache, args.out, args.plot):
        assert tmp_path in path.parents and Path(sq.__file__).resolve().parents[1] not in path.parents


def test_calibration_sensitivity_scores_the_seeds_and_the_reference_on_each_calibration(tmp_path, tiny_pair):
    """Every row is the mask's cost on that calibration, as an independent scorer computes it; the best mask per
    calibration is the row with the lowest cost; the markdown shows each row with its rank."""
    from dimr.calibration import load_calibration
    from dimr.pairs import load_tokenizer
    from workers import EvalSpec
    from workers.local import MaskScorer

    small = sq.open_table("tiny-random", SEQS, SEQ_LEN, "kl", tmp_path / "t.json")
    large = sq.open_table("tiny-random", 4, 32, "kl", tmp_path / "t.json")
    budget = Budget(8, 3)
    for m in heuristics.single_skip_masks(8):  # the profile, so the single-skip-rank seed is a row
        small.cost(m)
    b = sq.run_budget(small, budget, ["dimr"], seeds=[0], limit=20, enumerate_limit=100, log=lambda _: None)
    sens = sq.calibration_sensitivity(small, {"4x32": large}, b)
    names = [n for r in sens["rows"] for n in r["name"].split(" = ")]
    assert sorted(names) == sorted([n for n, _ in heuristics.seed_masks(budget, small.block_influence)]
                                   + ["single-skip-rank", "reference"])
    assert len({r["mask"] for r in sens["rows"]}) == len(sens["rows"])
    calib = load_calibration(tiny_pair.calibration, load_tokenizer(tiny_pair), 4, 32)
    scorer = MaskScorer(EvalSpec(pair=tiny_pair, input_ids=calib.input_ids, cost="kl", device="cpu"))
    for r in sens["rows"]:
        assert r["costs"]["4x32"] == pytest.approx(scorer.score(mask_from_key(r["mask"])).cost, rel=1e-6)
        assert r["costs"]["benchmark"] == small.costs[r["mask"]]
    for label in ("benchmark", "4x32"):
        assert sens["best"][label] == min(sens["rows"], key=lambda r: r["costs"][label])["name"]
    text = sq.markdown({"num_layers": 8, "limit": 20, "num_sequences": SEQS, "seq_len": SEQ_LEN,
                        "budgets": [b], "sensitivity": [sens]})
    assert "Calibration sensitivity, skip 3" in text and "(#1)" in text


def test_swap_model_fit_on_an_additive_table(tmp_path):
    """On a table whose cost is the sum of single-skip costs, the baseline alone ranks the neighbours exactly,
    and the mean with the baseline picks the cheapest one."""
    from itertools import combinations

    from benchmarks import swap_model_fit

    weights = [5.0, 0.1, 3.0, 0.2, 4.0, 0.3, 2.0, 1.0]
    costs = {}
    for k in (1, 3):
        for skipped in combinations(range(8), k):
            costs[mask_key(tuple(i not in skipped for i in range(8)))] = sum(weights[i] for i in skipped)
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"k": {"costs": costs}}))
    out = swap_model_fit.main(["--table", str(path), "--skip", "3", "--fits", "3", "--repeats", "3"])
    assert out["seed"] == mask_key(tuple(i not in (1, 3, 5) for i in range(8)))
    assert out["baseline_rho"] == pytest.approx(1.0)
    mean = next(r for r in out["rows"] if r["baseline"] and r["acquisition"] == "mean")
    assert mean["rho"] == pytest.approx(1.0, abs=1e-6)


def test_score_masks_equals_the_scorer_on_layer_and_sublayer_keys(tiny_pair, capsys):
    """A layer key scored as a sublayer key gives the layer mask's cost; each row is the search's scorer."""
    from benchmarks import score_masks
    from dimr.calibration import load_calibration
    from dimr.masks import SublayerMask
    from dimr.pairs import load_tokenizer
    from workers import EvalSpec
    from workers.local import MaskScorer

    out = score_masks.main(["--pair", "tiny-random", "--calibrations", "2x16", "11011011", "1m1a1111"])
    calib = load_calibration(tiny_pair.calibration, load_tokenizer(tiny_pair), 2, 16)
    scorer = MaskScorer(EvalSpec(pair=tiny_pair, input_ids=calib.input_ids, cost="kl", device="cpu"))
    assert out["11011011"]["2x16"]["cost"] == pytest.approx(scorer.score(mask_from_key("11011011")).cost, rel=1e-6)
    assert out["1m1a1111"]["2x16"]["cost"] == pytest.approx(
        scorer.score(SublayerMask.from_key("1m1a1111")).cost, rel=1e-6)
    assert "`1m1a1111`" in capsys.readouterr().out
