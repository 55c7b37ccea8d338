"""Fuzzy speculative decoding (Holsman et al., ACL Findings 2025, arXiv 2502.20704).

Acceptance is deterministic and ignores which token was drafted: position i passes iff Div(p_d,i, p_t,i) ≤ T,
with Div measured on the models' own (temperature-1) distributions. At the first failing position the token is
drawn from p_t itself, not from the residual; π_bonus = p_t. In the unified form: π_rej = p_d where Div ≤ T and 0
elsewhere; π_res = p_d + p_t, whose residual (π_res − p_d)+ is p_t. Divergences: JS (the authors' default,
T ≈ 0.4), KL, TV; T is per divergence. T < 0 switches relaxation off (every token comes from p_t: lossless
output, no speed-up), so the sweep starts at T = 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from dimr.decoding.verify import Context, Targets
from dimr.divergence import DIVERGENCES, own_probs
from dimr.relaxed.base import require_context


@dataclass(frozen=True)
class Fuzzy:
    threshold: float = -1.0  # T; < 0 = off
    divergence: str = "js"

    def __post_init__(self) -> None:
        if self.divergence not in DIVERGENCES:
            raise ValueError(f"unknown divergence {self.divergence!r}; use one of {', '.join(DIVERGENCES)}")

    def __call__(self, draft_probs: Tensor, full_probs: Tensor, context: Context | None = None) -> Targets:
        ctx = require_context(context, "fuzzy")
        n = draft_probs.shape[0]
        div = DIVERGENCES[self.divergence](own_probs(ctx.draft_logits), own_probs(ctx.full_logits[:n]))
        passes = (div <= self.threshold)[:, None]
        rej = torch.where(passes, draft_probs, torch.zeros_like(draft_probs))
        return Targets(rej, draft_probs + full_probs[:-1], full_probs[-1])
