"""Tuned VIA-SD routing (`dimr tune-thresholds`, `decode --config`) and the nested ladder (two slims of one
verifier as draft and middle tier, `decode --draft-slim`), through the CLI on tiny-random and mini."""

from __future__ import annotations

import itertools
import json
import math
import os
from dataclasses import replace

import numpy as np
import pytest
from cli_runner import cli

from dimr.decoding import DecodeConfig, Decoder, Thresholds
from dimr.decoding.costs import Costs
from dimr.decoding.tuning import DecoderConfig, Point, load_decoder_config, pareto_set
from dimr.errors import DimrError

PROMPT = "def f(x):"


def slim_file(pair, mask, path, metrics=None):
    from dimr.pairs import get_pair, load_model
    from dimr.slim_config import make_slim_config

    p = get_pair(pair)
    verifier = load_model(p, "verifier", "cpu")
    cfg = make_slim_config(verifier, mask, pair=pair, verifier_id=p.verifier, cost="kl",
                           metrics=metrics or {"cost": 0.1}, calibration="test", calibration_hash="0", study="ladder")
    return cfg.save(path)


@pytest.fixture(scope="module")
def slims(tmp_path_factory):
    """tiny-random (8 layers): a light slim (6 kept) and a heavy one (3 kept)."""
    d = tmp_path_factory.mktemp("slims")
    light = slim_file("tiny-random", (1, 1, 0, 1, 1, 0, 1, 1), d / "light.json")
    heavy = slim_file("tiny-random", (1, 0, 0, 1, 0, 0, 0, 1), d / "heavy.json")
    return light, heavy


# --- the Pareto set -------------------------------------------------------------------------------------

def test_pareto_set_equals_hand_computation():
    points = [(1, 1), (2, 0), (0, 2), (1, 0.5), (2, 0), (0.5, 0.5), (1.5, 1)]
    # (1, 1) is beaten by (1.5, 1); (1, 0.5) and (0.5, 0.5) by (1.5, 1) too; the two (2, 0) tie, both stay.
    assert pareto_set(points) == [1, 2, 4, 6]
    assert pareto_set([(3.0, -1.2, 0.5), (3.0, -1.1, 0.5), (4.0, -2.0, 0.25), (2.0, -1.1, 1.0)]) == [1, 2, 3]
    assert pareto_set([]) == []
    rng = np.random.default_rng(0)  # against the definition, point by point
    values = rng.integers(0, 4, size=(40, 3)).tolist()
    brute = [i for i, p in enumerate(values)
             if not any(all(q[k] >= p[k] for k in range(3)) and q != p for q in values)]
    assert pareto_set(values) == brute


# --- tune-thresholds and decode --config -----------------------------------------------------------------

def point(accept, close=2.0, regen=2.0, tps=1.0, loglik=-1.0) -> Point:
    return Point(accept, close, regen, tps, tps, tps, loglik, 1.0, None, 0.5)


def hand_config(light, **changes) -> DecoderConfig:
    from dimr.slim_config import load_slim_config

    slim = load_slim_config(light)
    cfg = DecoderConfig(pair="tiny-random", slim_mask=slim.mask, slim_fingerprint=slim.fingerprint, gamma=3,
                        temperature=0.0, max_new_tokens=8, prompts=1, speed="predicted", default=1,
                        ar={"tokens_per_second": 1.0}, points=[point(0.0, tps=3.0), point(2.0, loglik=-0.5)])
    return replace(cfg, **changes)


def test_default_point_is_the_fastest_that_loses_nothing():
    from dimr.decoding.tuning import default_point

    ar = {"loglik": -0.30, "task_accuracy": 0.5, "same_as_ar": 1.0}
    task = [Point(0.5, 0, 0.5, 9, 9, 9, -0.70, 0.0, 0.25, 0.5),  # fastest, worse task accuracy
            Point(0.9, 0.5, 0.5, 6, 6, 6, -0.37, 0.5, 0.75, 0.8),  # better accuracy, but log-lik drops 0.07
            Point(0.9, 0.5, 0.9, 5, 5, 4, -0.305, 1.0, 0.5, 0.9),  # within 0.01 nats, same accuracy
            Point(2, 2, 2, 5, 5, 3, -0.30, 1.0, 0.5, 1.0)]
    assert default_point(task, "predicted", ar) == 2 and default_point(task, "measured", ar) in (2, 3)
    assert default_point(task[:2], "predicted", ar) == 1  # none keeps ar's quality: the best one


