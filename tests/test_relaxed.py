"""Relaxed verification rules: π distributions against independent numpy, "off" = lossless, acceptance theory.

Numpy references are written from the methods' published formulas, not from the torch code. Decoder-level checks
use real (tiny, seeded) Llama models built from configs, greedy and sampled.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from dimr.decoding import DecodeConfig, Decoder, verify
from dimr.decoding.sampling import Sampler
from dimr.relaxed import (
    METHODS,
    Cactus,
    Cascade,
    Contrastive,
    Diversed,
    EnsembleHead,
    Fly,
    Fuzzy,
    Mentored,
    Recorder,
    StaticEnsemble,
    make_rule,
)
from dimr.relaxed.base import acceptance_probs
from dimr.relaxed.mentored import mentor, mentor_for_budget
from dimr.relaxed.predict import expected_accepted_length
from dimr.slim import slim_verifier

V = 12


def random_block(seed: int, n: int = 3, v: int = V, temperature: float = 1.0):
    """Random logits → (draft_probs [n, V], full_probs [n+1, V], Context) as the decoder would build them."""
    g = torch.Generator().manual_seed(seed)
    draft_logits = torch.randn(n, v, generator=g, dtype=torch.float64) * 2
    full_logits = torch.randn(n + 1, v, generator=g, dtype=torch.float64) * 2
    full_logits[:n] += draft_logits * 0.5  # related, as a draft and a target are
    sampler = Sampler(temperature)
    draft_probs, full_probs = sampler.probs(draft_logits), sampler.probs(full_logits)
    tokens = torch.multinomial(draft_probs, 1, generator=g)[:, 0]
    h_draft, h_full = torch.randn(n, 5, generator=g), torch.randn(n + 1, 7, generator=g)
    ctx = verify.Context(tokens, draft_logits.float(), full_logits.float(), sampler, h_draft, h_full)
    return draft_probs.float(), full_probs.float(), ctx


def softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def np_kl(p, q):
    m = p > 0
    return float((p[m] * (np.log(p[m]) - np.log(np.maximum(q[m], 1e-300)))).sum())


def np_js(p, q):
    m = 0.5 * (p + q)
    return 0.5 * np_kl(p, m) + 0.5 * np_kl(q, m)


# --- π against numpy ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(5))
def test_pi_against_numpy(seed: int):
    dp, fp, ctx = random_block(seed)
    pd, pt, x = dp.double().numpy(), fp.double().numpy(), ctx.tokens.numpy()
    own_d, own_t = softmax(ctx.draft_logits.double().numpy()), softmax(ctx.full_logits.double().numpy())
    n = len(x)

    t = StaticEnsemble(0.3)(dp, fp, ctx)
    np.testing.assert_allclose(t.rej.numpy(), 0.3 * pt[:n] + 0.7 * pd, atol=1e-6)
    np.testing.assert_allclose(t.bonus.numpy(), pt[n], atol=1e-7)

    delta = 0.7
    t = Cactus(delta)(dp, fp, ctx)
    for i in range(n):
        q = pt[i, x[i]]
        h = min(1.0, q + math.sqrt(2 * delta * q * (1 - q)))
        expected = pt[i] * (1 - h) / (1 - q)
        expected[x[i]] = h
        np.testing.assert_allclose(t.res[i].numpy(), expected, atol=1e-6)
        assert t.rej[i, x[i]].item() == pytest.approx(h, abs=1e-6)
        np.testing.assert_allclose(t.res[i].sum().item(), 1.0, atol=1e-6)

    t = Fuzzy(0.2, "js")(dp, fp, ctx)
    for i in range(n):
        passes = np_js(own_d[i], own_t[i]) <= 0.2
        np.testing.assert_allclose(t.rej[i].numpy(), pd[i] if passes else 0 * pd[i], atol=1e-7)
        np.testing.assert_allclose(np.maximum(t.res[i].numpy() - pd[i], 0), pt[i], atol=1e-6)

    for rule, alpha in (("chow", 0.4), ("diff", 0.1), ("opt", 0.5), ("token", 0.2)):
        t = Cascade(alpha, rule)(dp, fp, ctx)
        for i in range(n):
            md, mt = own_d[i].max(), own_t[i].max()
            tvd = 0.5 * np.abs(own_d[i] - own_t[i]).sum()
            if rule == "token":
                keep = own_t[i] >= mt - alpha
                expected = pd[i] * keep + (1 - (pd[i] * keep).sum()) * pt[i]
            else:
                use = {"chow": md >= 1 - alpha, "diff": md >= mt - alpha, "opt": md >= mt - alpha * tvd}[rule]
                expected = pd[i] if use else pt[i]
            np.testing.assert_allclose(t.rej[i].numpy(), expected, atol=1e-6, err_msg=rule)
            np.testing.assert_allclose(t.res[i].numpy(), expected, atol=1e-6, err_msg=rule)

    beta, alpha = 0.5, 0.1
    t = Contrastive(beta, alpha)(dp, fp, ctx)
    for i in range(n):
        lt, ld = np.log(own_t[i]), np.log(own_d[i])
        score = np.where(own_t[i] >= alpha * own_t[i].max(), (1 + beta) * lt - beta * ld, -np.inf)
        np.testing.assert_allclose(t.rej[i].numpy(), softmax(score), atol=1e-5)
    np.testing.assert_allclose(t.bonus.numpy(), pt[n], atol=1e-7)

    head = EnsembleHead(5, 7)
    torch.nn.init.normal_(head.linear.weight, generator=torch.Generator().manual_seed(seed))
    t = Diversed(head, shift=0.5)(dp, fp, ctx)
    wts, b = head.linear.weight.detach().double().numpy(), head.linear.bias.detach().double().numpy()
    z = np.concatenate([ctx.h_draft.double().numpy(), ctx.h_full[:n].double().numpy()], -1) @ wts.T + b
    w = softmax(z + np.array([0.5, 0.0]))[:, 0]
    np.testing.assert_allclose(t.res.numpy(), w[:, None] * pt[:n] + (1 - w[:, None]) * pd, atol=1e-5)


def np_mentor(pt, pd, alpha):
    """π for one row by bisection on β (independent of the closed form in dimr.relaxed.mentored)."""
    r = np.where(pd > 0, pt / np.maximum(pd, 1e-300), np.inf)

    def pi(beta):
        return np.where(r <= alpha, pt / alpha, np.where(r < beta, pd, pt / beta))

    lo, hi = alpha, 1e6
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if pi(mid).sum() > 1 else (lo, mid)
    return pi(hi)


@pytest.mark.parametrize("seed", range(4))
def test_mentor_against_numpy(seed: int):
    dp, fp, _ = random_block(seed)
    fp = fp[:-1]
    for alpha in (0.2, 0.5, 0.9):
        got = mentor(fp.double(), dp.double(), torch.full((dp.shape[0],), alpha, dtype=torch.float64))
        for i in range(dp.shape[0]):
            np.testing.assert_allclose(got[i].numpy(), np_mentor(fp[i].double().numpy(), dp[i].double().numpy(),
                                                                 alpha), atol=1e-6)
    for budget in (0.02, 0.1):
        pi = mentor_for_budget(fp.double(), dp.double(), budget)
        for i in range(dp.shape[0]):
            p, q = fp[i].double().numpy(), pi[i].numpy()
            assert q.sum() == pytest.approx(1.0, abs=1e-6)
            if np_kl(p, dp[i].double().numpy()) > budget:
                assert np_kl(p, q) == pytest.approx(budget, abs=2e-3)


def test_fly_relaxes_only_unsure_mismatches_followed_by_matches():
    dp, fp, ctx = random_block(0, n=5, temperature=0.0)
    argmax = ctx.full_logits[:5].argmax(-1)
    tokens = argmax.clone()
    tokens[1] = (argmax[1] + 1) % V  # one mismatch, then matches
    flat = ctx.full_logits.clone()
    flat[1] = 0.0  # the target is unsure at the mismatch (uniform: top-3 entropy ln 3)
    ctx = ctx._replace(tokens=tokens, full_logits=flat)
    full_probs = Sampler(0.0).probs(flat)
    draft_probs = torch.nn.functional.one_hot(tokens, V).float()
    relaxed = Fly(theta=1.0, window=3)(draft_probs, full_probs, ctx)
    assert acceptance_probs(draft_probs, relaxed).tolist() == [1.0] * 5
    strict = Fly(theta=1.0, window=5)(draft_probs, full_probs, ctx)  # the window does not fit after position 1
    assert acceptance_probs(draft_probs, strict)[1].item() == 0.0
    sure = Fly(theta=1.2, window=3)(draft_probs, full_probs, ctx)  # ln 3 < 1.2: not unsure enough
    assert acceptance_probs(draft_probs, sure)[1].item() == 0.0


# --- "off" is lossless --------------------------------------------------------------------------------

def off_rules(head: EnsembleHead) -> dict[str, verify.TargetsFn]:
    rules = {}
    for name, m in METHODS.items():
        if name != "lossless":
            rules[name] = m.build(head, **{m.param: m.off}) if m.needs_head else m.build(**{m.param: m.off})
    rules["contrastive"] = Contrastive(beta=0.0, alpha=0.0)
    return rules


def chi_square_p(counts: np.ndarray, probs: np.ndarray) -> float:
    expected = probs * counts.sum()
    keep = expected >= 5
    obs = np.append(counts[keep], counts[~keep].sum())
    exp = np.append(expected[keep], expected[~keep].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    return float(chisquare(obs, exp * obs.sum() / exp.sum()).pvalue)


def first_token_law(rule, dp, fp, ctx, runs: int, seed: int = 0) -> np.ndarray:
    """Counts of the first emitted token of one block (drafted token resampled from the draft each run)."""
    g = torch.Generator().manual_seed(seed)
    counts = np.zeros(dp.shape[-1])
    for _ in range(runs):
        x = torch.multinomial(dp[0], 1, generator=g)
        c = ctx._replace(tokens=x, draft_logits=ctx.draft_logits[:1], full_logits=ctx.full_logits[:2],
                         h_draft=ctx.h_draft[:1], h_full=ctx.h_full[:2])
        n, token, _ = verify.accept(dp[:1], x, rule(dp[:1], fp[:2], c), g)
        counts[int(x) if n else int(token)] += 1
    return counts


def test_off_reproduces_the_full_verifier_in_distribution():
    dp, fp, ctx = random_block(11, n=1)
    head = EnsembleHead(5, 7)
    for name, rule in off_rules(head).items():
        counts = first_token_law(rule, dp, fp, ctx, runs=3000)
        assert chi_square_p(counts, fp[0].double().numpy()) > 1e-3, name
    # the same test fails for a relaxed rule: it has power
    counts = first_token_law(StaticEnsemble(0.2), dp, fp, ctx, runs=3000)
    assert chi_square_p(counts, fp[0].double().numpy()) < 1e-6
    # ... and the relaxed rule's output law is its ensemble π (speculative sampling against π samples π)
    nu = (0.2 * fp[0] + 0.8 * dp[0]).double().numpy()
    assert chi_square_p(counts, nu / nu.sum()) > 1e-3


def tiny_models(seed: int = 0, vocab: int = 64):
    """A 4-layer verifier with peaked heads and a 1-layer draft that shares its first layer (real Llama models)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    def config(layers: int) -> LlamaConfig:
        return LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                           bos_token_id=0, eos_token_id=1, pad_token_id=2)

    torch.manual_seed(seed)
    verifier = LlamaForCausalLM(config(4)).eval()
    with torch.no_grad():
        verifier.lm_head.weight.mul_(30.0 / verifier.lm_head.weight.norm(dim=-1, keepdim=True).mean())
    draft = LlamaForCausalLM(config(1)).eval()
    draft.load_state_dict(verifier.state_dict(), strict=False)
    return verifier, draft


