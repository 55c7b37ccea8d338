"""Sampled speculative decoding reproduces the verifier's distribution; a broken acceptance rule does not.

Exact references come from independent computations: numpy for the acceptance step, and for the decoder the
exact joint distribution of the first two tokens from plain (uncached) forwards of the verifier.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch
from scipy.stats import chisquare
from test_decoding import build_pair

from dimr.decoding import DecodeConfig, modes, verify
from dimr.decoding.proposer import ModelProposer, NgramProposer
from dimr.decoding.sampling import Sampler, sample, top_p_filter
from dimr.decoding.tiers import Tier

P_PASS = 1e-3  # a correct sampler fails with probability 1e-3 per test (deterministic here: fixed seeds)
RUNS = 600


def broken_accept(draft_probs, tokens, targets, generator) -> verify.Verdict:
    """A classic bug: after a rejection, sample from the target itself instead of the residual (target − draft)+."""
    n, _, bonus = verify.accept(draft_probs, tokens, targets, generator)
    if bonus:
        return verify.Verdict(n, sample(targets.bonus, generator), True)
    return verify.Verdict(n, sample(targets.res[n], generator), False)


def chi_square_p(observed: np.ndarray, expected_probs: np.ndarray) -> float:
    """Pearson chi-square p-value; cells expecting fewer than 5 counts are pooled into one."""
    observed, expected = observed.ravel(), expected_probs.ravel() * observed.sum()
    small = expected < 5
    obs = np.append(observed[~small], observed[small].sum())
    exp = np.append(expected[~small], expected[small].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    return float(chisquare(obs, exp * obs.sum() / exp.sum()).pvalue)


# --- the acceptance step alone, against numpy ---------------------------------------------------------

def test_accept_step_exact_law_is_the_target():
    """The exact law of `verify.accept`'s token at one position, composed from the two pieces it draws with
    (accept x with `verify.acceptance`, else sample the normalised `verify.residual`), is the target q
    (an identity checked in numpy); a residual that forgets to subtract the draft is not."""
    rng = np.random.default_rng(0)
    for _ in range(20):
        p, q = rng.dirichlet(np.ones(10) * 0.5), rng.dirichlet(np.ones(10) * 0.5)
        draft = torch.tensor(p, dtype=torch.float64)
        full = torch.tensor(np.stack([q, q]), dtype=torch.float64)
        targets = verify.lossless(draft[None], full)
        tokens = torch.arange(10)
        a = verify.acceptance(draft.expand(10, 10), tokens, targets.rej.expand(10, 10)).numpy()
        res = verify.residual(targets.res[0], draft).numpy()
        law = p * a + (1 - (p * a).sum()) * res / res.sum()
        np.testing.assert_allclose(law, q, atol=1e-12)
        wrong = targets.res[0].numpy()  # the classic bug: resample from the target itself
        assert np.abs(p * a + (1 - (p * a).sum()) * wrong - q).sum() > 1e-3


def test_accept_step_output_law():
    rng = np.random.default_rng(1)
    p, q = rng.dirichlet(np.ones(6)), rng.dirichlet(np.ones(6))
    draft_probs, full_probs = torch.tensor(p, dtype=torch.float32)[None], torch.tensor(np.stack([q, q]),
                                                                                         dtype=torch.float32)
    gen = torch.Generator().manual_seed(0)
    counts = {"good": np.zeros(6), "broken": np.zeros(6)}
    for _ in range(6000):
        x = sample(draft_probs[0], gen)
        for name, rule in (("good", verify.accept), ("broken", broken_accept)):
            n, token, _ = rule(draft_probs, x, verify.lossless(draft_probs, full_probs), gen)
            counts[name][int(x) if n == 1 else int(token)] += 1
    assert chi_square_p(counts["good"], q) > P_PASS
    assert chi_square_p(counts["broken"], q) < 1e-6


def test_own_draws_step_law_is_the_target():
    """`verify.own_draws` with a one-hot draft x, over a fine grid of uniforms (an exact integral up to the grid):
    x is accepted with probability q(x), the first token's law is q, and after a rejection the token is never x.
    Emitting a fresh draw of q after a rejection (the classic bug, in this rule's terms) gives another law."""
    grid = 20_000
    u = ((torch.arange(grid, dtype=torch.float64) + 0.5) / grid)[:, None]
    rng = np.random.default_rng(2)
    for x in range(6):
        q = rng.dirichlet(np.ones(6) * 0.7)
        full = torch.tensor(np.stack([q, q]), dtype=torch.float64)
        draft = torch.nn.functional.one_hot(torch.tensor([x]), 6).double()
        targets = verify.lossless(draft, full)
        first, fresh = np.zeros(6), np.zeros(6)
        for i in range(grid):
            n, token, bonus = verify.own_draws(torch.stack([u[i], u[(i * 7919) % grid]]))(
                draft, torch.tensor([x]), targets, None)
            first[x if n == 1 else int(token)] += 1
            assert bonus == (n == 1) and (n == 1 or int(token) != x)
            fresh[x if n == 1 else int(sample(full[0], torch.Generator().manual_seed(i)))] += 1
        np.testing.assert_allclose(first / grid, q, atol=2 / grid)
        assert np.abs(fresh / grid - q).sum() > 0.02


def test_sample_draws_each_row_by_its_weights(monkeypatch):
    """`sample` (inverse of the cumulative weights) against the exact law: unnormalised rows, zero weights
    never drawn, a batch of rows each by its own weights; a uniform rounded up to the total still draws a token
    of positive weight. A sampler that skips the last token fails the same test."""
    gen = torch.Generator().manual_seed(0)
    weights = torch.tensor([[0.0, 1.5, 0.0, 0.9, 0.6, 0.0], [0.2, 0.0, 0.0, 0.0, 0.0, 0.8]])
    law = (weights / weights.sum(-1, keepdim=True)).double().numpy()
    drawn = torch.cat([sample(weights, gen) for _ in range(RUNS * 5)], dim=1).numpy()  # [2, draws]
    for row in range(2):
        counts = np.bincount(drawn[row], minlength=6)
        assert counts[law[row] == 0].sum() == 0 and chi_square_p(counts, law[row]) > P_PASS
    single = np.bincount(torch.cat([sample(weights[0], gen) for _ in range(RUNS * 5)]).numpy(), minlength=6)
    assert chi_square_p(single, law[0]) > P_PASS
    skipped = np.bincount(torch.cat([sample(weights[0, :-2], gen) for _ in range(RUNS * 5)]).numpy(), minlength=6)
    assert chi_square_p(skipped, law[0]) < 1e-6
    monkeypatch.setattr(torch, "rand", lambda shape, **kw: torch.ones(shape, dtype=kw.get("dtype")))
    assert sample(weights, gen)[:, 0].tolist() == [4, 5]  # u = the total: the last token of positive weight


def test_top_p_filter_numpy():
    probs = torch.tensor([[0.05, 0.4, 0.15, 0.3, 0.1]])
    kept = top_p_filter(probs, 0.7).numpy()[0]  # 0.4 + 0.3 reaches 0.7: keep those two
    np.testing.assert_allclose(kept, np.array([0, 0.4, 0, 0.3, 0]) / 0.7, rtol=1e-6)
    assert top_p_filter(probs, 0.01).numpy()[0].tolist() == [0, 1, 0, 0, 0]  # always at least one token
    greedy = Sampler(0.0).probs(torch.tensor([0.1, 2.0, -1.0]))
    assert greedy.tolist() == [0.0, 1.0, 0.0]


# --- the whole decoder: first two tokens of sampled sd vs the exact verifier law ---------------------

PROMPT = torch.tensor([3, 7, 5, 4])


@pytest.fixture(scope="module")
def pair():
    """8-token vocabulary; the draft's head is the verifier's rolled by one row: TV(draft, full) ≈ 0.5."""
    verifier, draft = build_pair("llama", layers=2, vocab=8, head_scale=1.0, seed=3)
    with torch.no_grad():
        draft.lm_head.weight.copy_(torch.roll(verifier.lm_head.weight, 1, 0))
    return verifier, draft


def exact_two_tokens(verifier, sampler: Sampler) -> np.ndarray:
    """P(t1, t2) under the verifier with ``sampler``, from two uncached forwards."""
    with torch.no_grad():
        q1 = sampler.probs(verifier(PROMPT[None]).logits[0, -1])
        continuations = torch.cat([PROMPT.repeat(8, 1), torch.arange(8)[:, None]], dim=1)
        q2 = sampler.probs(verifier(continuations).logits[:, -1])
    return (q1[:, None] * q2).double().numpy()


def sampled_two_tokens(verifier, draft, config: DecodeConfig, accept=verify.accept) -> np.ndarray:
    full, proposer = Tier("full", verifier), ModelProposer(Tier("draft", draft))
    counts = np.zeros((8, 8))
    for seed in range(RUNS):  # γ alternates 1 and 2: accepted, residual and bonus tokens all occur
        cfg = DecodeConfig(**{**config.__dict__, "seed": seed, "gamma": 1 + seed % 2, "max_new_tokens": 2})
        t1, t2 = modes.sd(proposer, full, PROMPT, cfg, accept=accept).tokens
        counts[t1, t2] += 1
    return counts


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.8)])
def test_sampled_sd_reproduces_verifier(pair, temperature, top_p):
    verifier, draft = pair
    config = DecodeConfig(temperature=temperature, top_p=top_p)
    exact = exact_two_tokens(verifier, config.sampler)
    counts = sampled_two_tokens(verifier, draft, config)
    tv = 0.5 * np.abs(counts / RUNS - exact).sum()
    assert chi_square_p(counts, exact) > P_PASS, tv
    if temperature == 1.0:  # the deliberately broken rule is caught by the same test
        broken = sampled_two_tokens(verifier, draft, config, accept=broken_accept)
        assert chi_square_p(broken, exact) < 1e-6


