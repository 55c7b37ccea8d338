"""Predictions to print beside measurements: expected accepted length and the survey's speed-up model.

- Expected accepted length with position-dependent acceptance (DIVERSED): per block,
  E[accepted] = Σ_{k ≤ γ} Π_{t ≤ k} β_t with β_t = Σ_x min(p_d, π_rej) = 1 − TV(p_d, π_rej) for a normalised
  π_rej. :class:`Recorder` wraps any rule and keeps the β_t of every block it verified, along the drafted
  path, so the average of Σ_k Π_{t ≤ k} β_t over blocks is an unbiased prediction of the measured mean
  accepted length (not the i.i.d. β(1 − β^γ)/(1 − β)).
- The survey's model: S ≈ (L̄_AR / L̄_relax) · (l̄_accept + 1) / (1 + N_draft · c_rel): relaxation that lengthens
  answers can cost more than it gains.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from torch import Tensor

from dimr.decoding.verify import Context, Targets, TargetsFn
from dimr.relaxed.base import acceptance_probs


def expected_accepted_length(betas: Tensor) -> float:
    """Σ_k Π_{t ≤ k} β_t for one block's acceptance probabilities [n]."""
    return float(torch.cumprod(betas.double(), 0).sum()) if betas.numel() else 0.0


def survey_speedup(len_ar: float, len_relax: float, accepted_length: float, n_draft: int, c_rel: float) -> float:
    """S ≈ (L̄_AR / L̄_relax) · (l̄_accept + 1) / (1 + N_draft · c_rel)."""
    if len_relax <= 0:
        return 0.0
    return (len_ar / len_relax) * (accepted_length + 1) / (1 + n_draft * c_rel)


@dataclass
class Recorder:
    """Wraps a rule; records β_t per verified block and the seconds the rule took. Transparent to the decoder
    (same Targets, same hidden)."""

    rule: TargetsFn
    betas: list[Tensor] = field(default_factory=list)
    seconds: float = 0.0  # the rule's own time over every call, measured inside the decode

    @property
    def needs_hidden(self) -> bool:
        return bool(getattr(self.rule, "needs_hidden", False))

    @property
    def needs_draft_model(self) -> bool:
        return bool(getattr(self.rule, "needs_draft_model", False))

    def __call__(self, draft_probs: Tensor, full_probs: Tensor, context: Context | None = None) -> Targets:
        began = time.perf_counter()
        targets = self.rule(draft_probs, full_probs, context)
        self.seconds += time.perf_counter() - began
        self.betas.append(acceptance_probs(draft_probs, targets).detach().cpu())
        return targets

    def reset(self) -> None:
        self.betas.clear()
        self.seconds = 0.0

    @property
    def predicted_accepted_length(self) -> float:
        """Mean over recorded blocks of Σ_k Π_{t ≤ k} β_t."""
        return sum(map(expected_accepted_length, self.betas)) / len(self.betas) if self.betas else 0.0

    @property
    def predicted_acceptance(self) -> float:
        """Mean β_t over every verified position (the per-token acceptance, an upper view of the measured rate:
        positions after a rejection are never tested)."""
        return float(torch.cat(self.betas).mean()) if self.betas else 0.0
