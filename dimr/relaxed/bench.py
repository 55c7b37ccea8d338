"""``dimr bench-relaxed``: every relaxed rule, its main parameter swept, on a pair's held-out workloads.

Workloads come from the pair's own data (:mod:`dimr.relaxed.workloads`): ``arithmetic`` and ``code`` for ``mini``,
``instruct``, ``task`` and ``code`` for ``smollm2``. Every run decodes the same prompts with the same seeds. The
draft tier is the pair's draft model (``drafter="model"``, mode ``sd``) or the n-gram prompt-lookup proposer
(``"ngram"``, mode ``lookup``: a deterministic, one-hot proposal, see ``Method.ngram`` for the rules that cannot
use it). Per row: acceptance rate (accepted / tested drafted tokens), mean accepted length (per block) and its
prediction E[Σ_k Π_{t≤k} β_t], output length, the repeated-4-gram rate (rambling), tokens/s, speed-up over ``ar``
(end-to-end time for the whole workload, so longer answers cost what they cost; CPU time of this process when the
decoder records it, else wall time) with two predictions beside it: the forward-cost model's (the run's forward
calls priced on a table c(tier, n) measured by the process that decoded the row,
:func:`dimr.decoding.costs.predict_from_counts`, plus each block's step work and the rule's own work beyond lossless
verification's, timed inside the decode, lossless's by :func:`rule_seconds`) and the survey's
S = (L̄_AR/L̄)·(l̄ + 1)/(1 + γ·c_rel); quality (exact match, or the full verifier's log-likelihood per token);
and 95% intervals over the prompts (:mod:`dimr.relaxed.metrics`) for the per-prompt metrics and the speed-up.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

import torch

from dimr.decoding.costs import Costs, predict_from_counts
from dimr.decoding.decoder import Decoder
from dimr.decoding.sampling import Sampler
from dimr.decoding.sequence import DecodeConfig
from dimr.decoding.stats import DecodeStats
from dimr.decoding.verify import Context, TargetsFn, lossless
from dimr.relaxed import METHODS, EnsembleHead
from dimr.relaxed.metrics import mean_interval, ratio_interval, repetition
from dimr.relaxed.predict import Recorder, survey_speedup
from dimr.relaxed.workloads import EXACT, Workload, checker
from dimr.userfiles import write_atomic

DRAFTERS = {"model": "sd", "ngram": "lookup"}  # the draft tier → the decoding mode that runs it

_STEP = re.compile(r"(\d+)([+*-])(\d+)(\+1)?=(\d+)")


def step_accuracy(text: str) -> float:
    """Share of the worked steps (``6+8=14``, ``9+1+1=11``, ``12-6=6``, ``3*7=21``) that are right; 0 if none.

    A graded check of the task's chain of thought, for when exact match is too sparse to compare methods.
    """
    steps = _STEP.findall(text)
    ok = 0
    for a, op, b, carry, c in steps:
        x, y = int(a), int(b)
        value = x + y if op == "+" else x - y if op == "-" else x * y
        ok += value + (1 if carry else 0) == int(c)
    return ok / len(steps) if steps else 0.0


@torch.inference_mode()
def full_loglik(decoder: Decoder, prompt: torch.Tensor, tokens: Sequence[int]) -> tuple[float, int]:
    """Σ log p_full(y_t | ·) at temperature 1 over the output, and its length."""
    if not tokens:
        return 0.0, 0
    y = torch.tensor(tokens, device=prompt.device)
    logits = decoder.full.model(input_ids=torch.cat([prompt, y])[None], logits_to_keep=len(tokens) + 1).logits[0]
    logp = torch.log_softmax(logits[:-1].float(), -1)
    return float(logp[torch.arange(len(tokens)), y].sum()), len(tokens)


Interval = tuple[float, float]
NAN2: Interval = (math.nan, math.nan)


@dataclass
class Row:
    """One (workload, drafter, γ, method, value) point. Means are over prompts; ``*_ci`` their 95% intervals;
    ``per_prompt`` keeps the per-prompt values they come from (seconds, quality, loglik, length, rep, acc)."""

    workload: str
    method: str
    param: str
    value: float
    gamma: int
    mode: str
    drafter: str = "model"
    metric: str = "loglik"
    tokens: int = 0
    prompts: int = 0
    acceptance: float = math.nan
    accepted_length: float = math.nan
    predicted_accepted_length: float = math.nan
    output_length: float = math.nan
    tokens_per_second: float = math.nan
    seconds: float = math.nan
    speedup: float = math.nan
    # the speed-up at its ar's machine speed: × its forward ratio / ar's (the machine's speed drifts within a run)
    speedup_steady: float = math.nan
    predicted_speedup: float = math.nan  # the survey's S
    cost_speedup: float = math.nan  # the cost model's prediction of ``speedup`` (its ar's time over its own)
    cost_rate: float = math.nan  # the cost model's tokens/s for this row's calls (its ar's is the ratio's base)
    forward_ratio: float = math.nan  # CPU seconds its forwards took / the table's price for them (load: > 1)
    rule_seconds: float = math.nan  # its rule's own work per verification of γ drafts beyond lossless's
    rule_seconds_empty: float = math.nan  # ... and of no draft (an n-gram block without a match still verifies)
    # its rule's seconds per verification as timed inside the decode (what the cost model prices, lossless's
    # rule timed above subtracted; rows from before the field priced the rule by the two timings above)
    rule_seconds_decode: float = math.nan
    rule_work: float = math.nan  # seconds in all the cost model adds for the rule: the decode's less lossless's
    verifications: float = math.nan  # rule calls of the decode, and the drafted tokens they verified
    drafts_verified: float = math.nan
    quality: float = math.nan
    steps: float = math.nan
    loglik: float = math.nan
    repetition: float = math.nan
    c_rel: float = math.nan
    speedup_ci: Interval = NAN2
    quality_ci: Interval = NAN2
    loglik_ci: Interval = NAN2
    output_length_ci: Interval = NAN2
    repetition_ci: Interval = NAN2
    acceptance_ci: Interval = NAN2
    per_prompt: dict[str, list[float]] = field(default_factory=dict, repr=False)
    outputs: list[list[int]] = field(default_factory=list, repr=False)
    stats: DecodeStats | None = field(default=None, repr=False)
    session: str = ""  # the process that decoded it (its start, UTC): a speed-up is against that process's ar
    # lossless's speed-up at its point in the first session that decoded it / in this row's session (derive)
    rebase: float = 1.0

    @property
    def speed(self) -> float:
        """The speed-up rows are compared by: the steady one where it is known, else the measured one, carried to
        the first session that decoded the lossless point at the row's (workload, drafter, γ) by ``rebase``."""
        return _unrebased(self) * self.rebase

    @property
    def label(self) -> str:
        if self.mode == "ar":
            return "ar"
        lossless = " (lossless)" if self.method == "static" and self.value == 1.0 else ""
        return f"{self.method} {self.param}={self.value:g}{lossless}"

    @property
    def lossless(self) -> bool:
        return self.mode == "ar" or METHODS[self.method].off == self.value