def test_decode_with_the_config_uses_its_thresholds(slims, tmp_path, capsys):
    light, _ = slims
    path = hand_config(light).save(tmp_path / "tuned.json")
    loaded = load_decoder_config(path)
    assert loaded == hand_config(light, created_at=loaded.created_at)  # round trip
    base = ["decode", "--pair", "tiny-random", "--slim", str(light), "--config", str(path), "--prompt", PROMPT,
            "--max-new-tokens", "10", "--ignore-eos", "--json"]
    dec = Decoder.load("tiny-random", slim=light, device="cpu")
    calls = {}
    for k, thresholds in ((0, Thresholds(0.0, 2.0, 2.0)), (1, Thresholds.never()), (None, Thresholds.never())):
        code, out, err = cli(capsys, *base, *([] if k is None else ["--point", str(k)]))
        assert code == 0, err
        got = json.loads(out)
        api = dec.run(dec.encode(PROMPT), "via", DecodeConfig(max_new_tokens=10, gamma=3, thresholds=thresholds))
        assert got["tokens"] == api.tokens and got["stats"]["gamma"] == 3
        calls[k] = got["stats"]["calls"]["full"]
    # point 0 accepts every drafted token directly (no full forward); point 1, the default, escalates all
    assert calls[0] == 0 < calls[1] == calls[None]


def test_tune_thresholds_writes_the_pareto_set(slims, tmp_path, capsys):
    light, _ = slims
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": PROMPT, "answer": 3}) + "\n" + json.dumps("import os") + "\n")
    out_file = tmp_path / "tuned.json"
    code, out, err = cli(capsys, "tune-thresholds", "--pair", "tiny-random", "--slim", str(light), "--prompts",
                         str(prompts), "--accept", "0,0.5,2", "--close", "0,2", "--regen", "0.5,2",
                         "--max-new-tokens", "8", "--gamma", "3", "--out", str(out_file), "--json")
    assert code == 0, err
    printed = json.loads(out)
    swept = [Point(**p) for p in printed["points"]]
    assert len(swept) == 12 and printed["ar"]["same_as_ar"] == 1.0
    never = next(p for p in swept if (p.accept, p.close, p.regen) == (2, 2, 2))
    assert never.same_as_ar == 1.0 and never.full_per_token > 0  # all escalated: lossless, equal to ar
    direct = next(p for p in swept if (p.accept, p.close) == (0, 2) and p.regen == 2)
    assert direct.full_per_token == 0  # accept 0: every drafted token accepted by the slim verifier
    tuned = load_decoder_config(out_file)
    assert all(p.task_accuracy is None for p in swept)  # one prompt has no answer: no task accuracy
    objectives = [[p.predicted_tokens_per_second, p.loglik, p.same_as_ar] for p in swept]  # no answer on line 2
    assert tuned.points == [swept[i] for i in pareto_set(objectives)] and tuned.gamma == 3
    assert tuned.points[tuned.default].same_as_ar == 1.0  # ar's outputs, e.g. the all-escalating point
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]


def bad_files(light, tmp_path):
    good = hand_config(light).to_dict()
    cases = {
        "not-json": "{",
        "list": "[]",
        "schema": {**good, "schema": "dimr.decoder-config/0"},
        "missing": {k: v for k, v in good.items() if k != "points"},
        "extra": {**good, "surprise": 1},
        "nan-threshold": {**good, "points": [{**good["points"][0], "accept": "nan"}]},
        "negative": {**good, "points": [{**good["points"][0], "close": -1}]},
        "bool": {**good, "gamma": True},
        "default": {**good, "default": 5},
        "no-points": {**good, "points": []},
        "point-field": {**good, "points": [{"accept": 0.5}]},
        "pair": {**good, "pair": "mini"},
        "slim": {**good, "slim_mask": "11111111"},
    }
    for name, data in cases.items():
        path = tmp_path / f"{name}.json"
        path.write_text(data if isinstance(data, str) else json.dumps(data))
        yield name, path


