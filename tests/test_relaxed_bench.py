"""bench-relaxed on any pair: the rambling metric on hand-made texts, the intervals against scipy, the pair's own
workloads, relaxed rules on the n-gram drafter (one-hot p_d) against numpy, the cost-model column, transfer."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from cli_runner import cli
from scipy import stats
from test_relaxed import chi_square_p, decoder, first_token_law, np_js, np_mentor, off_rules  # noqa: F401

from dimr.decoding import DecodeConfig, Decoder, verify
from dimr.decoding.costs import Costs
from dimr.decoding.sampling import Sampler
from dimr.errors import DimrError
from dimr.relaxed import METHODS, Cactus, Cascade, Contrastive, Diversed, EnsembleHead, Fuzzy, StaticEnsemble
from dimr.relaxed import bench as rb
from dimr.relaxed import workloads as rw
from dimr.relaxed.base import acceptance_probs
from dimr.relaxed.mentored import mentor, mentor_for_budget
from dimr.relaxed.metrics import mean_interval, ratio_interval, repetition
from dimr.relaxed.transfer import parse_transfer, transfers

# --- the rambling metric -----------------------------------------------------------------------------------


def test_repetition_on_hand_made_texts():
    loop = "I think that I think that I think that I think that".split()
    # 4-grams: 9, distinct: 3 ("I think that I", "think that I think", "that I think that") → 1 − 3/9
    assert repetition(loop) == pytest.approx(1 - 3 / 9)
    clean = "the quick brown fox jumps over the lazy dog and runs far away".split()  # "the" repeats, no 4-gram
    assert repetition(clean) == 0.0
    assert repetition([7] * 50) == pytest.approx(1 - 1 / 47)  # one token forever → approaches 1
    assert repetition([]) == 0.0 and repetition([1, 2, 3]) == 0.0  # shorter than one 4-gram
    assert repetition([1, 2, 3, 4]) == 0.0  # exactly one 4-gram: nothing earlier to repeat
    assert repetition([1, 2, 1, 2, 1], n=2) == pytest.approx(1 - 2 / 4)  # (1,2),(2,1),(1,2),(2,1)
    assert repetition("abcabc", n=3) == pytest.approx(1 - 3 / 4)  # works on any sequence (characters)
    assert repetition(loop[:8]) == pytest.approx(1 - 3 / 5)  # the longer the loop, the higher the rate


# --- 95% intervals -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(3))
def test_mean_interval_equals_scipy(seed: int):
    x = np.random.default_rng(seed).normal(2.0, 1.5, size=12 + seed * 10)
    lo, hi = mean_interval(x.tolist())
    ref = stats.ttest_1samp(x, 0.0).confidence_interval(0.95)
    assert (lo, hi) == pytest.approx((ref.low, ref.high), rel=1e-12)
    ref = stats.t.interval(0.9, len(x) - 1, loc=x.mean(), scale=stats.sem(x))
    assert mean_interval(x.tolist(), 0.9) == pytest.approx(ref, rel=1e-12)
    acc = [1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0, 1.0]  # a 0/1 metric (exact match)
    ref = stats.ttest_1samp(acc, 0.0).confidence_interval(0.95)
    assert mean_interval(acc) == pytest.approx((ref.low, ref.high), rel=1e-12)
    assert mean_interval([3.0, math.nan, 5.0]) == pytest.approx(mean_interval([3.0, 5.0]))  # NaN = no value
    assert mean_interval([4.0]) == (4.0, 4.0) and all(math.isnan(v) for v in mean_interval([]))


def test_ratio_interval_identities():
    rng = np.random.default_rng(0)
    a = rng.uniform(1, 3, size=20)
    # equal denominators: the ratio of sums is the mean of a/b, and the interval is its t-interval
    ref = stats.ttest_1samp(a / 2.0, 0.0).confidence_interval(0.95)
    assert ratio_interval(a, np.full(20, 2.0)) == pytest.approx((ref.low, ref.high), rel=1e-10)
    # proportional pairs: no spread around the ratio → a zero-width interval at Σa/Σb
    b = rng.uniform(1, 3, size=20)
    lo, hi = ratio_interval(3 * b, b)
    assert lo == pytest.approx(3.0) and hi == pytest.approx(3.0)
    lo, hi = ratio_interval(a, b)
    assert lo < a.sum() / b.sum() < hi
    # the delta-method variance, written out: Var(R) ≈ Σ(a − R b)² / ((n − 1) n b̄²)
    r = a.sum() / b.sum()
    half = stats.t.ppf(0.975, 19) * np.sqrt(((a - r * b) ** 2).sum() / 19 / 20) / b.mean()
    assert (lo, hi) == pytest.approx((r - half, r + half), rel=1e-10)


# --- the pair's own workloads ------------------------------------------------------------------------------


def test_smollm2_workloads_come_from_its_shipped_data():
    assert rw.workloads_for("smollm2") == ("instruct", "task", "code")
    assert rw.workloads_for("mini") == rw.workloads_for("tiny-random") == ("arithmetic", "code")
    instruct, task, code = (rw.load_workload(w, pair="smollm2") for w in rw.workloads_for("smollm2"))
    for w in (instruct, task, code):
        assert len(w.prompts) >= 40 and len(set(w.prompts)) == len(w.prompts)
    assert all(p.startswith("<|im_start|>system\n") and p.endswith("<|im_start|>assistant\n") for p in instruct.prompts)
    assert all(p.startswith("<|im_start|>") for p in task.prompts) and all(isinstance(a, int) for a in task.answers)
    assert not any("<|im_start|>" in p for p in code.prompts)  # raw code continuation
    held = {json.loads(line)["text"] for line in (rw_data() / "heldout_code.jsonl").read_text().splitlines()}
    assert all(any(p in text for text in held) for p in code.prompts)  # pieces of held-out files
    assert (instruct.metric, task.metric, code.metric) == ("loglik", "exact", "loglik")
    check = rw.checker(task)
    assert check("4 + 5 = 9. So Omar has 9 cookies.", 9) == 1.0 and check("#### 8", 9) == 0.0
    assert math.isnan(rw.checker(instruct)("anything", None))
    mini = rw.load_workload("arithmetic", 5, pair="mini")
    assert len(mini.prompts) == 5 and mini.metric == "exact"
    with pytest.raises(DimrError, match="has the workloads arithmetic, code"):
        rw.check_workloads("mini", ["instruct"])


def rw_data():
    from dimr.zoo import DATA_DIR

    return DATA_DIR


# --- relaxed rules on the n-gram drafter: a one-hot, deterministic proposal ---------------------------------


def one_hot_block(seed: int, n: int = 3, v: int = 12):
    """The n-gram proposer's block: p_d = δ_x (logits log δ_x), the verifier's p_t from random logits."""
    g = torch.Generator().manual_seed(seed)
    full_logits = torch.randn(n + 1, v, generator=g, dtype=torch.float64) * 2
    tokens = torch.randint(0, v, (n,), generator=g)
    draft_probs = torch.nn.functional.one_hot(tokens, v).float()
    sampler = Sampler(1.0)
    ctx = verify.Context(tokens, draft_probs.log(), full_logits.float(), sampler, torch.zeros(n, 5),
                         torch.zeros(n + 1, 7))  # no hidden states are read: placeholders for first_token_law
    return draft_probs, sampler.probs(full_logits).float(), ctx


@pytest.mark.parametrize("seed", range(4))
def test_rules_on_a_one_hot_draft_against_numpy(seed: int):
    dp, fp, ctx = one_hot_block(seed)
    pt, x = fp.double().numpy(), ctx.tokens.numpy()
    n = len(x)
    q = pt[np.arange(n), x]  # p_t of the drafted tokens
    beta = lambda rule: acceptance_probs(dp, rule(dp, fp, ctx)).double().numpy()  # noqa: E731

    # static: accept x with w·p_t(x) + 1 − w = 1 − w·TV(δ_x, p_t); residual ∝ p_t off x
    t = StaticEnsemble(0.3)(dp, fp, ctx)
    np.testing.assert_allclose(beta(StaticEnsemble(0.3)), 1 - 0.3 * (1 - q), atol=1e-6)
    for i in range(n):
        res = np.maximum(t.res[i].double().numpy() - dp[i].double().numpy(), 0)
        expected = pt[i].copy()
        expected[x[i]] = 0
        np.testing.assert_allclose(res / res.sum(), expected / expected.sum(), atol=1e-6)
    # cactus: accept x with h(x) = min(1, q + √(2δq(1 − q)))
    np.testing.assert_allclose(beta(Cactus(0.5)), np.minimum(1, q + np.sqrt(2 * 0.5 * q * (1 - q))), atol=1e-6)
    # mentored: the mentor for a one-hot draft (ratio +inf off x) against the numpy bisection
    for alpha in (0.3, 0.8):
        got = mentor(fp[:-1].double(), dp.double(), torch.full((n,), alpha, dtype=torch.float64))
        for i in range(n):
            np.testing.assert_allclose(got[i].numpy(), np_mentor(pt[i], dp[i].double().numpy(), alpha), atol=1e-6)
    pi = mentor_for_budget(fp[:-1].double(), dp.double(), 0.1)
    np.testing.assert_allclose(pi.sum(-1).numpy(), 1.0, atol=1e-6)
    assert (pi[torch.arange(n), ctx.tokens].numpy() >= q - 1e-9).all()  # mass moves towards the drafted token
    # fuzzy: JS(δ_x, p_t) ≤ T, deterministic
    t = Fuzzy(0.3)(dp, fp, ctx)
    for i in range(n):
        passes = np_js(dp[i].double().numpy(), pt[i]) <= 0.3
        assert t.rej[i, x[i]].item() == (1.0 if passes else 0.0)
    # cascade (token rule): accepted outright if x is plausible for the verifier, else with p_t(x)
    np.testing.assert_allclose(beta(Cascade(0.2)), np.where(pt[np.arange(n), x] >= pt[:n].max(-1) - 0.2, 1.0, q),
                               atol=1e-6)


def test_a_one_hot_draft_keeps_lossless_and_relaxed_laws():
    dp, fp, ctx = one_hot_block(5, n=1)
    for name, rule in off_rules(EnsembleHead(5, 7)).items():
        if METHODS[name].ngram:
            continue
        counts = first_token_law(rule, dp, fp, ctx, runs=3000)
        assert chi_square_p(counts, fp[0].double().numpy()) > 1e-3, name
    counts = first_token_law(StaticEnsemble(0.3), dp, fp, ctx, runs=3000)
    nu = (0.3 * fp[0] + 0.7 * dp[0]).double().numpy()  # the output law is the ensemble π
    assert chi_square_p(counts, nu) > 1e-3 and chi_square_p(counts, fp[0].double().numpy()) < 1e-6


PROMPT = torch.tensor([0, 5, 9, 17, 33, 4, 5, 9, 17])


def test_lookup_with_relaxed_rules(decoder: Decoder):  # noqa: F811
    config = DecodeConfig(max_new_tokens=40, gamma=4, temperature=0.0)
    reference = decoder.run(PROMPT, "lookup", config)
    assert reference.tokens == decoder.run(PROMPT, "ar", config).tokens and reference.stats.drafted > 0
    for name, rule in off_rules(EnsembleHead(32, 32)).items():
        if METHODS[name].ngram:
            with pytest.raises(DimrError, match="n-gram proposer"):
                decoder.run(PROMPT, "lookup", config, rule)
        else:
            assert decoder.run(PROMPT, "lookup", config, rule).tokens == reference.tokens, name
    relaxed = decoder.run(PROMPT, "lookup", config, StaticEnsemble(0.0))  # accept every n-gram draft
    assert relaxed.tokens != reference.tokens and relaxed.stats.rejected == 0
    with pytest.raises(DimrError, match="n-gram proposer"):
        decoder.run(PROMPT, "lookup", config, Diversed(EnsembleHead(32, 32), shift=0.0))
    assert {n for n, m in METHODS.items() if m.ngram} == {"diversed", "contrastive"}
    assert Contrastive.needs_draft_model


# --- the bench: cost-model column, intervals, drafters ---------------------------------------------------


def test_bench_rows_wire_the_cost_model_and_intervals(tiny_pair):
    dec = Decoder.load("tiny-random")
    works = [rw.load_workload("arithmetic", 3, 10, pair="tiny-random")]
    steps = {"ar": 0.002, "sd": 0.004, "lookup": 0.003}  # step work per block, measured at γ = 2
    costs = Costs({"full": {1: 0.05, 17: 0.05}, "draft": {1: 0.01, 17: 0.01}}, "flat", steps=steps)
    config = DecodeConfig(temperature=1.0, seed=0)
    rows = rb.run_bench(dec, works, ["static", "contrastive"], config, gammas=(3,), full_grid_gamma=3, points=1,
                        drafters=("model", "ngram"), costs=costs, session="s1")
    ar = rows[0]
    assert ar.mode == "ar" and {(r.drafter, r.method) for r in rows[1:]} == {
        ("model", "static"), ("model", "contrastive"), ("ngram", "static")}
    assert {r.session for r in rows} == {"s1"}
    seconds = lambda s: s.calls["full"] * 0.05 + s.calls["draft"] * 0.01  # noqa: E731  (flat costs)

    def by_hand(r) -> float:  # forwards + step work per verified token (γ + 1 = 4 of the 3 measured) + the rule's
        step = r.stats.blocks * steps[r.mode] * (1 if r.mode == "ar" else 4 / 3)
        if r.mode == "ar":
            return r.tokens / (seconds(r.stats) + step)
        # the rule's work: its time inside the decode less lossless verification's
        return r.tokens / (seconds(r.stats) + step + r.rule_work)

    assert ar.cost_rate == pytest.approx(by_hand(ar))
    for r in rows[1:]:
        assert r.rule_seconds >= 0 and math.isfinite(r.rule_seconds)
        # the speed-up is end to end (shorter answers save their time): so is its prediction
        # every block verifies once, an n-gram block without a match too (nothing drafted)
        assert (r.verifications, r.drafts_verified) == (r.stats.blocks, r.stats.drafted)
        assert r.rule_seconds_empty >= 0 and (r.drafter == "ngram" or r.rule_seconds_empty == 0)
        assert r.rule_seconds_decode > 0 and 0 <= r.rule_work <= r.rule_seconds_decode * r.verifications
        assert r.cost_speedup == pytest.approx((ar.tokens / by_hand(ar)) / (r.tokens / by_hand(r)))
        assert r.speedup == pytest.approx(sum(ar.per_prompt["seconds"]) / sum(r.per_prompt["seconds"]))
        assert r.speedup_ci == pytest.approx(ratio_interval(ar.per_prompt["seconds"], r.per_prompt["seconds"]))
        assert r.quality_ci == pytest.approx(mean_interval(r.per_prompt["quality"]))
        assert r.output_length_ci == pytest.approx(mean_interval(r.per_prompt["length"]))
        assert r.repetition == pytest.approx(np.mean([repetition(o) for o in r.outputs]))
    for r in rows:  # the forwards' CPU time over the table's price for them; the speed-up at ar's machine speed
        assert r.forward_ratio == pytest.approx(sum(r.stats.cpu_seconds_tier.values()) / seconds(r.stats))
        assert r.speedup_steady == pytest.approx(r.speedup * r.forward_ratio / ar.forward_ratio)
    assert all(r.stats.calls["draft"] == 0 for r in rows if r.drafter == "ngram" and r.mode != "ar")
    assert "skipped: contrastive" not in "\n".join(rb.skipped(["static"], ["ngram"], None))
    assert any("contrastive with the n-gram drafter" in s for s in rb.skipped(["contrastive"], ["ngram"], None))


def test_rule_seconds_times_the_rule_on_the_pairs_sizes(tiny_pair):
    """The rule's own work is timed on distributions of the pair's vocabulary and hidden states of its sizes."""
    dec = Decoder.load("tiny-random")
    seen = []

    def rule(draft_probs, full_probs, context):
        seen.append((*draft_probs.shape, *full_probs.shape, *context.h_draft.shape, *context.h_full.shape))
        return verify.lossless(draft_probs, full_probs, context)

    seconds = rb.rule_seconds(rule, dec, 3, 0.7, reps=2)
    v, hd, hf = dec.vocab_size, dec.draft.model.config.hidden_size, dec.full.model.config.hidden_size
    assert seen == [(3, v, 4, v, 3, hd, 4, hf)] * 2 and 0 < seconds < math.inf
    drafts = []
    rb.rule_seconds(lambda d, f, c: drafts.append(d) or verify.lossless(d, f, c), dec, 3, 0.7, reps=1, one_hot=True)
    assert drafts[0].max(-1).values.tolist() == [1.0] * 3 and drafts[0].sum().item() == 3  # the n-gram draft's kind
    rb.rule_seconds(lambda d, f, c: drafts.append(d) or verify.lossless(d, f, c), dec, 0, 0.7, reps=1, one_hot=True)
    assert drafts[1].shape == (0, v)  # a verification of an n-gram block without a match


def test_the_grid_runs_at_the_best_lossless_gamma(tiny_pair):
    dec = Decoder.load("tiny-random")
    works = [rw.load_workload("code", 2, 8, pair="tiny-random")]
    rows = rb.run_bench(dec, works, ["static", "fuzzy"], DecodeConfig(temperature=1.0), gammas=(2, 4),
                        full_grid_gamma=None, points=1, gamma_methods=["static"],
                        costs=Costs({"full": {1: 0.05}, "draft": {1: 0.01}}))
    lossless = {r.gamma: r for r in rows if r.method == "static" and r.value == 1.0}
    best = max(lossless, key=lambda g: lossless[g].speed)  # the steady speed-up, as the grid picks it
    assert set(lossless) == {2, 4} and len(rows) == len({(r.gamma, r.method, r.value) for r in rows})  # no rerun
    assert {r.gamma for r in rows if r.method == "static" and r.value != 1.0} == {2, 4}
    assert {r.gamma for r in rows if r.method == "fuzzy"} == {best}  # fuzzy is not in gamma_methods
    assert len([r for r in rows if r.method == "static" and r.gamma == best]) == 4  # off + 3 grid points


def test_cli_bench_drafters_transfer_and_bad_input(capsys, tmp_path, tiny_pair):
    rows = tmp_path / "rows.json"
    code, out, err = cli(capsys, "bench-relaxed", "--pair", "tiny-random", "--methods", "static,fly,contrastive",
                         "--drafter", "model,ngram", "--gammas", "3", "--sweep-gamma", "3", "--grid-points", "1",
                         "--prompts", "2", "--tokens", "6", "--transfer", "arithmetic:code", "--json-out", str(rows))
    assert code == 0, err
    assert "skipped: contrastive with the n-gram drafter" in out and "transfer (tuned" in out
    data = json.loads(rows.read_text())
    assert {r["workload"] for r in data["rows"]} == {"arithmetic", "code"}
    assert {r["drafter"] for r in data["rows"] if r["mode"] != "ar"} == {"model", "ngram"}
    assert len(data["meta"]["transfer"]) >= 2 and data["meta"]["workloads"]["code"]["prompts"] == 2
    loaded, _ = rb.load_rows(rows)
    assert loaded[1].speedup_ci == pytest.approx(tuple(data["rows"][1]["speedup_ci"]))
    for args, msg in ((("--workloads", "instruct"), "has the workloads arithmetic, code"),
                      (("--drafter", "eagle"), "--drafter takes"),
                      (("--transfer", "arithmetic:arithmetic"), "SOURCE:TARGET"),
                      (("--prompts", "-1"), "must be 0"),
                      (("--sweep-gamma", "fast"), "--sweep-gamma")):
        code, _, err = cli(capsys, "bench-relaxed", "--pair", "tiny-random", *args)
        assert code == 2 and msg in err and "Traceback" not in err, args


def test_an_interrupted_bench_resumes_where_it_stopped(capsys, tmp_path, tiny_pair, monkeypatch):
    args = ("bench-relaxed", "--pair", "tiny-random", "--methods", "static", "--gammas", "3", "--sweep-gamma", "3",
            "--grid-points", "1", "--prompts", "2", "--tokens", "6", "--temperature", "1")
    whole, part = tmp_path / "whole.json", tmp_path / "part.json"
    assert cli(capsys, *args, "--json-out", str(whole))[0] == 0
    reference = {rb.point_key(r): r for r in rb.load_rows(whole)[0]}
    real, calls = rb.run_one, []

    def counted(*a, **k):
        calls.append(a[3])
        if len(calls) == limit:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(rb, "run_one", counted)
    limit = 4
    code, _, err = cli(capsys, *args, "--json-out", str(part))
    assert code == 130 and "interrupted: 3 rows in" in err and "--resume" in err
    first = rb.load_rows(part)[0]
    same = lambda r: (r.workload, "ar") if r.mode == "ar" else rb.point_key(r)  # noqa: E731  (ar: any process)
    assert len(first) == 3 and {same(r) for r in first} < {same(r) for r in reference.values()}
    before = part.read_bytes()
    for extra, msg in (((), "exists: add --resume"), (("--resume", "--temperature", "0.5"), "temperature 1.0"),
                       (("--resume", "--tokens", "5"), "max new tokens on arithmetic")):
        code, _, err = cli(capsys, *args, *extra, "--json-out", str(part))
        assert code == 2 and msg in err and "Traceback" not in err, extra
    assert part.read_bytes() == before  # refused runs leave the saved rows as they were
    limit, calls[:] = 0, []
    code, out, err = cli(capsys, *args, "--json-out", str(part), "--resume")
    assert code == 0, err
    # only the missing points ran, against an ar of their own process (a resumed run may be on another machine),
    # and the begun workload's lossless point again, as this process's reference for its new points at that γ
    begun = first[0].workload  # the interrupted run's only workload: its ar is decoded again
    assert len(calls) == len(reference) - 3 + 2 and calls[0] == "ar" and out.count("(kept)") == 3
    assert calls[1] == "sd" and sum(c == "sd" for c in calls) == len(calls) - sum(c == "ar" for c in calls)
    rows = rb.load_rows(part)[0]
    old_ar, new_ar = [r for r in rows if r.mode == "ar" and r.workload == begun]
    assert old_ar.session != new_ar.session and {r.session for r in first} == {old_ar.session}
    ars = {(r.workload, r.session): r for r in rows if r.mode == "ar"}
    for r in rows:
        if r.mode != "ar":
            assert r.speedup == pytest.approx(ars[(r.workload, r.session)].seconds / r.seconds)
    assert sum(r.session == new_ar.session for r in rows) == len(reference) - 3 + 2
    off = {r.session: r for r in rows if r.workload == begun and r.mode != "ar" and r.method == "static"
           and r.value == 1.0}
    assert set(off) == {old_ar.session, new_ar.session}  # the lossless point, once per session
    for r in rows:  # the new session's rows are compared through its own lossless row, at the old one's speed
        if r.mode == "ar":
            continue
        if r.workload == begun and r.session == new_ar.session:
            assert r.rebase == pytest.approx(off[old_ar.session].speedup_steady / off[new_ar.session].speedup_steady)
            assert r.speed == pytest.approx(r.speedup_steady * r.rebase)
        else:
            assert r.rebase == 1.0 and r.speed == r.speedup_steady
    assert off[new_ar.session].speed == pytest.approx(off[old_ar.session].speed)
    tables = rb.load_rows(part)[1]["tables"]  # each process priced its rows on a table it measured, step work too
    assert set(tables) == {old_ar.session, new_ar.session} and all(t["steps"]["sd"] > 0 for t in tables.values())
    resumed = {same(r): r for r in rows}
    assert set(resumed) == {same(r) for r in reference.values()}
    for r in reference.values():  # same seeds: the same decodes, whichever run made them
        got = resumed[same(r)]
        assert (got.quality, got.loglik, got.output_length) == pytest.approx(
            (r.quality, r.loglik, r.output_length), nan_ok=True), same(r)
    missing = tmp_path / "missing.json"
    for extra, msg in ((("--resume",), "--resume continues the rows of --json-out"),
                       (("--resume", "--json-out", str(missing)), "does not exist; drop --resume")):
        code, _, err = cli(capsys, *args, *extra)
        assert code == 2 and msg in err, extra
    assert not missing.exists()


def test_static_line_gap_interpolates_the_reference_line():
    rows = [_row("task", "ar", math.nan, 1.0, 0.50), _row("task", "static", 1.0, 0.8, 0.50),
            _row("task", "static", 0.6, 1.2, 0.40), _row("task", "static", 0.0, 2.0, 0.00),
            _row("task", "diversed", 0.0, 1.0, 0.50), _row("task", "diversed", -2.0, 1.6, 0.10),
            _row("task", "fuzzy", 0.2, 2.5, 0.20), _row("task", "fuzzy", -1.0, 0.8, 0.50)]
    gaps = {(r.method, r.value): g for r, g in rb.static_line_gap(rows)}
    # 1.0 lies between (0.8, 0.50) and (1.2, 0.40): the line is at 0.45; 1.6 between (1.2, 0.4) and (2.0, 0.0): 0.2
    assert gaps[("diversed", 0.0)] == pytest.approx(0.05) and gaps[("diversed", -2.0)] == pytest.approx(-0.10)
    assert math.isnan(gaps[("fuzzy", 0.2)])  # faster than the whole line: no reference
    assert ("fuzzy", -1.0) not in gaps  # the off value is lossless, not a relaxed point
    other = _row("task", "diversed", 0.0, 1.0, 0.5)
    other.gamma = 3  # another γ has no static line here
    assert math.isnan(rb.static_line_gap(rows[:4] + [other])[0][1])


# --- transfer ---------------------------------------------------------------------------------------------


def _row(workload: str, method: str, value: float, speedup: float, quality: float, metric: str = "exact"):
    mode = "ar" if method == "ar" else "sd"
    return rb.Row(workload, method, METHODS[method].param if method != "ar" else "", value, 5, mode, metric=metric,
                  speedup=speedup, quality=quality)


def test_derive_compares_each_row_with_the_ar_of_its_own_process():
    """The cost model predicts the end-to-end speed-up (ar's predicted time over the row's), and the steady
    speed-up takes the machine's drift out (× the row's forward ratio / its ar's), each against its own ar."""
    def row(method, session, tokens, cost_rate, forward_ratio, speedup=1.0):
        r = _row("task", method, math.nan if method == "ar" else 1.0, speedup, 0.5)
        r.session, r.tokens, r.cost_rate, r.forward_ratio = session, tokens, cost_rate, forward_ratio
        return r

    rows = rb.derive([row("ar", "a", 600, 10.0, 1.1), row("ar", "b", 600, 12.0, 0.9),
                      row("static", "a", 500, 15.0, 1.3, 1.2), row("static", "b", 400, 18.0, math.nan, 1.4)])
    a, b = rows[2], rows[3]
    assert a.cost_speedup == pytest.approx((600 / 10.0) / (500 / 15.0))  # = 1.8: 1.5× the rate, 5/6 the tokens
    assert b.cost_speedup == pytest.approx((600 / 12.0) / (400 / 18.0))
    assert a.speedup_steady == pytest.approx(1.2 * 1.3 / 1.1)  # it ran on a slower machine than its ar
    assert b.speedup_steady == 1.4  # no forward ratio: the measured speed-up
    assert rows[0].speedup_steady == rows[1].speedup_steady == 1.0