def _seconds(stats: DecodeStats) -> float:
    return getattr(stats, "cpu_seconds", 0.0) or stats.wall_seconds


def run_one(decoder: Decoder, work: Workload, config: DecodeConfig, mode: str, rule: TargetsFn
            ) -> tuple[DecodeStats, Recorder | None, Row]:
    """Decode every prompt of ``work`` with ``rule`` in ``mode``; return summed stats, β recorder and a row."""
    recorder = Recorder(rule) if mode != "ar" else None
    check = checker(work)
    total, outputs = None, []
    pp: dict[str, list[float]] = {k: [] for k in ("seconds", "quality", "loglik", "length", "rep", "acc", "steps")}
    config = replace(config, max_new_tokens=work.max_new_tokens)
    for k, (text, answer) in enumerate(zip(work.prompts, work.answers, strict=True)):
        prompt = decoder.encode(text)
        per_prompt = replace(config, seed=config.seed + k)  # one seed per prompt: independent draws across prompts
        result = decoder.run(prompt, mode, per_prompt, recorder if recorder is not None else lossless)
        s = result.stats
        total = s if total is None else total.merge(s)
        out_text = decoder.tokenizer.decode(result.tokens, skip_special_tokens=True)
        ll, n = full_loglik(decoder, prompt, result.tokens)
        tested = s.accepted + s.rejected
        pp["seconds"].append(_seconds(s))
        pp["quality"].append(check(out_text, answer))
        pp["steps"].append(step_accuracy(out_text))
        pp["loglik"].append(ll / n if n else math.nan)
        pp["length"].append(float(len(result.tokens)))
        pp["rep"].append(repetition(result.tokens))
        pp["acc"].append(s.accepted / tested if tested else math.nan)
        outputs.append(result.tokens)
    k = len(work.prompts)
    mean = lambda key: float(torch.tensor(pp[key], dtype=torch.float64).nanmean())  # noqa: E731
    row = Row(work.name, "", "", math.nan, config.gamma, mode, metric=work.metric, tokens=total.tokens, prompts=k,
              output_length=total.tokens / k, tokens_per_second=total.tokens / max(_seconds(total), 1e-9),
              seconds=_seconds(total), steps=mean("steps"), loglik=mean("loglik"), repetition=mean("rep"),
              loglik_ci=mean_interval(pp["loglik"]), output_length_ci=mean_interval(pp["length"]),
              repetition_ci=mean_interval(pp["rep"]), per_prompt=pp, outputs=outputs, stats=total)
    row.quality, row.quality_ci = ((mean("quality"), mean_interval(pp["quality"])) if work.metric == "exact"
                                   else (row.loglik, row.loglik_ci))
    if mode != "ar":
        tested = total.accepted + total.rejected
        row.acceptance = total.accepted / tested if tested else math.nan
        row.acceptance_ci = mean_interval(pp["acc"])
        row.accepted_length = total.mean_accepted_length
        row.predicted_accepted_length = recorder.predicted_accepted_length
    return total, recorder, row