def test_bad_decoder_configs_are_refused(slims, tmp_path, capsys):
    light, heavy = slims
    good = hand_config(light).save(tmp_path / "good.json")
    base = ["decode", "--pair", "tiny-random", "--prompt", PROMPT, "--max-new-tokens", "2"]
    runs = [[*base, "--slim", str(light), "--config", str(path)] for _, path in bad_files(light, tmp_path)]
    runs += [[*base, "--slim", str(light), "--config", str(good), "--point", "2"],
             [*base, "--slim", str(light), "--config", str(good), "--point", "-1"],
             [*base, "--slim", str(heavy), "--config", str(good)],  # tuned for another slim
             [*base, "--config", str(good)],  # no slim
             [*base, "--slim", str(light), "--config", str(good), "--mode", "sd"],
             [*base, "--slim", str(light), "--point", "0"],
             [*base, "--slim", str(light), "--config", str(tmp_path / "absent.json")],
             [*base, "--slim", str(light), "--config", str(tmp_path)],
             ["tune-thresholds", "--pair", "tiny-random", "--slim", str(light), "--out", str(tmp_path / "x.json")],
             ["tune-thresholds", "--pair", "tiny-random", "--slim", str(light), "--prompts", str(good), "--accept",
              "0.5,x", "--out", str(tmp_path / "x.json")],
             ["tune-thresholds", "--pair", "tiny-random", "--slim", str(light), "--prompts", str(good),
              "--out", str(tmp_path / "no" / "x.json")]]
    for args in runs:
        code, out, err = cli(capsys, *args)
        assert code == 2 and err.startswith("error: ") and err.count("\n") == 1, (args, err)
        assert "Traceback" not in out + err
    assert not (tmp_path / "x.json").exists()


def test_a_failed_write_leaves_nothing(slims, tmp_path, monkeypatch):
    light, _ = slims
    target = tmp_path / "tuned.json"

    def fail(*_):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(DimrError, match="No space left"):
        hand_config(light).save(target)
    assert list(tmp_path.iterdir()) == []


# --- the ladder -----------------------------------------------------------------------------------------

def test_ladder_shares_the_verifiers_weights(slims):
    light, heavy = slims
    dec = Decoder.load("tiny-random", slim=light, draft_slim=heavy, device="cpu")
    verifier = {p.data_ptr() for p in dec.full.model.parameters()}
    for tier in (dec.draft, dec.slim):
        ptrs = {p.data_ptr() for p in tier.model.parameters()}
        assert ptrs <= verifier and len(ptrs) < len(verifier)
    assert len(dec.draft.model.model.layers) == 3 and len(dec.slim.model.model.layers) == 6


