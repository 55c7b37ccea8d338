"""Shared pieces of the relaxed rules: the acceptance probability, the ensemble, the context check.

Divergences and the models' own distributions are in `dimr.divergence`. ``draft_probs`` is p_d, ``full_probs``
is p_t (both made by the decoder's sampler, so temperature and top-p are already applied), x is the drafted
token. A rule returns :class:`~dimr.decoding.verify.Targets`: ``rej`` is read only at the drafted tokens (accept
x with probability min(1, rej(x)/p_d(x))), so it may be an unnormalised measure; ``res`` enters as the residual
(res − p_d)+, which is normalised when sampled; ``bonus`` is sampled as is.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from dimr.decoding.verify import Context, Targets


def acceptance_probs(draft_probs: Tensor, targets: Targets) -> Tensor:
    """β_t = Σ_x min(p_d(x), π_rej(x)) [n]: the probability that position t passes, given it is reached."""
    return torch.minimum(draft_probs, targets.rej).sum(-1).clamp(max=1.0)


def mix(w: Tensor | float, full_probs: Tensor, draft_probs: Tensor) -> Tensor:
    """The ensemble ν = w·p_t + (1 − w)·p_d (``w`` a float or [n] weights on the target)."""
    if isinstance(w, Tensor):
        w = w[..., None]
    return w * full_probs + (1 - w) * draft_probs


def require_context(context: Context | None, method: str) -> Context:
    if context is None:
        raise ValueError(f"the {method} rule needs the verification Context (drafted tokens and logits)")
    return context


def parse_float(value: str) -> float:
    """'inf', '-inf' and plain numbers."""
    return math.inf if value in ("inf", "+inf") else (-math.inf if value == "-inf" else float(value))
