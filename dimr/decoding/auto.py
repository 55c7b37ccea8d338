"""``auto``: block by block, the lossless mode and γ (Γ) with the best predicted speed.

Before each block the :class:`Chooser` draws each model-drafted tier pair's acceptance from its Beta posteriors
(Thompson sampling, as in bandit approaches to speculation such as BanditSpec): of the first draft a block tests, and
of each later one once those before it were accepted (:func:`part`), as the n-gram proposer's below. A block starts
where the draft and the verifier last disagreed, and on greedy text where they agree they tend to go on agreeing,
which one rate per drafted token prices as a short γ's win and a long one's loss (replayed clock-free on greedy
texts, auto's speed moved +1.1% on code for both pairs, +0.1–0.4% on prose, none on the task; timed A/Bs on mini
saw no difference: ``benchmarks/results/auto_split_*``). It then prices every arm with the
cost model (:func:`dimr.decoding.costs.block`, plus the catch-up forward of a tier that sat out recent blocks) and
runs one block of the fastest. The draft's catch-up is paid once for all of its later blocks, so a block bears the
share of it that its tokens are of the tokens the draft's arms will emit (the tokens left times the share of tokens
they emitted recently, :meth:`Chooser.used`): at a prompt's start the draft lags by the whole prompt, and charged
whole to one block that priced sd below ar on mini's long code prompts, each ar block lengthening the lag (``ar``
ran 9 of 24 choices on one prompt). That holds until the draft has run on the prompt: a later lag is the chooser's
own interleaving, paid again at each return, and is charged whole. On smollm2's task at T = 0.7, where ``sd``
emitted under a tenth of the tokens, its blocks after other arms took 76–91 ms against 70–75 after itself
(``benchmarks/auto_anatomy.py``), priced with a share of the tokens left. The slim's is charged whole: spread too,
it made hier run where it lost to sd. Every block is one block of a lossless mode run from the current sequence, so
the output law is the full verifier's whatever the choices; greedy output equals ``ar``'s. The n-gram proposer is
observed for free: after every block its would-be proposal is compared with the tokens emitted (each match is an
unbiased draw of its acceptance q(x)), and its arms only compete in blocks where the last n-gram occurred before,
priced at the length of what followed it and at its posterior mean, not a draw: seen whatever runs, it gains nothing
from exploration, and its draws had run n-gram blocks that the mean said would lose (3 choices in 10 where it is
accepted 9 times in 24 and ``ar`` is cheaper). Its acceptance is kept per matched n-gram length (a proposal after a
matched trigram is accepted more often than one after a single matched token), so a block is priced with the rate of
the match it would use; its first drafted token apart from the rest (:func:`dimr.decoding.costs.expected_tokens`
with (first, rest)): the first is a guess, but once it is accepted the text that followed the match tends to go on
(smollm2's prose after a one-token match: 0.12 of first tokens accepted, then nearly all later ones), which one
i.i.d. rate prices as a short proposal's win and a long one's loss; and per prompt: whether text repeats is a
property of the prompt, so each prompt's n-gram posterior starts from the pooled counts scaled to :data:`SEED`
tokens and its own blocks soon outweigh them (pooled, a prompt whose text stopped repeating kept drawing 0.9 from
earlier prompts' trigrams).

The posterior counts live in the :class:`Chooser` and carry over between prompts, faded to at most
:data:`HORIZON` tested tokens per pair (running estimates that still adapt to a new prompt). The chooser
also times every forward it asks for: per tier and per forward size, a running ratio of measured to tabled
seconds rescales the cost table, so a table measured under other load (or one whose multi-token entries are
off by another factor than its one-token ones) still prices the arms as they run now. The chooser only sees the
sizes it runs, so the ratio of a size it has stopped running fades toward its tier's (:data:`FADE` per forward):
kept as last measured, a size timed in a slow spell stayed priced so after it, and the γ that ran instead, its own
price falling with the machine's, was chosen again and again (mini, code, T = 0.7). Forwards longer than any
block's (the prompt's prefill) are not timed, and one forward moves a ratio by a factor 1 + RATE at most: on
mini, forwards slowed by another model's decode having evicted these weights from the cache had made the
chooser run ``ar`` where ``sd`` was fastest. It also times each
block's work outside the forwards (the step's tensor code, the n-gram proposer's search), a running mean
per mode and verified token (the choice's own time is not in it: every arm pays it alike, and counted per
verified token it had priced a 2-token sd block's 0.4 ms of choosing into every longer γ), added to each
block in proportion to its γ + 1: where a forward costs a few milliseconds (``mini``) that is 10–15% of an
``sd`` or ``lookup`` block (0.6 ms) and about 5% of an ``ar`` step. Choices then depend on timing, so a sampled
``auto`` decode with a fixed seed may take other paths between runs; its law does not change. When one mode wins
again and again, each choice runs a longer stretch of its blocks, until it has emitted 1, 2, 4… up to :data:`RUN`
tokens, which keeps the chooser's own time (the choice, the n-gram look-up) off the per-token cost once the choice
has settled; the n-gram proposer is then observed once per choice. A prompt's first choice resumes at half the
stretch its mode last ran on an earlier prompt, not at one token: on mini's greedy texts replayed clock-free
(``benchmarks/auto_replay.py``, ``--restart`` for the rule before) that cut the choices by 2–21% (each 64-token
prompt had begun again at one token) at the same speed within 0.3%, and changed smollm2's by under 0.2%. Within a
prompt a mode chosen after another's stretch starts again at one token: resumed there too, mini's choices fell by
20–29% but smollm2's replay lost 1.1–1.5% on code and the task (a model draft's exploring picks ran longer), where
a choice costs under 1% of a block. The stretch is counted in tokens, so a choice is a bet of
about the same size whatever its arm's block length: counted in blocks (up to 4), hier/2/8's 8-token blocks had
emitted 22% of mini's prose at T = 0.7 on 11% of the choices, at 0.85 of sd/2's speed. It lengthens
when the same mode wins at another γ: draws flipping between sd/3 and sd/4 had cut it back to one block. A
stretch of n-gram blocks ends where the match it was priced at does: past it a block drafts nothing and yields
one token for a full forward. A stretch of another mode ends where a longer match than the one at its choice
appears, so the n-gram arms are priced there: on mini's greedy prose, ``sd`` stretches had run on through repeats
where an n-gram block emitted 1.4 times the tokens per second.

A pair whose acceptance was measured offline starts from it: a slim config carries its slim's top-1 agreement and
expected acceptance with the full verifier on calibration text (:attr:`Chooser.calibrated`), and a decoder loaded
from a pair measures its draft model's against the full verifier and the slim on the verifier's own continuations
of calibration prompts (:meth:`dimr.decoding.Decoder.calibrate_pairs`); that is then the pair's prior, worth
:data:`CALIBRATED` tested tokens. Calibration text is not the workload's: smollm2's draft agrees with its verifier
on 0.34 of calibration continuations, yet ``sd@4`` beat ``ar`` on greedy code (which its costs allow only above
about 0.75); the prior priced ``sd`` below ``ar`` from the first block, so it never ran and was never seen. So a
model-drafted pair, calibrated or not, whose mode loses at the posterior means but would beat every arm by
:data:`WORTH` were its drafts always accepted is first tested on :data:`MIN_TESTED` tokens, one block at a time,
at γ = 1 and then at the γ its accepted drafts allow (:func:`probe_arm`). A pair whose mode wins at the means
runs anyway; one that could not win even then is not worth a test (mini's slim, top-1 agreement 0.96, loses to
``sd`` there, and testing it had cost about 4% of each cold prompt set). A calibration its pair's own evidence
contradicts is dropped (:attr:`Chooser.overruled`): when the accepted count lies in a tail of the prior's predictive
law (the beta-binomial) rarer than :data:`CONFLICT`, checked at 8, 16, 32… tested tokens, the pair goes on from
:data:`PRIOR` and its own evidence. Unlike the n-gram proposer's, a model draft's acceptance is only seen when its arm
runs: a pair rejected on its first three tokens (mini's draft on greedy code, whose acceptance is 0.74) drew below the
n-gram and ``ar`` arms from then on and never ran again. hier's inner pair (the draft against the slim) is tested the
same way, with its shortest arm (γ = 1, Γ = 4): otherwise it is never seen, and hier never ran where it was the fastest
fixed mode (mini, T = 0.7, the task).

The draw picks the mode; the evidence caps its bet. An arm's γ (and Γ) runs at most 1 + the tokens its tier
pair has seen accepted, as an adaptive draft length starts short and grows on success: when the draw's best
arm is longer than that, the chooser runs the same mode at the best γ within the cap. A pair that only pays
at a long γ (a verification of 5 tokens costing little more than one of 2) is thus still tried, and a cold
try costs one drafted token, which tells as much as eight when the first is rejected.

A model-drafted mode (sd, self, hier) whose pairs the chooser knows (:data:`NAP_TESTED` tokens of evidence each) and
whose best arm a choice's draws price below :data:`DORMANT` × the best arm's other than the n-gram ones (those are on
offer only where the text matched) sits out the next :data:`NAP` choices unpriced; new evidence of its pairs, or less
lag in a tier it runs, wakes it at once (its own counts and lags change only when it runs). On mini the slim's modes
rarely win, and pricing their twelve arms (hier's with a fill table per γ) is left out of most choices: a choice on a
warmed state takes 93 µs with the naps, 143 without (``benchmarks/choice_cost.py``); timed A/Bs did not tell the two
apart (medians 0.99–1.01, passes 0.90–1.08).

Each γ of ``sd`` is offered twice: drafting all γ tokens, and (``sd/γ~``) drafting while the draft is sure of its
tokens: it stops after one the draft gives less than :data:`STOP` (its own probability at temperature 1; transformers'
``assistant_confidence_threshold`` and SpecDec++'s stop on a likely rejection are the same idea), so γ is a cap, and
the output law does not change. Each part (first, rest) of the draft's counts then holds two more rates, counted by
the stop arms' blocks: of its accepted drafts that it was sure of and of all its drafts
(:class:`dimr.decoding.costs.Sure`). A stop arm's block is priced with them and the acceptance that every sd block
counts (:func:`dimr.decoding.costs.stopped`); its step work (kept apart: ``sd~`` reads the draft's probability of each
draft) by the tokens it is expected to verify, and measured by those it verified (priced at γ + 1, a long γ that
drafts one token and a bit looked 3× dearer than it is). On mini's greedy task ``auto`` ran 1.21× as fast with it as
without, 1.17× the fixed ``sd@6``, where the draft's drafts are sure and accepted in long runs; on prose at T = 0.7,
where the draft is sure of a fifth of its first tokens, the timed A/Bs did not tell the two apart, and on code at
T = 0.7 a stopping ``sd`` ran 1–5% below the best one drafting all, hence both are offered and priced.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Protocol

import torch
from torch import Tensor

from dimr.decoding import modes
from dimr.decoding.costs import FREE, STOP_SUFFIX, Acceptance, Costs, Sure, blocks, expected_drafts
from dimr.decoding.proposer import NgramProposer, Proposer
from dimr.decoding.sequence import DecodeConfig, DecodeResult, Output
from dimr.decoding.stats import DecodeStats
from dimr.decoding.tiers import Tier

GAMMAS = (1, 2, 3, 4, 6, 8)
HIER = ((1, 4), (2, 4), (2, 8), (4, 8), (4, 12), (4, 16))  # (γ, Γ)
PAIRS = (("draft", "full"), ("slim", "full"), ("lookup", "full"), ("draft", "slim"))
CATCH_UP = {"sd": ("draft",), "self": ("slim",), "hier": ("draft", "slim")}  # tiers an arm brings up to date
# tiers whose prompt catch-up a block bears only its share of (its tokens / tokens left): the slim's is charged whole
SPREAD = ("draft",)
# ... over the tokens its arms are expected to emit: the tokens left × the share its arms emitted recently, at least
# this share (a tier recent prompts barely used, charged its whole catch-up, would never run again)
USAGE_FLOOR = 0.1
DRAFTS = {"sd": ("draft", "full"), "self": ("slim", "full"), "lookup": ("lookup", "full")}  # two-tier arms' pair
PRIOR = (1.0, 2.0)  # Beta(accepted + 1, rejected + 2): a mildly pessimistic start (mean 1/3)
# tested tokens a calibrated acceptance m is worth at most: Beta(accepted + 1 + m·k, rejected + 1 + (1 - m)·k);
# less where the calibration's sequences disagree (calibration_worth)
CALIBRATED = 16.0
HORIZON = 256.0  # tested tokens a pair's posterior holds at most: older evidence fades (exponential forgetting)
RATE = 0.1  # weight of the newest forward in the running measured/tabled time ratio
RATIO_BOUNDS = (0.2, 5.0)  # one forward's ratio is clipped to this: a single stall must not flip the table
# ... and to [1/STALL, STALL] × the running ratio: a forward slowed by another model having evicted this one's
# weights from the cache (a 12 MB mini tier after a decode of another mode) moves the ratio by a factor
# 1 + RATE at most, while a tier that really runs slower still reaches its ratio within a few dozen forwards
STALL = 2.0
# per forward of a tier, the share by which each of its forward sizes not run in that block moves its ratio toward the
# tier's: a size's own ratio is evidence about the machine's state when it last ran, and the chooser only sees the
# sizes it runs. Kept, a size measured in a slow spell stayed priced that way after the spell ended (mini, code,
# T = 0.7: sd/4's 5-token verification at 16.4 ms while the sd/3 that ran instead was seen at 12.0; sd/4 never ran
# again on the pass), and so did one the table prices high
FADE = 0.02
OBSERVED = max(w for _, w in HIER) + 1  # longer forwards (the prompt's prefill, a long catch-up) are not timed
# a mode chosen again and again runs blocks until it has emitted 1, 2, 4… tokens per choice (at least one block), up
# to this many: fewer choices, same law
RUN = 16
# a model-drafted mode whose best arm a choice's draws price below DORMANT × the best one's sits out the next NAP
# choices unpriced (the probes' pricing at the means still sees it)
DORMANT = 0.8
NAP = 8
NAPPING = ("sd", "self", "hier")
NAP_TESTED = 32.0  # ... once its pairs' posteriors hold this many tested tokens
WAKES = {("draft", "full"): ("sd",), ("slim", "full"): ("self", "hier"), ("draft", "slim"): ("hier",)}  # pair → modes
# tokens a model-drafted pair (sd's, self's) is tested on before the draws alone decide whether it runs again
MIN_TESTED = 8
LOOKUP = ("lookup", "full")
INNER = ("draft", "slim")  # hier's inner pair
# a pair is tested only if its mode could then beat every arm by this factor: a mode that only ties at best
# (smollm2's slim, 1.00–1.06× ar were it always accepted) is not worth the test's cost
WORTH = 1.1
# a calibrated prior is dropped when its pair's accepted count lies in a tail of the prior's predictive law this rare
CONFLICT = 0.1
# tested tokens of the pooled n-gram evidence each prompt's own n-gram posterior starts from: whether a prompt's
# text repeats is a property of that prompt, so a few of its own blocks outweigh every earlier prompt's
SEED = 8.0
# auto's sd blocks stop drafting after a token the draft gives less than this (its own probability at temperature 1):
# a long γ then drafts while the draft is sure and stops where it guesses (mini's greedy task: sd@6 1.71× ar with it,
# the best γ drafting all 1.46×; benchmarks/stop_sweep.py); 0 turns it off
STOP = 0.3
SURE_PRIOR = (1.0, 1.0)  # Beta prior of the rates at which the draft is sure (Sure.kept, Sure.sure)
# the key, in a choice's rates, of sd's draft under the stop: a (first, rest) of Sure, priced for the stop arms
STOPPED = ("draft" + STOP_SUFFIX, "full")


def part(pair: tuple[str, str], rest: bool) -> tuple[str, str]:
    """The key of a model-drafted pair's counts of the first draft each block tests (``^``), or (``rest``, ``+``)
    of each later one, tested once those before it were accepted."""
    return (pair[0] + ("+" if rest else "^"), pair[1])


def sure_key(pair: tuple[str, str], kept: bool) -> tuple[str, str]:
    """The key of a model draft's counts, under :attr:`Chooser.stop`, of the drafted tokens it was sure of (``~sure``),
    or (``kept``) of the accepted ones (``~kept``)."""
    return (pair[0] + ("~kept" if kept else "~sure"), pair[1])


def lookup_pair(ngram: int, rest: bool = False) -> tuple[str, str]:
    """The key of the n-gram proposer's counts after a match of ``ngram`` tokens (0: the pooled key): of its first
    drafted token, or (``rest``) of each later one, once those before it were accepted."""
    return (("lookup" if not ngram else f"lookup@{ngram}") + ("+" if rest else ""), "full")


@dataclass(frozen=True)
class Arm:
    mode: str  # ar | sd | self | lookup | hier
    gamma: int = 0
    window: int = 0
    stop: bool = False  # sd: drafting stops after a token the draft is unsure of (Chooser.stop)

    @property
    def step(self) -> str:
        """The key of its step work (:attr:`Chooser.overhead`): its mode's, apart for a stop arm (``sd~``: the draft's
        probability of each token it drafts is read)."""
        return self.mode + ("~" if self.stop else "")

    @property
    def label(self) -> str:
        return (self.mode + (f"/{self.gamma}" if self.gamma else "") + (f"/{self.window}" if self.window else "")
                + ("~" if self.stop else ""))


# (mode, the pair its probe tests, the probe's arm): hier's inner pair is only seen when hier runs, as sd's is
PROBES = (("sd", DRAFTS["sd"], Arm("sd", 1)), ("self", DRAFTS["self"], Arm("self", 1)),
          ("hier", INNER, Arm("hier", *HIER[0])))


def arms(draft: bool, slim: bool) -> list[Arm]:
    """Every arm the available tiers allow (each γ of sd with and without the stop; at γ = 1 the stop changes
    nothing)."""
    out = [Arm("ar")] + [Arm("lookup", g) for g in GAMMAS]
    out += [Arm("sd", g, stop=stop) for g in GAMMAS for stop in (False, True) if g > 1 or not stop] if draft else []
    out += [Arm("self", g) for g in GAMMAS] if slim else []
    out += [Arm("hier", g, w) for g, w in HIER] if slim and draft else []
    return out


@dataclass
class Chooser:
    costs: Costs
    arms: list[Arm]
    counts: dict[tuple[str, str], list[float]] = field(default_factory=dict)  # pair → [accepted, rejected]
    chosen: dict[str, int] = field(default_factory=dict)  # arm label → blocks, over the last decode
    # tier, or (tier, tokens fed): running measured / tabled seconds of its forwards
    scale: dict[str | tuple[str, int], float] = field(default_factory=dict)
    adapt: bool = True  # rescale the table by measured times (off: price by the table alone)
    # price a model-drafted pair's first draft of a block apart from the later ones (off: one rate per draft)
    split: bool = True
    # the stop arms' sd blocks stop drafting after a token the draft gives less than this, and are priced so
    # (:class:`Sure`; 0: stop arms are not offered)
    stop: float = STOP
    # mode (Arm.step) → running seconds outside forwards per token a block verifies (its drafts + 1; Γ + 1 for hier;
    # 1 for ar)
    overhead: dict[str, float] = field(default_factory=dict)
    probing: bool = False  # the last choice was a probe (it runs one block: the probe ends at MIN_TESTED)
    # n-gram pair → [accepted, rejected] on the current prompt, seeded with the pooled counts scaled to SEED tokens
    local: dict[tuple[str, str], list[float]] = field(default_factory=dict)
    # pair → its per-token acceptance measured offline (a slim config's, on calibration text): the pair's prior
    calibrated: dict[tuple[str, str], float] = field(default_factory=dict)
    # calibrated pair → tested tokens its calibration is worth (calibration_worth; absent: CALIBRATED)
    worth: dict[tuple[str, str], float] = field(default_factory=dict)
    # calibrated pairs whose own evidence contradicted the calibration: they go on from PRIOR
    overruled: set[tuple[str, str]] = field(default_factory=set)
    _checked: dict[tuple[str, str], int] = field(default_factory=dict, repr=False)  # next tested count to check at
    # ``remaining`` at or below which the decision not to test is revisited (None: at the next choice)
    _recheck: int | None = field(default=None, repr=False)
    _gap: int = field(default=MIN_TESTED, repr=False)  # tokens until that revisit (doubling while it holds)
    # choices of the draws a model-drafted mode sits out before it is priced again (NAP)
    nap: int = NAP
    _asleep: dict[str, int] = field(default_factory=dict, repr=False)  # mode → choices it still sits out
    _lags: dict[str, int] = field(default_factory=dict, repr=False)  # each tier's lag at the last choice
    # a prompt's first choice runs half the stretch its mode last ran (on an earlier prompt), else one token
    resume: bool = True
    stretches: dict[str, int] = field(default_factory=dict, repr=False)  # mode → the stretch (tokens) it last ran
    # SPREAD tier → [tokens emitted by blocks of arms that run it, by other arms], faded to HORIZON tokens
    usage: dict[str, list[float]] = field(default_factory=dict)
    _caught: set[str] = field(default_factory=set, repr=False)  # SPREAD tiers an arm has run on this prompt
    _table: dict[tuple[str, int], float] = field(default_factory=dict, repr=False)

    def state(self) -> dict:
        """What the chooser has learned, as JSON-ready data (:meth:`from_state` reads it back): the tier pairs'
        counts, calibrations and overruled calibrations, the measured/tabled time ratios, the step overheads and
        the draft's share of the tokens (:meth:`used`).
        The cost table and the arms are the decoder's, not part of it."""
        return {"counts": {_key(p): c for p, c in self.counts.items()},
                "calibrated": {_key(p): m for p, m in self.calibrated.items()},
                "worth": {_key(p): k for p, k in self.worth.items()},
                "overruled": sorted(_key(p) for p in self.overruled),
                "scale": {_key(k) if isinstance(k, tuple) else k: v for k, v in self.scale.items()},
                "overhead": dict(self.overhead), "usage": {t: list(u) for t, u in self.usage.items()}}

    @classmethod
    def from_state(cls, costs: Costs, arms: list[Arm], state: dict) -> Chooser:
        """A chooser that goes on from :meth:`state`'s data, pricing ``arms`` with ``costs``."""
        out = cls(costs, arms, calibrated={_pair(k): float(m) for k, m in state["calibrated"].items()})
        out.counts = {_pair(k): [float(a), float(r)] for k, (a, r) in state["counts"].items()}
        for pair in [p for p in PAIRS if p != LOOKUP and p in out.counts and part(p, False) not in out.counts]:
            for rest in (False, True):  # saved before first and later drafts were counted apart: both from the pool
                out.counts[part(pair, rest)] = list(out.counts[pair])
        out.worth = {_pair(k): float(w) for k, w in state.get("worth", {}).items()}
        out.overruled = {_pair(k) for k in state["overruled"]}
        out.scale = {(k.partition("|")[0], int(k.partition("|")[2])) if "|" in k else k: float(v)
                     for k, v in state["scale"].items()}
        out.overhead = {mode: float(v) for mode, v in state["overhead"].items()}
        out.usage = {str(t): [float(used), float(other)] for t, (used, other) in state.get("usage", {}).items()}
        return out

    def new_prompt(self) -> None:
        self.chosen, self.local, self._recheck, self._caught, self._asleep, self._lags = {}, {}, None, set(), {}, {}
        self._gap = MIN_TESTED

    def seeded(self, pair: tuple[str, str]) -> list[float]:
        """This prompt's counts of an n-gram pair: from the pooled ones scaled to :data:`SEED` tokens at first."""
        if pair not in self.local:
            counts = self.counts.get(pair, [0.0, 0.0])
            self.local[pair] = [c * min(1.0, SEED / max(sum(counts), 1e-9)) for c in counts]
        return self.local[pair]

    def prior(self, pair: tuple[str, str]) -> tuple[float, float]:
        """The pair's Beta prior: :data:`PRIOR`, or its calibrated acceptance worth :attr:`worth` tokens."""
        if pair not in self.calibrated or pair in self.overruled:
            return PRIOR
        m, k = min(max(self.calibrated[pair], 0.0), 1.0), self.worth.get(pair, CALIBRATED)
        return 1.0 + m * k, 1.0 + (1.0 - m) * k

    def evidence(self, pair: tuple[str, str], ngram: int = 0, rest: bool = False) -> tuple[float, float]:
        """``pair``'s accepted and rejected tested tokens (the n-gram proposer's on this prompt after a match of
        ``ngram`` tokens, of its first drafted token or the ``rest``): with :meth:`prior`, the Beta posterior every
        choice prices the arms from."""
        if pair == LOOKUP:
            return tuple(self.seeded(lookup_pair(ngram, rest)))
        a, r = self.counts.get(pair, (0.0, 0.0))
        return a, r

    def parts(self, pair: tuple[str, str], prior: tuple[float, float] | None = None) -> list[tuple[float, float]]:
        """A model-drafted pair's Beta posterior parameters (from ``prior``, by default :meth:`prior`): of its first
        draft in a block and of the later ones (:attr:`split`), else of every draft pooled (one entry)."""
        (pa, pr), keys = prior or self.prior(pair), [part(pair, False), part(pair, True)] if self.split else [pair]
        return [(a + pa, r + pr) for a, r in (self.counts.get(key, (0.0, 0.0)) for key in keys)]

    def stopping(self, pair: tuple[str, str], accepted: float | tuple[float, float],
                 draw: Callable[[float, float], float]) -> tuple[Sure, Sure]:
        """``pair``'s (first, rest) rates under :attr:`stop`: its acceptance ``accepted`` (pooled or (first, rest))
        with the rates at which the draft is sure of its accepted and of its drafted tokens, each ``draw(a, b)`` of
        its Beta(a, b) posterior (a draw, or the mean)."""
        alphas = accepted if isinstance(accepted, tuple) else (accepted, accepted)
        kept, sure = ([draw(a, b) for a, b in self.parts(sure_key(pair, k), SURE_PRIOR)] for k in (True, False))
        kept, sure = (v if len(v) == 2 else v * 2 for v in (kept, sure))
        return Sure(alphas[0], kept[0], sure[0]), Sure(alphas[1], kept[1], sure[1])

    def lookup_means(self, ngram: int) -> tuple[float, float]:
        """The n-gram draft's posterior mean acceptance after a match of ``ngram`` tokens: (first, rest)."""
        out = []
        for rest in (False, True):
            (a, r), (pa, pr) = self.evidence(LOOKUP, ngram, rest), PRIOR
            out.append((a + pa) / (a + r + pa + pr))
        return out[0], out[1]

    def means(self, ngram: int = 0) -> dict[tuple[str, str], float | tuple[float, float]]:
        """Every tier pair's posterior mean acceptance (the n-gram draft's: :meth:`lookup_means`; sd's draft under the
        stop's: :data:`STOPPED`)."""
        out: dict[tuple[str, str], float | tuple[float, float] | tuple[Sure, Sure]] = {}
        for pair in PAIRS:
            out[pair] = (self.lookup_means(ngram) if pair == LOOKUP
                         else _rate([a / (a + b) for a, b in self.parts(pair)]))
        if self.stop > 0:
            out[STOPPED] = self.stopping(DRAFTS["sd"], out[DRAFTS["sd"]], _mean)
        return out

    def observe(self, observations: list[modes.Observation]) -> None:
        for proposer, target, accepted, tested in observations:
            pair = (proposer, target)
            if proposer.startswith("lookup"):
                for c in (self.counts.setdefault(pair, [0.0, 0.0]), self.seeded(pair)):
                    _count(c, accepted, tested - accepted)
                continue
            # pooled (probes, calibration checks, the γ cap), and the first draft apart from the later ones
            _count(self.counts.setdefault(pair, [0.0, 0.0]), accepted, tested - accepted)
            for mode in WAKES.get(pair, ()):  # new evidence: priced again at the next choice
                self._asleep.pop(mode, None)
            for key, hits, tried in ((part(pair, False), min(accepted, 1), min(tested, 1)),
                                     (part(pair, True), max(accepted - 1, 0), max(tested - 1, 0))):
                if tried:
                    _count(self.counts.setdefault(key, [0.0, 0.0]), hits, tried - hits)
            self._check(pair)

    def _check(self, pair: tuple[str, str]) -> None:
        """Drop ``pair``'s calibration if its evidence, at 8, 16, 32… tested tokens, contradicts it."""
        if pair not in self.calibrated or pair in self.overruled:
            return
        accepted, rejected = self.counts[pair]
        tested = round(accepted + rejected)
        if tested < self._checked.get(pair, MIN_TESTED):
            return
        self._checked[pair] = 2 * tested
        if predictive_tail(round(accepted), tested, *self.prior(pair)) < CONFLICT:
            self.overruled.add(pair)

    def used(self, tier: str) -> float:
        """The share of tokens that arms running ``tier`` emitted recently (1 before any were emitted; at least
        :data:`USAGE_FLOOR`): per token left, the tokens a :data:`SPREAD` tier's catch-up is paid back over."""
        used, other = self.usage.get(tier, (0.0, 0.0))
        return max(used / (used + other), USAGE_FLOOR) if used + other else 1.0

    def tabled(self, tier: str, n: int) -> float:
        if (tier, n) not in self._table:
            self._table[(tier, n)] = self.costs(tier, n)
        return self._table[(tier, n)]

    def price(self, tier: str, n: int) -> float:
        """Seconds of one forward of ``n`` tokens of ``tier`` as they run now: the table's entry times the
        measured ratio of that tier's forwards of this size (of all its forwards for a size not yet seen; fading toward
        that while the size is not run: :data:`FADE`)."""
        if tier == FREE:
            return 0.0
        return self.tabled(tier, n) * self.scale.get((tier, n), self.scale.get(tier, 1.0))

    def observe_forwards(self, tier: str, forwards: list[tuple[int, float]]) -> None:
        """``forwards``: (tokens fed, seconds) of each forward ``tier`` just ran."""
        if not self.adapt:
            return
        timed = [(n, seconds) for n, seconds in forwards if seconds > 0 and n <= OBSERVED]
        for n, seconds in timed:
            ratio = min(max(seconds / self.tabled(tier, n), RATIO_BOUNDS[0]), RATIO_BOUNDS[1])
            base = self.scale.get(tier, 1.0)  # a size seen for the first time starts from the tier's ratio
            for key in (tier, (tier, n)):
                old = self.scale.get(key, base)
                step = min(max(ratio, old / STALL), old * STALL)  # a stall moves it by a factor 1 + RATE at most
                self.scale[key] = old + RATE * (step - old)
        if timed and FADE:
            ran, fade, level = {n for n, _ in timed}, 1.0 - (1.0 - FADE) ** len(timed), self.scale[tier]
            for key in [k for k in self.scale if isinstance(k, tuple) and k[0] == tier and k[1] not in ran]:
                self.scale[key] += fade * (level - self.scale[key])

    def observe_tokens(self, arm: Arm, tokens: int) -> None:
        """``arm``'s blocks just emitted ``tokens``: the running share of tokens that arms running each
        :data:`SPREAD` tier emit, over which that tier's catch-up at a prompt's start is spread."""
        for tier in SPREAD:
            runs = tier in CATCH_UP.get(arm.mode, ())
            _count(self.usage.setdefault(tier, [0.0, 0.0]), tokens if runs else 0, 0 if runs else tokens)

    def observe_overhead(self, mode: str, seconds: float, verified: float = 1) -> None:
        """``seconds``: the time one block of ``mode`` spent outside its forwards (the step's own tensor code,
        the n-gram proposer's search; not the choice), of a block that verified ``verified`` tokens. Kept per verified
        token, a running mean per mode: on mini that time grows in proportion to γ + 1 (0.27–0.30 ms per token
        at T = 0.7 for sd at γ = 1 and 2), so one mean per block would price a long γ below what it costs."""
        if not self.adapt:
            return
        seconds = max(seconds, 0.0) / max(verified, 1)
        old = self.overhead.get(mode)
        self.overhead[mode] = seconds if old is None else old + RATE * (seconds - old)

    def choose(self, rng: random.Random, lag: dict[str, int], lookup_len: int = GAMMAS[-1], ngram: int = 0,
               remaining: int = 0) -> Arm:
        """The arm of highest sampled tokens/s; ``lag[tier]``: tokens a tier's cache is behind;
        ``remaining``: tokens the decode may still emit (0: unknown), over which the draft's catch-up is spread;
        ``lookup_len``: tokens the n-gram proposer has to offer now (none: its arms are left out), after a match
        of ``ngram`` tokens (its acceptance is drawn from that length's counts)."""
        rates, means, limit = {}, {}, {}
        for pair in PAIRS:
            if pair == LOOKUP:
                # the n-gram proposer is seen after every block whatever runs: a draw would only add exploration
                rates[pair] = means[pair] = self.lookup_means(ngram)
                limit[pair] = 1 + self.evidence(pair, ngram)[0] + self.evidence(pair, ngram, rest=True)[0]
                continue
            parts = self.parts(pair)
            means[pair] = _rate([a / (a + b) for a, b in parts])
            rates[pair] = _rate([rng.betavariate(a, b) for a, b in parts])
            limit[pair] = 1 + self.evidence(pair)[0]  # γ (Γ) runs at most 1 + the tokens the pair has seen accepted
        for rate in (rates, means):
            rate[INNER] = within_band(rate[INNER], rate[DRAFTS["sd"]], rate[DRAFTS["self"]])
        stops = self.stop > 0 and any(a.stop for a in self.arms)  # the stop arms' rates are drawn only if offered
        if stops:
            rates[STOPPED] = self.stopping(DRAFTS["sd"], rates[DRAFTS["sd"]], rng.betavariate)

        def allowed(arm: Arm) -> bool:
            if arm.mode == "hier":
                return arm.gamma <= limit[INNER] and arm.window <= limit[("slim", "full")]
            return arm.mode not in DRAFTS or drafted(arm, lookup_len) <= limit[DRAFTS[arm.mode]]

        def speeds(priced: list[Arm], at: dict[tuple[str, str], float | tuple[float, float]]) -> list[float]:
            return self.speeds(priced, at, lag, lookup_len, remaining)

        offered = [a for a in self.arms if (a.mode != "lookup" or drafted(a, lookup_len) > 0)
                   and (self.stop > 0 or not a.stop)] or self.arms[:1]
        arm = None
        if self._recheck is None or remaining <= self._recheck:
            if stops:  # the means price arms only here
                means[STOPPED] = self.stopping(DRAFTS["sd"], means[DRAFTS["sd"]], _mean)
            arm = self._probe(offered, means, speeds)
            # whether to test turns on the posterior means, which a block barely moves: the decision not to is
            # revisited after MIN_TESTED more tokens (pricing every arm at the means each block cost as much as
            # the choice itself, 3% of mini's decode), then after twice as many each time it holds on the prompt
            # (mini's slim pairs are never worth a test: rechecked every 8 tokens, ~1% of its greedy prose decode)
            if arm is None and remaining > 0:
                self._recheck, self._gap = remaining - self._gap, 2 * self._gap
            else:
                self._recheck = None
        self.probing = arm is not None
        if arm is None:
            # The draw's best arm, whatever its evidence, says which mode to try; a pair with little evidence
            # then bets small: the same mode at the best γ its evidence allows (else the best allowed arm).
            for tier, behind in lag.items():  # a tier that lags less than at the last choice: its modes cost less
                if behind < self._lags.get(tier, behind):
                    for mode in (m for m, tiers in CATCH_UP.items() if tier in tiers):
                        self._asleep.pop(mode, None)
            self._lags = dict(lag)
            awake = [a for a in offered if not self._asleep.get(a.mode)] or offered
            speed = speeds(awake, rates)
            best = max(range(len(awake)), key=speed.__getitem__)
            arm = awake[best]
            if not allowed(arm):
                within = [i for i, a in enumerate(awake) if allowed(a)]
                arm = awake[max([i for i in within if awake[i].mode == arm.mode] or within or [0],
                                key=speed.__getitem__)]
            self._nap(awake, speed)
        self.chosen[arm.label] = self.chosen.get(arm.label, 0) + 1
        self._caught.update(t for t in CATCH_UP.get(arm.mode, ()) if t in SPREAD)
        return arm

    def _nap(self, priced: list[Arm], speed: list[float]) -> None:
        """After a choice among ``priced`` at ``speed``: a :data:`NAPPING` mode whose best arm priced below
        :data:`DORMANT` × the best arm's but the n-gram arms' (they are on offer only where the text matched) is left
        unpriced for the next :attr:`nap` choices; those asleep now come a choice closer to waking."""
        best: dict[str, float] = {}
        for a, s in zip(priced, speed, strict=True):
            if a.mode != "lookup" and s > best.get(a.mode, 0.0):
                best[a.mode] = s
        top = max(best.values(), default=0.0)
        for mode in NAPPING:
            if mode in best:
                self._asleep[mode] = self.nap if self._known(mode) and best[mode] < DORMANT * top else 0
            elif self._asleep.get(mode):
                self._asleep[mode] -= 1

    def _known(self, mode: str) -> bool:
        """Whether each tier pair ``mode`` runs holds :data:`NAP_TESTED` tokens of evidence (its prior's included): a
        pair its draws still spread widely keeps being drawn at every choice (Thompson sampling's exploration)."""
        return all(sum(self.counts.get(pair, (0.0, 0.0))) + sum(self.prior(pair)) >= NAP_TESTED
                   for pair, modes in WAKES.items() if mode in modes)

    def speeds(self, priced: list[Arm], rates: dict[tuple[str, str], float | tuple[float, float]],
               lag: dict[str, int], lookup_len: int = GAMMAS[-1], remaining: int = 0) -> list[float]:
        """Tokens/s of each arm in ``priced`` at acceptance ``rates`` (:func:`dimr.decoding.costs.blocks` at the
        current prices, plus the step work and the catch-up of the tiers that lag; :meth:`choose`'s arguments)."""
        memo: dict[tuple[str, int], float] = {}

        def price(tier: str, n: int) -> float:  # the prices hold for this choice: each is computed once
            if (tier, n) not in memo:
                memo[(tier, n)] = self.price(tier, n)
            return memo[(tier, n)]

        catch_up = {tier: price(tier, lag[tier] + 1) - price(tier, 1) for tier in lag}
        # tokens the prompt's catch-up of a SPREAD tier is paid back over (none: charged whole)
        over = {tier: remaining * self.used(tier) for tier in SPREAD
                if tier in lag and tier not in self._caught and remaining > 0}
        gammas = [drafted(a, lookup_len) for a in priced]
        stopping = rates.get(STOPPED)  # without it a stop arm is priced as drafting all γ
        stops = stopping is not None and any(a.stop for a in priced)
        specs = [(a.step if stops else a.mode, g, a.window) for a, g in zip(priced, gammas, strict=True)]
        # the step work grows with the tokens verified: a stopping draft's expected drafts + 1
        drafts = expected_drafts(*stopping, max(g for a, g in zip(priced, gammas, strict=True) if a.stop)) if stops \
            else []
        steps = {step: self.overhead.get(step, self.overhead.get(step.rstrip("~"), 0.0)) for step, _, _ in specs}
        out = []
        for arm, (step, g, _), (tokens, seconds) in zip(priced, specs, blocks(specs, Acceptance(rates), price),
                                                        strict=True):
            seconds += steps[step] * (drafts[g] + 1 if stops and arm.stop else verified(arm, g))
            for tier in CATCH_UP.get(arm.mode, ()):
                # the prompt's catch-up is paid once for every later block of the arm: each block bears its share;
                # once the tier has run on the prompt, a lag is the chooser's own interleaving, paid at each return
                share = min(1.0, tokens / over[tier]) if tier in over else 1.0
                seconds += catch_up[tier] * share
            out.append(tokens / seconds)
        return out

    def _probe(self, offered: list[Arm], means: dict[tuple[str, str], float],
               speeds: Callable[[list[Arm], dict[tuple[str, str], float]], list[float]]) -> Arm | None:
        """A test block of a model-drafted pair tested on fewer than :data:`MIN_TESTED` tokens, if its mode loses at
        the posterior means but would beat every arm by :data:`WORTH` were those drafts always accepted (else None:
        the draws decide): :func:`probe_arm`."""
        untested = [(mode, pair, probe) for mode, pair, probe in PROBES
                    if probe in offered and sum(self.counts.get(pair, (0.0, 0.0))) < MIN_TESTED]
        if not untested:  # the usual case once each pair is tested: no pricing at the means
            return None
        at_means = speeds(offered, means)
        best = max(at_means)
        for mode, pair, probe in untested:
            own = [a for a in offered if a.mode == mode]
            mine = max(s for a, s in zip(offered, at_means, strict=True) if a.mode == mode)
            if mine < best < max(speeds(own, {**means, pair: 1.0})) / WORTH:
                return probe_arm(probe, [a for a in own if not a.stop], *self.counts.get(pair, (0.0, 0.0)))
        return None