def test_transfer_tunes_on_one_workload_and_reports_the_loss_on_another():
    rows = [_row("task", "ar", math.nan, 1.0, 0.50), _row("task", "static", 1.0, 1.1, 0.50),
            _row("task", "static", 0.6, 1.4, 0.47), _row("task", "static", 0.2, 1.8, 0.30),
            _row("instruct", "ar", math.nan, 1.0, -1.00, "loglik"),
            _row("instruct", "static", 1.0, 1.1, -1.00, "loglik"),
            _row("instruct", "static", 0.6, 1.3, -1.40, "loglik"),
            _row("instruct", "static", 0.2, 1.6, -2.00, "loglik")]
    (t,) = transfers(rows, "task", "instruct")
    # on task, w = 0.6 is the fastest within 0.05 accuracy of ar; on instruct it loses 0.4 nats per token
    assert (t.tuned, t.source_speedup, t.target_speedup) == (0.6, 1.4, 1.3)
    assert t.lost == pytest.approx(0.4) and not t.holds
    assert t.target_best == 1.0 and t.target_best_speedup == 1.1  # only lossless qualifies there
    (back,) = transfers(rows, "instruct", "task")
    assert back.tuned == 1.0 and back.lost == pytest.approx(0.0) and back.holds
    assert parse_transfer("all", ["task", "instruct"]) == [("task", "instruct"), ("instruct", "task")]
    with pytest.raises(DimrError, match="SOURCE:TARGET"):
        parse_transfer("task-instruct", ["task", "instruct"])


