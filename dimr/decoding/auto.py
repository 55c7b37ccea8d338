"""``auto``: block by block, the lossless mode and γ (Γ) with the best predicted speed.

Before each block the :class:`Chooser` draws every tier pair's per-token acceptance from its Beta
posterior (Thompson sampling, as in bandit approaches to speculation such as BanditSpec), prices every arm
with the cost model (:func:`dimr.decoding.costs.block`, plus the catch-up forward of a tier that sat out
recent blocks) and runs one block of the fastest. Every block is one block of a lossless mode run from the
current sequence, so the output law is the full verifier's whatever the choices; greedy output equals
``ar``'s. The n-gram proposer is observed for free: after every block its would-be proposal is compared with
the tokens emitted (each match is an unbiased draw of its acceptance q(x)), and its arms only compete in
blocks where the last n-gram occurred before, priced at the length of what followed it.

The posterior counts live in the :class:`Chooser` and carry over between prompts, halved at each new one
(running estimates that still adapt per prompt). The chooser also times the forwards it asks for: per tier,
a running ratio of measured to tabled seconds rescales the cost table, so a table measured under other load
(or a machine whose load changes) still prices the arms as they run now. Choices then depend on timing, so a
sampled ``auto`` decode with a fixed seed may take other paths between runs; its law does not change.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import torch
from torch import Tensor

from dimr.decoding import modes
from dimr.decoding.costs import Acceptance, Costs, block
from dimr.decoding.proposer import NgramProposer, Proposer, lookup
from dimr.decoding.sequence import DecodeConfig, DecodeResult, Output
from dimr.decoding.stats import DecodeStats
from dimr.decoding.tiers import Tier

GAMMAS = (1, 2, 3, 4, 6, 8)
HIER = ((1, 4), (2, 4), (2, 8), (4, 8), (4, 12), (4, 16))  # (γ, Γ)
PRIOR = (1.0, 2.0)  # Beta(accepted + 1, rejected + 2): a mildly pessimistic start (mean 1/3)
RATE = 0.2  # weight of the newest block in the running measured/tabled time ratio of a tier
RATIO_BOUNDS = (0.2, 5.0)  # one block's ratio is clipped to this: a single stall must not flip the table


@dataclass(frozen=True)
class Arm:
    mode: str  # ar | sd | self | lookup | hier
    gamma: int = 0
    window: int = 0

    @property
    def label(self) -> str:
        return self.mode + (f"/{self.gamma}" if self.gamma else "") + (f"/{self.window}" if self.window else "")


def arms(draft: bool, slim: bool) -> list[Arm]:
    """Every arm the available tiers allow."""
    out = [Arm("ar")] + [Arm("lookup", g) for g in GAMMAS]
    out += [Arm("sd", g) for g in GAMMAS] if draft else []
    out += [Arm("self", g) for g in GAMMAS] if slim else []
    out += [Arm("hier", g, w) for g, w in HIER] if slim and draft else []
    return out


@dataclass
class Chooser:
    costs: Costs
    arms: list[Arm]
    counts: dict[tuple[str, str], list[float]] = field(default_factory=dict)  # pair → [accepted, rejected]
    chosen: dict[str, int] = field(default_factory=dict)  # arm label → blocks, over the last decode
    scale: dict[str, float] = field(default_factory=dict)  # tier → running measured / tabled seconds
    adapt: bool = True  # rescale the table by measured times (off: price by the table alone)

    def new_prompt(self) -> None:
        for c in self.counts.values():
            c[0], c[1] = c[0] / 2, c[1] / 2
        self.chosen = {}

    def observe(self, observations: list[modes.Observation]) -> None:
        for proposer, target, accepted, tested in observations:
            c = self.counts.setdefault((proposer, target), [0.0, 0.0])
            c[0], c[1] = c[0] + accepted, c[1] + tested - accepted

    def observe_time(self, tier: str, calls: int, fed: int, seconds: float) -> None:
        """``calls`` forwards of ``tier`` fed ``fed`` tokens in all and took ``seconds``."""
        if not self.adapt or calls <= 0 or seconds <= 0:
            return
        ratio = seconds / (calls * self.costs(tier, fed / calls))
        ratio = min(max(ratio, RATIO_BOUNDS[0]), RATIO_BOUNDS[1])
        old = self.scale.get(tier, 1.0)
        self.scale[tier] = old + RATE * (ratio - old)

    def choose(self, rng: random.Random, lag: dict[str, int], lookup_len: int = GAMMAS[-1]) -> Arm:
        """The arm of highest sampled tokens/s; ``lag[tier]``: tokens a tier's cache is behind;
        ``lookup_len``: tokens the n-gram proposer has to offer now (none: its arms are left out)."""
        pairs = {("draft", "full"), ("slim", "full"), ("lookup", "full"), ("draft", "slim")}
        rates = {}
        for pair in pairs:
            a, r = self.counts.get(pair, (0.0, 0.0))
            rates[pair] = rng.betavariate(a + PRIOR[0], r + PRIOR[1])
        acceptance = Acceptance(rates)
        costs = self.costs.scaled(self.scale) if self.scale else self.costs

        def speed(arm: Arm) -> float:
            gamma = min(arm.gamma, lookup_len) if arm.mode == "lookup" else arm.gamma
            tokens, seconds = block(arm.mode, gamma, acceptance, costs, arm.window)
            for tier in {"sd": ["draft"], "self": ["slim"], "hier": ["draft", "slim"]}.get(arm.mode, []):
                seconds += costs(tier, lag[tier] + 1) - costs(tier, 1)
            return tokens / seconds

        arm = max([a for a in self.arms if a.mode != "lookup" or lookup_len > 0] or self.arms, key=speed)
        self.chosen[arm.label] = self.chosen.get(arm.label, 0) + 1
        return arm


def _lookup_seen(ids: Tensor, emitted: Tensor, gamma: int) -> list[modes.Observation]:
    """The n-gram proposal at ``ids`` against the tokens actually emitted after it: leading matches."""
    proposal = lookup(ids, gamma)[: emitted.numel()]
    if proposal.numel() == 0:
        return []
    miss = (proposal != emitted[: proposal.numel()]).nonzero()
    accepted = int(miss[0, 0]) if miss.numel() else proposal.numel()
    return [("lookup", "full", accepted, min(accepted + 1, proposal.numel()))]


@torch.inference_mode()
def auto(chooser: Chooser, full: Tier, draft: Tier | None, slim: Tier | None, prompt: Tensor,
         config: DecodeConfig, vocab_size: int, trace: list | None = None,
         escalate: modes.Escalate | None = None) -> DecodeResult:
    """Decode block by block with the arm the chooser picks. ``trace``, if given, receives one
    (arm, sequence before the block, generator state before the block, tokens emitted) per block."""
    from dimr.decoding.proposer import ModelProposer

    out = Output(prompt, config, DecodeStats("auto", config.gamma), [full, draft, slim])
    generator, rng = config.generator(prompt.device), random.Random(config.seed)
    proposers: dict[str, Proposer] = {"lookup": NgramProposer(vocab_size)}
    if draft is not None:
        proposers["sd"] = ModelProposer(draft)
    if slim is not None:
        proposers["self"] = ModelProposer(slim)
    chooser.new_prompt()
    timed = [t for t in (full, draft, slim) if t is not None and t.timed]
    while not out.done:
        ids = out.ids
        lag = {t.name: ids.numel() - 1 - t.length for t in (draft, slim) if t is not None}
        arm = chooser.choose(rng, lag, lookup(ids, GAMMAS[-1]).numel())
        state = generator.get_state() if trace is not None else None
        before = {t.name: (t.calls, t.fed, t.seconds) for t in timed}
        if arm.mode == "ar":
            seen = modes.ar_block(full, out, generator)
        elif arm.mode == "hier":
            seen = modes.hier_block(proposers["sd"], slim, full, out, arm.gamma, arm.window, generator,
                                    escalate=escalate)
        else:
            seen = modes.sd_block(proposers[arm.mode], full, out, arm.gamma, generator)
        emitted = out.ids[ids.numel():]
        if arm.mode != "lookup":
            seen += _lookup_seen(ids, emitted, max(GAMMAS))
        chooser.observe(seen)
        for t in timed:
            calls, fed, seconds = before[t.name]
            chooser.observe_time(t.name, t.calls - calls, t.fed - fed, t.seconds - seconds)
        if trace is not None:
            trace.append((arm, ids, state, emitted.tolist()))
    return out.result()