def probe_arm(probe: Arm, own: list[Arm], accepted: float, rejected: float) -> Arm:
    """The arm a test of ``probe``'s pair runs, having seen ``accepted`` and ``rejected`` of its drafts: ``probe``
    (γ = 1; hier's γ = 1, Γ = 4 for its draft against the slim) at first, then, as an adaptive draft length grows on
    success, the longest γ of its mode among ``own`` within 1 + the tokens seen accepted and the tokens the test
    still needs. At γ = 1 a test of MIN_TESTED accepted drafts took eight blocks (mini's greedy task: eight sd/1 test
    blocks a cold pass, at 129 tok/s against ``sd@6``'s 174); growing, three or four."""
    if probe.mode == "hier":
        return probe
    room = min(1.0 + accepted, MIN_TESTED - accepted - rejected)
    return max((a for a in own if a.gamma <= room), key=lambda a: a.gamma, default=probe)


def _count(counts: list[float], hits: float, misses: float) -> None:
    """Add to [hits, misses] counts, the older evidence faded so they hold at most :data:`HORIZON` tokens."""
    counts[0], counts[1] = counts[0] + hits, counts[1] + misses
    if counts[0] + counts[1] > HORIZON:
        fade = HORIZON / (counts[0] + counts[1])
        counts[0], counts[1] = counts[0] * fade, counts[1] * fade


