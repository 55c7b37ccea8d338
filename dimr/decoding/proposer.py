"""The draft tier as a proposer: something that proposes γ tokens with the distributions they came from.

A proposer is a model with its own KV cache — the draft model (``sd``, ``via``) or the slim verifier
(``self``) — or :class:`NgramProposer`, prompt-lookup drafts that need no model (``lookup``). Another
proposer (early exit…) only has to implement :class:`Proposer`.
"""

from __future__ import annotations

import math
from typing import Protocol

import torch
from torch import Tensor

from dimr.decoding.sampling import Sampler
from dimr.decoding.tiers import Tier
from dimr.divergence import own_probs


class Proposer(Protocol):
    tier: Tier | None  # None: the proposer runs no model
    name: str  # the tier name in acceptance statistics: draft, slim or lookup
    one_hot: bool  # its drafts are deterministic (one-hot distributions), whatever the sampler

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

    one_hot = False

    def __init__(self, tier: Tier) -> None:
        self.tier = tier
        self.name = tier.name
        self.hidden: Tensor | None = None  # [γ, d]: last hidden states of the last proposal, if tier.keep_hidden
        self.sure = 0  # leading tokens of the last proposal the proposer gave at least ``stop_below`` (all if 0)

    def propose(self, ids: Tensor, gamma: int, sampler: Sampler, generator: torch.Generator | None,
                stop_below: float = 0.0) -> tuple[Tensor, Tensor, Tensor]:
        tokens, probs, logits, hidden = [], [], [], []
        self.sure = 0
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
            self.sure += 1
        self.hidden = torch.stack(hidden) if hidden else None
        return torch.cat(tokens), torch.stack(probs), torch.stack(logits)

    def keep(self, length: int) -> None:
        self.tier.crop(length)


def lookup(ids: Tensor, gamma: int, max_ngram: int = 3, min_ngram: int = 1) -> Tensor:
    """Up to ``gamma`` tokens that followed the latest earlier occurrence of the longest suffix n-gram of
    ``ids`` (``max_ngram`` down to ``min_ngram`` tokens); empty if no suffix n-gram occurred before."""
    return lookup_match(ids, gamma, max_ngram, min_ngram)[0]


def lookup_match(ids: Tensor, gamma: int, max_ngram: int = 3, min_ngram: int = 1) -> tuple[Tensor, int]:
    """:func:`lookup`'s proposal and the length of the n-gram it matched (0: none)."""
    for n in range(min(max_ngram, ids.numel() - 1), min_ngram - 1, -1):
        hits = (ids[:-1].unfold(0, n, 1) == ids[-n:]).all(-1).nonzero()  # windows ending before the last token
        if hits.numel():
            start = int(hits[-1, 0]) + n
            return ids[start:start + gamma], n
    return ids[:0], 0


class NgramIndex:
    """:func:`lookup_match` on a sequence that grows between calls, from a table of each n-gram's latest earlier
    occurrence kept up to date as tokens are appended: a few dict look-ups a call where the search is a few tensor
    ops per n-gram length over the whole sequence, at every block of ``lookup`` and of ``auto`` (inside mini's
    ``auto`` decodes 46 µs a call against 80: ``benchmarks/ngram_index_cost.py``). A sequence that is not the last
    one extended is indexed afresh."""

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1) -> None:
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.tokens: list[int] = []
        self.after: dict[tuple[int, ...], int] = {}  # n-gram → where what followed its latest occurrence starts

    def match(self, ids: Tensor, gamma: int) -> tuple[Tensor, int]:
        """:func:`lookup_match` of ``ids`` [L] with this index's n-gram lengths."""
        tokens = ids.tolist()
        known = len(self.tokens)
        if len(tokens) < known or tokens[:known] != self.tokens:
            self.after, known = {}, 0
        # the windows that now end before the last token: ending at known - 1 … L - 2
        for end in range(max(known - 1, 0), len(tokens) - 1):
            for n in range(self.min_ngram, min(self.max_ngram, end + 1) + 1):
                self.after[tuple(tokens[end - n + 1:end + 1])] = end + 1
        self.tokens = tokens
        for n in range(min(self.max_ngram, len(tokens) - 1), self.min_ngram - 1, -1):
            start = self.after.get(tuple(tokens[-n:]))
            if start is not None:
                return ids[start:start + gamma], n
        return ids[:0], 0


class NgramProposer:
    """Prompt-lookup decoding (HF's ``prompt_lookup_num_tokens``, vLLM's n-gram speculator): the draft is
    what followed the last n-gram earlier in the prompt and output. Deterministic, so its distribution is
    one-hot and speculative sampling against it stays lossless (acceptance q(x), residual (q − 1_x)+)."""

    tier = None
    name = "lookup"
    hidden = None
    one_hot = True

    def __init__(self, vocab_size: int, max_ngram: int = 3, min_ngram: int = 1) -> None:
        self.vocab_size, self.index = vocab_size, NgramIndex(max_ngram, min_ngram)

    def propose(self, ids: Tensor, gamma: int, sampler: Sampler, generator: torch.Generator | None,
                stop_below: float = 0.0) -> tuple[Tensor, Tensor, Tensor]:
        tokens = self.index.match(ids, gamma)[0]
        probs = torch.nn.functional.one_hot(tokens, self.vocab_size).float()
        # log of the one-hot rows, built directly: `probs.log()` costs ~2 ms per block at a 49k vocabulary
        logits = torch.full_like(probs, -math.inf).scatter_(-1, tokens[:, None], 0.0)
        return tokens, probs, logits

    def keep(self, length: int) -> None:
        pass
