"""Local pairs that need no model hub.

- ``tiny-random``: a Llama verifier (8 layers) and draft (2 layers) with seeded random weights and a
  byte-level tokenizer, written once under ``$DIMR_HOME`` and then loaded like any local checkpoint.
- ``mini``: the small real pair trained by ``dimr zoo train-mini`` and shipped in ``dimr/zoo/mini``.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

MINI_DIR = Path(__file__).parent / "mini"
DATA_DIR = Path(__file__).parent / "data"
TINY_SEED = 1234
TINY_VERSION = 1  # bump when the tiny pair's recipe changes


def byte_tokenizer():
    """A byte-level tokenizer with no merges: 256 byte tokens + <bos>/<eos>/<pad>. Fully offline."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    for tok in ("<bos>", "<eos>", "<pad>"):
        vocab[tok] = len(vocab)
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>")


def _tiny_config(num_layers: int, vocab_size: int):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=num_layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        bos_token_id=vocab_size - 3, eos_token_id=vocab_size - 2, pad_token_id=vocab_size - 1,
        tie_word_embeddings=False,
    )


def materialise_tiny_random(root: Path) -> Path:
    """Write the tiny-random pair (tokenizer, verifier, draft) under ``root`` if not there yet."""
    from transformers import LlamaForCausalLM

    done = root / "DONE"
    if done.exists() and done.read_text() == str(TINY_VERSION):
        return root
    tok = byte_tokenizer()
    for name, layers in (("verifier", 8), ("draft", 2)):
        torch.manual_seed(TINY_SEED + layers)
        model = LlamaForCausalLM(_tiny_config(layers, len(tok)))
        model.save_pretrained(root / name)
        tok.save_pretrained(root / name)
    (root / "calibration.txt").write_text(tiny_calibration_text())
    done.write_text(str(TINY_VERSION))
    return root


def tiny_calibration_text() -> str:
    """Deterministic text for the tiny pair's default calibration: some Python source of this file."""
    return Path(__file__).read_text() * 4


def tiny_random_root() -> Path:
    """Where the tiny-random pair lives (written by `materialise_tiny_random` on first load, not before)."""
    from dimr.paths import dimr_home

    return dimr_home() / f"tiny-random-v{TINY_VERSION}"


def mini_info() -> dict | None:
    """The shipped ``mini`` pair's metadata, or None if this checkout does not have it."""
    meta = MINI_DIR / "pair.json"
    return json.loads(meta.read_text()) if meta.exists() else None