def test_auto_takes_each_slims_calibrated_acceptance_as_its_prior(tmp_path):
    """The slim config's calibration metrics (top-1 agreement when greedy, expected acceptance when sampling) seed
    auto's estimate for the pair that slim drafts in: the slim against the full verifier, and a ladder's draft
    slim against the full verifier."""
    metrics = {"cost": 0.1, "top1_agreement": 0.9, "expected_acceptance": 0.8}
    light = slim_file("tiny-random", (1, 1, 0, 1, 1, 0, 1, 1), tmp_path / "light.json", metrics)
    heavy = slim_file("tiny-random", (1, 0, 0, 1, 0, 0, 0, 1), tmp_path / "heavy.json",
                      {"cost": 0.5, "top1_agreement": 0.5, "expected_acceptance": float("nan")})
    def slims(chooser) -> dict:  # the pairs a slim config calibrated (the draft model's are measured at load)
        return {pair: m for pair, m in chooser.calibrated.items() if pair != ("draft", "slim")}

    dec = Decoder.load("tiny-random", slim=light, device="cpu")
    dec.calibrated.update({("draft", "full"): {"top1_agreement": math.nan, "expected_acceptance": math.nan},
                           ("draft", "slim"): {"top1_agreement": math.nan, "expected_acceptance": math.nan}})
    dec.costs = Costs({t: {1: 1.0, 17: 1.0} for t in ("draft", "slim", "full")}, "test")
    assert dec.auto_chooser(0.0).calibrated == {("slim", "full"): 0.9}
    assert dec.auto_chooser(0.7).calibrated == {("slim", "full"): 0.8}  # one chooser per temperature
    assert dec.auto_chooser(0).calibrated == {("slim", "full"): 0.9} and len(dec.choosers) == 2
    ladder = Decoder.load("tiny-random", slim=light, draft_slim=heavy, device="cpu")
    ladder.costs = dec.costs
    assert slims(ladder.auto_chooser(0.0)) == {("slim", "full"): 0.9, ("draft", "full"): 0.5}
    assert slims(ladder.auto_chooser(0.7)) == {("slim", "full"): 0.8}  # not measured: the plain prior
    built = dec.ladder(heavy)
    built.costs = dec.costs
    assert slims(built.auto_chooser(0.0)) == {("slim", "full"): 0.9, ("draft", "full"): 0.5}
    plain = Decoder.load("tiny-random", slim=slim_file("tiny-random", (1, 1, 0, 1, 1, 0, 1, 1), tmp_path / "p.json"),
                         device="cpu")  # a config without calibration metrics: the slim starts from the prior
    plain.costs = dec.costs
    assert ("slim", "full") not in plain.auto_chooser(0.0).calibrated
    config = DecodeConfig(max_new_tokens=12)  # and auto stays lossless with the calibrated prior
    assert dec.run(dec.encode(PROMPT), "auto", config).tokens == dec.run(dec.encode(PROMPT), "ar", config).tokens


@pytest.mark.parametrize("pair,light_mask,heavy_mask", [
    ("tiny-random", (1, 1, 0, 1, 1, 0, 1, 1), (1, 0, 0, 1, 0, 0, 0, 1)),
    ("mini", (1, 1, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1), (1, 0, 0, 0, 0, 0, 0, 1, 0, 0, 1, 1)),
])
def test_ladder_greedy_equals_ar(pair, light_mask, heavy_mask, tmp_path, capsys):
    light = slim_file(pair, light_mask, tmp_path / "light.json")
    heavy = slim_file(pair, heavy_mask, tmp_path / "heavy.json")
    base = ["decode", "--pair", pair, "--prompt", PROMPT, "--max-new-tokens", "24", "--ignore-eos", "--json"]
    code, out, err = cli(capsys, *base, "--mode", "ar")
    assert code == 0, err
    ar = json.loads(out)["tokens"]
    for gamma, window in itertools.product((1, 3), (4, 8)):
        code, out, err = cli(capsys, *base, "--mode", "hier", "--slim", str(light), "--draft-slim", str(heavy),
                             "--gamma", str(gamma), "--window", str(window))
        assert code == 0, err
        got = json.loads(out)
        assert got["tokens"] == ar, (gamma, window)
        stats = got["stats"]
        assert stats["calls"]["draft"] > 0 and stats["calls"]["full"] == stats["blocks"] < 24
        assert stats["tested"]["slim>full"][0] == stats["accepted"] and stats["tested"]["draft>slim"][1] > 0


def test_ladder_bad_input(slims, capsys):
    light, heavy = slims
    base = ["decode", "--pair", "tiny-random", "--prompt", PROMPT, "--mode", "hier"]
    for args in ([*base, "--slim", str(heavy), "--draft-slim", str(light)],  # rungs swapped
                 [*base, "--slim", str(light), "--draft-slim", str(light)],  # same rung
                 [*base, "--mode", "sd", "--draft-slim", str(heavy)]):  # no upper rung
        code, out, err = cli(capsys, *args)
        assert code == 2 and err.startswith("error: ") and err.count("\n") == 1, (args, err)


