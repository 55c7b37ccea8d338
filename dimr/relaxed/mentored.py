"""Mentored decoding: the mentor π closest to p_d within a KL budget D of the target.

With r = p_t/p_d: π = p_t/α where r ≤ α, p_d where α < r < β, p_t/β where r ≥ β (0 < α ≤ 1 ≤ β, β set so that
π sums to 1); α is found by bisection so that KL(p_t ‖ π) ≈ D. Speculative sampling against π: π_rej = π (accept
with min(1, r(x)/α)), π_res = π (residual norm(max(0, p_t/β − p_d))), π_bonus = p_t. If KL(p_t ‖ p_d) ≤ D the
draft is accepted outright. D = 0 is lossless; typical D is 0.1–0.2 nats. Not meant for temperature 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from dimr.decoding.verify import Context, Targets, lossless
from dimr.divergence import kl


def _sorted_ratios(full_probs: Tensor, draft_probs: Tensor) -> tuple[Tensor, ...]:
    """The α-independent part of π: r = p_t/p_d, r sorted, the cumulative masses of p_t and p_d in that order,
    and each split's neighbouring ratios (computed once per verification, reused by every bisection step)."""
    ratio = torch.where(draft_probs > 0, full_probs / draft_probs.clamp_min(1e-30),
                        torch.where(full_probs > 0, torch.inf, 0.0))
    r_sorted, order = ratio.sort(-1)
    t_sorted, d_sorted = full_probs.gather(-1, order), draft_probs.gather(-1, order)
    zero = torch.zeros_like(t_sorted[:, :1])
    t_cum, d_cum = torch.cat([zero, t_sorted.cumsum(-1)], -1), torch.cat([zero, d_sorted.cumsum(-1)], -1)
    r_lo = torch.cat([zero - torch.inf, r_sorted], -1)  # r of the token before the split
    r_hi = torch.cat([r_sorted, zero + torch.inf], -1)  # r of the token after it
    return ratio, r_sorted.contiguous(), t_cum, d_cum, r_lo, r_hi


def _mentor(full_probs: Tensor, draft_probs: Tensor, alpha: Tensor, ratios: tuple[Tensor, ...]) -> Tensor:
    ratio, r_sorted, t_cum, d_cum, r_lo, r_hi = ratios
    a = alpha[:, None]
    i_alpha = torch.searchsorted(r_sorted, a.contiguous(), right=True)  # tokens with r ≤ α come first
    low_mass = t_cum.gather(-1, i_alpha) / a  # Σ_{r ≤ α} p_t/α
    # split j ≥ i_α: sorted tokens [i_α, j) take p_d, [j, V) take p_t/β; f(β) = 1 gives β_j
    mid = d_cum - d_cum.gather(-1, i_alpha)
    beta_j = (t_cum[:, -1:] - t_cum) / (1 - low_mass - mid).clamp_min(1e-30)
    j = torch.arange(t_cum.shape[-1], device=alpha.device)[None]
    valid = (j >= i_alpha) & (beta_j >= r_lo) & (beta_j <= r_hi) & (beta_j >= a)
    first = valid.float().argmax(-1, keepdim=True)
    beta = torch.where(valid.any(-1, keepdim=True), beta_j.gather(-1, first), torch.full_like(a, torch.inf))
    return torch.where(ratio <= a, full_probs / a, torch.where(ratio < beta, draft_probs, full_probs / beta))


def mentor(full_probs: Tensor, draft_probs: Tensor, alpha: Tensor) -> Tensor:
    """π for per-row ``alpha`` [n] ∈ (0, 1]; β solved exactly from the sorted ratios (f(β) is monotone)."""
    return _mentor(full_probs, draft_probs, alpha, _sorted_ratios(full_probs, draft_probs))


def mentor_for_budget(full_probs: Tensor, draft_probs: Tensor, budget: float, steps: int = 30) -> Tensor:
    """π with KL(p_t ‖ π) ≈ ``budget`` per row (bisection on log α); p_d itself where it is within budget."""
    ratios = _sorted_ratios(full_probs, draft_probs)
    lo = torch.full(full_probs.shape[:1], -30.0, device=full_probs.device)  # log α
    hi = torch.zeros_like(lo)
    for _ in range(steps):
        m = 0.5 * (lo + hi)
        within = kl(full_probs, _mentor(full_probs, draft_probs, m.exp(), ratios)) <= budget
        hi, lo = torch.where(within, m, hi), torch.where(within, lo, m)
    pi = _mentor(full_probs, draft_probs, hi.exp(), ratios)
    draft_within = kl(full_probs, draft_probs) <= budget
    return torch.where(draft_within[:, None], draft_probs, pi)


@dataclass(frozen=True)
class Mentored:
    budget: float = 0.0  # D, nats of KL(p_t ‖ π); 0 = lossless

    def __call__(self, draft_probs: Tensor, full_probs: Tensor, context: Context | None = None) -> Targets:
        if self.budget <= 0:
            return lossless(draft_probs, full_probs)
        pi = mentor_for_budget(full_probs[:-1], draft_probs, self.budget)
        return Targets(pi, pi, full_probs[-1])