@pytest.fixture(scope="module")
def decoder() -> Decoder:
    verifier, draft = tiny_models()
    return Decoder.from_models(verifier, draft, slim_verifier(verifier, (True, False, True, True)))


PROMPT = torch.tensor([0, 5, 9, 17, 33, 4])


@pytest.mark.parametrize("mode", ["sd", "via"])
def test_off_reproduces_lossless_greedy_exactly(decoder: Decoder, mode: str):
    config = DecodeConfig(max_new_tokens=40, gamma=4, temperature=0.0)
    reference = decoder.run(PROMPT, mode, config).tokens  # via is lossy by design (slim routing): compare with it
    if mode == "sd":
        assert reference == decoder.run(PROMPT, "ar", config).tokens
    head = EnsembleHead(32, 32)
    for name, rule in off_rules(head).items():
        assert decoder.run(PROMPT, mode, config, rule).tokens == reference, name
    # greedy relaxed rules do change the output (the comparison has power)
    changed = [decoder.run(PROMPT, mode, config, rule).tokens != reference
               for rule in (StaticEnsemble(0.0), Cascade(1.0), Fuzzy(10.0))]
    assert all(changed)


def test_via_applies_the_rule_where_the_full_verifier_decides(decoder: Decoder):
    config = DecodeConfig(max_new_tokens=40, gamma=4, temperature=1.0, seed=3)
    recorder = Recorder(StaticEnsemble(0.0))  # accept whatever reaches the full verifier
    stats = decoder.run(PROMPT, "via", config, recorder).stats
    assert stats.calls["full"] == len(recorder.betas) > 0  # called once per escalation, never otherwise
    assert stats.escalated == 0  # the full verifier never had to write a token itself