def sweep(method: str, gammas: Sequence[int], full_grid_gamma: int, points: int | None = None
          ) -> list[tuple[int, float]]:
    """(γ, value) pairs: the grid (``points`` values of it, spread evenly) at ``full_grid_gamma``, its middle else.

    Every "off" value is the same lossless decoder, so it runs once per γ, as the static ensemble's w = 1.
    """
    m = METHODS[method]
    grid = [v for v in m.grid if v != m.off]
    middle = grid[len(grid) // 2]
    if points is not None:  # the reference line and the learned head keep at least 3 and 2 points
        points = max(points, {"static": 3, "diversed": 2}.get(method, 1))
        if points == 1:
            grid = [middle]
        elif points < len(grid):
            grid = [grid[round(k * (len(grid) - 1) / (points - 1))] for k in range(points)]
    off = [m.off] if method == "static" else []
    out = []
    for g in gammas:
        values = off + grid if g == full_grid_gamma else off + [middle]
        out += [(g, v) for v in dict.fromkeys(values)]
    return out


def skipped(methods: Sequence[str], drafters: Sequence[str], head: EnsembleHead | None) -> list[str]:
    """One line per (method, drafter) the bench leaves out, with the reason."""
    notes = []
    for method in methods:
        m = METHODS[method]
        if m.needs_head and head is None:
            notes.append(f"{method}: no --head given (train one with `dimr diversed train`)")
            continue
        if "ngram" in drafters and m.ngram:
            notes.append(f"{method} with the n-gram drafter: {m.ngram}")
    return notes


STEP_GAMMA = 2  # the γ `Decoder.measure_steps` calibrates at: step work is priced per verified token from it


def rule_seconds(rule: TargetsFn, decoder: Decoder, gamma: int, temperature: float, reps: int = 3,
                 one_hot: bool = False) -> float:
    """Seconds one verification of γ drafted tokens by ``rule`` takes at the pair's vocabulary (random logits,
    hidden states of the pair's sizes for the rules that read them; with ``one_hot`` the draft is one-hot, as the
    n-gram proposer's is; fastest of ``reps``): the rule's own work, which no forward's price contains."""
    gen = torch.Generator().manual_seed(0)
    vocab = decoder.vocab_size
    sampler = Sampler(temperature=temperature)
    draft_logits, full_logits = (torch.randn(n, vocab, generator=gen) * 3 for n in (gamma, gamma + 1))
    draft_probs, full_probs = sampler.probs(draft_logits), sampler.probs(full_logits)
    tokens = (torch.multinomial(draft_probs, 1, generator=gen)[:, 0] if gamma
              else torch.zeros(0, dtype=torch.long))  # γ = 0: a verification with nothing drafted
    if one_hot:
        draft_probs = torch.nn.functional.one_hot(tokens, vocab).to(full_probs.dtype)
        draft_logits = draft_probs.log()
    hidden = [torch.randn(n, m.config.hidden_size, generator=gen)
              for n, m in ((gamma, decoder.draft.model), (gamma + 1, decoder.full.model))]
    context = Context(tokens, draft_logits, full_logits, sampler, *hidden)
    best = math.inf
    for _ in range(reps):
        t0 = time.perf_counter()
        rule(draft_probs, full_probs, context)
        best = min(best, time.perf_counter() - t0)
    return best


def cost_rate(stats: DecodeStats, tokens: int, costs: Costs, mode: str, gamma: int, verifications: int = 0,
              rule: float = 0.0, drafted: float | None = None, rule_empty: float = 0.0,
              rule_work: float | None = None) -> float:
    """The cost model's tokens/s for a decode: its forwards priced at their sizes, each block's step work
    (``costs.steps``, measured at γ = 2, per verified token) and the rule's work: ``rule_work`` seconds in all if
    given (the rule timed inside the decode, beyond lossless's), else ``rule`` seconds a verification of γ drafts,
    ``rule_empty`` one of none, linear in between over the ``drafted`` tokens the ``verifications`` verified
    (default: γ each). An n-gram block drafts what its match offers (often nothing): priced at γ drafts a
    verification, Mentored's n-gram rows were predicted 28% below the speed they ran at."""
    verified = 1 if mode == "ar" else (gamma + 1) / (STEP_GAMMA + 1)
    rate = predict_from_counts(tokens, stats.calls, stats.fed, costs, stats.forwards, stats.blocks * verified, mode)
    if not tokens or math.isnan(rate):
        return math.nan
    if rule_work is None:
        drafted = verifications * gamma if drafted is None else drafted
        rule_work = verifications * rule_empty + drafted * (rule - rule_empty) / max(gamma, 1)
    return tokens / (tokens / rate + rule_work)


def run_bench(decoder: Decoder, workloads: Sequence[Workload], methods: Sequence[str], config: DecodeConfig,
              gammas: Sequence[int] = (3, 5, 8), full_grid_gamma: int | None = 5, head: EnsembleHead | None = None,
              progress: Callable[[Row], None] | None = None, points: int | None = None,
              gamma_methods: Sequence[str] | None = None, drafters: Sequence[str] = ("model",),
              costs: Costs | None = None, saved: Sequence[Row] = (), session: str = "") -> list[Row]:
    """Every (workload, drafter, γ, method, value) row plus ``ar`` per workload; speed-ups relative to that ``ar``.

    ``full_grid_gamma``: the γ where every grid value runs; None = the best lossless γ, chosen per workload and
    drafter from lossless runs at every γ of ``gammas`` (the fastest measured). ``points`` thins each grid;
    ``gamma_methods`` limits which methods run at the other γ; ``costs`` is the table (forwards, and step
    work per mode if it has it) the predictions price this process's rows on (measured here if None); each
    rule's own work is timed here (:func:`rule_seconds`). ``session`` names this process (default: its start).
    ``saved``: rows of an earlier, interrupted run with
    the same settings (:func:`load_rows`); a point found there is taken as it is, not decoded again. A point
    decoded now is measured against an ``ar`` decoded in this process (before the workload's first new point),
    as a resumed run may run on another machine, or the same one at another speed: a row's ``session`` says which
    process decoded it, and its speed-up is against that process's ``ar``. Before its first new point at a γ, a
    process decodes the lossless point there again when the saved one is another session's: the shape of the
    cost curve moves between sessions, so a row is compared with other sessions' rows through its own session's
    lossless row (:func:`derive`).
    """
    costs = costs or decoder.costs or decoder.measure_costs()
    session = session or new_session()
    timed: dict[tuple, float] = {}  # (method, value, one-hot draft, drafts) → rule seconds per verification
    kept = {point_key(r): r for r in saved if r.mode != "ar"}
    saved_ar = {r.workload: r for r in saved if r.mode == "ar"}  # the latest saved ar of each workload
    rows: list[Row] = []
    for work in workloads:
        fresh: list[Row] = []

        def base(work: Workload = work, fresh: list[Row] = fresh) -> Row:
            """This process's ar of ``work``, decoded the first time a point needs it."""
            if not fresh:
                _, _, row = run_one(decoder, work, config, "ar", lossless)
                row.method, row.speedup, row.cost_speedup, row.session = "ar", 1.0, 1.0, session
                row.speedup_ci = (1.0, 1.0)
                row.cost_rate = cost_rate(row.stats, row.tokens, costs, "ar", 0)
                row.forward_ratio = _forward_ratio(row.stats, row.tokens, costs)
                fresh.append(row)
                rows.append(row)
                if progress:
                    progress(row)
            return fresh[0]

        if work.name in saved_ar:
            rows.append(saved_ar[work.name])
            if progress:
                progress(saved_ar[work.name])
        else:  # a workload not begun: its ar first
            base()
        for drafter in drafters:
            done: dict[tuple[int, str, float], Row] = {}
            c_rel_by_gamma: dict[int, float] = {}

            def point(method: str, gamma: int, value: float, drafter: str = drafter, done=done,
                      c_rel_by_gamma=c_rel_by_gamma, base=base, work: Workload = work, again: bool = False) -> Row:
                if (gamma, method, value) in done and not again:
                    return done[(gamma, method, value)]
                old = None if again else kept.get((work.name, drafter, gamma, method, float(value)))
                if old is not None:
                    c_rel_by_gamma.setdefault(gamma, old.c_rel)
                    done[(gamma, method, value)] = old
                    rows.append(old)
                    if progress:
                        progress(old)
                    return old
                m = METHODS[method]
                off = done.get((gamma, "static", METHODS["static"].off))
                if (method, value) != ("static", METHODS["static"].off) and off is not None and off.session != session:
                    point("static", gamma, METHODS["static"].off, again=True)  # this session's lossless reference
                rule = m.build(head, **{**dict(m.fixed), m.param: value})
                ar_row = base()
                stats, recorder, row = run_one(decoder, work, replace(config, gamma=gamma), DRAFTERS[drafter], rule)
                row.method, row.param, row.value, row.drafter, row.session = method, m.param, value, drafter, session
                if gamma not in c_rel_by_gamma:  # draft/full cost per forward, from the first run at γ
                    spent = getattr(stats, "cpu_seconds_tier", None) or stats.seconds
                    per_call = {t: spent[t] / max(stats.calls[t], 1) for t in ("draft", "full")}
                    c_rel_by_gamma[gamma] = per_call["draft"] / max(per_call["full"], 1e-12)
                row.c_rel = c_rel_by_gamma[gamma]
                row.speedup = ar_row.seconds / max(row.seconds, 1e-12)
                row.speedup_ci = ratio_interval(ar_row.per_prompt["seconds"], row.per_prompt["seconds"])
                row.predicted_speedup = survey_speedup(ar_row.output_length, row.output_length,
                                                       row.predicted_accepted_length, gamma, row.c_rel)
                one_hot = drafter == "ngram"  # the n-gram proposer's draft is one-hot, and may be empty
                own, base_key = (method, float(value), one_hot), ("lossless", one_hot)
                for n in (gamma, 0) if one_hot else (gamma,):
                    for key, fn in ((own, rule), (base_key, lossless)):
                        if (*key, n) not in timed:
                            timed[(*key, n)] = rule_seconds(fn, decoder, n, config.temperature, one_hot=one_hot)
                row.rule_seconds = max(timed[(*own, gamma)] - timed[(*base_key, gamma)], 0.0)
                row.rule_seconds_empty = max(timed[(*own, 0)] - timed[(*base_key, 0)], 0.0) if one_hot else 0.0
                row.verifications = len(recorder.betas)
                row.drafts_verified = sum(b.numel() for b in recorder.betas)
                row.rule_seconds_decode = recorder.seconds / max(row.verifications, 1)
                # the rule's work beyond lossless's: its time in the decode (random logits had priced Mentored's
                # 103 ms a verification where the decode took 83) less lossless's, timed on the same sizes
                lossless_empty = timed[(*base_key, 0)] if one_hot else timed[(*base_key, gamma)]
                lossless_work = (row.verifications * lossless_empty + row.drafts_verified
                                 * (timed[(*base_key, gamma)] - lossless_empty) / max(gamma, 1))
                row.rule_work = max(recorder.seconds - lossless_work, 0.0)
                row.cost_rate = cost_rate(stats, row.tokens, costs, DRAFTERS[drafter], gamma, rule_work=row.rule_work)
                row.forward_ratio = _forward_ratio(stats, row.tokens, costs)
                derive([ar_row, row])
                done[(gamma, method, value)] = row
                rows.append(row)
                if progress:
                    progress(row)
                return row

            grid_gamma = full_grid_gamma
            if grid_gamma is None:  # the best lossless γ: lossless sd (static w = 1) at every γ first
                grid_gamma = max(gammas, key=lambda g: point("static", g, METHODS["static"].off).speed)
            for method in methods:
                m = METHODS[method]
                if (m.needs_head and head is None) or (drafter == "ngram" and m.ngram):
                    continue
                for gamma, value in sweep(method, gammas, grid_gamma, points):
                    if gamma != grid_gamma and gamma_methods is not None and method not in gamma_methods:
                        continue
                    point(method, gamma, value)
    used = {id(r) for r in rows}
    return derive(rows + [r for r in saved if id(r) not in used])  # an earlier run's points outside it stay


def derive(rows: Sequence[Row]) -> list[Row]:
    """Set what each row's speed-up is compared with, against the ``ar`` of its own process: ``cost_speedup``, the
    cost model's prediction of the end-to-end speed-up (ar's predicted time over the row's: a row that writes
    shorter answers saves their time, as the measured speed-up counts it), and ``speedup_steady``, the measured
    speed-up at ar's machine speed (× the row's forward ratio / ar's; the measured one where either is missing).
    ``rebase``: a row whose session is not the first to have decoded the lossless point at its (workload, drafter,
    γ) is compared with other rows as its speed-up over its own session's lossless row there, times the first
    session's lossless speed-up (1 where its session has no lossless row there)."""
    ar = {(r.workload, r.session): r for r in rows if r.mode == "ar"}
    for r in rows:
        base = ar.get((r.workload, r.session))
        r.rebase = 1.0
        if r.mode == "ar" or base is None:
            r.speedup_steady = r.speedup
            continue
        r.cost_speedup = ((r.cost_rate / base.cost_rate) * (base.tokens / r.tokens)
                          if base.cost_rate and r.tokens else math.nan)
        drift = r.forward_ratio / base.forward_ratio
        r.speedup_steady = r.speedup * drift if math.isfinite(drift) else r.speedup
    offs = [r for r in rows if r.mode != "ar" and r.method == "static" and r.value == METHODS["static"].off]
    first: dict[tuple, Row] = {}
    for r in sorted(offs, key=lambda r: r.session):
        first.setdefault((r.workload, r.drafter, r.gamma), r)
    own = {(r.workload, r.drafter, r.gamma, r.session): r for r in offs}
    for r in rows:
        anchor, mine = first.get((r.workload, r.drafter, r.gamma)), own.get((r.workload, r.drafter, r.gamma, r.session))
        if r.mode != "ar" and anchor is not None and mine is not None and mine is not anchor:
            r.rebase = _unrebased(anchor) / _unrebased(mine)
    return list(rows)


def _unrebased(r: Row) -> float:
    return r.speedup_steady if math.isfinite(r.speedup_steady) else r.speedup


def _forward_ratio(stats: DecodeStats, tokens: int, costs: Costs) -> float:
    """The decode's forwards' CPU seconds over what the cost table prices them at: ≈ 1 on a quiet machine, above
    it when other work slowed this row (CPU time still grows when two processes share the memory bus)."""
    spent = sum((getattr(stats, "cpu_seconds_tier", None) or stats.seconds).values())
    rate = predict_from_counts(tokens, stats.calls, stats.fed, costs, stats.forwards)
    return spent * rate / tokens if tokens and rate else math.nan


def point_key(row: Row) -> tuple:
    """What identifies a row's decode across runs: (workload, "ar", session) or (workload, drafter, γ, method,
    value)."""
    if row.mode == "ar":
        return (row.workload, "ar", row.session)
    return (row.workload, row.drafter, row.gamma, row.method, float(row.value))


def quality_of(row: Row, metric: str | None = None) -> float:
    """A y axis of the figure: ``exact`` or ``steps`` for the exact-match workloads, ``loglik`` (any workload)."""
    metric = metric or row.metric
    return {"exact": row.quality, "steps": row.steps, "loglik": row.loglik}[metric]


PANELS = (("arithmetic", "exact", "accuracy (exact match)"),
          ("arithmetic", "steps", "share of correct worked steps"),
          ("task", "exact", "accuracy (exact match)"),
          ("instruct", "loglik", "full-verifier log-lik / token"),
          ("code", "loglik", "full-verifier log-lik / token"))


COLUMNS = ("workload", "draft", "γ", "method", "acc.rate", "acc.len", "pred.len", "out.len", "rep4", "speedup [95%]",
           "steady", "pred.cost", "pred.S", "quality [95%]", "loglik")


def _f(x: float | None, p: int = 2) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{p}f}"


