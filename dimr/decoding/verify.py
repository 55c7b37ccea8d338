"""The speculative acceptance step, in the unified form of relaxed speculative decoding.

Three target distributions take the place of the full verifier's: π_rej in the acceptance test, π_res for
residual sampling after a rejection, π_bonus for the bonus token after a fully accepted block. Lossless
speculative sampling (Leviathan et al. 2023; Chen et al. 2023) sets all three to ``full_probs``; relaxed
methods (`dimr.relaxed`) are other :data:`TargetsFn` functions and leave :func:`accept` untouched.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

from dimr.decoding.sampling import Sampler, inverse_cdf, sample


class Targets(NamedTuple):
    """π_rej [n, V], π_res [n, V] at the n drafted positions and π_bonus [V] at the position after them."""

    rej: Tensor
    res: Tensor
    bonus: Tensor


class Context(NamedTuple):
    """What a relaxed rule may look at beyond the two distributions, all for the same n positions.

    ``tokens`` [n] are the drafted tokens; ``draft_logits`` [n, V] and ``full_logits`` [n + 1, V] the raw
    logits (before the sampler); ``sampler`` made ``draft_probs``/``full_probs`` from them; ``h_draft``
    [n, d] and ``h_full`` [n + 1, d] are the last hidden states (after the final norm), present only when
    the rule has ``needs_hidden = True`` (they cost an extra output per forward).
    """

    tokens: Tensor
    draft_logits: Tensor
    full_logits: Tensor
    sampler: Sampler
    h_draft: Tensor | None = None
    h_full: Tensor | None = None


TargetsFn = Callable[[Tensor, Tensor, "Context | None"], Targets]
"""(draft_probs [n, V], full_probs [n + 1, V], context) → Targets. ``needs_hidden`` attribute: see Context."""


def lossless(draft_probs: Tensor, full_probs: Tensor, context: Context | None = None) -> Targets:
    """π_rej = π_res = π_bonus = full: the output distribution is exactly the full verifier's."""
    return Targets(full_probs[:-1], full_probs[:-1], full_probs[-1])


class Verdict(NamedTuple):
    n_accepted: int
    token: Tensor  # [1]: the residual sample at position n_accepted, or the bonus token if all were accepted
    bonus: bool


def accept(draft_probs: Tensor, tokens: Tensor, targets: Targets,
           generator: torch.Generator | None) -> Verdict:
    """Accept drafted ``tokens`` [n] left to right with probability min(1, π_rej(x)/draft(x)).

    At the first rejection sample from residual = (π_res − draft)+; if every token passes, sample the bonus
    token from π_bonus. Draws exactly n uniforms and one token, whatever the outcome.
    """
    u = torch.rand(tokens.numel(), generator=generator, device=tokens.device)
    rejected = (u >= acceptance(draft_probs, tokens, targets.rej)).nonzero()
    if rejected.numel() == 0:
        return Verdict(tokens.numel(), sample(targets.bonus, generator), True)
    n = int(rejected[0])
    return Verdict(n, sample(residual(targets.res[n], draft_probs[n]), generator), False)


def own_draws(u: Tensor) -> AcceptFn:
    """:func:`accept` for a one-hot draft (n-gram proposals) and lossless targets, by the target's own draws:
    at each drafted position and the one after, the target draws its token at the uniform ``u`` [≥ n + 1, 1]
    (:func:`dimr.decoding.sampling.inverse_cdf`); the drafts are accepted while they equal those draws, and the
    first draw that differs (or the one after the block) is emitted. The same law as :func:`accept`'s: a draft
    x is accepted with probability π(x), and otherwise the token is a draw of π without x, as the residual
    (π − 1_x)+ is. The emitted tokens are then those that ``ar`` draws from the same uniforms."""

    def matched(draft_probs: Tensor, tokens: Tensor, targets: Targets,
                generator: torch.Generator | None) -> Verdict:
        n = tokens.numel()
        draws = inverse_cdf(torch.cat([targets.rej, targets.bonus[None]]), u[:n + 1]).view(-1)
        missed = (draws[:n] != tokens).nonzero()
        k = int(missed[0]) if missed.numel() else n
        return Verdict(k, draws[k:k + 1], k == n)

    return matched


def acceptance(draft_probs: Tensor, tokens: Tensor, rej: Tensor) -> Tensor:
    """min(1, π_rej(x)/draft(x)) at each drafted token x [n]."""
    idx = torch.arange(tokens.numel(), device=tokens.device)
    return (rej[idx, tokens] / draft_probs[idx, tokens]).clamp(max=1.0)


def residual(res: Tensor, draft: Tensor) -> Tensor:
    """(π_res − draft)+ [V], unnormalised (`sample` normalises); π_res itself where that is zero everywhere
    (only possible for relaxed targets with π_res ≤ draft)."""
    out = (res - draft).clamp(min=0.0)
    return out if out.sum() > 0 else res


AcceptFn = Callable[[Tensor, Tensor, Targets, "torch.Generator | None"], Verdict]