def test_recorder_times_the_rule_it_wraps(decoder: Decoder):
    """The recorder's seconds are the wrapped rule's own: a rule that waits 5 ms a call adds at least that."""
    import time

    def slow(draft_probs, full_probs, context):
        time.sleep(0.005)
        return verify.lossless(draft_probs, full_probs, context)

    config = DecodeConfig(max_new_tokens=12, gamma=3, temperature=1.0, seed=0)
    fast, waits = Recorder(verify.lossless), Recorder(slow)
    assert decoder.run(PROMPT, "sd", config, waits).tokens == decoder.run(PROMPT, "sd", config, fast).tokens
    assert len(waits.betas) == len(fast.betas) > 0
    assert waits.seconds >= 0.005 * len(waits.betas) and fast.seconds > 0
    waits.reset()
    assert (waits.seconds, waits.betas) == (0.0, [])


def test_diversed_needs_and_gets_hidden_states(decoder: Decoder):
    head = EnsembleHead(32, 32)
    seen = []

    class Spy(Diversed):
        def weights(self, context):
            seen.append((context.h_draft.shape, context.h_full.shape, context.tokens.shape))
            return super().weights(context)

    config = DecodeConfig(max_new_tokens=12, gamma=3, temperature=1.0)
    decoder.run(PROMPT, "sd", config, Spy(head))
    assert seen and all(hd[0] == t[0] and hf[0] == t[0] + 1 for hd, hf, t in seen)
    assert decoder.full.hidden is not None
    decoder.run(PROMPT, "sd", config)  # a lossless run switches hidden states off again
    assert decoder.full.hidden is None


