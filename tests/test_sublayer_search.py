"""Sublayer searches under a cost budget, on the tiny-random pair: the budget against a hand computation, the
moves and proposers on sublayer bits, a study end to end (search → export → decode), its slim config from
disk with and without a KV cache, resume refusals, and bad input."""

from __future__ import annotations

import itertools
import json

import numpy as np
import optuna
import pytest
import torch
from cli_runner import cli
from optuna.trial import TrialState
from transformers import DynamicCache

from dimr.decoding.costs import Costs
from dimr.masks import CostBudget, SublayerMask, sublayer_to_bits
from dimr.pairs import get_pair, load_model, verifier_config
from dimr.search.budget import flops_budget, measured_budget
from dimr.search.heuristics import profile_seed
from dimr.search.settings import PROFILE_ATTR
from dimr.slim_config import SCHEMA_SUBLAYER, apply_slim_config, load_slim_config
from storage import open_storage

SMALL = ["--num-sequences", "2", "--seq-len", "16"]
MAX_COST = 0.7


def hand_flops_fraction(config, key: str, context: int) -> float:
    """FLOPs per token of sublayer mask ``key`` over the full model's, written out from the formulas."""
    h, q, kv = config.hidden_size, config.num_attention_heads, config.num_key_value_heads
    d = getattr(config, "head_dim", None) or h // q
    attn = 2 * h * d * (2 * q + 2 * kv) + 4 * q * d * context
    mlp = 2 * 3 * h * config.intermediate_size
    head = 2 * h * config.vocab_size
    runs = np.array([[c in "1a", c in "1m"] for c in key], dtype=float)
    return (head + runs[:, 0].sum() * attn + runs[:, 1].sum() * mlp) / (head + len(key) * (attn + mlp))


def test_flops_budget_admits_by_a_hand_computed_cost():
    config = verifier_config(get_pair("tiny-random"))
    budget = flops_budget(config, MAX_COST, context=16)
    rng = np.random.default_rng(0)
    admitted = 0
    for _ in range(200):
        key = "".join(rng.choice(list("1am0"), size=8))
        bits = sublayer_to_bits(SublayerMask.from_key(key))
        want = hand_flops_fraction(config, key, 16)
        assert budget.cost(bits) == pytest.approx(want, rel=1e-12)
        runs_attention = any(c in "1a" for c in key)
        assert budget.admits(bits) == (want <= MAX_COST and runs_attention), key
        admitted += budget.admits(bits)
    assert 0 < admitted < 200  # both sides of the budget were tried


def test_measured_budget_and_count_against_enumeration():
    # 8 layers: attention 2 ms, MLP 3 ms, the rest 10 ms: a mask running p attentions and r MLPs costs
    # (10 + 2p + 3r) / 50 of the full forward.
    costs = Costs({"full": {1: 0.05}}, sublayers={"pair": "tiny-random", "layers": 8, "attention": {1: 0.002},
                                                   "mlp": {1: 0.003}, "fixed": {1: 0.010}})
    budget = measured_budget(Costs.from_dict(json.loads(json.dumps(costs.to_dict()))), "tiny-random", 8, 0.6)
    assert "measured" in budget.source
    fits = 0
    for bits in itertools.product((False, True), repeat=16):
        p, r = sum(bits[0::2]), sum(bits[1::2])
        assert budget.cost(bits) == pytest.approx((10 + 2 * p + 3 * r) / 50)
        fits += (10 + 2 * p + 3 * r) / 50 <= 0.6 + 1e-12 and p > 0
    assert budget.count() == fits and budget.all_masks(10 ** 6) is not None and len(budget.all_masks(10 ** 6)) == fits
    from dimr.errors import DimrError

    with pytest.raises(DimrError, match="measured on pair"):
        measured_budget(costs, "mini", 12, 0.6)
    with pytest.raises(DimrError, match="no attention/MLP measurement"):
        measured_budget(Costs({"full": {1: 0.05}}), "tiny-random", 8, 0.6)