def _key(pair: tuple) -> str:
    return "|".join(str(x) for x in pair)


def _pair(key: str) -> tuple[str, str]:
    first, _, second = key.partition("|")
    if not first or not second:
        raise ValueError(f"{key!r} is not a tier pair")
    return first, second


def _mean(a: float, b: float) -> float:
    return a / (a + b)


def _rate(rates: list[float]) -> float | tuple[float, float]:
    """One pooled rate, or (first, rest) (:func:`dimr.decoding.costs.expected_tokens`)."""
    return rates[0] if len(rates) == 1 else (rates[0], rates[1])


def within_band(inner: float | tuple[float, float], draft: float | tuple[float, float],
                slim: float | tuple[float, float]) -> float | tuple[float, float]:
    """The draft's acceptance against the slim verifier (``inner``) moved into the band the other two pairs allow:
    an acceptance is 1 − the expected total variation between the two tiers' next-token laws (greedy: the rate at
    which their tokens agree), and by the triangle inequality the draft's distance to the slim differs from its
    distance to the full verifier by at most the slim's own, so ``inner`` lies within ``draft`` ± (1 − ``slim``).
    hier's inner pair is seen only when hier runs; sd's and self's pairs are seen far more often, and bound it: drawn
    alone from a few dozen tokens, it had run hier where the means priced it 13–20% below sd (mini, prose, T = 0.7)."""
    if isinstance(inner, tuple):  # (first, rest), as are the other two: each within its own band
        return within_band(inner[0], draft[0], slim[0]), within_band(inner[1], draft[1], slim[1])
    gap = 1.0 - slim
    return min(max(inner, draft - gap), draft + gap)