def test_bench_ladder_rows(slims):
    from dimr.decoding.bench import run_bench

    light, heavy = slims
    dec = Decoder.load("tiny-random", slim=light, device="cpu")
    ladder = dec.ladder(heavy)
    assert ladder.full.model is dec.full.model and ladder.slim.model is dec.slim.model
    report = run_bench(dec, [PROMPT], ["sd@2", "hier@2x4", "ladder@2x4"], DecodeConfig(max_new_tokens=10), hf=False,
                       warmup=False, ladder=ladder)
    rows = {r.mode: r for r in report.rows}
    assert rows["ladder@2x4"].outputs == rows["ar"].outputs == rows["hier@2x4"].outputs
    assert rows["ladder@2x4"].stats.calls["draft"] > 0 and rows["ladder@2x4"].modelled > 0
    assert ladder.costs("draft", 1) != dec.costs("draft", 1) and ladder.costs("full", 1) == dec.costs("full", 1)


def test_bench_model_speedup_is_prediction_over_prediction(tiny_pair):
    """The model column's speed-up divides a row's predicted tokens/s by ar's predicted tokens/s, as the
    measured one divides by ar's measured: the prefill both pay is in both. By hand from the forwards and the
    blocks (each priced at its mode's step work)."""
    from dimr.decoding.bench import run_bench

    dec = Decoder.load("tiny-random", device="cpu")
    dec.costs = Costs({"full": {1: 1.0, 3: 1.5, 17: 4.0, 64: 9.0}, "draft": {1: 0.25, 64: 2.0}}, "test",
                      steps={"ar": 0.01, "sd": 0.2})
    report = run_bench(dec, [PROMPT], ["sd@2"], DecodeConfig(max_new_tokens=10), hf=False, warmup=False)
    rows = {r.mode: r for r in report.rows}

    def by_hand(row) -> float:
        seconds = sum(k * dec.costs(t, n) for t, sizes in row.stats.forwards.items() for n, k in sizes.items())
        step = {"ar": 0.01, "sd@2": 0.2}[row.mode]  # the step's own work, per block
        return row.stats.tokens / (seconds + row.stats.blocks * step)

    assert rows["ar"].model_speedup == 1.0
    assert rows["sd@2"].model_speedup == pytest.approx(by_hand(rows["sd@2"]) / by_hand(rows["ar"]))
    assert rows["ar"].modelled == pytest.approx(by_hand(rows["ar"])) and rows["ar"].modelled < 1.0  # prefill


def test_bench_shuffles_the_order_the_rows_decode_in(tiny_pair, monkeypatch):
    """Each prompt of each pass is decoded by every row, in an order shuffled per prompt and pass (a decode starts
    with the weights of the one before it in the CPU's caches, and auto prices by what it measures): no row always
    follows the same row, and the rows' results do not depend on it (greedy: ar's tokens)."""
    from dimr.decoding.bench import decode_order, run_bench

    assert decode_order(3, 0) == [0, 1, 2] and decode_order(0, 4) == []
    assert decode_order(6, 5) == decode_order(6, 5) != list(range(6))  # seeded: shuffled, and alike in every run
    assert all(sorted(decode_order(5, k)) == list(range(5)) for k in range(20))
    dec = Decoder.load("tiny-random", device="cpu")
    dec.costs = Costs({t: {1: 1.0, 17: 1.8} for t in ("draft", "full")}, "test")
    order, real_run = [], Decoder.run

    def run(self, ids, mode, config, *args):
        if config.max_new_tokens == 10:  # the measured decodes, not the warm-up's 8 tokens
            order.append(mode)
        return real_run(self, ids, mode, config, *args)

    monkeypatch.setattr(Decoder, "run", run)
    prompts = [PROMPT, PROMPT + " and", PROMPT + " or"]
    report = run_bench(dec, prompts, ["sd@2", "lookup@2"], DecodeConfig(max_new_tokens=10), hf=False, warmup=False,
                       passes=2)
    per_prompt = [order[k:k + 3] for k in range(0, len(order), 3)]
    assert len(per_prompt) == 6 and all(sorted(modes) == ["ar", "lookup", "sd"] for modes in per_prompt)
    assert per_prompt[0] == ["ar", "sd", "lookup"] and len({tuple(modes) for modes in per_prompt}) > 2
    before = {mode: {order[k - 1] for k in range(1, len(order)) if order[k] == mode} for mode in ("ar", "sd", "lookup")}
    assert all(b - {mode} == {"ar", "sd", "lookup"} - {mode} for mode, b in before.items())  # after both others
    rows = {r.mode: r for r in report.rows}
    assert rows["sd@2"].outputs == rows["lookup@2"].outputs == rows["ar"].outputs