def test_moves_random_and_projection_stay_within_the_budget():
    budget = flops_budget(verifier_config(get_pair("tiny-random")), MAX_COST, context=16)
    rng = np.random.default_rng(1)
    for _ in range(30):
        mask = budget.random(rng)
        assert budget.admits(mask)
        moves = budget.moves(mask, rng)
        assert moves and all(budget.admits(m) and m != mask for m in moves)
        assert budget.admits(budget.neighbour(mask, rng))
        assert budget.admits(budget.project(tuple(rng.random(16) < 0.5), rng))
    assert budget.admits(budget.project((False,) * 16, rng))  # no attention at all: one is run again


@pytest.mark.parametrize("sampler", ["swap", "tpe", "random"])
def test_proposers_propose_admitted_sublayer_masks(sampler):
    from dimr.search.driver import new_trial
    from dimr.search.proposers import make_proposer
    from dimr.search.sampler import BudgetSampler

    budget = flops_budget(verifier_config(get_pair("tiny-random")), MAX_COST, context=16)
    s = BudgetSampler(budget, make_proposer(sampler, 0, 2), startup=2, seed=0)
    study = optuna.create_study(sampler=s)
    seen: set = set()
    s.is_taken = lambda m: m in seen  # the driver's ledger
    for number in range(14):
        s.system_attrs = {}  # where a wrapped Optuna sampler writes, as the driver sets it around one ask
        params = s.propose(study, [new_trial(number)])[0]
        mask = budget.from_params(params)
        assert set(params) == set(budget.space()) and budget.admits(mask) and mask not in seen
        seen.add(mask)
        cost = float(budget.cost(mask) + 0.01 * sum(mask[0::2]))  # any deterministic cost
        study.add_trial(optuna.trial.create_trial(params=params, distributions=budget.space(), value=cost))
    assert s.phase(13) == ("random" if sampler == "random" else "bayes")


@pytest.fixture(scope="module")
def sublayer_study(tmp_path_factory):
    d = tmp_path_factory.mktemp("sublayer")
    return f"sqlite:///{d / 's.db'}", d


