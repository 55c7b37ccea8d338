"""Slim verifiers on tiny random Llama, Qwen2, Mistral and Gemma2 models: KV cache, generate(), shared
weights, prefix reuse. Gemma2 and Mistral use a sliding window (4) shorter than the test sequence (16)."""

import pytest
import torch
from transformers import (
    DynamicCache,
    Gemma2Config,
    Gemma2ForCausalLM,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from dimr.errors import DimrError
from dimr.masks import first_skipped, kept_layers, mask_from_key, mask_key
from dimr.slim import forward_from, layer_inputs, num_layers, slim_verifier

L, V, T = 6, 128, 16
COMMON = dict(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=L, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=128)
FAMILIES = {
    "llama": lambda attn: LlamaForCausalLM(LlamaConfig(**COMMON, attn_implementation=attn)),
    "qwen2": lambda attn: Qwen2ForCausalLM(Qwen2Config(**COMMON, attn_implementation=attn)),
    "mistral": lambda attn: MistralForCausalLM(
        MistralConfig(**COMMON, sliding_window=4, attn_implementation=attn)),
    # Gemma2 has no SDPA path in transformers 5.x: eager only.
    "gemma2": lambda attn: Gemma2ForCausalLM(Gemma2Config(
        **COMMON, head_dim=16, sliding_window=4,
        layer_types=["sliding_attention", "full_attention"] * (L // 2),
        attn_implementation="eager")),
}
CASES = [("llama", "sdpa"), ("qwen2", "sdpa"), ("mistral", "eager"), ("gemma2", "eager")]
# skip layer 0 (cache slot 0 becomes original layer 1; Gemma2's types shift), skip a middle pair, skip last
MASKS = ["011011", "110101", "111110"]


@pytest.fixture(scope="module", params=CASES, ids=[f"{f}-{a}" for f, a in CASES])
def model(request):
    family, attn = request.param
    torch.manual_seed(0)
    return FAMILIES[family](attn).eval()


@pytest.fixture(scope="module")
def ids():
    return torch.randint(0, V, (2, T), generator=torch.Generator().manual_seed(1))


def test_mask_helpers():
    m = mask_from_key("011011")
    assert m == (False, True, True, False, True, True) and mask_key(m) == "011011"
    assert kept_layers(m) == [1, 2, 4, 5] and first_skipped(m) == 0 and first_skipped((True,) * 3) == 3
    with pytest.raises(DimrError):
        mask_from_key("01a")


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

    out = slim(ids, output_hidden_states=True)
    slim.generate(ids[:1, :4], max_new_tokens=3, do_sample=False)
    assert len(out.hidden_states) == 4 + 1
    assert not torch.allclose(out.logits, ref)  # the skip really changes the output

    assert model.config.num_hidden_layers == L and len(model.model.layers) == L
    assert [layer.self_attn.layer_idx for layer in model.model.layers] == list(range(L))
    after = model(ids, output_hidden_states=True)
    assert torch.equal(after.logits, ref) and len(after.hidden_states) == L + 1


class _Skip(torch.nn.Module):
    def forward(self, hidden_states, *args, **kwargs):
        return hidden_states


@pytest.mark.parametrize("key", MASKS)
@torch.no_grad()
def test_slim_equals_full_model_with_skipped_layers_as_identity(model, ids, key):
    """Independent reference: a copy of the full model (original layer indices, types and masks) whose
    skipped layers pass their input through."""
    import copy

    ref = copy.deepcopy(model)
    for i, keep in enumerate(mask_from_key(key)):
        if not keep:
            ref.model.layers[i] = _Skip()
    torch.testing.assert_close(slim_verifier(model, mask_from_key(key))(ids).logits, ref(ids).logits)


@torch.no_grad()
def test_all_true_mask_equals_full_model(model, ids):
    torch.testing.assert_close(slim_verifier(model, (True,) * L)(ids).logits, model(ids).logits)


@pytest.mark.parametrize("key", MASKS[:2])
@torch.no_grad()
def test_kv_cache_matches_uncached(model, ids, key):
    slim = slim_verifier(model, mask_from_key(key))
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


@torch.no_grad()
def test_generate_equals_uncached_greedy_loop(model, ids):
    slim = slim_verifier(model, mask_from_key("011011"))
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
    for key in [*MASKS, "100000"]:
        mask = mask_from_key(key)
        want = slim_verifier(model, mask)(ids).logits
        torch.testing.assert_close(forward_from(model, mask, hidden), want, msg=key)
        torch.testing.assert_close(forward_from(model, mask, hidden, start=0), want, msg=key)
    with pytest.raises(ValueError):
        forward_from(model, mask_from_key("110111"), hidden, start=3)


def test_bad_masks_and_architectures(model):
    with pytest.raises(DimrError, match="layers"):
        slim_verifier(model, (True,) * (L + 1))
    with pytest.raises(DimrError, match="keeps no layer"):
        slim_verifier(model, (False,) * L)
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=V))
    with pytest.raises(DimrError, match="gpt2"):
        slim_verifier(gpt2, (True, False))


@torch.no_grad()
def test_tiny_random_pair_verifier(tiny_pair):
    from dimr.pairs import load_model

    verifier = load_model(tiny_pair, "verifier", "cpu")
    ids = torch.arange(3, 15).unsqueeze(0)
    mask = mask_from_key("01111011")
    hidden = layer_inputs(verifier, ids)
    want = slim_verifier(verifier, mask)(ids).logits
    torch.testing.assert_close(forward_from(verifier, mask, hidden), want)