LOOKUP_PROMPT = torch.tensor([3, 7, 5, 4, 3, 7])  # ends in a repeat: the n-gram drafts 5, 4


def sampled_two_tokens_lookup(verifier) -> np.ndarray:
    full, proposer = Tier("full", verifier), NgramProposer(8)
    counts = np.zeros((8, 8))
    for seed in range(RUNS):  # γ alternates 1 and 2: accepted, rejected and bonus tokens all occur
        cfg = DecodeConfig(temperature=1.0, seed=seed, gamma=1 + seed % 2, max_new_tokens=2)
        result = modes.sd(proposer, full, LOOKUP_PROMPT, cfg, mode="lookup")
        t1, t2 = result.tokens
        counts[t1, t2] += 1
    return counts


def test_sampled_lookup_reproduces_verifier(pair, monkeypatch):
    """Sampled n-gram drafts, checked by the verifier's own draws at position-keyed uniforms, give the verifier's
    joint law of two tokens; uniforms keyed by the seed alone (one for every position) do not."""
    verifier, _ = pair
    monkeypatch.setattr(sys.modules[__name__], "PROMPT", LOOKUP_PROMPT)
    exact = exact_two_tokens(verifier, Sampler(1.0))
    counts = sampled_two_tokens_lookup(verifier)
    assert chi_square_p(counts, exact) > P_PASS, 0.5 * np.abs(counts / RUNS - exact).sum()
    keyed = DecodeConfig.uniforms
    monkeypatch.setattr(DecodeConfig, "uniforms",
                        lambda self, position, n, device: keyed(self, 0, 1, device).expand(n, 1))
    assert chi_square_p(sampled_two_tokens_lookup(verifier), exact) < 1e-6
