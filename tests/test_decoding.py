"""Decoder correctness on tiny models of every family routing supports (Llama, Qwen2, Mistral, Gemma2).

The models are real transformers models built from configs with seeded random weights. The draft is the
verifier's first layer (embeddings and head copied), so draft and verifier agree often but not always, and
the LM head is scaled up so that distributions are peaked: both acceptance and rejection paths run.
Gemma2 and Mistral use a sliding window shorter than the sequence, so cache crops roll back past the window.
"""

from __future__ import annotations

import pytest
import torch

from dimr.decoding import DecodeConfig, Thresholds
from dimr.decoding.decoder import Decoder
from dimr.slim import slim_verifier

FAMILIES = ("llama", "qwen2", "mistral", "gemma2")
PROMPT = torch.tensor([3, 14, 15, 9, 26, 5, 35, 8, 97 - 18])  # no special ids (0-2)
NEW_TOKENS = 24


def family_config(family: str, layers: int, vocab: int = 96, window: int | None = None):
    from transformers import Gemma2Config, LlamaConfig, MistralConfig, Qwen2Config

    common = dict(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  bos_token_id=0, eos_token_id=1, pad_token_id=2)
    if family == "llama":
        return LlamaConfig(**common)
    if family == "qwen2":
        return Qwen2Config(**common)
    if family == "mistral":
        return MistralConfig(**common, sliding_window=window or 8)
    if family == "gemma2":
        return Gemma2Config(**common, head_dim=8, sliding_window=window or 6, query_pre_attn_scalar=8,
                            tie_word_embeddings=False,
                            layer_types=(["sliding_attention", "full_attention"] * layers)[:layers])
    raise ValueError(family)


