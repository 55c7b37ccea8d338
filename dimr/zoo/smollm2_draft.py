"""The SmolLM2 pair's draft: a few Llama layers and a sub-vocabulary head over SmolLM2's embedding.

At one token a SmolLM2 forward is memory-bound, and its 49152-row head costs more than all of a 2-layer
draft's layers together. The draft's head therefore scores only ``draft_vocab_size`` tokens (the ones the
verifier writes most often, ids in ``lm_head.vocab_ids``) with the verifier's own (tied, frozen) embedding
rows, and its logits for every other token are ``FILL`` (a large negative number, not ``-inf``, so that
``p·log p`` stays 0 in KL-type costs). It shares the verifier's tokenizer and vocabulary: logits come out
over all 49152 ids, and greedy/sampled proposals are ordinary token ids.

Shipped in ``dimr/zoo/smollm2/draft``: ``draft.safetensors`` (the trained layers and final norm in bfloat16
plus ``vocab_ids``), ``draft.json`` (which draft layer is trained, which is a frozen copy of a verifier layer)
and ``hashes.json``. :func:`draft_checkpoint` assembles a full transformers checkpoint (adding the verifier's
embedding, head rows and copied layers) under ``$DIMR_HOME/smollm2-draft/<hash>`` on first use;
:func:`load_draft` loads it. Importing this module registers the model type with ``AutoModelForCausalLM``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from dimr.errors import DimrError

DRAFT_DIR = Path(__file__).parent / "smollm2" / "draft"
MODEL_TYPE = "dimr_subvocab_llama"
FILL = -1.0e4
SHIPPED = ("draft.safetensors", "draft.json")
ASSEMBLY_VERSION = 1


class SubVocabLlamaConfig(LlamaConfig):
    model_type = MODEL_TYPE

    def __init__(self, draft_vocab_size: int = 8192, **kwargs):
        self.draft_vocab_size = draft_vocab_size
        kwargs["tie_word_embeddings"] = False
        super().__init__(**kwargs)


class SubVocabHead(nn.Module):
    """Logits over the full vocabulary from ``weight`` rows for ``vocab_ids`` only; ``FILL`` elsewhere."""

    def __init__(self, hidden: int, vocab_size: int, draft_vocab_size: int) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.weight = nn.Parameter(torch.zeros(draft_vocab_size, hidden), requires_grad=False)
        self.register_buffer("vocab_ids", torch.zeros(draft_vocab_size, dtype=torch.long))

    def sub_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden @ self.weight.T

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        sub = self.sub_logits(hidden)
        out = sub.new_full((*hidden.shape[:-1], self.vocab_size), FILL)
        return out.index_copy_(-1, self.vocab_ids, sub)


class SubVocabLlamaForCausalLM(LlamaForCausalLM):
    """A Llama causal LM whose head is a :class:`SubVocabHead` (see the module docstring)."""

    config_class = SubVocabLlamaConfig
    _tied_weights_keys = {}

    def __init__(self, config: SubVocabLlamaConfig) -> None:
        super().__init__(config)
        self.lm_head = SubVocabHead(config.hidden_size, config.vocab_size, config.draft_vocab_size)
        self.post_init()

    def get_output_embeddings(self):
        return None  # nothing to tie or resize: the head is a fixed subset of the embedding

    def _init_weights(self, module):
        if isinstance(module, SubVocabHead):
            return
        super()._init_weights(module)


AutoConfig.register(MODEL_TYPE, SubVocabLlamaConfig, exist_ok=True)
AutoModelForCausalLM.register(SubVocabLlamaConfig, SubVocabLlamaForCausalLM, exist_ok=True)


def build_draft(verifier: LlamaForCausalLM, layers: list[int], vocab_ids: torch.Tensor) -> SubVocabLlamaForCausalLM:
    """A draft whose layer ``i`` starts as a copy of verifier layer ``layers[i]``; embedding/head from the verifier."""
    vc = verifier.config.to_dict()
    for key in ("architectures", "model_type", "transformers_version", "tie_word_embeddings", "dtype",
                "quantization_config", "_name_or_path", "_model_name_or_path"):
        vc.pop(key, None)
    vc["num_hidden_layers"] = len(layers)
    config = SubVocabLlamaConfig(draft_vocab_size=len(vocab_ids), **vc)
    config.architectures = ["SubVocabLlamaForCausalLM"]
    draft = SubVocabLlamaForCausalLM(config).to(verifier.dtype)
    draft.model.embed_tokens.weight.data.copy_(verifier.model.embed_tokens.weight.data)
    draft.model.embed_tokens.weight.requires_grad_(False)
    for i, j in enumerate(layers):
        draft.model.layers[i].load_state_dict(verifier.model.layers[j].state_dict())
    draft.model.norm.load_state_dict(verifier.model.norm.state_dict())
    draft.lm_head.vocab_ids.copy_(vocab_ids.to(torch.long))
    draft.lm_head.weight.data.copy_(verifier.model.embed_tokens.weight.data[vocab_ids])
    draft.generation_config = verifier.generation_config
    return draft.eval()


def trained_state(draft: SubVocabLlamaForCausalLM, frozen: list[int]) -> dict[str, torch.Tensor]:
    """What ships: trained layers and the final norm (bfloat16) and the sub-vocabulary ids."""
    state = {}
    for name, t in draft.model.state_dict().items():
        if name.startswith("layers."):
            if int(name.split(".")[1]) in frozen:
                continue
        elif not name.startswith("norm."):
            continue
        state[f"model.{name}"] = t.detach().to(torch.bfloat16).contiguous()
    state["vocab_ids"] = draft.lm_head.vocab_ids.to(torch.int32).contiguous()
    return state


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def shipped_hashes(directory: Path = DRAFT_DIR) -> dict[str, str]:
    return {name: file_sha256(directory / name) for name in SHIPPED}


def save_shipped(draft: SubVocabLlamaForCausalLM, meta: dict, directory: Path = DRAFT_DIR) -> None:
    """Write ``draft.safetensors``, ``draft.json`` and ``hashes.json`` into ``directory``."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    save_file(trained_state(draft, meta["frozen"]), str(directory / "draft.safetensors"))
    (directory / "draft.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
    (directory / "hashes.json").write_text(json.dumps(shipped_hashes(directory), indent=1, sort_keys=True) + "\n")


def check_shipped(directory: Path = DRAFT_DIR) -> dict[str, str]:
    """The shipped files' hashes, after checking them against ``hashes.json`` (DimrError if they differ)."""
    if not (directory / "hashes.json").is_file():
        raise DimrError(f"the SmolLM2 draft is not in this checkout ({directory}): train it with "
                        "`python -m dimr.zoo.train_draft`")
    want = json.loads((directory / "hashes.json").read_text())
    have = shipped_hashes(directory)
    if have != want:
        bad = sorted(k for k in want if have.get(k) != want[k])
        raise DimrError(f"the SmolLM2 draft's files {bad} do not match {directory / 'hashes.json'}")
    return have


def assemble(verifier: LlamaForCausalLM, directory: Path = DRAFT_DIR) -> SubVocabLlamaForCausalLM:
    """The draft model from the shipped files and the verifier (in memory)."""
    from safetensors.torch import load_file

    meta = json.loads((directory / "draft.json").read_text())
    state = load_file(str(directory / "draft.safetensors"))
    vocab_ids = state.pop("vocab_ids").to(torch.long)
    draft = build_draft(verifier, meta["layers"], vocab_ids)
    missing = draft.load_state_dict({k: v.to(verifier.dtype) for k, v in state.items()}, strict=False)
    if missing.unexpected_keys:
        raise RuntimeError(f"unexpected draft tensors: {missing.unexpected_keys}")
    return draft.eval()


def draft_checkpoint(directory: Path = DRAFT_DIR) -> Path:
    """A full transformers checkpoint of the draft under ``$DIMR_HOME``, assembled on first use.

    Keyed by the shipped files' hashes and the verifier GGUF's hash; written to a temporary directory and
    renamed into place.
    """
    from dimr.gguf import gguf_file_hash, load_smollm2, smollm2_gguf_path
    from dimr.paths import dimr_home

    hashes = check_shipped(directory)
    gguf_hash = gguf_file_hash(smollm2_gguf_path())
    key = hashlib.sha256(json.dumps({"draft": hashes, "verifier": gguf_hash, "v": ASSEMBLY_VERSION},
                                    sort_keys=True).encode()).hexdigest()[:16]
    target = dimr_home() / "smollm2-draft" / key
    if (target / "DONE").is_file():
        return target
    verifier, tok = load_smollm2()
    draft = assemble(verifier, directory)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=target.parent))
    try:
        draft.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        (tmp / "DONE").write_text(json.dumps({"draft": hashes, "verifier_gguf": gguf_hash}, indent=1) + "\n")
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / "DONE").is_file():
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def load_draft(dtype=None) -> SubVocabLlamaForCausalLM:
    """The SmolLM2 draft in eval mode (assembling its checkpoint under ``$DIMR_HOME`` on first use)."""
    return AutoModelForCausalLM.from_pretrained(draft_checkpoint(), dtype=dtype or torch.float32).eval()
