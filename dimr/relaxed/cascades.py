"""Speculative cascades (Narasimhan et al., ICLR 2025; rules from the authors' Gemma colab, google-research).

A deferral rule picks, per position, a target π between the draft and the verifier; then lossless speculative
sampling runs against π (π_rej = π_res = π, π_bonus = p_t). Decisions use the models' own (temperature-1)
distributions, the mixture uses the sampler's. ``alpha`` is the colab's "lenience":

- ``chow``: π = p_d if max p_d ≥ 1 − α, else p_t;
- ``diff``: π = p_d if max p_d ≥ max p_t − α, else p_t;
- ``opt``: π = p_d if max p_d ≥ max p_t − α·TV(p_d, p_t), else p_t;
- ``token`` (the colab's token-v2): tokens with p_t(v) ≥ max p_t − α are accepted from the draft,
  π = p_d·1[accepted] + (1 − Σ p_d·1[accepted])·p_t.

α = −1 is lossless for chow, diff and token (α = −inf for opt); α = 1 is the draft alone for chow and token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from dimr.decoding.verify import Context, Targets
from dimr.divergence import own_probs, tv
from dimr.relaxed.base import require_context

RULES = ("chow", "diff", "opt", "token")


@dataclass(frozen=True)
class Cascade:
    alpha: float = -1.0  # lenience; -1 = lossless
    rule: str = "token"

    def __post_init__(self) -> None:
        if self.rule not in RULES:
            raise ValueError(f"unknown deferral rule {self.rule!r}; use one of {', '.join(RULES)}")

    def __call__(self, draft_probs: Tensor, full_probs: Tensor, context: Context | None = None) -> Targets:
        ctx = require_context(context, "cascade")
        n = draft_probs.shape[0]
        own_draft, own_full = own_probs(ctx.draft_logits), own_probs(ctx.full_logits[:n])
        target = full_probs[:-1]
        max_draft, max_full = own_draft.max(-1).values, own_full.max(-1).values
        if self.rule == "token":
            kept = (own_full >= (max_full - self.alpha)[:, None]).float()
            kept_draft = draft_probs * kept
            pi = kept_draft + (1 - kept_draft.sum(-1, keepdim=True)) * target
        else:
            if self.rule == "chow":
                use_draft = max_draft >= 1 - self.alpha
            elif self.rule == "diff":
                use_draft = max_draft >= max_full - self.alpha
            else:
                use_draft = max_draft >= max_full - self.alpha * tv(own_draft, own_full)
            pi = torch.where(use_draft[:, None], draft_probs, target)
        return Targets(pi, pi, full_probs[-1])
