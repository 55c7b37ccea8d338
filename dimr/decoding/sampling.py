"""Logits → probabilities (temperature, top-p, greedy) and drawing tokens from them.

Greedy decoding is temperature 0 and is represented as a one-hot distribution at the argmax. That keeps one
code path: the speculative acceptance test min(1, full/draft) is then exactly "the draft token is the full
verifier's argmax", and the residual (full − draft)+ is the full verifier's argmax, so greedy speculative
decoding reproduces greedy autoregressive decoding token for token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class Sampler:
    """How a distribution over the vocabulary is made from logits. ``temperature=0`` is greedy."""

    temperature: float = 0.0
    top_p: float = 1.0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0

    def probs(self, logits: Tensor) -> Tensor:
        """float32 probabilities, same shape as ``logits`` ([..., V])."""
        logits = logits.float()
        if self.greedy:
            return torch.zeros_like(logits).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
        probs = torch.softmax(logits / self.temperature, dim=-1)
        if self.top_p < 1.0:
            probs = top_p_filter(probs, self.top_p)
        return probs

    def draw(self, probs: Tensor, generator: torch.Generator | None, u: Tensor | None = None) -> Tensor:
        """A token from ``probs`` ([V] → [1]): the argmax when greedy (no random draw), else :func:`sample`, or
        :func:`inverse_cdf` at the uniform ``u`` [1] when given."""
        if self.greedy:
            return probs.argmax(-1, keepdim=True)
        return sample(probs, generator) if u is None else inverse_cdf(probs, u)


def top_p_filter(probs: Tensor, top_p: float) -> Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches ``top_p`` (≥ 1 token); renormalise."""
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    mass_before = sorted_probs.cumsum(-1) - sorted_probs
    sorted_probs = sorted_probs.masked_fill(mass_before >= top_p, 0.0)
    kept = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
    return kept / kept.sum(-1, keepdim=True)


def sample(probs: Tensor, generator: torch.Generator | None) -> Tensor:
    """One token per row of ``probs`` ([V] → [1], [n, V] → [n, 1]); weights need not be normalised.

    By inverting the cumulative weights at one uniform per row (:func:`inverse_cdf`): on CPU ``torch.multinomial``
    takes 1.2 ms for one token of a 49k vocabulary (120 µs at 4k), this 95 µs (34 µs), and a sampled block draws
    one token per drafted position and one after."""
    u = torch.rand((*probs.shape[:-1], 1), generator=generator, device=probs.device, dtype=probs.dtype)
    return inverse_cdf(probs, u)


def inverse_cdf(probs: Tensor, u: Tensor) -> Tensor:
    """Per row of ``probs`` ([V] or [n, V], weights need not be normalised), the token whose interval of the
    cumulative weights holds ``u`` [1] or [n, 1] (in [0, 1)) times the total: a draw of the row's law when ``u`` is
    uniform. A token of weight 0 is never drawn: its interval is empty, and a uniform rounded up to the total falls
    back to the last token of positive weight."""
    cdf = probs.cumsum(-1)
    total = cdf[..., -1:]
    out = torch.searchsorted(cdf, u.to(cdf.dtype).view(total.shape) * total, right=True)
    if bool((out >= probs.shape[-1]).any()):
        last = probs.shape[-1] - 1 - (probs > 0).flip(-1).int().argmax(-1, keepdim=True)
        out = torch.where(out >= probs.shape[-1], last, out)
    return out