def calibration_worth(rates: list[float], tokens: float) -> float:
    """Tested tokens a calibration is worth as a prior, from its sequences' own acceptance ``rates`` (each over
    ``tokens`` positions): the concentration k of the Beta law of a new text's acceptance whose beta-binomial
    variance, k = m(1 − m)/σ² − 1 between texts, matches their spread (the method of moments: the rates' variance
    is the between-text one plus the binomial m(1 − m)/``tokens`` within a text). At most :data:`CALIBRATED`:
    calibration text is not the workload's. On eight calibration continuations of 48 tokens smollm2's draft is
    accepted 0.10–0.52 of the time (1 − TV), worth about 7 tokens: priced from two of them (0.41 and 0.46, worth
    16), it had run on the task at T = 0.7 at a posterior 0.23–0.26 where it realises 0.17."""
    n = len(rates)
    if n < 2 or tokens <= 1:
        return CALIBRATED
    m = sum(rates) / n
    spread = sum((r - m) ** 2 for r in rates) / (n - 1)
    if not 0.0 < m < 1.0:
        return CALIBRATED
    rho = (spread * tokens / (m * (1.0 - m)) - 1.0) / (tokens - 1.0)  # beta-binomial: var = m(1-m)(1+(t-1)ρ)/t
    return CALIBRATED if rho <= 0.0 else min(max(1.0 / rho - 1.0, 0.0), CALIBRATED)


