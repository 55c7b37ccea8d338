"""The decoding modes, one function each: ``ar``, ``sd`` (also ``self``: the slim verifier drafts, and
``lookup``: n-gram drafts), ``hier`` (draft → slim → full, lossless) and ``via`` (lossy routing).

Each takes KV-cached tiers, the prompt ids [L] and a :class:`DecodeConfig`, and returns the generated tokens
with their :class:`DecodeStats`. Batch size 1. ``ar``, ``sd`` and ``hier`` loop over one block function each
(``*_block``), which `auto` mixes block by block. Every tier keeps its own cache; after each block every
tier that ran is cropped back to the tokens that were kept (never recomputed).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from dimr.decoding import verify
from dimr.decoding.proposer import Proposer
from dimr.decoding.sequence import DecodeConfig, DecodeResult, Output
from dimr.decoding.stats import DecodeStats
from dimr.decoding.tiers import Tier
from dimr.divergence import own_probs

Escalate = Callable[[Tensor, int], Tensor]
"""(input_ids [n], keep) → the full verifier's last ``keep`` logits: ``Tier.forward`` or a faster equivalent."""
Observation = tuple[str, str, int, int]
"""(proposer, target, accepted, tested): what a block saw of one tier's per-token acceptance (`auto` learns)."""


def ar_block(full: Tier, out: Output, generator: torch.Generator) -> list[Observation]:
    """One token from the full verifier."""
    logits = full.forward(out.ids[full.length:], keep=1)[0]
    full.crop(full.length)  # no-op, except that it bounds sliding-window caches
    out.stats.blocks += 1
    sampler = out.config.sampler
    u = None if sampler.greedy else out.config.uniforms(out.ids.numel(), 1, logits.device)[0]  # see own_draws
    out.emit(sampler.draw(sampler.probs(logits), generator, u), "escalated")
    return []


@torch.inference_mode()
def ar(full: Tier, prompt: Tensor, config: DecodeConfig) -> DecodeResult:
    """Autoregressive decoding with the full verifier: one forward per token."""
    out = Output(prompt, config, DecodeStats("ar"), [full])
    generator = config.generator(prompt.device)
    while not out.done:
        ar_block(full, out, generator)
    return out.result()


def speculate(proposer: Proposer, target: Tier, ids: Tensor, gamma: int, config: DecodeConfig,
              generator: torch.Generator, targets: verify.TargetsFn = verify.lossless,
              accept: verify.AcceptFn = verify.accept, stop: float | None = None
              ) -> tuple[Tensor, verify.Verdict, Tensor]:
    """The proposer drafts up to γ tokens after ``ids`` (stopping after one it gives less than ``stop``, by default
    ``config.draft_stop``), one forward of ``target`` checks them; ``target`` and the proposer are cropped to the
    accepted tokens. → (drafted tokens [g], verdict, the target's probabilities [g + 1, V] at the drafted positions
    and the one after)."""
    sampler = config.sampler
    stop = config.draft_stop if stop is None else stop
    tokens, draft_probs, draft_logits = proposer.propose(ids, gamma, sampler, generator, stop)
    target_logits = target.forward(torch.cat([ids[target.length:], tokens]), keep=tokens.numel() + 1)
    target_probs = sampler.probs(target_logits)
    context = verify.Context(tokens, draft_logits, target_logits, sampler, proposer.hidden, target.hidden)
    verdict = accept(draft_probs, tokens, targets(draft_probs, target_probs, context), generator)
    target.crop(ids.numel() + verdict.n_accepted)
    proposer.keep(ids.numel() + verdict.n_accepted)
    return tokens, verdict, target_probs


def _tested(verdict: verify.Verdict, drafted: int) -> int:
    """Drafted tokens that went through the acceptance test: all of them, or up to the first rejected."""
    return drafted if verdict.bonus else verdict.n_accepted + 1


def _emit_verdict(out: Output, tokens: Tensor, verdict: verify.Verdict) -> None:
    out.stats.blocks += 1
    out.stats.drafted += tokens.numel()
    out.emit(tokens[:verdict.n_accepted], "accepted")
    out.stats.rejected += out.emit(verdict.token, "bonus" if verdict.bonus else "escalated") * (not verdict.bonus)


