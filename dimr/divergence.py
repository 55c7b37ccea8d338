"""Divergences between next-token distributions, and a model's own distribution: one module for the search's
costs, the relaxed rules, the benchmarks and the training code.

Two forms of each: on log-probabilities (``*_log``: ``log_softmax`` outputs, ``-inf`` allowed for exact
zeros; the search's costs) and on probabilities (the decoder's distributions, after temperature and top-p).
All reduce over the last axis and return one value per position, in nats.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def kl_log(logp: Tensor, logq: Tensor) -> Tensor:
    """KL(p‖q) = Σ p (log p − log q) from log-probabilities, with 0·log 0 = 0 (and +inf where p > 0 = q)."""
    p = logp.exp()
    terms = torch.where(p > 0, p * (logp - logq), torch.zeros((), dtype=p.dtype, device=p.device))
    return terms.sum(-1)


def js_log(logp: Tensor, logq: Tensor) -> Tensor:
    """JS(p, q) = ½ KL(p‖m) + ½ KL(q‖m), m = ½ (p + q), from log-probabilities. Symmetric, ≤ log 2."""
    log_m = torch.logaddexp(logp, logq) - math.log(2.0)
    return 0.5 * kl_log(logp, log_m) + 0.5 * kl_log(logq, log_m)


def tv_log(logp: Tensor, logq: Tensor) -> Tensor:
    """Total variation ½ Σ |p − q| from log-probabilities."""
    return tv(logp.exp(), logq.exp())


def kl(p: Tensor, q: Tensor) -> Tensor:
    """KL(p ‖ q) from probabilities (0 · log 0 = 0; both floored at 1e-30 inside the log)."""
    return torch.where(p > 0, p * (p.clamp_min(1e-30).log() - q.clamp_min(1e-30).log()), 0.0).sum(-1)


def js(p: Tensor, q: Tensor) -> Tensor:
    """Jensen–Shannon divergence from probabilities (at most ln 2)."""
    m = 0.5 * (p + q)
    return 0.5 * kl(p, m) + 0.5 * kl(q, m)


def tv(p: Tensor, q: Tensor) -> Tensor:
    """Total variation ½ Σ |p − q| from probabilities."""
    return 0.5 * (p - q).abs().sum(-1)


DIVERGENCES = {"js": js, "kl": kl, "tv": tv}


def own_probs(logits: Tensor) -> Tensor:
    """A model's own distribution (softmax at temperature 1): what VIA's routing, deferral and divergence tests
    look at, whatever the decoder's sampling settings."""
    return torch.softmax(logits.float(), dim=-1)
