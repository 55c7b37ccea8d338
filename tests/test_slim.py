"""Slim verifiers on tiny random models of every family routing claims (Llama, Qwen2, Qwen3, Mistral, Gemma,
Gemma2, Gemma3, Phi-3, OLMo, OLMo 2, OLMo 3, SmolLM3): KV cache, generate(), shared weights, prefix reuse, for
layer masks and sublayer masks. Mistral, Gemma2 (1:1), Gemma3 (5:1, local/global rotary bases) and OLMo 3 (3:1)
use a sliding window (4) shorter than the test sequence (16)."""

import copy

import pytest
import torch
from transformers import (
    CohereConfig,
    CohereForCausalLM,
    DynamicCache,
    Gemma2Config,
    Gemma2ForCausalLM,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    GemmaConfig,
    GemmaForCausalLM,
    GPT2Config,
    GPT2LMHeadModel,
    GraniteConfig,
    GraniteForCausalLM,
    Lfm2Config,
    Lfm2ForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Olmo2Config,
    Olmo2ForCausalLM,
    Olmo3Config,
    Olmo3ForCausalLM,
    OlmoConfig,
    OlmoForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    SmolLM3Config,
    SmolLM3ForCausalLM,
    T5Config,
)

from dimr.errors import DimrError
from dimr.masks import (
    SublayerMask,
    first_skipped,
    kept_layers,
    mask_from_key,
    mask_key,
    params_to_sublayer_mask,
    sublayer_mask_to_params,
    sublayer_space,
)
from dimr.slim import check_family, forward_from, layer_inputs, num_layers, slim_verifier