def predictive_tail(accepted: int, tested: int, a: float, b: float) -> float:
    """The smaller tail, P(K ≤ accepted) or P(K ≥ accepted), of K accepted in ``tested`` drafts under the
    Beta(a, b)-binomial law: how rare the count is for a pair whose acceptance the Beta(a, b) prior describes.
    (scipy's ``betabinom`` gives the same; importing ``scipy.stats`` takes 0.8 s, inside a timed decode.)"""
    log_beta = math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)
    pmf = [math.exp(math.lgamma(tested + 1) - math.lgamma(k + 1) - math.lgamma(tested - k + 1)
                    + math.lgamma(k + a) + math.lgamma(tested - k + b) - math.lgamma(tested + a + b) - log_beta)
           for k in range(tested + 1)]
    return min(sum(pmf[: accepted + 1]), sum(pmf[accepted:]))


def drafted(arm: Arm, lookup_len: int) -> int:
    """Tokens one block of ``arm`` drafts now: an n-gram arm at most the ``lookup_len`` its proposer offers."""
    return min(arm.gamma, lookup_len) if arm.mode == "lookup" else arm.gamma


def verified(arm: Arm, gamma: int) -> int:
    """Tokens one block of ``arm`` verifies (drafting ``gamma``): the size its step work grows with."""
    return 1 if arm.mode == "ar" else (arm.window if arm.mode == "hier" else gamma) + 1