def build_pair(family: str, layers: int = 4, vocab: int = 96, head_scale: float = 40.0, seed: int = 0,
               window: int | None = None):
    """(verifier, draft): seeded random verifier; the draft is a 1-layer copy of its first layer."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    verifier = AutoModelForCausalLM.from_config(family_config(family, layers, vocab, window)).eval()
    with torch.no_grad():
        verifier.lm_head.weight.mul_(head_scale / verifier.lm_head.weight.norm(dim=-1, keepdim=True).mean())
        if family == "gemma2":  # its post-layer norms make random layers outweigh the embedding: rebalance
            verifier.model.embed_tokens.weight.mul_(10.0)
    draft = AutoModelForCausalLM.from_config(family_config(family, 1, vocab, window)).eval()
    draft.load_state_dict(verifier.state_dict(), strict=False)
    return verifier, draft


@pytest.fixture(scope="module", params=FAMILIES)
def decoder(request) -> Decoder:
    verifier, draft = build_pair(request.param)
    slim = slim_verifier(verifier, (True, False, True, True))
    return Decoder.from_models(verifier, draft, slim)


def check_counters(stats) -> None:
    assert stats.accepted + stats.regenerated + stats.escalated + stats.bonus == stats.tokens
    assert stats.accepted_direct <= stats.accepted
    for tier in stats.calls:  # the forwards by size add up to the calls and the tokens fed
        assert sum(stats.forwards[tier].values()) == stats.calls[tier]
        assert sum(n * k for n, k in stats.forwards[tier].items()) == stats.fed[tier]


def test_ar_forwards_are_one_prefill_and_one_token_steps(decoder: Decoder):
    ar = decoder.run(PROMPT, "ar", DecodeConfig(max_new_tokens=NEW_TOKENS))
    assert ar.stats.forwards["full"] == {PROMPT.numel(): 1, 1: NEW_TOKENS - 1}
    merged = ar.stats.merge(ar.stats)
    assert merged.forwards["full"] == {PROMPT.numel(): 2, 1: 2 * (NEW_TOKENS - 1)}


def test_greedy_sd_and_self_equal_ar(decoder: Decoder):
    config = DecodeConfig(max_new_tokens=NEW_TOKENS, gamma=4)
    ar = decoder.run(PROMPT, "ar", config)
    reference = decoder.full.model.generate(PROMPT[None], max_new_tokens=NEW_TOKENS, do_sample=False,
                                            min_new_tokens=NEW_TOKENS)[0, PROMPT.numel():].tolist()
    assert ar.tokens == reference  # our ar against transformers' own greedy loop
    for mode, cfg in (("sd", config), ("self", config), ("sd", DecodeConfig(**{**config.__dict__,
                                                                                "draft_stop": 0.6}))):
        result = decoder.run(PROMPT, mode, cfg)
        assert result.tokens == ar.tokens, mode
        check_counters(result.stats)
        # both the acceptance and the rejection paths ran, and caches were cropped past rejections
        assert result.stats.accepted > 0 and result.stats.rejected > 0, mode
        assert result.stats.calls["full"] == result.stats.blocks < NEW_TOKENS


@pytest.mark.parametrize("temperature,top_p", [(0.0, 1.0), (0.8, 0.9)])
def test_via_escalating_everything_equals_sd(decoder: Decoder, temperature: float, top_p: float):
    config = DecodeConfig(max_new_tokens=NEW_TOKENS, gamma=3, temperature=temperature, top_p=top_p, seed=7)
    sd = decoder.run(PROMPT, "sd", config)
    via = decoder.run(PROMPT, "via", DecodeConfig(**{**config.__dict__, "thresholds": Thresholds.never()}))
    assert via.tokens == sd.tokens
    assert via.stats.accepted_direct == via.stats.regenerated == 0
    assert via.stats.calls["full"] == sd.stats.calls["full"] == via.stats.calls["slim"]
    check_counters(via.stats)


def test_via_routes_and_counters_add_up(decoder: Decoder):
    cases = [(Thresholds(), 0.0), (Thresholds(0.5, 0.0, 0.5), 1.0),
             (Thresholds(0.0, 0.0, 0.0), 0.0),  # every drafted token accepted directly, then a slim bonus
             (Thresholds(0.0, 0.0, 2.0), 1.0),  # every drafted token accepted directly, no bonus
             (Thresholds(2.0, 0.0, 0.0), 0.0)]  # every block's first token regenerated by the slim verifier
    for thresholds, temperature in cases:
        config = DecodeConfig(max_new_tokens=NEW_TOKENS, gamma=4, temperature=temperature,
                              thresholds=thresholds)
        result = decoder.run(PROMPT, "via", config)
        stats = result.stats
        assert stats.tokens == len(result.tokens) == NEW_TOKENS
        check_counters(stats)
        assert stats.calls["slim"] == stats.blocks
        if thresholds.accept == 0.0:  # the full verifier never runs
            assert stats.calls["full"] == 0 and stats.accepted_direct == stats.accepted == stats.drafted
            if thresholds.regen == 0.0:
                assert stats.bonus == stats.blocks - 1  # a slim bonus after every block but the truncated last
            else:
                assert stats.bonus == 0 and stats.accepted == NEW_TOKENS
        if thresholds.accept > 1:
            assert stats.calls["full"] == stats.accepted == 0
            assert stats.regenerated == stats.blocks == NEW_TOKENS


def test_eos_and_max_new_tokens_truncate():
    verifier, draft = build_pair("llama", seed=1)
    dec = Decoder.from_models(verifier, draft, slim_verifier(verifier, (True, True, False, True)))
    base = dec.run(PROMPT, "ar", DecodeConfig(max_new_tokens=30))
    eos = base.tokens[17]
    first = base.tokens.index(eos)
    for mode in ("ar", "sd", "self", "via"):
        for n in (1, 5):
            short = dec.run(PROMPT, mode, DecodeConfig(max_new_tokens=n, thresholds=Thresholds.never()))
            assert short.tokens == base.tokens[:n] and short.stats.tokens == n
        stopped = dec.run(PROMPT, mode, DecodeConfig(max_new_tokens=30, eos_token_ids=(eos,),
                                                     thresholds=Thresholds.never()))
        assert stopped.tokens == base.tokens[: first + 1]
        check_counters(stopped.stats)