def test_sublayer_study_end_to_end(capsys, sublayer_study):
    url, d = sublayer_study
    code, out, err = cli(capsys, "search", "--pair", "tiny-random", "--granularity", "sublayer", "--max-cost",
                         str(MAX_COST), "--trials", "10", *SMALL, "--storage", url, "--study", "sub", "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["complete"] == 10
    study = optuna.load_study(study_name="sub", storage=open_storage(url))
    settings = study.user_attrs["dimr_settings"]
    assert settings["granularity"] == "sublayer" and settings["max_cost"] == MAX_COST
    assert settings["cost_model"] == "FLOPs at context 16"
    budget = CostBudget(8, MAX_COST, tuple(settings["cost_weights"]), settings["cost_fixed"], settings["cost_model"])
    trials = study.get_trials(states=(TrialState.COMPLETE,))
    keys = [t.user_attrs["mask"] for t in trials]
    assert len(set(keys)) == len(keys), "a mask was evaluated twice"
    config = verifier_config(get_pair("tiny-random"))
    for key in keys:
        assert hand_flops_fraction(config, key, 16) <= MAX_COST + 1e-12
        assert budget.admits(budget.from_key(key))
    heuristics = {t.user_attrs.get("heuristic") for t in trials if t.user_attrs["phase"] == "seed"}
    assert "sublayer-influence" in heuristics and any(h.startswith("layer:") for h in heuristics)
    # the single-skip profile: one cost per attention and MLP, and its seed among the trials
    profile = study.user_attrs[PROFILE_ATTR]
    assert len(profile) == 16 and result["profiled"] == 16
    assert budget.key(profile_seed(budget, profile)) in keys
    assert any(set(k) & {"a", "m"} for k in keys)

    # export: the best trial's sublayer mask, checked strictly on load
    slim = d / "slim.json"
    code, out, err = cli(capsys, "export", "sub", "--storage", url, "-o", str(slim), "--json")
    assert code == 0, err
    cfg = load_slim_config(slim)
    best = min(trials, key=lambda t: t.value)
    assert cfg.mask == best.user_attrs["mask"] and cfg.metrics["cost"] == best.value
    assert cfg.metrics["cost_fraction"] == pytest.approx(hand_flops_fraction(config, cfg.mask, 16))
    assert set(cfg.mask) & {"a", "m"}, "the tiny study's best mask runs some layer in part (it does, seeded)"
    assert cfg.schema == SCHEMA_SUBLAYER and cfg.kept_layers == [i for i, c in enumerate(cfg.mask) if c != "0"]

    # decode: greedy self-speculation with the sublayer slim drafting reproduces greedy autoregressive decoding
    texts = {}
    for mode in ("ar", "self"):
        code, out, err = cli(capsys, "decode", "--pair", "tiny-random", "--slim", str(slim), "--mode", mode,
                             "--prompt", "the cat", "--max-new-tokens", "12", "--ignore-eos", "--json")
        assert code == 0, err
        texts[mode] = json.loads(out)["tokens"]
    assert texts["self"] == texts["ar"] and len(texts["ar"]) == 12

    # --format hf cannot express a sublayer slim: one line, exit 2, nothing written
    code, out, err = cli(capsys, "export", "sub", "--storage", url, "--format", "hf", "-o", str(d / "hf"))
    assert code == 2 and err.count("\n") == 1 and "whole-layer slims only" in err and not (d / "hf").exists()

    code, out, err = cli(capsys, "report", "sub", "--storage", url, "-o", str(d / "r.html"))
    assert code == 2 and err.count("\n") == 1 and "sublayer" in err and not (d / "r.html").exists()

    # resume with the same settings: two more masks, none evaluated twice
    code, out, err = cli(capsys, "search", "--pair", "tiny-random", "--granularity", "sublayer", "--max-cost",
                         str(MAX_COST), "--trials", "12", *SMALL, "--storage", url, "--study", "sub", "--json")
    assert code == 0 and json.loads(out)["complete"] == 12 and json.loads(out)["evaluated"] == 2, err
    assert json.loads(out)["profiled"] == 0  # the study keeps its profile
    study = optuna.load_study(study_name="sub", storage=open_storage(url))
    keys = [t.user_attrs["mask"] for t in study.get_trials(states=(TrialState.COMPLETE,))]
    assert len(set(keys)) == 12

    # resume with another budget or granularity: refused in one line before anything is written
    for extra, needle in ((["--granularity", "sublayer", "--max-cost", "0.6"], "max_cost"),
                          (["--budget", "2"], "granularity")):
        code, out, err = cli(capsys, "search", "--pair", "tiny-random", *extra, "--trials", "12", *SMALL,
                             "--storage", url, "--study", "sub")
        assert code == 2 and err.count("\n") == 1 and needle in err, err
    assert len(optuna.load_study(study_name="sub", storage=open_storage(url)).trials) == len(study.trials)


@torch.no_grad()
def test_sublayer_slim_config_from_disk_cached_equals_uncached(tmp_path):
    from dimr.slim_config import make_slim_config

    pair = get_pair("tiny-random")
    verifier = load_model(pair, "verifier", "cpu")
    for key in ("m1a11a0a", "1a0m11am"):
        cfg = make_slim_config(verifier, SublayerMask.from_key(key), pair="tiny-random", verifier_id=pair.verifier,
                               cost="kl", metrics={"cost": 0.5}, calibration="test", calibration_hash="0")
        path = cfg.save(tmp_path / f"{key}.json")
        assert json.loads(path.read_text())["schema"] == SCHEMA_SUBLAYER
        slim = apply_slim_config(load_slim_config(path), verifier)
        assert slim.config.dimr_mask == key and slim.config.num_hidden_layers == sum(c in "1a" for c in key)
        ids = torch.randint(3, 200, (1, 10), generator=torch.Generator().manual_seed(0))
        whole = slim(ids).logits
        cache = DynamicCache(config=slim.config)
        steps = torch.cat([slim(ids[:, :4], cache=cache, use_cache=True).logits]
                          + [slim(ids[:, t:t + 1], cache=cache, use_cache=True).logits for t in range(4, 10)], 1)
        torch.testing.assert_close(steps, whole, rtol=1e-4, atol=1e-5)
        assert not torch.allclose(whole, verifier(ids).logits)


@pytest.mark.parametrize(("args", "needle"), [
    (["--granularity", "blocks", "--max-cost", "0.7"], "--granularity"),
    (["--granularity", "sublayer", "--max-cost", "0"], "outside (0, 1)"),
    (["--granularity", "sublayer", "--max-cost", "1"], "outside (0, 1)"),
    (["--granularity", "sublayer", "--max-cost", "1.5"], "outside (0, 1)"),
    (["--granularity", "sublayer", "--max-cost", "nan"], "outside (0, 1)"),
    (["--granularity", "sublayer", "--max-cost", "abc"], "--max-cost"),
    (["--granularity", "sublayer"], "needs --max-cost"),
    (["--granularity", "sublayer", "--budget", "3", "--max-cost", "0.7"], "--budget counts whole layers"),
    (["--budget", "3", "--max-cost", "0.7"], "add --granularity sublayer"),
    (["--granularity", "sublayer", "--max-cost", "0.7", "--objective", "pareto"], "pareto"),
    (["--granularity", "sublayer", "--max-cost", "0.001"], "only 0 sublayer masks fit"),
])
def test_bad_sublayer_input_one_line_exit_2(capsys, tmp_path, args, needle):
    db = tmp_path / "new.db"
    code, out, err = cli(capsys, "search", "--pair", "tiny-random", "--trials", "6", *SMALL, *args,
                         "--storage", f"sqlite:///{db}")
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], err
    assert "Traceback" not in err and not db.exists()