def sure_seen(seen: modes.Observation, sure: int, drafted: int) -> list[modes.Observation]:
    """What a block of a draft that stops when unsure (``sure`` of its ``drafted`` tokens before the first it was
    unsure of) showed besides its acceptance (``seen``): its drafted and its accepted tokens it was sure of."""
    proposer, target, accepted, _ = seen
    return [(*sure_key((proposer, target), False), sure, drafted),
            (*sure_key((proposer, target), True), min(sure, accepted), accepted)]


def _lookup_seen(proposal: Tensor, emitted: Tensor) -> list[modes.Observation]:
    """The n-gram proposal made before a block against the tokens the block emitted: leading matches."""
    proposal = proposal[: emitted.numel()]
    if proposal.numel() == 0:
        return []
    miss = (proposal != emitted[: proposal.numel()]).nonzero()
    accepted = int(miss[0, 0]) if miss.numel() else proposal.numel()
    return [("lookup", "full", accepted, min(accepted + 1, proposal.numel()))]


def _by_match(seen: list[modes.Observation], ngram: int) -> list[modes.Observation]:
    """The n-gram proposer's observations filed under the length of the match its proposal came from, its first
    drafted token apart from the rest."""
    out = []
    for proposer, target, accepted, tested in seen:
        if (proposer, target) != LOOKUP:
            out.append((proposer, target, accepted, tested))
            continue
        if tested:
            out.append((*lookup_pair(ngram), min(accepted, 1), 1))
        if tested > 1:
            out.append((*lookup_pair(ngram, rest=True), accepted - 1, tested - 1))
    return out


