"""Shared-prefix escalation: the full forward starts where the slim verifier first differs from it.

The layers before the slim's first skipped layer f (`first_skipped_of`) are the full verifier's own, on the
same tokens, so the keys/values the slim tier cached for them and the hidden state it fed into its layer f are
exactly what the full verifier would compute. :class:`SharedPrefix` records that hidden state during slim
forwards (a pre-hook on slim layer f); :meth:`SharedPrefix.forward` then appends the slim's keys/values of
layers < f to the full cache, runs layers < f only for the tokens the slim has not seen, and layers ≥ f for
all of them.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor
from transformers.cache_utils import Cache

from dimr.decoding.tiers import Tier
from dimr.masks import SublayerMask
from dimr.slim import _build_slim, _slots, decoder_layers


def first_skipped_of(slim: Tier) -> int:
    """f: the slim's layers 0..f−1 are the full verifier's layers 0..f−1, whole and in place, so the input of
    the slim's layer f is the full's hidden state entering layer f (0 when there is none, or when the slim has
    no layer f to start from: nothing to share). In a sublayer slim a layer whose attention is skipped runs its
    MLP inside the slim layer before it (`dimr.slim._slots`), so that earlier layer is not whole either."""
    key = getattr(slim.model.config, "dimr_mask", None) or ""
    if not key:
        return 0
    slots, parts = _slots(SublayerMask.from_key(key))
    f = 0
    while f < len(slots) and slots[f] == f and parts[f] == [("attn", f), ("mlp", f)]:
        f += 1
    return f if f < len(decoder_layers(slim.model)) else 0


class SharedPrefix:
    """Escalations of ``full`` that reuse ``slim``'s first ``f`` layers (dynamic caches only)."""

    def __init__(self, full: Tier, slim: Tier) -> None:
        self.full, self.slim, self.f = full, slim, first_skipped_of(slim)
        self.layers = len(decoder_layers(full.model))
        part = [SublayerMask.from_layer_mask([(i < self.f) == head for i in range(self.layers)]) for head in (1, 0)]
        self.head = _build_slim(full.model, part[0]).model
        self.head.norm = torch.nn.Identity()  # the head's own copy: it returns the hidden state entering layer f
        self.tail = _build_slim(full.model, part[1])
        self.hidden: Tensor | None = None  # [positions, d]: the hidden state entering layer f, per position

    @contextmanager
    def recording(self) -> Iterator[None]:
        """Record the slim's hidden states entering layer f during the decode in this block (a pre-hook on
        the slim's own shallow copy of that layer, so the full verifier and other callers never trigger it)."""
        hook = decoder_layers(self.slim.model)[self.f].register_forward_pre_hook(self._record, with_kwargs=True)
        self.hidden = None
        try:
            yield
        finally:
            hook.remove()

    def _record(self, _module, args, kwargs) -> None:
        h = (args[0] if args else kwargs["hidden_states"])[0]
        start, end = self.slim.length, self.slim.length + h.shape[0]
        if self.hidden is None or self.hidden.shape[0] < end:
            grown = h.new_zeros(max(end, 2 * (0 if self.hidden is None else self.hidden.shape[0])), h.shape[1])
            if self.hidden is not None:
                grown[: self.hidden.shape[0]] = self.hidden
            self.hidden = grown
        self.hidden[start:end] = h

    def usable(self) -> bool:
        """Whether both caches are dynamic and filled, so the slim's prefix can be spliced into the full's."""
        layers = getattr(self.full.cache, "layers", [])
        return (self.f > 0 and not self.full.static and not self.slim.static and self.full.length > 0
                and len(layers) == self.layers and self.hidden is not None)

    def forward(self, input_ids: Tensor, keep: int) -> Tensor:
        """``full.forward(input_ids, keep)``, computed from the slim's prefix where the slim saw the tokens."""
        if not self.usable():
            return self.full.forward(input_ids, keep)
        full, t0, c0 = self.full, time.perf_counter(), time.process_time()
        start, n = full.length, input_ids.numel()
        seen = max(0, min(self.slim.length, start + n) - start)  # tokens whose prefix the slim computed
        layers = full.cache.layers
        for i in range(self.f):
            src = self.slim.cache.layers[i]
            layers[i].update(src.keys[:, :, start:start + seen], src.values[:, :, start:start + seen])
        hidden = self.hidden[start:start + seen]
        positions = torch.arange(start, start + n, device=input_ids.device)
        if seen < n:
            rest = self.head(input_ids=input_ids[None, seen:], position_ids=positions[None, seen:],
                             cache_position=positions[seen:], cache=Cache(layers=layers[:self.f]), use_cache=True)
            hidden = torch.cat([hidden, rest.last_hidden_state[0]])
        logits = self.tail(inputs_embeds=hidden[None], position_ids=positions[None], cache_position=positions,
                           cache=Cache(layers=layers[self.f:]), use_cache=True, logits_to_keep=keep).logits[0]
        full.length += n
        full.count(n, (t0, c0) if full.timed else None)
        return logits
