"""Decoding statistics: returned beside the tokens, printed the same way by the CLI and the benchmark.

Every generated token is counted exactly once, by who wrote it:

- ``accepted``: a drafted token that was kept, directly by the slim verifier (``via``; also counted in
  ``accepted_direct``) or by the full verifier's acceptance test;
- ``regenerated``: a token the slim verifier wrote in place of a drafted token (``via`` only);
- ``escalated``: a token the full verifier wrote itself: the residual sample after a rejection (and every
  token of ``ar``, where there is no draft);
- ``bonus``: the extra token after a block whose drafted tokens were all kept.

So accepted + regenerated + escalated + bonus = tokens. ``rejected`` counts drafted tokens that were tested
and replaced (by the slim or the full verifier); the rejection rate is rejected / (accepted + rejected), the
per-token rejection probability (1 − β in the survey's notation). Mean accepted length is accepted drafted
tokens per block (the survey's l_accept).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

TIERS = ("draft", "slim", "full")


@dataclass
class DecodeStats:
    mode: str
    gamma: int = 0
    tokens: int = 0
    blocks: int = 0
    drafted: int = 0
    accepted: int = 0
    accepted_direct: int = 0
    rejected: int = 0
    regenerated: int = 0
    escalated: int = 0
    bonus: int = 0
    calls: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TIERS, 0))
    fed: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TIERS, 0))  # tokens fed per tier
    # per tier: tokens fed in one forward → how many forwards fed that many (the prefill apart from the steps)
    forwards: dict[str, dict[int, int]] = field(default_factory=lambda: {t: {} for t in TIERS})
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(TIERS, 0.0))
    cpu_seconds_tier: dict[str, float] = field(default_factory=lambda: dict.fromkeys(TIERS, 0.0))
    wall_seconds: float = 0.0
    cpu_seconds: float = 0.0
    # "proposer>target" → [accepted, tested]: per-token acceptance of each tier pair a block saw (sd, hier)
    tested: dict[str, list[int]] = field(default_factory=dict)

    def observe(self, proposer: str, target: str, accepted: int, tested: int) -> None:
        counts = self.tested.setdefault(f"{proposer}>{target}", [0, 0])
        counts[0] += accepted
        counts[1] += tested

    def acceptance(self, proposer: str, target: str) -> float:
        """Accepted / tested drafted tokens of ``proposer`` against ``target`` (NaN if none was tested)."""
        accepted, tested = self.tested.get(f"{proposer}>{target}", (0, 0))
        return accepted / tested if tested else float("nan")

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.wall_seconds if self.wall_seconds > 0 else 0.0

    @property
    def tokens_per_cpu_second(self) -> float:
        """Tokens per second of this process's CPU time: steadier than wall time on a shared machine."""
        return self.tokens / self.cpu_seconds if self.cpu_seconds > 0 else 0.0

    @property
    def mean_accepted_length(self) -> float:
        return self.accepted / self.blocks if self.blocks else 0.0

    @property
    def rejection_rate(self) -> float:
        tested = self.accepted + self.rejected
        return self.rejected / tested if tested else 0.0

    def calls_per_token(self, tier: str) -> float:
        return self.calls[tier] / self.tokens if self.tokens else 0.0

    def merge(self, other: DecodeStats) -> DecodeStats:
        """Sum of two runs of the same mode (e.g. over a prompt set)."""
        out = DecodeStats(self.mode, max(self.gamma, other.gamma))
        for name in ("tokens", "blocks", "drafted", "accepted", "accepted_direct", "rejected", "regenerated",
                     "escalated", "bonus", "wall_seconds", "cpu_seconds"):
            setattr(out, name, getattr(self, name) + getattr(other, name))
        out.calls = {t: self.calls[t] + other.calls[t] for t in TIERS}
        out.fed = {t: self.fed[t] + other.fed[t] for t in TIERS}
        out.forwards = {t: dict(self.forwards[t]) for t in TIERS}
        for t in TIERS:
            for n, k in other.forwards[t].items():
                out.forwards[t][n] = out.forwards[t].get(n, 0) + k
        out.seconds = {t: self.seconds[t] + other.seconds[t] for t in TIERS}
        out.cpu_seconds_tier = {t: self.cpu_seconds_tier[t] + other.cpu_seconds_tier[t] for t in TIERS}
        for stats in (self, other):
            for key, (accepted, tested) in stats.tested.items():
                out.observe(*key.split(">"), accepted, tested)
        return out

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(tokens_per_second=self.tokens_per_second, tokens_per_cpu_second=self.tokens_per_cpu_second,
                 mean_accepted_length=self.mean_accepted_length,
                 rejection_rate=self.rejection_rate,
                 calls_per_token={t: self.calls_per_token(t) for t in TIERS})
        return d

    def lines(self) -> list[str]:
        """Human-readable summary, a few lines."""
        per_tier = "  ".join(
            f"{t} {self.calls[t]} calls ({self.calls_per_token(t):.2f}/tok) {self.seconds[t]:.3f}s"
            for t in TIERS if self.calls[t])
        return [
            f"mode {self.mode}  gamma {self.gamma}  tokens {self.tokens}  blocks {self.blocks}  "
            f"{self.tokens_per_second:.1f} tok/s  wall {self.wall_seconds:.3f}s  cpu {self.cpu_seconds:.3f}s",
            f"accepted {self.accepted} (direct {self.accepted_direct})  regenerated {self.regenerated}  "
            f"escalated {self.escalated}  bonus {self.bonus}  rejected {self.rejected}",
            f"mean accepted length {self.mean_accepted_length:.2f}  rejection rate {self.rejection_rate:.3f}",
            per_tier,
        ]