def test_cost_table_for_another_pair_or_without_sublayers_refused(capsys, tmp_path):
    other = tmp_path / "other.json"
    other.write_text(json.dumps(Costs({"full": {1: 0.05}}, sublayers={
        "pair": "mini", "layers": 12, "attention": {1: 1e-3}, "mlp": {1: 1e-3}, "fixed": {1: 1e-3}}).to_dict()))
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps(Costs({"full": {1: 0.05}}).to_dict()))
    for table, needle in ((other, "measured on pair 'mini'"), (plain, "no attention/MLP measurement")):
        code, _, err = cli(capsys, "search", "--pair", "tiny-random", "--granularity", "sublayer", "--max-cost",
                           "0.7", "--costs", str(table), "--trials", "4", *SMALL, "--storage",
                           f"sqlite:///{tmp_path / 'x.db'}")
        assert code == 2 and err.count("\n") == 1 and needle in err, err
    assert not (tmp_path / "x.db").exists()


def test_measured_search_records_its_cost_model(capsys, tmp_path):
    table = tmp_path / "costs.json"
    table.write_text(json.dumps(Costs({"full": {1: 0.05}}, sublayers={
        "pair": "tiny-random", "layers": 8, "attention": {1: 0.002}, "mlp": {1: 0.003},
        "fixed": {1: 0.010}}).to_dict()))
    url = f"sqlite:///{tmp_path / 'm.db'}"
    code, out, err = cli(capsys, "search", "--pair", "tiny-random", "--granularity", "sublayer", "--max-cost",
                         "0.6", "--costs", str(table), "--trials", "5", *SMALL, "--storage", url, "--json")
    assert code == 0, err
    study = optuna.load_study(study_name=json.loads(out)["study"], storage=open_storage(url))
    settings = study.user_attrs["dimr_settings"]
    assert settings["cost_model"].startswith("measured 1-token forward")
    for t in study.get_trials(states=(TrialState.COMPLETE,)):
        key = t.user_attrs["mask"]
        p, r = sum(c in "1a" for c in key), sum(c in "1m" for c in key)
        assert (10 + 2 * p + 3 * r) / 50 <= 0.6 + 1e-12
