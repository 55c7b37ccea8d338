"""Static KV caches + compiled forwards (``Tier(compiled=True)``) give what the dynamic eager tiers give.

Tiny Llama and Gemma2 built from configs (test_decoding's pairs). The Gemma2 one has a sliding window longer
than the decode (as real Gemma2's 4,096), so it runs on the static cache too; the Mistral one's window is
shorter than the decode, so its tiers must fall back to the dynamic cache and still decode exactly.
"""

from __future__ import annotations

import pytest
import torch
from test_decoding import PROMPT, build_pair, family_config

from dimr.decoding import DecodeConfig, Thresholds
from dimr.decoding.decoder import Decoder
from dimr.decoding.tiers import BUCKETS, Tier
from dimr.slim import slim_verifier

NEW_TOKENS = 24
CAPACITY = PROMPT.numel() + NEW_TOKENS + 5


def compiled_pair(family: str, window: int | None = None) -> tuple[Decoder, Decoder]:
    verifier, draft = build_pair(family, window=window)
    slim = slim_verifier(verifier, (True, False, True, True))
    compiled = Decoder.from_models(verifier, draft, slim, compiled=True)  # compiles each shape on first use
    return Decoder.from_models(verifier, draft, slim), compiled


@pytest.fixture(scope="module", params=[("llama", None), ("gemma2", 128)], ids=["llama", "gemma2"])
def pair(request) -> tuple[Decoder, Decoder]:
    return compiled_pair(*request.param)


def test_padded_compiled_forward_equals_eager(pair):
    eager, compiled = pair
    for tier_e, tier_c in ((eager.full, compiled.full), (eager.slim, compiled.slim)):
        with torch.inference_mode():
            tier_e.reset(CAPACITY)
            tier_c.reset(CAPACITY)
            assert tier_c.static and not tier_e.static
            for chunk in (PROMPT[:7], PROMPT[7:], torch.tensor([40, 41, 42])):  # 7 → 8, 2, 3 → 4: padded
                want = tier_e.forward(chunk, keep=chunk.numel())
                got = tier_c.forward(chunk, keep=chunk.numel())
                torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
            assert tier_c.length == tier_e.length == PROMPT.numel() + 3
            # a crop then a different continuation: the stale keys/values past the crop must not leak
            tier_e.crop(PROMPT.numel())
            tier_c.crop(PROMPT.numel())
            nxt = torch.tensor([50, 51])
            torch.testing.assert_close(tier_c.forward(nxt, keep=2), tier_e.forward(nxt, keep=2),
                                       rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("mode", ["ar", "sd", "self", "via"])
def test_compiled_modes_reproduce_eager_greedy(pair, mode):
    eager, compiled = pair
    config = DecodeConfig(max_new_tokens=NEW_TOKENS, gamma=4)
    want = eager.run(PROMPT, mode, config)
    got = compiled.run(PROMPT, mode, config)
    assert got.tokens == want.tokens
    assert got.stats.calls == want.stats.calls  # the same blocks, the same routes
    assert compiled.full.static and (mode == "ar" or compiled.draft.static or compiled.slim.static)
    if mode == "via":  # and with every token escalated, via still equals sd on the compiled tiers
        never = DecodeConfig(max_new_tokens=NEW_TOKENS, gamma=4, thresholds=Thresholds.never())
        assert compiled.run(PROMPT, "via", never).tokens == compiled.run(PROMPT, "sd", never).tokens


def test_compiled_sampled_sd_matches_eager(pair):
    eager, compiled = pair
    config = DecodeConfig(max_new_tokens=NEW_TOKENS, gamma=3, temperature=0.8, top_p=0.9, seed=5)
    # the same seeded draws on (numerically) the same distributions: the same tokens
    assert compiled.run(PROMPT, "sd", config).tokens == eager.run(PROMPT, "sd", config).tokens


def test_window_shorter_than_the_decode_falls_back_to_the_dynamic_cache():
    verifier, draft = build_pair("mistral")  # sliding window 8 < the decode
    eager = Decoder.from_models(verifier, draft)
    compiled = Decoder.from_models(verifier, draft, compiled=True)
    config = DecodeConfig(max_new_tokens=NEW_TOKENS, gamma=4)
    got = compiled.run(PROMPT, "sd", config)
    assert not compiled.full.static and not compiled.draft.static
    assert got.tokens == eager.run(PROMPT, "sd", config).tokens


def tiny_tier() -> Tier:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return Tier("full", AutoModelForCausalLM.from_config(family_config("llama", 2)).eval(), compiled=True)


def test_warm_up_compiles_every_shape_a_decode_uses():
    from torch._dynamo.utils import counters

    tier = tiny_tier()
    tier.warm_up(CAPACITY)
    graphs = counters["stats"]["unique_graphs"]
    with torch.inference_mode():
        tier.reset(CAPACITY)
        for n in range(1, BUCKETS[-1] + 1):
            tier.forward(torch.arange(3, 3 + n), keep=1)
            tier.crop(0)
    assert counters["stats"]["unique_graphs"] == graphs  # no compile while decoding


def test_static_cache_grows_for_a_longer_decode():
    tier = tiny_tier()
    tier.reset(100)
    small = tier._static_size
    tier.reset(small + 1)  # more than the cache holds with room for the largest padded bucket
    assert tier._static_size > small + BUCKETS[-1] and tier.static