L, V, T = 6, 128, 16
COMMON = dict(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=L, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=128, pad_token_id=0)
FAMILIES = {  # family: (model class, config class, extra config)
    "llama": (LlamaForCausalLM, LlamaConfig, {}),
    "qwen2": (Qwen2ForCausalLM, Qwen2Config, {}),
    "qwen3": (Qwen3ForCausalLM, Qwen3Config, {}),
    "mistral": (MistralForCausalLM, MistralConfig, dict(sliding_window=4)),
    "gemma": (GemmaForCausalLM, GemmaConfig, dict(head_dim=16)),
    "gemma2": (Gemma2ForCausalLM, Gemma2Config, dict(
        head_dim=16, sliding_window=4, layer_types=["sliding_attention", "full_attention"] * (L // 2))),
    # the default 5:1 pattern: layers 0-4 sliding (rope base 1e4), layer 5 global (rope base 1e6)
    "gemma3": (Gemma3ForCausalLM, Gemma3TextConfig, dict(head_dim=16, sliding_window=4)),
    "phi3": (Phi3ForCausalLM, Phi3Config, {}),
    "olmo": (OlmoForCausalLM, OlmoConfig, {}),
    "olmo2": (Olmo2ForCausalLM, Olmo2Config, {}),
    "olmo3": (Olmo3ForCausalLM, Olmo3Config, dict(sliding_window=4)),  # 3:1 sliding/global, post-norms
    "smollm3": (SmolLM3ForCausalLM, SmolLM3Config, {}),  # layer 3 has no rotary (no_rope_layers)
}
# Gemma2 has no SDPA path in transformers 5.x: eager only.
CASES = [("llama", "sdpa"), ("qwen2", "sdpa"), ("qwen3", "sdpa"), ("mistral", "eager"), ("gemma", "sdpa"),
         ("gemma2", "eager"), ("gemma3", "eager"), ("gemma3", "sdpa"), ("phi3", "sdpa"), ("olmo", "sdpa"),
         ("olmo2", "sdpa"), ("olmo3", "eager"), ("smollm3", "sdpa")]
# skip layer 0 (cache slot 0 becomes original layer 1; sliding/global types shift), skip a middle pair, skip
# layer 0 and the last (Gemma2/Gemma3/OLMo 3: a global layer)
MASKS = ["011011", "110101", "011110"]
# Sublayer masks ("1" both, "a" attention only, "m" MLP only, "0" neither): layer 0's attention skipped (its
# MLP runs before the first kept attention), attention-only layers including the last (a global one); skipped
# attentions whose MLPs join the previous slot; one attention (the last layer's) after five MLPs.
SUB_MASKS = ["m1a11a", "1m0a1m", "mmmmma"]


def make(family: str, attn: str = "sdpa", **extra):
    model_cls, config_cls, family_extra = FAMILIES[family]
    torch.manual_seed(0)
    return model_cls(config_cls(**COMMON, **{**family_extra, **extra}, attn_implementation=attn)).eval()


def as_mask(key: str):
    return mask_from_key(key) if set(key) <= {"0", "1"} else SublayerMask.from_key(key)


@pytest.fixture(scope="module", params=CASES, ids=[f"{f}-{a}" for f, a in CASES])
def model(request):
    return make(*request.param)


@pytest.fixture(scope="module")
def ids():
    return torch.randint(0, V, (2, T), generator=torch.Generator().manual_seed(1))


def test_mask_helpers():
    m = mask_from_key("011011")
    assert m == (False, True, True, False, True, True) and mask_key(m) == "011011"
    assert kept_layers(m) == [1, 2, 4, 5] and first_skipped(m) == 0 and first_skipped((True,) * 3) == 3
    with pytest.raises(DimrError):
        mask_from_key("01a")


def test_sublayer_mask_codec():
    s = SublayerMask.from_key("1am0")
    assert s.attn == (True, True, False, False) and s.mlp == (True, False, True, False) and s.key == "1am0"
    assert not s.is_layer_mask and s.first_partial() == 1 and len(s) == 4
    whole = SublayerMask.from_layer_mask(mask_from_key("1101"))
    assert whole.key == "1101" and whole.is_layer_mask and whole.layer_mask() == mask_from_key("1101")
    assert SublayerMask.from_key("1101") == whole and SublayerMask.from_key("1111").first_partial() == 4
    params = sublayer_mask_to_params(s)
    assert params == {"attn_00": 1, "mlp_00": 1, "attn_01": 1, "mlp_01": 0, "attn_02": 0, "mlp_02": 1,
                      "attn_03": 0, "mlp_03": 0}
    assert set(sublayer_space(4)) == set(params) and params_to_sublayer_mask(params, 4) == s
    with pytest.raises(DimrError, match="1/a/m/0"):
        SublayerMask.from_key("1x")
    with pytest.raises(ValueError):
        s.layer_mask()


@torch.no_grad()
def test_weights_shared_and_full_model_unaffected(model, ids):
    ref = model(ids).logits
    slim = slim_verifier(model, mask_from_key("011011"))
    full_ptrs = {p.data_ptr() for p in model.parameters()}
    slim_ptrs = {p.data_ptr() for p in slim.parameters()}
    assert slim_ptrs <= full_ptrs
    assert model.lm_head.weight.data_ptr() == slim.lm_head.weight.data_ptr()
    assert model.model.embed_tokens.weight.data_ptr() == slim.model.embed_tokens.weight.data_ptr()
    assert slim.model.layers[0].mlp is model.model.layers[1].mlp
    assert num_layers(slim) == 4 and slim.config.num_hidden_layers == 4 and slim.config.dimr_mask == "011011"
    if getattr(model.config, "layer_types", None) is not None:
        assert slim.config.layer_types == [model.config.layer_types[i] for i in (1, 2, 4, 5)]

    out = slim(ids, output_hidden_states=True)
    slim.generate(ids[:1, :4], max_new_tokens=3, do_sample=False)
    assert len(out.hidden_states) == 4 + 1
    assert not torch.allclose(out.logits, ref)  # the skip really changes the output

    assert model.config.num_hidden_layers == L and len(model.model.layers) == L
    assert [layer.self_attn.layer_idx for layer in model.model.layers] == list(range(L))
    after = model(ids, output_hidden_states=True)
    assert torch.equal(after.logits, ref) and len(after.hidden_states) == L + 1


@torch.no_grad()
def test_sublayer_slim_slots_and_sharing(model, ids):
    """"m1a11a": attention runs in layers 1-5, so 5 cache slots; slot 0 runs layer 0's MLP, then layer 1."""
    ref = model(ids).logits
    slim = slim_verifier(model, SublayerMask.from_key("m1a11a"))
    assert {p.data_ptr() for p in slim.parameters()} <= {p.data_ptr() for p in model.parameters()}
    assert slim.config.num_hidden_layers == 5 and slim.config.dimr_mask == "m1a11a"
    if getattr(model.config, "layer_types", None) is not None:
        assert slim.config.layer_types == model.config.layer_types[1:]
    slot0 = slim.model.layers[0]
    assert isinstance(slot0, type(model.model.layers[0]))  # found by class (output_hidden_states)
    assert [p.fn for p in slot0.dimr_parts] == [model.model.layers[0].mlp, slot0.self_attn,
                                                model.model.layers[1].mlp]
    assert slot0.self_attn.layer_idx == 0 and slot0.self_attn.o_proj is model.model.layers[1].self_attn.o_proj
    assert [layer.self_attn.layer_idx for layer in slim.model.layers] == list(range(5))
    assert slim.model.layers[2] is not model.model.layers[3] and slim.model.layers[2].mlp is model.model.layers[3].mlp
    assert len(slim(ids, output_hidden_states=True).hidden_states) == 5 + 1
    assert [layer.self_attn.layer_idx for layer in model.model.layers] == list(range(L))
    assert torch.equal(model(ids).logits, ref)


class _Skip(torch.nn.Module):
    def forward(self, hidden_states, *args, **kwargs):
        return hidden_states


class _NoAttention(torch.nn.Module):
    def forward(self, hidden_states, *args, **kwargs):
        return torch.zeros_like(hidden_states), None


class _NoMLP(torch.nn.Module):
    def forward(self, hidden_states):
        return torch.zeros_like(hidden_states)


@pytest.mark.parametrize("key", [*MASKS, *SUB_MASKS])
@torch.no_grad()
def test_slim_equals_full_model_with_skipped_parts_as_identity(model, ids, key):
    """Independent reference: a copy of the full model (original layer indices, types, rotary and masks) whose
    skipped layers pass their input through and whose skipped attentions / MLPs output zeros (exact here:
    every claimed family adds a sublayer's output to the residual stream after at most an RMSNorm, and
    RMSNorm(0) = 0)."""
    ref = copy.deepcopy(model)
    mask = SublayerMask.from_key(key)
    for i, (attn, mlp) in enumerate(zip(mask.attn, mask.mlp, strict=True)):
        if not attn and not mlp:
            ref.model.layers[i] = _Skip()
        elif not attn:
            ref.model.layers[i].self_attn = _NoAttention()
        elif not mlp:
            ref.model.layers[i].mlp = _NoMLP()
    torch.testing.assert_close(slim_verifier(model, as_mask(key))(ids).logits, ref(ids).logits)


@torch.no_grad()
def test_all_true_mask_equals_full_model(model, ids):
    torch.testing.assert_close(slim_verifier(model, (True,) * L)(ids).logits, model(ids).logits)


@pytest.mark.parametrize("key", MASKS)
@torch.no_grad()
def test_sublayer_mask_of_whole_layers_equals_layer_slim(model, ids, key):
    want = slim_verifier(model, mask_from_key(key))(ids).logits
    bits = mask_from_key(key)
    got = slim_verifier(model, SublayerMask(attn=bits, mlp=bits))
    assert got.config.dimr_mask == key and torch.equal(got(ids).logits, want)


@pytest.mark.parametrize("key", [*MASKS, *SUB_MASKS])
@torch.no_grad()
def test_kv_cache_matches_uncached(model, ids, key):
    slim = slim_verifier(model, as_mask(key))
    uncached = slim(ids).logits

    cache = DynamicCache(config=slim.config)
    steps = [slim(ids[:, t:t + 1], cache=cache, use_cache=True).logits for t in range(T)]
    torch.testing.assert_close(torch.cat(steps, 1), uncached, atol=1e-5, rtol=1e-4)

    cache = DynamicCache(config=slim.config)
    bounds = [0, 5, 8, 12, T]  # prefill, then chunks crossing the sliding window
    chunks = [slim(ids[:, a:b], cache=cache, use_cache=True).logits
              for a, b in zip(bounds, bounds[1:], strict=False)]
    torch.testing.assert_close(torch.cat(chunks, 1), uncached, atol=1e-5, rtol=1e-4)
    assert cache.get_seq_length() == T


@pytest.mark.parametrize("key", ["011011", "m1a11a"])
@torch.no_grad()
def test_generate_equals_uncached_greedy_loop(model, ids, key):
    slim = slim_verifier(model, as_mask(key))
    prompt = ids[:1, :6]
    out = slim.generate(prompt, max_new_tokens=10, do_sample=False, pad_token_id=0)
    x = prompt
    for _ in range(10):
        x = torch.cat([x, slim(x).logits[:, -1:].argmax(-1)], 1)
    assert torch.equal(out, x)


@torch.no_grad()
def test_forward_from_equals_slim_forward(model, ids):
    hidden = layer_inputs(model, ids)
    assert len(hidden) == L + 1 and all(h.shape == (2, T, 64) for h in hidden)
    torch.testing.assert_close(forward_from(model, (True,) * L, hidden), model(ids).logits)
    # "11111m": the tail from layer 5 runs an MLP and no attention
    for key in [*MASKS, "100000", *SUB_MASKS, "11111m", "11a111"]:
        mask = as_mask(key)
        want = slim_verifier(model, mask)(ids).logits
        torch.testing.assert_close(forward_from(model, mask, hidden), want, msg=key)
        torch.testing.assert_close(forward_from(model, mask, hidden, start=0), want, msg=key)
    with pytest.raises(ValueError):
        forward_from(model, mask_from_key("110111"), hidden, start=3)
    with pytest.raises(ValueError):
        forward_from(model, SublayerMask.from_key("11a111"), hidden, start=3)


def test_bad_masks_and_architectures(model):
    with pytest.raises(DimrError, match="layers"):
        slim_verifier(model, (True,) * (L + 1))
    with pytest.raises(DimrError, match="sublayer mask has 5 entries"):
        slim_verifier(model, SublayerMask.from_key("11111"))
    with pytest.raises(DimrError, match="keeps no layer"):
        slim_verifier(model, (False,) * L)
    with pytest.raises(DimrError, match="keeps no layer"):
        slim_verifier(model, SublayerMask.from_key("000000"))
    with pytest.raises(DimrError, match="runs no attention"):
        slim_verifier(model, SublayerMask.from_key("m0mmm0"))
    with pytest.raises(DimrError, match="from the full model"):
        slim_verifier(slim_verifier(model, SublayerMask.from_key("1a1111")), (True,) * L)
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=V))
    with pytest.raises(DimrError, match="gpt2"):
        slim_verifier(gpt2, (True, False))


def test_refusals_name_what_is_missing():
    with pytest.raises(DimrError, match=r"model type 'gpt2'.*no decoder layer list model.model.layers"):
        slim_verifier(GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=V)), (True, False))
    hybrid = Lfm2ForCausalLM(Lfm2Config(**COMMON, layer_types=["conv", "full_attention"] * (L // 2)))
    with pytest.raises(DimrError, match=r"decoder layer 0 \(Lfm2DecoderLayer\) has no self_attn"):
        slim_verifier(hybrid, (True,) * L)
    # from the config alone (the search checks a pair before loading weights)
    check_family(Gemma3TextConfig(**COMMON, head_dim=16, sliding_window=4))
    with pytest.raises(DimrError, match=r"model type 'gpt2' \(verifier of x\): it has no decoder layer list"):
        check_family(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=V), " (verifier of x)")
    with pytest.raises(DimrError, match="Lfm2DecoderLayer.* has no self_attn"):
        check_family(hybrid.config)
    with pytest.raises(DimrError, match="model type 't5'.*builds no causal LM"):
        check_family(T5Config(vocab_size=V, d_model=32, num_layers=2, num_heads=2, d_ff=64))
    llama = make("llama")
    llama.model.layers[2].self_attn.layer_idx = 0
    with pytest.raises(DimrError, match="layer 2's self_attn.layer_idx is 0"):
        slim_verifier(llama, (True,) * L)


@torch.no_grad()
def test_whole_layers_only_where_sublayers_do_not_split(ids):
    """Cohere runs attention and MLP in parallel on one norm, Granite scales each sublayer's output and its
    embeddings: whole-layer masks route, sublayer masks (Cohere; Granite's scaled residual is refused too)
    and prefix reuse (Granite: layer 0's input is not the embedding) are refused with one line."""
    torch.manual_seed(0)
    cohere = CohereForCausalLM(CohereConfig(**COMMON)).eval()
    slim = slim_verifier(cohere, mask_from_key("011011"))
    cache = DynamicCache(config=slim.config)
    steps = [slim(ids[:, t:t + 1], cache=cache, use_cache=True).logits for t in range(T)]
    torch.testing.assert_close(torch.cat(steps, 1), slim(ids).logits, atol=1e-5, rtol=1e-4)
    with pytest.raises(DimrError, match="CohereDecoderLayer does not split into an attention and an MLP"):
        slim_verifier(cohere, SublayerMask.from_key("1a1111"))

    granite = GraniteForCausalLM(GraniteConfig(**COMMON, residual_multiplier=0.5, embedding_multiplier=2.0))
    slim_verifier(granite, mask_from_key("011011"))(ids)
    with pytest.raises(DimrError, match="GraniteDecoderLayer does not split"):
        slim_verifier(granite.eval(), SublayerMask.from_key("1a1111"))
    with pytest.raises(DimrError, match="prefix reuse needs layer 0's input"):
        layer_inputs(granite, ids)


@pytest.mark.parametrize("key", ["a1m1a0", "m1111a", "1a1m11"])
@torch.no_grad()
def test_sublayer_slim_equals_hand_computation_llama(ids, key):
    """Llama by hand: h += attn(input_layernorm(h)) where the attention runs, h += mlp(post_attention_layernorm(h))
    where the MLP runs, then the final norm and the head (SDPA without a mask is causal)."""
    model = make("llama")
    mask = SublayerMask.from_key(key)
    h = model.model.embed_tokens(ids)
    rope = model.model.rotary_emb(h, torch.arange(T).unsqueeze(0))
    for layer, attn, mlp in zip(model.model.layers, mask.attn, mask.mlp, strict=True):
        if attn:
            h = h + layer.self_attn(layer.input_layernorm(h), position_embeddings=rope, attention_mask=None)[0]
        if mlp:
            h = h + layer.mlp(layer.post_attention_layernorm(h))
    want = model.lm_head(model.model.norm(h))
    torch.testing.assert_close(slim_verifier(model, mask)(ids).logits, want)
    assert not torch.allclose(want, model(ids).logits)


@torch.no_grad()
def test_tiny_random_pair_verifier(tiny_pair):
    from dimr.pairs import load_model

    verifier = load_model(tiny_pair, "verifier", "cpu")
    ids = torch.arange(3, 15).unsqueeze(0)
    mask = mask_from_key("01111011")
    hidden = layer_inputs(verifier, ids)
    want = slim_verifier(verifier, mask)(ids).logits
    torch.testing.assert_close(forward_from(verifier, mask, hidden), want)
