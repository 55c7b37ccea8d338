"""CACTUS (ICLR 2026, arXiv 2604.04987): raise the target's mass on the drafted token within a KL budget δ.

With q = p_t(x) for the drafted x: h(x) = min(1, q + √(2δ·q(1 − q))) and every other token scaled by
(1 − h(x))/(1 − q). π_rej(x) = h(x) (accept with min(1, h(x)/p_d(x))), π_res = h built around the drafted token
at that position, π_bonus = p_t. δ = 0 is lossless; the authors' quick start uses δ = 1. At temperature 0 (q ∈
{0, 1}) nothing is relaxed; tokens with p_t(x) = 0 never are.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from dimr.decoding.verify import Context, Targets, lossless
from dimr.relaxed.base import require_context


def raised_mass(full_probs: Tensor, delta: float) -> Tensor:
    """h = min(1, p_t + √(2δ·p_t(1 − p_t))) elementwise: the raised mass each token would get if drafted."""
    return (full_probs + (2 * delta * full_probs * (1 - full_probs)).clamp_min(0).sqrt()).clamp(max=1.0)


@dataclass(frozen=True)
class Cactus:
    delta: float = 0.0  # KL budget (nats, χ² approximation); 0 = lossless

    def __call__(self, draft_probs: Tensor, full_probs: Tensor, context: Context | None = None) -> Targets:
        if self.delta <= 0:
            return lossless(draft_probs, full_probs)
        tokens = require_context(context, "cactus").tokens
        target = full_probs[:-1]
        h = raised_mass(target, self.delta)  # π_rej, read at the drafted token only
        idx = torch.arange(tokens.numel(), device=tokens.device)
        q, h_x = target[idx, tokens], h[idx, tokens]
        scale = torch.where(q < 1, (1 - h_x) / (1 - q).clamp_min(1e-30), torch.ones_like(q))
        h_around_x = target * scale[:, None]
        h_around_x[idx, tokens] = h_x
        return Targets(h, h_around_x, full_probs[-1])
