"""The growing output: emitting tokens block by block, stopping, and counting who wrote each token."""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass

import torch
from torch import Tensor

from dimr.decoding.sampling import Sampler
from dimr.decoding.stats import DecodeStats
from dimr.decoding.tiers import Tier
from dimr.errors import DimrError


@dataclass(frozen=True)
class Thresholds:
    """VIA routing thresholds, on the models' own (temperature-1) distributions; see docs/decoding.md.

    - ``accept``: a drafted token is accepted directly when the slim verifier gives it at least this much;
    - ``close`` and ``regen``: otherwise, when draft and slim are close (1 − TV(draft, slim) ≥ ``close``) and
      the slim verifier is confident (its top probability ≥ ``regen``), the slim verifier writes the token
      and the block ends; ``regen`` also gates the slim bonus token after a fully direct block;
    - anything else escalates to the full verifier.

    Values above 1 switch a route off: ``Thresholds.never()`` sends every token to the full verifier.
    """

    accept: float = 0.8
    close: float = 0.5
    regen: float = 0.9

    @classmethod
    def never(cls) -> Thresholds:
        return cls(accept=2.0, close=2.0, regen=2.0)


@dataclass(frozen=True)
class DecodeConfig:
    """Everything that shapes one decode. ``temperature=0`` is greedy; ``eos_token_ids`` stop it."""

    max_new_tokens: int = 64
    gamma: int = 4
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    eos_token_ids: tuple[int, ...] = ()
    draft_stop: float = 0.0  # stop drafting after a token the draft gives less than this (0 = always gamma)
    window: int = 8  # hier: slim-accepted tokens the full verifier checks in one forward (Γ)
    share_prefix: bool = True  # hier: the full forward starts from the slim's state at its first skipped layer
    thresholds: Thresholds = Thresholds()

    def __post_init__(self) -> None:
        finite = {"temperature": self.temperature, "top_p": self.top_p, "draft_stop": self.draft_stop,
                  **{f"{k} threshold": v for k, v in vars(self.thresholds).items()}}
        problems = [f"{k} {v} is not a finite number" for k, v in finite.items() if not math.isfinite(v)]
        if problems:
            raise DimrError("; ".join(problems) + "; fix the decoding options")
        problems = [msg for bad, msg in (
            (self.gamma < 1, f"gamma {self.gamma} must be at least 1"),
            (self.window < 1, f"window {self.window} must be at least 1"),
            (self.max_new_tokens < 0, f"max_new_tokens {self.max_new_tokens} must not be negative"),
            (self.temperature < 0, f"temperature {self.temperature} must be 0 (greedy) or positive"),
            (not 0 < self.top_p <= 1, f"top_p {self.top_p} must be in (0, 1]"),
            (self.draft_stop < 0, f"draft_stop {self.draft_stop} must not be negative"),
        ) if bad]
        if problems:
            raise DimrError("; ".join(problems) + "; fix the decoding options")

    @property
    def sampler(self) -> Sampler:
        return Sampler(self.temperature, self.top_p)

    def generator(self, device: torch.device) -> torch.Generator:
        return torch.Generator(device=device).manual_seed(self.seed)

    def uniforms(self, position: int, n: int, device: torch.device) -> Tensor:
        """Uniforms [n, 1] for the tokens at ``position`` … ``position + n - 1`` of the sequence (prompt and
        output), fixed by the seed and the position alone, not by what drew before: the draws by which the full
        verifier samples its own token (``ar``'s steps, n-gram blocks), so that every mode built from those emits
        the same text for one seed. A stream apart from :meth:`generator`'s."""
        first, last = position // UNIFORM_CHUNK, (position + n - 1) // UNIFORM_CHUNK
        u = torch.cat([_uniform_chunk(self.seed, k) for k in range(first, last + 1)])
        start = position - first * UNIFORM_CHUNK
        return u[start:start + n, None].to(device, copy=True)


UNIFORM_CHUNK = 256  # positions per chunk of DecodeConfig.uniforms, each drawn from its own seeded generator


@functools.lru_cache(maxsize=64)
def _uniform_chunk(seed: int, k: int) -> Tensor:
    # mixing the seed and the chunk index keeps these generators apart from DecodeConfig.generator's (seeded with
    # the seed itself) and from each other
    key = (seed * 0x9E3779B97F4A7C15 + (k + 1) * 0xBF58476D1CE4E5B9) % (2**63 - 1)
    return torch.rand(UNIFORM_CHUNK, generator=torch.Generator().manual_seed(key))


@dataclass
class DecodeResult:
    tokens: list[int]  # generated tokens only (the prompt excluded)
    stats: DecodeStats


class Output:
    """Prompt + emitted tokens. :meth:`emit` truncates at ``max_new_tokens`` and at the first EOS."""

    KINDS = ("accepted", "direct", "regenerated", "escalated", "bonus")

    def __init__(self, prompt: Tensor, config: DecodeConfig, stats: DecodeStats,
                 tiers: list[Tier | None]) -> None:
        tiers = [t for t in tiers if t is not None]
        self.ids = prompt
        self.new: list[int] = []
        self.config = config
        self.stats = stats
        self.tiers = tiers
        self.done = config.max_new_tokens <= 0
        for tier in tiers:  # the most any tier is fed: the output so far plus a drafted block and its bonus
            tier.reset(capacity=prompt.numel() + config.max_new_tokens + max(config.gamma, config.window) + 1)
        self.t0, self.c0 = time.perf_counter(), time.process_time()

    @property
    def remaining(self) -> int:
        return self.config.max_new_tokens - len(self.new)

    def emit(self, tokens: Tensor, kind: str) -> int:
        """Append ``tokens`` [n] written by ``kind``; return how many were kept."""
        if self.done or tokens.numel() == 0:
            return 0
        values = tokens.tolist()[: self.remaining]
        eos = self.config.eos_token_ids
        stop = next((k + 1 for k, v in enumerate(values) if v in eos), None)
        if stop is not None:
            values, self.done = values[:stop], True
        kept = len(values)
        self.new += values
        self.ids = torch.cat([self.ids, tokens[:kept]])
        self.done = self.done or self.remaining <= 0
        if kind == "direct":
            self.stats.accepted_direct += kept
            kind = "accepted"
        setattr(self.stats, kind, getattr(self.stats, kind) + kept)
        return kept

    def result(self) -> DecodeResult:
        self.stats.wall_seconds = time.perf_counter() - self.t0
        self.stats.cpu_seconds = time.process_time() - self.c0
        self.stats.tokens = len(self.new)
        for tier in self.tiers:
            self.stats.calls[tier.name] += tier.calls
            self.stats.fed[tier.name] += tier.fed
            sizes = self.stats.forwards[tier.name]
            for n, k in tier.sizes.items():
                sizes[n] = sizes.get(n, 0) + k
            self.stats.seconds[tier.name] += tier.seconds
            self.stats.cpu_seconds_tier[tier.name] += tier.cpu_seconds
        return DecodeResult(self.new, self.stats)