def sd_block(proposer: Proposer, full: Tier, out: Output, gamma: int, generator: torch.Generator,
             targets: verify.TargetsFn = verify.lossless,
             accept: verify.AcceptFn = verify.accept, stop: float | None = None) -> list[Observation]:
    """γ drafted tokens verified by one parallel full forward (standard speculative sampling); ``stop``: as in
    :func:`speculate`. One-hot drafts (n-gram) under lossless verification are checked by the verifier's own
    position-keyed draws (:func:`verify.own_draws`): the same law, and the text ``ar`` samples with the same seed."""
    gamma = min(gamma, out.remaining)
    if proposer.one_hot and targets is verify.lossless and accept is verify.accept and not out.config.sampler.greedy:
        accept = verify.own_draws(out.config.uniforms(out.ids.numel(), gamma + 1, out.ids.device))
    tokens, verdict, _ = speculate(proposer, full, out.ids, gamma, out.config, generator, targets, accept, stop)
    _emit_verdict(out, tokens, verdict)
    return [(proposer.name, "full", verdict.n_accepted, _tested(verdict, tokens.numel()))]


@torch.inference_mode()
def sd(proposer: Proposer, full: Tier, prompt: Tensor, config: DecodeConfig, mode: str = "sd",
       targets: verify.TargetsFn = verify.lossless, accept: verify.AcceptFn = verify.accept) -> DecodeResult:
    """Two-tier speculative decoding: the proposer drafts γ tokens, one parallel full forward verifies them.

    Lossless with the default ``targets``; a relaxed ``targets`` (``dimr.relaxed``) changes only the three
    target distributions. ``self`` mode is this function with the slim verifier as proposer, ``lookup``
    with the n-gram proposer.
    """
    out = Output(prompt, config, DecodeStats(mode, config.gamma), [proposer.tier, full])
    generator = config.generator(prompt.device)
    while not out.done:
        for seen in sd_block(proposer, full, out, config.gamma, generator, targets, accept):
            out.stats.observe(*seen)
    return out.result()


def hier_block(proposer: Proposer, slim: Tier, full: Tier, out: Output, gamma: int, window: int,
               generator: torch.Generator, accept: verify.AcceptFn = verify.accept,
               escalate: Escalate | None = None) -> list[Observation]:
    """Staged speculation (TriForce): blocks of γ drafts speculated against the slim verifier fill a window
    of Γ slim tokens — an exact sample of the slim verifier's own sequence law — and one full forward then
    checks the window against the full verifier with the slim's probabilities as the draft's. ``escalate``
    replaces ``full.forward`` (shared-prefix escalation, :mod:`dimr.decoding.shared`)."""
    ids, limit = out.ids, min(window, out.remaining)
    seq, probs, seen = ids, [], []
    while seq.numel() - ids.numel() < limit:
        room = limit - (seq.numel() - ids.numel())
        tokens, verdict, slim_probs = speculate(proposer, slim, seq, min(gamma, room), out.config, generator,
                                                accept=accept)
        seq = torch.cat([seq, tokens[:verdict.n_accepted], verdict.token])
        probs.append(slim_probs[:verdict.n_accepted + 1])
        seen.append((proposer.name, "slim", verdict.n_accepted, _tested(verdict, tokens.numel())))
    drafted, slim_probs = seq[ids.numel():ids.numel() + limit], torch.cat(probs)[:limit]
    full_logits = (escalate or full.forward)(torch.cat([ids[full.length:], drafted]), keep=limit + 1)
    full_probs = out.config.sampler.probs(full_logits)
    verdict = accept(slim_probs, drafted, verify.lossless(slim_probs, full_probs), generator)
    full.crop(ids.numel() + verdict.n_accepted)
    slim.crop(ids.numel() + verdict.n_accepted)
    proposer.keep(ids.numel() + verdict.n_accepted)
    _emit_verdict(out, drafted, verdict)
    return [*seen, ("slim", "full", verdict.n_accepted, _tested(verdict, limit))]


@torch.inference_mode()
def hier(proposer: Proposer, slim: Tier, full: Tier, prompt: Tensor, config: DecodeConfig,
         accept: verify.AcceptFn = verify.accept, escalate: Escalate | None = None) -> DecodeResult:
    """Lossless three tiers: :func:`hier_block` with γ = ``config.gamma`` and Γ = ``config.window``."""
    out = Output(prompt, config, DecodeStats("hier", config.gamma), [proposer.tier, slim, full])
    generator = config.generator(prompt.device)
    while not out.done:
        for seen in hier_block(proposer, slim, full, out, config.gamma, config.window, generator, accept, escalate):
            out.stats.observe(*seen)
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