# --- acceptance theory ---------------------------------------------------------------------------------

@pytest.mark.parametrize("w", [1.0, 0.7, 0.3])
def test_static_acceptance_is_one_minus_w_tv(w: float):
    dp, fp, ctx = random_block(5, n=1)
    tv = 0.5 * (dp[0] - fp[0]).abs().sum().item()
    g = torch.Generator().manual_seed(1)
    runs, accepted = 4000, 0
    targets = StaticEnsemble(w)(dp, fp, ctx)
    for _ in range(runs):
        x = torch.multinomial(dp[0], 1, generator=g)
        accepted += verify.accept(dp, x, targets, g).n_accepted
    expected = 1 - w * tv
    assert acceptance_probs(dp, targets).item() == pytest.approx(expected, abs=1e-5)
    sigma = math.sqrt(expected * (1 - expected) / runs)
    assert abs(accepted / runs - expected) < 4 * sigma + 1e-9


def test_static_acceptance_in_the_decoder(decoder: Decoder):
    """Measured acceptance over real sampled decoding vs the recorded β = 1 − w·TV of the same blocks."""
    for w in (1.0, 0.5):
        recorder = Recorder(StaticEnsemble(w))
        stats = decoder.run(PROMPT, "sd", DecodeConfig(max_new_tokens=400, gamma=1, temperature=1.0, seed=7),
                            recorder).stats
        beta = recorder.predicted_acceptance  # γ = 1: every block tests exactly one token
        tested = stats.accepted + stats.rejected
        assert tested == len(recorder.betas)
        sigma = math.sqrt(beta * (1 - beta) / tested)
        assert abs(stats.accepted / tested - beta) < 4 * sigma + 0.01


def test_expected_accepted_length_position_dependent():
    dp, fp, ctx = random_block(8, n=4)
    rule = StaticEnsemble(0.6)
    targets = rule(dp, fp, ctx)
    g = torch.Generator().manual_seed(2)
    runs, total = 4000, 0
    betas = []
    for _ in range(runs):  # drafted tokens resampled from fixed per-position draft distributions
        x = torch.multinomial(dp, 1, generator=g)[:, 0]
        total += verify.accept(dp, x, targets, g).n_accepted
    betas = acceptance_probs(dp, targets)
    predicted = expected_accepted_length(betas)
    iid = float(betas.mean()) * (1 - float(betas.mean()) ** 4) / (1 - float(betas.mean()))
    assert abs(total / runs - predicted) < 0.06
    assert predicted == pytest.approx(sum(float(torch.prod(betas[:k + 1])) for k in range(4)))
    assert predicted != pytest.approx(iid, abs=1e-3)


def test_make_rule_parses_and_rejects():
    from dimr.errors import DimrError

    assert make_rule("cascade", {"alpha": "0.3", "rule": "chow"}) == Cascade(0.3, "chow")
    assert make_rule("fly", {"theta": "inf", "window": "2"}) == Fly(math.inf, 2)
    assert make_rule("mentored", {"budget": "0.1"}) == Mentored(0.1)
    for bad in (("static", {"v": "1"}), ("static", {"w": "x"}), ("nope", {}), ("diversed", {}),
                ("fuzzy", {"divergence": "xx"})):
        with pytest.raises(DimrError):
            make_rule(*bad)