def test_token_types():
    from dimr.relaxed.diversed import token_type

    assert [token_type(t) for t in ("42", " 7", ".", " ,", "!?", " hello", "Omar", "\n", " ", "x2", "'s")] == [
        "digits", "digits", "punctuation", "punctuation", "punctuation", "words", "words", "space", "space",
        "other", "other"]
    assert token_type("<|im_end|>", special=True) == "special"


# --- the claims' evidence ------------------------------------------------------------------------------------


def test_claim_evidence_on_hand_made_rows():
    from dimr.relaxed import claims

    def row(method, value, gamma, speedup, quality, drafter="model", length=50.0, rep=0.02, acc=0.3):
        r = _row("task", method, value, speedup, quality)
        r.gamma, r.drafter, r.output_length, r.repetition, r.acceptance = gamma, drafter, length, rep, acc
        return r

    ar = row("ar", math.nan, 5, 1.0, 0.50)
    rows = [ar, row("static", 1.0, 2, 0.8, 0.50, acc=0.2), row("static", 1.0, 3, 0.6, 0.50),
            row("static", 0.6, 2, 1.2, 0.47), row("static", 0.0, 2, 2.0, 0.00, length=80.0, rep=0.5),
            row("diversed", 0.0, 2, 1.0, 0.50, acc=0.35), row("cactus", 0.5, 2, 0.9, 0.49),
            row("cactus", 1.0, 2, 0.7, 0.30), row("cactus", 3.0, 2, 1.1, 0.50, rep=0.3),
            row("static", 1.0, 2, 0.9, 0.50, "ngram"), row("fuzzy", 0.2, 2, 1.5, 0.10, "ngram")]
    assert claims.useful(rows, rows[3]) and not claims.useful(rows, rows[4])  # 0.47 ≥ 0.5 − 0.05; 0.0 is not
    assert not claims.useful(rows, rows[7])  # slower than lossless at its γ
    assert not claims.useful(rows, rows[8])  # faster, ar's quality, but repeated 4-grams 0.3 against ar's 0.02
    ev = claims.evidence(rows)
    assert set(ev) == set(claims.CLAIMS)
    assert ev["gamma"] == ["task/model: lossless 0.60× (γ=3) → 0.80× (γ=2): γ gains 1.33×; the fastest useful "
                           "relaxed point, γ=2 static w=0.6 1.20×, is 1.50× the best lossless γ"]
    # model draft: static w=0 and cactus δ=1 lose capability (2 of 6 relaxed points); w=0 (80 > 1.3·50) and
    # cactus δ=3 (rep4 0.3 > 0.02 + 0.15) collapse
    assert ev["ramble"][0].startswith("model draft: 2/6 relaxed points lose capability, 2/6 flagged")
    assert ev["ramble"][1].startswith("ngram draft: 1/1 relaxed points lose capability, 0/1")
    assert ev["controlled"][0] == ("task/model cactus: γ=2 cactus delta=0.5 0.90×, lost +0.010; γ=2 cactus "
                                   "delta=1 0.70×, lost +0.200; γ=2 cactus delta=3 1.10×, lost +0.000 (1/3 useful; "
                                   "1 more keep the quality but loop)")  # δ = 0.5: faster, within 0.05
    # the diversed point at 1.0× sits between (0.8, 0.50) and (1.2, 0.47): the line is at 0.485
    assert ev["diversed"] == ["task/model γ=2 diversed shift=0: 1.00×, +0.015 against the static line"]
    assert ev["acceptance"] == ["task γ=2 diversed shift=0: acceptance 0.35 (lossless 0.20); static static w=0.6 "
                                "at 1.20×: 0.30"]
    assert ev["transfer"] == [] and ev["contrastive"] == []