def test_bench_auto_warm_starts_every_pass_from_the_warmed_chooser(tiny_pair, monkeypatch):
    """The auto-warm row's chooser is the one that decoded the held-out prompts, copied afresh at every pass
    (what a pass learns does not reach the next); the cold auto row starts every pass without one; greedy,
    both emit ar's tokens. Without held-out prompts the row is refused in one line."""
    import copy

    from dimr.decoding import bench

    dec = Decoder.load("tiny-random", device="cpu")
    dec.costs = Costs({t: {1: 1.0, 17: 1.8} for t in ("draft", "full")}, "test")
    warmed, starts = [], []
    real_warm, real_run = bench.warm_chooser, Decoder.run

    def warm_chooser(*args):
        choosers = real_warm(*args)  # per temperature; these decodes are greedy
        warmed.append(copy.deepcopy(choosers[0.0].counts))
        return choosers

    def run(self, ids, mode, config, *args):
        if mode == "auto" and config.max_new_tokens == 10:  # the measured decodes, not the warm-up's 8 tokens
            chooser = self.choosers.get(float(config.temperature))
            starts.append(None if chooser is None else (id(chooser), copy.deepcopy(chooser.counts)))
        return real_run(self, ids, mode, config, *args)

    monkeypatch.setattr(bench, "warm_chooser", warm_chooser)
    monkeypatch.setattr(Decoder, "run", run)
    report = bench.run_bench(dec, [PROMPT], ["sd@2", "auto", bench.WARM], DecodeConfig(max_new_tokens=10),
                             hf=False, passes=2, warm=["def g(y):", "class A:"])
    assert len(warmed) == 1 and sum(sum(c) for c in warmed[0].values()) > 0  # the held-out decodes taught it
    assert len(starts) == 6  # the 2 held-out decodes, then auto and auto-warm in each of 2 passes
    # per pass, auto and auto-warm in either order (the rows' order is shuffled per prompt and pass)
    cold = [start for start in starts[2:] if start is None]
    warm = [start for start in starts[2:] if start is not None]
    assert len(cold) == 2 and all(None in starts[k:k + 2] for k in (2, 4))
    assert [counts for _, counts in warm] == [warmed[0], warmed[0]] and warm[0][0] != warm[1][0]
    rows = {r.mode: r for r in report.rows}
    assert rows[bench.WARM].outputs == rows["auto"].outputs == rows["ar"].outputs
    assert rows["auto"].arms and rows[bench.WARM].arms and not rows["sd@2"].arms  # what each auto row chose
    with pytest.raises(DimrError, match="held-out prompts"):
        bench.run_bench(dec, [PROMPT], [bench.WARM], DecodeConfig(max_new_tokens=10), hf=False, warmup=False)