def _ci(x: float, ci: Interval, p: int = 2) -> str:
    if isinstance(x, float) and math.isnan(x):
        return "–"
    lo, hi = ci
    return _f(x, p) if math.isnan(lo) or lo == hi else f"{_f(x, p)} [{_f(lo, p)}, {_f(hi, p)}]"


def format_table(rows: Sequence[Row]) -> str:
    """A Markdown table, one line per row; quality is accuracy on exact-match workloads, else log-lik / token."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in rows:
        exact = r.metric == "exact" or r.workload in EXACT
        lines.append("| " + " | ".join([
            r.workload, "–" if r.mode == "ar" else r.drafter, str(r.gamma) if r.mode != "ar" else "–", r.label,
            _f(r.acceptance), _f(r.accepted_length), _f(r.predicted_accepted_length), _f(r.output_length, 1),
            _f(r.repetition), _ci(r.speedup, r.speedup_ci), _f(r.speed) + ("*" if r.rebase != 1 else ""),
            _f(r.cost_speedup), _f(r.predicted_speedup),
            _ci(r.quality, r.quality_ci, 3 if exact else 3), _f(r.loglik, 3)]) + " |")
    return "\n".join(lines)


def collapsed(rows: Sequence[Row], length_factor: float = 1.3, rep_margin: float = 0.15) -> list[tuple[Row, Row]]:
    """(row, its ar) for the relaxed rows whose outputs are much longer or much more repetitive than ``ar``'s on
    the same workload (lossless rows differ from ar by noise only)."""
    ar = {r.workload: r for r in rows if r.mode == "ar"}
    return [(r, ar[r.workload]) for r in rows if r.mode != "ar" and r.workload in ar and not r.lossless
            and (r.output_length > length_factor * ar[r.workload].output_length
                 or r.repetition > ar[r.workload].repetition + rep_margin)]


def collapses(rows: Sequence[Row], length_factor: float = 1.3, rep_margin: float = 0.15) -> list[str]:
    """One line per :func:`collapsed` row."""
    return [f"{r.workload} {r.drafter} γ={r.gamma} {r.label}: output length {r.output_length:.1f} vs "
            f"ar {base.output_length:.1f}, repeated 4-grams {r.repetition:.2f} vs {base.repetition:.2f}"
            for r, base in collapsed(rows, length_factor, rep_margin)]


def warnings(rows: Sequence[Row]) -> list[str]:
    """The rows to read with care: ``collapse?`` (rambling). Rows measured while the machine ran slower need no
    warning: the ``steady`` speed-up corrects them by their forwards' speed."""
    return [f"collapse? {n}" for n in collapses(rows)]


