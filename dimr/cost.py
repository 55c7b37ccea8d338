"""Costs: how far the slim verifier's next-token distribution is from the full verifier's (lower is better).

Every cost takes log-probabilities ``[..., V]`` (``log_softmax`` outputs; ``-inf`` allowed for exact zeros)
and returns one value per token ``[...]``, in nats (`dimr.divergence`). Distributions are named ``draft``,
``slim`` and ``full``.
:func:`evaluate_logits` turns a batch into the numbers a trial records: the mean cost plus the top-1
agreement and the expected acceptance ``1 - TV(full, slim)``, which users read more easily than nats.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from dimr.divergence import js_log, kl_log, tv_log
from dimr.errors import DimrError

CostFn = Callable[..., Tensor]


def kl(full_logp: Tensor, slim_logp: Tensor, draft_logp: Tensor | None = None) -> Tensor:
    """KL(full‖slim) = Σ_v p_full(v) · (log p_full(v) − log p_slim(v)). The default cost (VIA-SD)."""
    return kl_log(full_logp, slim_logp)


def reverse_kl(full_logp: Tensor, slim_logp: Tensor, draft_logp: Tensor | None = None) -> Tensor:
    """KL(slim‖full) = Σ_v p_slim(v) · (log p_slim(v) − log p_full(v)): mode-seeking."""
    return kl_log(slim_logp, full_logp)


def js(full_logp: Tensor, slim_logp: Tensor, draft_logp: Tensor | None = None) -> Tensor:
    """JS(full, slim) = ½ KL(full‖m) + ½ KL(slim‖m), m = ½ (p_full + p_slim). Symmetric, ≤ log 2."""
    return js_log(full_logp, slim_logp)


def bridge(full_logp: Tensor, slim_logp: Tensor, draft_logp: Tensor | None = None) -> Tensor:
    """KL(draft‖slim) + KL(slim‖full): the two legs of VIA-SD's KL bridge draft → slim → full."""
    if draft_logp is None:
        raise ValueError("the bridge cost needs draft_logp (the draft model's log-probs on the same tokens)")
    return kl_log(draft_logp, slim_logp) + kl_log(slim_logp, full_logp)


COSTS: dict[str, CostFn] = {"kl": kl, "reverse-kl": reverse_kl, "js": js, "bridge": bridge}
DEFAULT_COST = "kl"
NEEDS_DRAFT = frozenset({"bridge"})


def get_cost(name: str) -> CostFn:
    """The cost called ``name``; DimrError naming the choices if unknown."""
    if name not in COSTS:
        raise DimrError(f"unknown cost {name!r}; choose one of {', '.join(COSTS)}")
    return COSTS[name]


def top1_agreement(full_logp: Tensor, slim_logp: Tensor) -> Tensor:
    """1.0 where argmax p_full = argmax p_slim, else 0.0, per token."""
    return (full_logp.argmax(-1) == slim_logp.argmax(-1)).to(full_logp.dtype)


def expected_acceptance(full_logp: Tensor, slim_logp: Tensor) -> Tensor:
    """1 − TV(full, slim): the chance a token sampled from slim is accepted against full, per token."""
    return 1.0 - tv_log(full_logp, slim_logp)


@torch.no_grad()
def evaluate_logits(
    full_logp: Tensor,
    slim_logp: Tensor,
    cost: str | CostFn = DEFAULT_COST,
    draft_logp: Tensor | None = None,
    token_mask: Tensor | None = None,
    chunk: int = 1024,
) -> dict[str, float]:
    """Mean ``cost``, ``top1_agreement`` and ``expected_acceptance`` over tokens, as floats.

    Inputs are ``[..., V]`` logits or log-probs (each is re-normalised with ``log_softmax`` in float32,
    which leaves log-probs unchanged). ``token_mask`` ``[...]`` (bool) selects the tokens that count, e.g.
    to drop padding. Tokens are processed ``chunk`` at a time to bound float32 memory for big vocabularies.
    """
    fn = get_cost(cost) if isinstance(cost, str) else cost
    vocab = full_logp.shape[-1]
    flat = [t.reshape(-1, vocab) if t is not None else None for t in (full_logp, slim_logp, draft_logp)]
    if token_mask is not None:
        keep = token_mask.reshape(-1).to(torch.bool)
        flat = [t[keep] if t is not None else None for t in flat]
    n = flat[0].shape[0]
    if n == 0:
        raise ValueError("evaluate_logits got no tokens")
    sums = {"cost": 0.0, "top1_agreement": 0.0, "expected_acceptance": 0.0}
    for lo in range(0, n, chunk):
        f, s, d = (torch.log_softmax(t[lo:lo + chunk].float(), -1) if t is not None else None for t in flat)
        sums["cost"] += fn(f, s, d).sum().item()
        sums["top1_agreement"] += top1_agreement(f, s).sum().item()
        sums["expected_acceptance"] += expected_acceptance(f, s).sum().item()
    return {k: v / n for k, v in sums.items()}
