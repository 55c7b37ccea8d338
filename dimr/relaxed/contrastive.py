"""Speculative contrastive decoding (Yuan et al., ACL 2024, arXiv 2311.08981); formula *unverified*, see docs.

The draft doubles as the contrastive "amateur": p_c ∝ exp((1 + β)·log p_t − β·log p_d) on the plausible set
{x : p_t(x) ≥ α·max p_t} and 0 elsewhere, with log-probabilities from the models' own distributions and the
decoder's sampler (temperature, top-p) applied to the contrastive logits. π_rej = π_res = p_c. π_bonus = p_t:
the draft has not run at the bonus position, so there is no amateur to contrast there (π_bonus = p_c
would need one more draft step). β = α = 0 is lossless. It aims at better answers at some cost in speed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from dimr.decoding.verify import Context, Targets, lossless
from dimr.relaxed.base import require_context


def contrastive_logits(full_logits: Tensor, draft_logits: Tensor, beta: float, alpha: float) -> Tensor:
    """(1 + β)·log p_t − β·log p_d on {p_t ≥ α·max p_t}, −inf elsewhere."""
    log_full, log_draft = torch.log_softmax(full_logits.float(), -1), torch.log_softmax(draft_logits.float(), -1)
    plausible = log_full >= log_full.max(-1, keepdim=True).values + torch.log(torch.tensor(max(alpha, 1e-30)))
    return torch.where(plausible, (1 + beta) * log_full - beta * log_draft, -torch.inf)


@dataclass(frozen=True)
class Contrastive:
    beta: float = 0.0  # contrast strength; 0 (with alpha 0) = lossless
    alpha: float = 0.0  # plausibility cut-off relative to the target's top probability
    needs_draft_model = True  # the amateur is a model's distribution; a one-hot n-gram draft has log p_d = −inf

    def __call__(self, draft_probs: Tensor, full_probs: Tensor, context: Context | None = None) -> Targets:
        if self.beta == 0 and self.alpha <= 0:
            return lossless(draft_probs, full_probs)
        ctx = require_context(context, "contrastive")
        n = draft_probs.shape[0]
        pc = ctx.sampler.probs(contrastive_logits(ctx.full_logits[:n], ctx.draft_logits, self.beta, self.alpha))
        return Targets(pc, pc, full_probs[-1])
