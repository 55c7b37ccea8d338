"""A ready decoder: a pair's models, its tokenizer and (optionally) a slim verifier from a slim config.

This is the Python API behind ``dimr decode``::

    dec = Decoder.load("mini", slim="slim.json")
    text, result = dec.generate("def fib(n):", mode="via", config=DecodeConfig(max_new_tokens=64))
    print(text, *result.stats.lines(), sep="\\n")
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch import Tensor
from transformers import PreTrainedModel

from dimr.decoding import modes, verify
from dimr.decoding.proposer import ModelProposer
from dimr.decoding.sequence import DecodeConfig, DecodeResult
from dimr.decoding.tiers import Tier
from dimr.errors import DimrError

MODES = ("ar", "sd", "self", "via")


@dataclass
class Decoder:
    """The three tiers (``slim`` may be None: then only ``ar`` and ``sd`` run) and the tokenizer."""

    full: Tier
    draft: Tier
    slim: Tier | None = None
    tokenizer: object | None = None

    @classmethod
    def from_models(cls, verifier: PreTrainedModel, draft: PreTrainedModel, slim: PreTrainedModel | None = None,
                    tokenizer: object | None = None, compiled: bool = False, timed: bool = True) -> Decoder:
        """``compiled``: static KV caches and compiled forwards (see :mod:`dimr.decoding.tiers`); ``timed``:
        per-tier timings (a device sync per forward on a GPU)."""
        slim_tier = Tier("slim", slim, compiled, timed) if slim is not None else None
        return cls(Tier("full", verifier, compiled, timed), Tier("draft", draft, compiled, timed), slim_tier,
                   tokenizer)

    @classmethod
    def load(cls, pair: str, slim: str | Path | None = None, device: str | None = None,
             pairs_file: Path | None = None, mask: Sequence[bool] | None = None, compiled: bool | None = False,
             timed: bool = True) -> Decoder:
        """Load ``pair``'s models on ``device``; the slim verifier from a slim config (or a raw ``mask``).
        ``compiled=None``: compiled on a GPU (exact: a decode longer than a sliding window runs eagerly), eager on
        the CPU. On a GPU the models load in bfloat16 unless the pair names float16 (`dimr.pairs.model_dtype`)."""
        from dimr.pairs import get_pair, load_model, load_tokenizer, pick_device
        from dimr.slim_config import apply_slim_config, check_pair, load_slim_config

        p = get_pair(pair, pairs_file)
        dev = pick_device(device)
        cfg = None
        if slim is not None:  # checked before any weights load
            cfg = load_slim_config(Path(slim))
            check_pair(cfg, p)
        verifier = load_model(p, "verifier", dev)
        slim_model = None
        if cfg is not None:
            slim_model = apply_slim_config(cfg, verifier)
        elif mask is not None:
            from dimr.slim import slim_verifier

            slim_model = slim_verifier(verifier, mask)
        if compiled is None:
            compiled = dev.type == "cuda"
        return cls.from_models(verifier, load_model(p, "draft", dev), slim_model, load_tokenizer(p), compiled, timed)

    def warm_up(self, capacity: int = 240, modes: Sequence[str] = MODES) -> None:
        """Compile the forwards of the compiled tiers that ``modes`` use, for decodes of up to ``capacity``
        tokens in all, so that no decode waits for a compile."""
        used = {"full"} | ({"draft"} if {"sd", "via"} & set(modes) else set()) | (
            {"slim"} if {"self", "via"} & set(modes) else set())
        for tier in (self.full, self.draft, self.slim):
            if tier is not None and tier.name in used:
                tier.warm_up(capacity)

    @property
    def device(self) -> torch.device:
        return self.full.model.device

    def eos_token_ids(self) -> tuple[int, ...]:
        eos = getattr(self.full.model.generation_config, "eos_token_id", None)
        if eos is None and self.tokenizer is not None:
            eos = self.tokenizer.eos_token_id
        return tuple(eos) if isinstance(eos, (list, tuple)) else (() if eos is None else (int(eos),))

    def encode(self, prompt: str) -> Tensor:
        ids = self.tokenizer(prompt, return_tensors="pt").input_ids[0]
        if ids.numel() == 0:
            bos = self.tokenizer.bos_token_id
            if bos is None:
                raise DimrError("the prompt is empty and the tokenizer has no BOS token; pass a prompt")
            ids = torch.tensor([bos])
        return ids.to(self.device)

    def run(self, prompt: Tensor, mode: str, config: DecodeConfig,
            targets: verify.TargetsFn = verify.lossless) -> DecodeResult:
        """Decode token ids [L] with ``mode`` (ar | sd | self | via); ``targets``: the verification rule."""
        if mode not in MODES:
            raise DimrError(f"unknown decoding mode {mode!r}; use one of {', '.join(MODES)}")
        if mode in ("self", "via") and self.slim is None:
            raise DimrError(f"mode {mode!r} needs a slim verifier; pass --slim with an exported slim config")
        if mode == "ar" and targets is not verify.lossless:
            raise DimrError("mode 'ar' has no draft to verify; use a relaxed rule with sd, self or via")
        needs_hidden = bool(getattr(targets, "needs_hidden", False))
        for tier in (self.full, self.draft, self.slim):
            if tier is not None:
                tier.keep_hidden = needs_hidden
        if mode == "ar":
            return modes.ar(self.full, prompt, config)
        if mode == "sd":
            return modes.sd(ModelProposer(self.draft), self.full, prompt, config, targets=targets)
        if mode == "self":
            return modes.sd(ModelProposer(self.slim), self.full, prompt, config, mode="self", targets=targets)
        return modes.via(ModelProposer(self.draft), self.slim, self.full, prompt, config, targets=targets)

    def generate(self, prompt: str, mode: str = "via", config: DecodeConfig | None = None,
                 stop_at_eos: bool = True, targets: verify.TargetsFn = verify.lossless) -> tuple[str, DecodeResult]:
        """Text in, text out (the continuation only)."""
        config = config or DecodeConfig()
        if stop_at_eos and not config.eos_token_ids:
            config = replace(config, eos_token_ids=self.eos_token_ids())
        result = self.run(self.encode(prompt), mode, config, targets)
        return self.tokenizer.decode(result.tokens, skip_special_tokens=True), result
