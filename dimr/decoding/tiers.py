"""One tier of the decoder (draft, slim or full): a model, its own KV cache, and its counters.

The cache holds the keys/values of the first ``length`` tokens of the sequence. A forward appends to it; on
rejection :meth:`Tier.crop` drops the tail (``DynamicCache.crop``), nothing is recomputed. Sliding-window
layers (Gemma2) are put in past-recording mode so that a crop can roll back past the window; that mode
needs exactly one ``crop`` after the forwards that grew the cache, which the decoding loops do every block.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from torch import Tensor
from transformers import DynamicCache, PreTrainedModel


@dataclass
class Tier:
    """A KV-cached model. ``calls`` counts its forwards, ``seconds``/``cpu_seconds`` the wall/CPU time in them."""

    name: str
    model: PreTrainedModel
    cache: DynamicCache = field(init=False)
    length: int = field(init=False, default=0)
    calls: int = field(init=False, default=0)
    seconds: float = field(init=False, default=0.0)
    cpu_seconds: float = field(init=False, default=0.0)
    keep_hidden: bool = False  # also keep the last hidden states of each forward (relaxed rules, issue 7)
    hidden: Tensor | None = field(init=False, default=None)  # [keep, d] after the final norm, if keep_hidden

    def __post_init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Empty the cache and zero the counters (a new prompt)."""
        self.cache = DynamicCache(config=self.model.config)
        self.cache.activate_past_recording()
        self.length = self.calls = 0
        self.seconds = self.cpu_seconds = 0.0

    def forward(self, input_ids: Tensor, keep: int) -> Tensor:
        """Feed ``input_ids`` [n] at positions ``length``… and return the last ``keep`` logits [keep, V]."""
        t0, c0 = time.perf_counter(), time.process_time()
        n = input_ids.numel()
        positions = torch.arange(self.length, self.length + n, device=input_ids.device)[None]
        out = self.model(input_ids=input_ids[None], position_ids=positions, cache=self.cache, use_cache=True,
                         logits_to_keep=keep, output_hidden_states=self.keep_hidden or None)
        self.length += n
        self.hidden = out.hidden_states[-1][0, -keep:] if self.keep_hidden else None
        logits = out.logits[0]
        if logits.device.type == "cuda":
            torch.cuda.synchronize(logits.device)
        self.calls += 1
        self.seconds += time.perf_counter() - t0
        self.cpu_seconds += time.process_time() - c0
        return logits

    def crop(self, length: int) -> None:
        """Keep the cache of the first ``length`` tokens (no-op if it holds fewer)."""
        drop = max(self.length - length, 0)
        self.cache.crop(-drop)
        self.length -= drop
