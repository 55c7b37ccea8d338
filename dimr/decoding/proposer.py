"""The draft tier as a proposer: something that proposes γ tokens with the distributions they came from.

Today a proposer is a model with its own KV cache: the draft model (``sd``, ``via``) or the slim verifier
(``self``). Another proposer (n-gram look-up, early exit) only has to implement :class:`Proposer`.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor

from dimr.decoding.sampling import Sampler
from dimr.decoding.tiers import Tier
from dimr.divergence import own_probs


class Proposer(Protocol):
    tier: Tier

    def propose(self, ids: Tensor, gamma: int, sampler: Sampler, generator: torch.Generator | None,
                stop_below: float = 0.0) -> tuple[Tensor, Tensor, Tensor]:
        """Continue ``ids`` [L] by up to ``gamma`` tokens → (tokens [n], probs [n, V], logits [n, V]).

        Drafting stops early after a token the proposer gives less than ``stop_below`` (its own temperature-1
        probability; 0 = always γ tokens). Lossless either way: only the proposal length changes.
        """
        ...

    def keep(self, length: int) -> None:
        """The first ``length`` tokens of the sequence are final: forget anything after them."""
        ...


class ModelProposer:
    """Autoregressive proposals from a KV-cached causal LM (the draft model or the slim verifier)."""

    def __init__(self, tier: Tier) -> None:
        self.tier = tier
        self.hidden: Tensor | None = None  # [γ, d]: last hidden states of the last proposal, if tier.keep_hidden

    def propose(self, ids: Tensor, gamma: int, sampler: Sampler, generator: torch.Generator | None,
                stop_below: float = 0.0) -> tuple[Tensor, Tensor, Tensor]:
        tokens, probs, logits, hidden = [], [], [], []
        pending = ids[self.tier.length:]  # tokens the cache has not seen yet (≥ 1)
        for _ in range(gamma):
            step_logits = self.tier.forward(pending, keep=1)[0]
            if self.tier.hidden is not None:
                hidden.append(self.tier.hidden[-1])
            step_probs = sampler.probs(step_logits)
            pending = sampler.draw(step_probs, generator)
            tokens.append(pending)
            probs.append(step_probs)
            logits.append(step_logits)
            if stop_below > 0 and float(own_probs(step_logits)[pending]) < stop_below:
                break
        self.hidden = torch.stack(hidden) if hidden else None
        return torch.cat(tokens), torch.stack(probs), torch.stack(logits)

    def keep(self, length: int) -> None:
        self.tier.crop(length)
