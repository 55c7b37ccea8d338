"""The decoding modes, one function each: ``ar``, ``sd`` (also ``self``: the slim verifier drafts), ``via``.

Each takes KV-cached tiers, the prompt ids [L] and a :class:`DecodeConfig`, and returns the generated tokens
with their :class:`DecodeStats`. Batch size 1. Every tier keeps its own cache; after each block every tier
that ran is cropped back to the tokens that were kept (never recomputed).
"""

from __future__ import annotations

import torch
from torch import Tensor

from dimr.decoding import verify
from dimr.decoding.proposer import Proposer
from dimr.decoding.sequence import DecodeConfig, DecodeResult, Output
from dimr.decoding.stats import DecodeStats
from dimr.decoding.tiers import Tier
from dimr.divergence import own_probs


@torch.inference_mode()
def ar(full: Tier, prompt: Tensor, config: DecodeConfig) -> DecodeResult:
    """Autoregressive decoding with the full verifier: one forward per token."""
    out = Output(prompt, config, DecodeStats("ar"), [full])
    generator = config.generator(prompt.device)
    while not out.done:
        logits = full.forward(out.ids[full.length:], keep=1)[0]
        full.crop(full.length)  # no-op, except that it bounds sliding-window caches
        out.stats.blocks += 1
        out.emit(config.sampler.draw(config.sampler.probs(logits), generator), "escalated")
    return out.result()


@torch.inference_mode()
def sd(proposer: Proposer, full: Tier, prompt: Tensor, config: DecodeConfig, mode: str = "sd",
       targets: verify.TargetsFn = verify.lossless, accept: verify.AcceptFn = verify.accept) -> DecodeResult:
    """Two-tier speculative decoding: the proposer drafts γ tokens, one parallel full forward verifies them.

    Lossless with the default ``targets``; a relaxed ``targets`` (``dimr.relaxed``) changes only the three
    target distributions. ``self`` mode is this function with the slim verifier as proposer.
    """
    out = Output(prompt, config, DecodeStats(mode, config.gamma), [proposer.tier, full])
    generator, sampler = config.generator(prompt.device), config.sampler
    while not out.done:
        ids = out.ids
        tokens, draft_probs, draft_logits = proposer.propose(ids, min(config.gamma, out.remaining), sampler,
                                                             generator, config.draft_stop)
        gamma = tokens.numel()
        full_logits = full.forward(torch.cat([ids[full.length:], tokens]), keep=gamma + 1)
        full_probs = sampler.probs(full_logits)
        context = verify.Context(tokens, draft_logits, full_logits, sampler, proposer.hidden, full.hidden)
        n, token, bonus = accept(draft_probs, tokens, targets(draft_probs, full_probs, context), generator)
        full.crop(ids.numel() + n)
        proposer.keep(ids.numel() + n)
        out.stats.blocks += 1
        out.stats.drafted += gamma
        out.emit(tokens[:n], "accepted")
        out.stats.rejected += out.emit(token, "bonus" if bonus else "escalated") * (not bonus)
    return out.result()


@torch.inference_mode()
def via(proposer: Proposer, slim: Tier, full: Tier, prompt: Tensor, config: DecodeConfig,
        targets: verify.TargetsFn = verify.lossless, accept: verify.AcceptFn = verify.accept) -> DecodeResult:
    """Three tiers (VIA-SD): draft proposes, the slim verifier routes each token, the full verifier resolves.

    Token by token along the block, on the models' own distributions: direct acceptance while the slim
    verifier gives the drafted token ≥ ``accept``; at the first other token, slim regeneration if draft and
    slim are close and the slim verifier is confident (the block ends there), else escalation: one parallel
    full forward over the pending tokens and standard acceptance with residual sampling from there on.
    A relaxed ``targets`` applies where the full verifier decides (the escalated part of the block).
    """
    out = Output(prompt, config, DecodeStats("via", config.gamma), [proposer.tier, slim, full])
    generator, sampler, th = config.generator(prompt.device), config.sampler, config.thresholds
    while not out.done:
        ids = out.ids
        tokens, draft_probs, draft_logits = proposer.propose(ids, min(config.gamma, out.remaining), sampler,
                                                             generator, config.draft_stop)
        gamma = tokens.numel()
        slim_logits = slim.forward(torch.cat([ids[slim.length:], tokens]), keep=gamma + 1)
        slim_conf, draft_conf = own_probs(slim_logits), own_probs(draft_logits)
        direct = slim_conf[torch.arange(gamma, device=tokens.device), tokens] >= th.accept
        close = 1 - 0.5 * (slim_conf[:-1] - draft_conf).abs().sum(-1) >= th.close
        confident = slim_conf.max(-1).values >= th.regen  # [γ + 1]: the last one gates the slim bonus
        regen = close & confident[:-1]
        i = int(torch.cat([(~direct).nonzero()[:, 0], torch.tensor([gamma], device=tokens.device)]).min())
        out.stats.blocks += 1
        out.stats.drafted += gamma
        out.emit(tokens[:i], "direct")
        if i < gamma and not regen[i]:  # escalate the rest of the block to the full verifier
            full_logits = full.forward(torch.cat([ids[full.length:], tokens]), keep=gamma - i + 1)
            full_probs = sampler.probs(full_logits)
            pending_probs, h_draft = draft_probs[i:], proposer.hidden
            context = verify.Context(tokens[i:], draft_logits[i:], full_logits, sampler,
                                     None if h_draft is None else h_draft[i:], full.hidden)
            n, token, bonus = accept(pending_probs, tokens[i:], targets(pending_probs, full_probs, context),
                                     generator)
            full.crop(ids.numel() + i + n)
            out.emit(tokens[i:i + n], "accepted")
            out.stats.rejected += out.emit(token, "bonus" if bonus else "escalated") * (not bonus)
            kept = ids.numel() + i + n
        elif i < gamma:  # slim regeneration: its token replaces the draft's, the block ends
            out.stats.rejected += out.emit(sampler.draw(sampler.probs(slim_logits[i]), generator), "regenerated")
            kept = ids.numel() + i
        else:  # every drafted token accepted directly; the slim verifier adds a bonus token if confident
            if confident[gamma]:
                out.emit(sampler.draw(sampler.probs(slim_logits[gamma]), generator), "bonus")
            kept = ids.numel() + gamma
        slim.crop(min(kept, out.ids.numel() - 1))  # always leave the last token pending: it gives the next logits
        proposer.keep(kept)
    return out.result()