def static_line_gap(rows: Sequence[Row], metric: str | None = None) -> list[tuple[Row, float]]:
    """Every relaxed non-static row against the static ensemble's line at the same workload, drafter and γ: its
    quality minus the line's, interpolated piecewise-linearly in speed-up between the static points (w = 1 …
    w = 0) that bracket the row's speed-up; NaN outside the line's range. Above 0: the row beats the line (more
    quality at its speed); the measure of DIVERSED's claim, and of every other rule against the baseline."""
    out = []
    for r in rows:
        if r.mode == "ar" or r.method == "static" or r.lossless:
            continue
        line = sorted((s.speed, quality_of(s, metric)) for s in rows if s.method == "static" and s.mode != "ar"
                      and (s.workload, s.drafter, s.gamma) == (r.workload, r.drafter, r.gamma))
        gap = math.nan
        for (x0, y0), (x1, y1) in zip(line, line[1:], strict=False):
            if x0 <= r.speed <= x1:
                y = y0 if x1 == x0 else y0 + (y1 - y0) * (r.speed - x0) / (x1 - x0)
                gap = quality_of(r, metric) - y
                break
        out.append((r, gap))
    return out


def save_json(rows: Sequence[Row], path: Path, meta: dict) -> None:
    """Rows and meta as JSON, written atomically (the bench rewrites it after every row: an interrupted run
    leaves every finished row, never a half-written file)."""
    data = {"meta": meta, "rows": [{k: v for k, v in asdict(r).items() if k not in ("outputs", "stats")}
                                   for r in rows]}
    write_atomic(Path(path), json.dumps(data, indent=1, default=lambda x: None if isinstance(x, float) else str(x))
                 + "\n")