class Walk(Protocol):
    """What :func:`drive` needs of a decode: :func:`auto`'s own, or a replay of known outcomes (the benchmark
    ``auto_replay.py`` replays greedy decodes against a cost table with this same loop)."""

    @property
    def done(self) -> bool: ...

    @property
    def remaining(self) -> int: ...

    def lag(self) -> dict[str, int]:
        """Tokens each cached tier other than the full verifier is behind."""

    def lookup(self) -> tuple[int, int]:
        """The n-gram proposal at the current position: its length and the length of the match it came from."""

    def ngram(self) -> int:
        """The length of the n-gram match at the current position (what :meth:`lookup` would return second)."""

    def block(self, arm: Arm) -> list[modes.Observation]:
        """Run one block of ``arm``."""

    def lookup_seen(self) -> list[modes.Observation]:
        """The n-gram proposal of the last :meth:`lookup` against the tokens emitted since."""

    def spent(self, arm: Arm, blocks: int, seconds: float) -> None:
        """``blocks`` blocks of ``arm`` took ``seconds`` of wall time (forwards included)."""


def _stretch_ends(arm: Arm, priced: int, now: int, ngrams: bool) -> bool:
    """Whether a stretch stops before its next block, which would start at an n-gram match of ``now`` tokens: an
    n-gram stretch where the match it was priced at (``priced`` tokens) changes; another mode's, if the chooser has
    n-gram arms (``ngrams``), where a longer match than at its choice appears."""
    return now != priced if arm.mode == "lookup" else ngrams and now > priced