def test_gamma_claim_puts_each_points_gain_from_gamma_beside_its_gain_from_relaxing():
    from dimr.relaxed import claims

    def row(method, value, gamma, speedup, quality):
        r = _row("task", method, value, speedup, quality)
        r.gamma, r.drafter, r.output_length, r.repetition = gamma, "model", 50.0, 0.02
        return r

    rows = [row("ar", math.nan, 5, 1.0, 0.50), row("static", 1.0, 2, 0.8, 0.50), row("static", 1.0, 3, 0.6, 0.50),
            row("cactus", 1.0, 2, 1.0, 0.50), row("cactus", 1.0, 3, 0.5, 0.50),  # slower than lossless at γ=3
            row("cactus", 3.0, 2, 1.2, 0.50)]  # one γ only: no line
    per = claims.gamma_per_method(rows)
    # fastest at γ=2 (useful: 1.0 > 0.8, quality kept), 1.0 / 0.5 = 2×; over lossless at γ=2: 1.0 / 0.8
    assert per == ["task/model cactus delta=1: γ=2 1.00×*, γ=3 0.50×: γ gains 2.00×, relaxing gains 1.25× over "
                   "lossless at γ=2"]
    assert claims.evidence(rows)["gamma"][1:] == per


def test_redo_decodes_a_group_again_in_this_process(capsys, tmp_path, tiny_pair):
    """--redo W:D drops the kept rows of that (workload, drafter) and decodes them again beside this process's
    ar, so that the group's rows come from one process; other groups stay as they were."""
    args = ("bench-relaxed", "--pair", "tiny-random", "--methods", "static", "--drafter", "model,ngram",
            "--gammas", "3", "--sweep-gamma", "3", "--grid-points", "1", "--prompts", "2", "--tokens", "6",
            "--temperature", "1")
    out = tmp_path / "rows.json"
    assert cli(capsys, *args, "--json-out", str(out))[0] == 0
    before = rb.load_rows(out)[0]
    work = before[0].workload
    for extra, msg in ((("--redo", f"{work}:model"), "add --resume"),
                       (("--resume", "--redo", "nope:model"), "give WORKLOAD:DRAFTER"),
                       (("--resume", "--redo", f"{work}:lookup"), "give WORKLOAD:DRAFTER")):
        code, _, err = cli(capsys, *args, *extra, "--json-out", str(out))
        assert code == 2 and msg in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, extra
    assert [rb.point_key(r) for r in rb.load_rows(out)[0]] == [rb.point_key(r) for r in before]  # refused: untouched
    code, _, err = cli(capsys, *args, "--resume", "--redo", f"{work}:ngram", "--json-out", str(out))
    assert code == 0, err
    after = rb.load_rows(out)[0]
    old = {r.session for r in before}
    redone = [r for r in after if r.mode != "ar" and (r.workload, r.drafter) == (work, "ngram")]
    kept = [r for r in after if r.mode != "ar" and (r.workload, r.drafter) != (work, "ngram")]
    assert len(redone) == len([r for r in before if r.mode != "ar" and (r.workload, r.drafter) == (work, "ngram")])
    assert len(kept) == len([r for r in before if r.mode != "ar"]) - len(redone) > 0
    assert {r.session for r in redone}.isdisjoint(old) and {r.session for r in kept} <= old
    new_ar = [r for r in after if r.mode == "ar" and r.session not in old]
    assert [r.workload for r in new_ar] == [work] and {r.session for r in redone} == {new_ar[0].session}