def resume_mismatch(saved: dict, now: dict) -> str | None:
    """The first setting in which a saved run's meta differs from this run's (rows from both would not compare),
    as "temperature 0.7 (this run: 0)"; None when they agree. Methods, drafters and γ may differ: a resumed run
    may add points."""
    for key in ("pair", "temperature", "seed", "head", "n_arith", "n_code"):
        if key in saved and saved[key] != now.get(key):
            return f"{key} {saved[key]} (this run: {now.get(key)})"
    for name, old in saved.get("workloads", {}).items():
        new = now.get("workloads", {}).get(name)
        for key in ("prompts", "max_new_tokens"):
            if new is not None and old.get(key) != new.get(key):
                return f"{old.get(key)} {key.replace('_', ' ')} on {name} (this run: {new.get(key)})"
    return None


def load_rows(path: Path) -> tuple[list[Row], dict]:
    """Rows and meta written by :func:`save_json` (to merge runs made in separate processes)."""
    data = json.loads(Path(path).read_text())
    rows = []
    for r in data["rows"]:
        r = {k: (math.nan if v is None and k not in ("method", "param", "mode", "workload") else v)
             for k, v in r.items()}
        r.setdefault("metric", "exact" if r["workload"] in EXACT else "loglik")  # files from before the field
        for k, v in r.items():
            if k.endswith("_ci"):
                r[k] = tuple(math.nan if x is None else x for x in v)
        rows.append(Row(**r))
    return derive(rows), data["meta"]