def test_bench_draws_each_sampled_pass_with_its_own_seed(tiny_pair, monkeypatch):
    """Sampling, pass p decodes every row with seed + p (one sample path per pass, not one replayed by every
    pass, whose luck would be part of a row's speed); greedy, every pass keeps the seed."""
    from dimr.decoding import bench

    dec = Decoder.load("tiny-random", device="cpu")
    seen, real_run = [], Decoder.run

    def run(self, ids, mode, config, *args):
        if config.max_new_tokens == 10:  # the measured decodes, not the warm-up's 8 tokens
            result = real_run(self, ids, mode, config, *args)
            seen.append((mode, config.seed))
            return result
        return real_run(self, ids, mode, config, *args)

    monkeypatch.setattr(Decoder, "run", run)
    for temperature, seeds in ((0.7, [5, 5, 6, 6, 7, 7]), (0.0, [5] * 6)):
        seen.clear()
        bench.run_bench(dec, [PROMPT], ["sd@2"], DecodeConfig(max_new_tokens=10, temperature=temperature, seed=5),
                        hf=False, passes=3)
        assert all(sorted(m for m, _ in seen[k:k + 2]) == ["ar", "sd"] for k in (0, 2, 4))  # each pass: both rows
        assert [s for _, s in seen] == seeds
    sampled = [real_run(dec, dec.encode(PROMPT), "ar", bench.pass_config(
        DecodeConfig(max_new_tokens=10, temperature=0.7, seed=5), p)).tokens for p in range(3)]
    assert len({tuple(t) for t in sampled}) == 3  # each pass's seed draws another path


def test_auto_priors_for_the_draft_are_its_agreement_on_the_verifiers_own_continuations(tmp_path):
    """The draft model's pairs (against the full verifier and the slim), which no slim config calibrates, get
    auto's prior from the verifier's greedy continuations of calibration prompts: by hand with numpy, top-1
    agreement and 1 − TV at every continued position, each mean worth what its sequences' spread says. A decoder
    built from models knows no calibration text."""
    import torch

    from dimr.calibration import load_calibration
    from dimr.decoding.auto import calibration_worth

    light = slim_file("tiny-random", (1, 1, 0, 1, 1, 0, 1, 1), tmp_path / "light.json",
                      {"cost": 0.1, "top1_agreement": 0.9, "expected_acceptance": 0.8})
    dec = Decoder.load("tiny-random", slim=light, device="cpu")
    got = dec.calibrate_pairs(num_sequences=2, prompt_len=8, new_tokens=12)
    assert got[("slim", "full")]["top1_agreement"] == 0.9  # the slim config's own, untouched
    rates = {pair: [] for pair in (("draft", "full"), ("draft", "slim"))}  # per sequence: top-1, 1 − TV
    lengths = []
    for prompt in load_calibration(dec.calibration, dec.tokenizer, 2, 8).input_ids:
        new = dec.run(prompt, "ar", DecodeConfig(max_new_tokens=12)).tokens
        ids = torch.cat([prompt, torch.tensor(new)])
        lengths.append(len(new))
        probs = {t.name: torch.softmax(t.model(input_ids=ids[None]).logits[0, 7:-1].double(), -1).detach().numpy()
                 for t in (dec.full, dec.draft, dec.slim)}
        for (proposer, target), rows in rates.items():
            p, q = probs[target], probs[proposer]
            rows.append([np.mean(p.argmax(-1) == q.argmax(-1)), np.mean(1 - 0.5 * np.abs(p - q).sum(-1))])
    for pair, rows in rates.items():
        (top1, accept), tokens = np.mean(rows, 0), np.mean(lengths)
        assert got[pair]["top1_agreement"] == pytest.approx(top1) and got[pair]["expected_acceptance"] == pytest.approx(
            accept, abs=1e-5)
        for i, key in enumerate(("top1_agreement", "expected_acceptance")):  # what each mean is worth as a prior
            assert got[pair][key + "_worth"] == pytest.approx(calibration_worth([r[i] for r in rows], tokens), abs=1e-4)
    built = Decoder.from_models(dec.full.model, dec.draft.model, dec.slim.model, dec.tokenizer)
    assert built.calibrate_pairs() == {}
    built.calibration = str(tmp_path / "missing.txt")  # unreadable: the pairs are left to their tests
    built.costs = Costs({t: {1: 1.0, 17: 1.0} for t in ("draft", "slim", "full")}, "test")
    assert built.auto_chooser(0.0).calibrated == {} and built.calibrate_pairs().keys() == {
        ("draft", "full"), ("draft", "slim")}  # tried once: marked not measured
