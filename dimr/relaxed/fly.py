"""FLy (arXiv 2511.22972): accept a mismatch when the target is unsure and the draft gets back on track.

Base check: the lossless test (at temperature 0: the drafted token is the target's argmax). A mismatch at
position i is accepted anyway when the target's top-3 entropy there (top-3 probabilities renormalised, own
temperature-1 distribution, nats) is ≥ θ and the next W − 1 drafted tokens, all inside this block, match the
target's argmax. In the unified form π_rej = p_d at those positions and p_t elsewhere; π_res = π_bonus = p_t.
The paper's defaults are W = 6, θ = 0.3 at temperature 0; our blocks are γ ≤ 8 tokens, so the default here is
W = 3 (a window of 6 would only ever fit at γ = 8). θ = inf is lossless.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from dimr.decoding.verify import Context, Targets
from dimr.divergence import own_probs
from dimr.relaxed.base import require_context


def top3_entropy(probs: Tensor) -> Tensor:
    """Entropy (nats) of the renormalised top-3 probabilities, [n, V] → [n]; at most ln 3."""
    top = probs.topk(min(3, probs.shape[-1]), dim=-1).values
    top = top / top.sum(-1, keepdim=True)
    return -(top * top.clamp_min(1e-30).log()).sum(-1)


@dataclass(frozen=True)
class Fly:
    theta: float = math.inf  # entropy threshold (nats); inf = lossless
    window: int = 3  # W: the mismatch plus W − 1 matching drafts after it

    def __call__(self, draft_probs: Tensor, full_probs: Tensor, context: Context | None = None) -> Targets:
        ctx = require_context(context, "fly")
        n, tokens = draft_probs.shape[0], ctx.tokens
        matches = tokens == ctx.full_logits[:n].argmax(-1)
        unsure = top3_entropy(own_probs(ctx.full_logits[:n])) >= self.theta
        back_on_track = torch.zeros(n, dtype=torch.bool, device=tokens.device)
        for i in range(max(n - self.window + 1, 0)):
            back_on_track[i] = bool(matches[i + 1:i + self.window].all())
        relaxed = (~matches & unsure & back_on_track)[:, None]
        rej = torch.where(relaxed, draft_probs, full_probs[:-1])
        return Targets(rej, full_probs[:-1], full_probs[-1])