def plot(rows: Sequence[Row], path: Path, gamma: int | None, title: str = "", y: str = "quality") -> Path:
    """Speed–quality plot per workload and drafter: the static ensemble as the reference line, every other rule on
    it, at ``gamma`` (None: the γ where the panel's grid ran, i.e. the one with the most rows). ``y="length"``:
    mean output length against speed instead (rambling makes answers longer, which costs time)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    drafters = [d for d in DRAFTERS if any(r.drafter == d and r.mode != "ar" for r in rows)] or ["model"]
    kinds = PANELS if y == "quality" else [(w, "length", "mean output length (tokens)") for w in
                                           dict.fromkeys(p[0] for p in PANELS)]
    panels = [(*p, d) for d in drafters for p in kinds if any(r.workload == p[0] for r in rows)]
    cols = max(1, len(panels) // len(drafters))
    fig, axes = plt.subplots(len(drafters), cols, figsize=(6 * cols, 5 * len(drafters)), squeeze=False)
    markers = dict(zip(METHODS, "o*sDv^<>ph", strict=False))
    for ax, (work, metric, ylabel, drafter) in zip(axes.flat, panels, strict=True):
        cand = [r.gamma for r in rows if r.workload == work and r.drafter == drafter and r.mode != "ar"]
        if not cand:  # a run in progress: this workload has no row with this drafter yet
            ax.set_title(f"{work}, {drafter} draft: not decoded yet")
            ax.axis("off")
            continue
        g = gamma if gamma is not None else max(set(cand), key=cand.count, default=0)
        sel = [r for r in rows if r.workload == work and ((r.gamma == g and r.drafter == drafter) or r.mode == "ar")]
        for method in METHODS:
            lossless = [r for r in sel if r.method == "static" and r.value == 1.0]
            grid = METHODS[method].grid  # connect points in order of relaxation, from lossless
            pts = (lossless if method != "static" else []) + sorted(
                (r for r in sel if r.method == method), key=lambda r: grid.index(r.value) if r.value in grid else 0)
            if len(pts) <= len(lossless):
                continue
            xs, ys = [r.speed for r in pts], [_y(r, metric) for r in pts]
            if method == "static":
                ax.plot(xs, ys, "-o", color="black", lw=2, label="static ensemble (reference)", zorder=3)
                for r in pts:
                    ax.annotate(f"w={r.value:g}", (r.speed, _y(r, metric)), fontsize=7, xytext=(3, 3),
                                textcoords="offset points")
            elif method == "diversed":
                ax.plot(xs, ys, "-*", color="crimson", ms=12, lw=2, label="DIVERSED (trained head)", zorder=4)
            else:
                ax.plot(xs, ys, ":", marker=markers[method], alpha=0.8, label=method)
        ar = [r for r in sel if r.mode == "ar"]
        if ar:
            ax.scatter([1.0], [_y(ar[0], metric)], marker="x", s=80, color="grey", label="ar", zorder=5)
        ax.set_xlabel("speed-up over ar (end-to-end CPU time)")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{work}, {drafter} draft, γ={g}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plots(rows: Sequence[Row], path: Path, gamma: int | None, title: str) -> tuple[Path, Path]:
    """Both figures: speed against quality at ``path``, output length against speed at ``NAME_length.png``."""
    return (plot(rows, path, gamma, title=f"{title}: speed vs quality"),
            plot(rows, path.with_name(f"{path.stem}_length{path.suffix}"), gamma,
                 title=f"{title}: output length vs speed", y="length"))


def _y(row: Row, metric: str) -> float:
    return row.output_length if metric == "length" else quality_of(row, metric)


def new_session() -> str:
    """A process's name in the rows it decodes (its start, UTC)."""
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