def _stretched(blocks: int, tokens: int) -> int:
    """How far a stretch of ``blocks`` blocks that emitted ``tokens`` tokens has gone, in :data:`RUN`'s unit."""
    return tokens


def _settled(arm: Arm, last: Arm | None) -> bool:
    """Whether the choice of ``arm`` after ``last`` goes on with a longer stretch: the same mode, whatever its γ."""
    return last is not None and arm.mode == last.mode


def drive(chooser: Chooser, rng: random.Random, walk: Walk) -> None:
    """``auto``'s loop: a choice, a stretch of its blocks, the observations; until the walk is done."""
    chooser.new_prompt()
    run, last = 0, None  # the last choice's stretch (tokens, :func:`_stretched`), and its arm
    ngrams = any(a.mode == "lookup" for a in chooser.arms)
    while not walk.done:
        offered, ngram = walk.lookup()
        before = walk.remaining
        arm = chooser.choose(rng, walk.lag(), offered, ngram, before)
        if chooser.probing:
            run = 1
        elif _settled(arm, last):
            run = min(2 * run, RUN)
        elif last is None and chooser.resume:  # a prompt's first choice: half the stretch its mode last ran
            run = max(chooser.stretches.get(arm.mode, 1) // 2, 1)
        else:
            run = 1
        chooser.stretches[arm.mode] = run
        last = arm
        seen, blocks, spent = [], 0, 0.0
        while not walk.done and not (blocks and (_stretched(blocks, before - walk.remaining) >= run
                                                 or _stretch_ends(arm, ngram, walk.ngram(), ngrams))):
            blocks += 1
            began = time.perf_counter()
            seen += walk.block(arm)
            spent += time.perf_counter() - began
        if arm.mode != "lookup":
            seen += walk.lookup_seen()
        chooser.observe(_by_match(seen, ngram))
        chooser.observe_tokens(arm, before - walk.remaining)
        walk.spent(arm, blocks, spent)


class _Decode:
    """:func:`auto`'s walk: blocks of the real tiers on one sequence."""

    def __init__(self, chooser: Chooser, full: Tier, draft: Tier | None, slim: Tier | None, out: Output,
                 generator: torch.Generator | None, vocab_size: int, trace: list | None,
                 escalate: modes.Escalate | None) -> None:
        from dimr.decoding.proposer import ModelProposer

        self.chooser, self.full, self.draft, self.slim, self.out = chooser, full, draft, slim, out
        self.generator, self.trace, self.escalate = generator, trace, escalate
        ngrams = NgramProposer(vocab_size)
        self.proposers: dict[str, Proposer] = {"lookup": ngrams}
        self.index = ngrams.index  # the n-gram look-ups of the choices and stretches share the proposer's
        if draft is not None:
            self.proposers["sd"] = ModelProposer(draft)
        if slim is not None:
            self.proposers["self"] = ModelProposer(slim)
        self.timed = [t for t in (full, draft, slim) if t is not None and t.timed]
        self.proposal, self.mark, self.drafted = out.ids[:0], out.ids.numel(), 0

    @property
    def done(self) -> bool:
        return self.out.done

    @property
    def remaining(self) -> int:
        return self.out.remaining

    def lag(self) -> dict[str, int]:
        n = self.out.ids.numel()
        return {t.name: n - 1 - t.length for t in (self.draft, self.slim) if t is not None}

    def lookup(self) -> tuple[int, int]:
        ids = self.out.ids
        self.proposal, ngram = self.index.match(ids, GAMMAS[-1])
        self.mark, self.drafted = ids.numel(), self.out.stats.drafted
        return self.proposal.numel(), ngram

    def ngram(self) -> int:
        return self.index.match(self.out.ids, 1)[1]

    def block(self, arm: Arm) -> list[modes.Observation]:
        out, full, generator = self.out, self.full, self.generator
        start, state = out.ids, generator.get_state() if self.trace is not None else None
        if arm.mode == "ar":
            seen = modes.ar_block(full, out, generator)
        elif arm.mode == "hier":
            seen = modes.hier_block(self.proposers["sd"], self.slim, full, out, arm.gamma, arm.window, generator,
                                    escalate=self.escalate)
        else:
            stop, before = self.chooser.stop if arm.stop else 0.0, out.stats.drafted
            seen = modes.sd_block(self.proposers[arm.mode], full, out, arm.gamma, generator, stop=stop)
            if stop:
                seen += sure_seen(seen[0], self.proposers[arm.mode].sure, out.stats.drafted - before)
        if self.trace is not None:
            self.trace.append((arm, start, state, out.ids[start.numel():].tolist()))
        return seen

    def lookup_seen(self) -> list[modes.Observation]:
        return _lookup_seen(self.proposal, self.out.ids[self.mark:])

    def spent(self, arm: Arm, blocks: int, seconds: float) -> None:
        if not self.timed:
            return
        forwards = sum(s for t in self.timed for _, s in t.log)
        # the tokens a block verified as it ran (a stopping draft's drafts vary); hier's, its window and one
        checked = (verified(arm, drafted(arm, self.proposal.numel())) if arm.mode in ("ar", "hier")
                   else (self.out.stats.drafted - self.drafted) / max(blocks, 1) + 1)
        self.chooser.observe_overhead(arm.step, (seconds - forwards) / max(blocks, 1), checked)
        for t in self.timed:
            self.chooser.observe_forwards(t.name, t.log)
            t.log.clear()


@torch.inference_mode()
def auto(chooser: Chooser, full: Tier, draft: Tier | None, slim: Tier | None, prompt: Tensor,
         config: DecodeConfig, vocab_size: int, trace: list | None = None,
         escalate: modes.Escalate | None = None) -> DecodeResult:
    """Decode block by block with the arm the chooser picks. ``trace``, if given, receives one
    (arm, sequence before the block, generator state before the block, tokens emitted) per block."""
    config = replace(config, draft_stop=0.0)  # the chooser sets sd's stop (Chooser.stop) and prices the rest without
    out = Output(prompt, config, DecodeStats("auto", config.gamma), [full, draft, slim])
    walk = _Decode(chooser, full, draft, slim, out, config.generator(prompt.device), vocab_size, trace, escalate)
    for t in walk.timed:
        t.log = []
    try:
        drive(chooser, random.Random(config.seed), walk)
    finally:
        for t in walk.timed:
            t.log = None
    return out.result()
