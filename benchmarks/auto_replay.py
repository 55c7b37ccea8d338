"""``auto``'s choices without the clock: greedy decodes replayed against the cost table.

Greedy output does not depend on the mode, so one ``ar`` decode per prompt fixes what every block of every mode
would accept: at each position, how many of the n-gram proposer's tokens match the continuation (and after a
match of how many tokens), and how many of the draft's greedy tokens do. This replays the fixed modes and
:class:`Chooser` (``ar``, ``sd`` and ``lookup`` arms, one chooser across the prompts, as in a pass) over those
outcomes and prices every forward at the cost table (plus each mode's step time per verified token, which the
chooser is given as it would have learned it), so what it prints is the quality of the choices alone, free of the
machine's timing noise: tokens/s of ``auto`` against the best fixed mode on the same text. The chooser here prices
by the table (``adapt`` off), as it would on a quiet machine. Beside it, the best fixed modes with a block at every
position: how much of the best fixed mode's lead comes from where its blocks happen to start.

    python benchmarks/auto_replay.py --pair smollm2 --slim benchmarks/results/smollm2_light.json --prompts 6 \
        --max-new-tokens 48 --seeds 4

Sampled (``--temperature T --samples S``): S texts per prompt drawn by ``ar``, each pass one text per prompt and a
fresh chooser, as the bench's passes. For ``ar`` and the n-gram arms the replay is exact: an n-gram block keeps its
drafts while they equal the verifier's own draws and emits the first draw that differs
(:func:`dimr.decoding.verify.own_draws`), so with one seed it emits ``ar``'s text. The draft model's is not: its
k-th drafted token is accepted with the expected acceptance sum(min(p, q)) at that position of the text, one
Bernoulli each (an approximation: its accepted tokens are not the text's).

    python benchmarks/auto_replay.py --pair smollm2 --workloads task --prompts 6 --max-new-tokens 48 \
        --temperature 0.7 --samples 8 --seeds 4 --tables benchmarks/results/bench_tiers_smollm2_task_T07_4p.json
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from dataclasses import astuple, dataclass
from pathlib import Path

import torch
from transformers.utils import logging

from dimr.decoding import DecodeConfig, Decoder
from dimr.decoding.auto import GAMMAS, Arm, Chooser, arms, drafted, drive
from dimr.decoding.costs import Costs
from dimr.decoding.proposer import lookup_match
from dimr.decoding.sampling import Sampler

sys.path.insert(0, str(Path(__file__).parent))
from bench_tiers import workload  # noqa: E402

LONGEST = GAMMAS[-1]
STEP_GAMMA = 2  # the γ Decoder.measure_steps times its blocks at


@dataclass
class Position:
    """What a block starting here would get: the n-gram match's length and proposal length, how many of the
    proposal's tokens the continuation repeats, and how many of the draft's greedy tokens it does."""

    ngram: int
    offered: int
    lookup_run: int
    draft_run: int  # -1 on a sampled text: then drawn at ``alpha`` per drafted token
    alpha: float = 1.0  # the draft's expected acceptance sum(min(p, q)) here (sampled texts)


def leading(a: torch.Tensor, b: torch.Tensor) -> int:
    n = min(a.numel(), b.numel())
    miss = (a[:n] != b[:n]).nonzero()
    return int(miss[0, 0]) if miss.numel() else n


@torch.inference_mode()
def positions(dec: Decoder, ids: torch.Tensor, max_new_tokens: int) -> list[Position]:
    """Every position of ``ids``'s greedy continuation."""
    tokens = dec.run(ids, "ar", DecodeConfig(max_new_tokens=max_new_tokens, temperature=0.0)).tokens
    seq = torch.cat([ids.view(-1), torch.tensor(tokens, dtype=ids.dtype)])
    start, out = ids.numel(), []
    for t in range(len(tokens)):
        prefix, rest = seq[: start + t], seq[start + t:]
        proposal, ngram = lookup_match(prefix, LONGEST)
        draft = dec.draft.model.generate(prefix.view(1, -1), max_new_tokens=LONGEST, do_sample=False,
                                         min_new_tokens=LONGEST)[0, prefix.numel():]
        out.append(Position(ngram, proposal.numel(), leading(proposal, rest), leading(draft, rest)))
    return out


@torch.inference_mode()
def sampled_positions(dec: Decoder, ids: torch.Tensor, max_new_tokens: int, temperature: float,
                      seed: int) -> list[Position]:
    """Every position of one continuation of ``ids`` drawn by ``ar`` at ``temperature`` with ``seed``."""
    config = DecodeConfig(max_new_tokens=max_new_tokens, temperature=temperature, seed=seed)
    tokens = dec.run(ids, "ar", config).tokens
    seq = torch.cat([ids.view(-1), torch.tensor(tokens, dtype=ids.dtype)])
    start, sampler = ids.numel(), Sampler(temperature)
    rows = slice(start - 1, seq.numel() - 1)  # the logits that predict each emitted token
    p = sampler.probs(dec.full.model(seq.view(1, -1)).logits[0, rows])
    q = sampler.probs(dec.draft.model(seq.view(1, -1)).logits[0, rows])
    alpha = torch.minimum(p, q).sum(-1).tolist()
    out = []
    for t in range(len(tokens)):
        proposal, ngram = lookup_match(seq[: start + t], LONGEST)
        out.append(Position(ngram, proposal.numel(), leading(proposal, seq[start + t:]), -1, alpha[t]))
    return out


def overhead(costs: Costs) -> dict[str, float]:
    """Each mode's step time per verified token, as :meth:`Chooser.observe_overhead` keeps it: the table's steps
    are per block, measured at γ = :data:`STEP_GAMMA` (one verified token a block for ``ar``)."""
    return {m: costs.step(m) / (1 if m == "ar" else STEP_GAMMA + 1) for m in ("ar", "sd", "lookup")}


def draft_run(path: list[Position], t: int, gamma: int, rng: random.Random | None) -> int:
    """Leading drafted tokens the verifier accepts from ``path[t]`` on: known on a greedy text, drawn at each
    position's expected acceptance on a sampled one."""
    if path[t].draft_run >= 0:
        return path[t].draft_run
    run = 0
    while run < gamma and t + run < len(path) and rng.random() < path[t + run].alpha:
        run += 1
    return run


def block(arm: Arm, path: list[Position], t: int, costs: Costs, steps: dict[str, float], lag: int,
          rng: random.Random | None = None) -> tuple[int, float, list]:
    """(tokens emitted, seconds, observations) of one block of ``arm`` at ``path[t]``; ``steps``:
    :func:`overhead`'s; ``rng``: the draft's acceptance draws on a sampled text."""
    pos, left, step = path[t], len(path) - t, steps[arm.mode]
    if arm.mode == "ar":
        return 1, costs("full", 1) + step, []
    gamma = drafted(arm, pos.offered)
    run = pos.lookup_run if arm.mode == "lookup" else draft_run(path, t, gamma, rng)
    accepted = min(gamma, run, left - 1)
    tested = min(accepted + 1, gamma)
    seconds = costs("full", gamma + 1) + step * (gamma + 1)
    pair = ("lookup", "full") if arm.mode == "lookup" else ("draft", "full")
    if arm.mode == "sd":
        seconds += costs("draft", lag + 1) + (gamma - 1) * costs("draft", 1)
    return accepted + 1, seconds, [(*pair, accepted, tested)]


def everywhere(paths: list[list[Position]], costs: Costs, arm: Arm, rng: random.Random | None = None) -> float:
    """Tokens/s of ``arm``'s blocks averaged over every position (each at no lag), not only those its own path
    starts at: where a fixed arm's blocks start depends on its γ, and on a few hundred greedy tokens that alone
    moves its speed by several per cent, the same in every pass (greedy text does not change)."""
    tokens = seconds = 0.0
    steps = overhead(costs)
    for path in paths:
        for t in range(len(path)):
            made, spent, _ = block(arm, path, t, costs, steps, 0, rng)
            tokens, seconds = tokens + made, seconds + spent
    return tokens / seconds


class Replay:
    """One prompt's known outcomes walked by ``auto``'s own loop (a :class:`dimr.decoding.auto.Walk`), every block
    priced at ``costs``."""

    def __init__(self, path: list[Position], costs: Costs, rng: random.Random | None = None) -> None:
        self.path, self.costs, self.steps, self.rng = path, costs, overhead(costs), rng
        self.t, self.seconds, self.draft_lag, self.mark = 0, 0.0, 0, 0

    @property
    def done(self) -> bool:
        return self.t >= len(self.path)

    @property
    def remaining(self) -> int:
        return len(self.path) - self.t

    def lag(self) -> dict[str, int]:
        return {"draft": self.draft_lag}

    def lookup(self) -> tuple[int, int]:
        self.mark = self.t
        return self.path[self.t].offered, self.path[self.t].ngram

    def ngram(self) -> int:
        return self.path[self.t].ngram

    def block(self, arm: Arm) -> list:
        made, spent, seen = block(arm, self.path, self.t, self.costs, self.steps, self.draft_lag, self.rng)
        self.draft_lag = 0 if arm.mode == "sd" else self.draft_lag + made
        self.t, self.seconds = self.t + made, self.seconds + spent
        return seen

    def lookup_seen(self) -> list:
        pos = self.path[self.mark]
        shown = min(pos.offered, self.t - self.mark)
        if not shown:
            return []
        accepted = min(pos.lookup_run, shown)
        return [("lookup", "full", accepted, min(accepted + 1, shown))]

    def spent(self, arm: Arm, blocks: int, seconds: float) -> None:
        pass  # the chooser prices by the table here (adapt off): nothing to learn from the clock


def replay(path: list[Position], costs: Costs, policy: Arm | None, chooser: Chooser | None = None,
           rng: random.Random | None = None, draws: random.Random | None = None) -> tuple[int, float]:
    """Tokens and seconds of one prompt decoded by ``policy`` (a fixed arm) or by ``chooser`` (its draws from
    ``rng``); ``draws``: the draft's acceptance on a sampled text."""
    walk = Replay(path, costs, draws)
    if chooser is not None:
        drive(chooser, rng, walk)
    while not walk.done:
        walk.block(policy)
    return len(path), walk.seconds


def texts(dec: Decoder, cached: dict, args: argparse.Namespace, name: str) -> list[list[list[Position]]]:
    """The passes' texts: a list per pass of one path per prompt (one pass of greedy texts; ``--samples`` passes
    of sampled ones), from ``cached`` (extended and written back where it holds fewer)."""
    key = name if not args.temperature else f"{name}@T{args.temperature}"
    have = cached.setdefault(key, [])  # per prompt: its greedy path, or a list of sampled ones
    samples = args.samples if args.temperature else 1
    prompts = workload(args.pair, name, args.prompts)
    grew = False
    for i, prompt in enumerate(prompts):
        ids = dec.encode(prompt)
        if not args.temperature:
            if i == len(have):
                have.append([astuple(x) for x in positions(dec, ids, args.max_new_tokens)])
                grew = True
            continue
        if i == len(have):
            have.append([])
        while len(have[i]) < samples:
            have[i].append([astuple(x) for x in sampled_positions(dec, ids, args.max_new_tokens, args.temperature,
                                                                  seed=len(have[i]))])
            grew = True
    if grew and args.paths:
        Path(args.paths).write_text(json.dumps(cached))
    rows = [[h] for h in have[: args.prompts]] if not args.temperature else have[: args.prompts]
    return [[[Position(*x) for x in row[s]] for row in rows] for s in range(samples)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", default="mini")
    ap.add_argument("--slim")
    ap.add_argument("--workloads", default="code,prose,task")
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--seeds", type=int, default=4, help="auto replays, each with its own draws (per pass)")
    ap.add_argument("--temperature", type=float, default=0.0, help="replay texts sampled at this temperature")
    ap.add_argument("--samples", type=int, default=8, help="with --temperature: texts per prompt, one per pass")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--costs", help="cost table JSON: read if it exists, else measured and written there")
    ap.add_argument("--paths", help="JSON of the outcomes per workload: read if it exists (extended when it"
                    " holds fewer prompts or samples), else written")
    ap.add_argument("--tables", help="a bench_tiers.py --out JSON: price each workload at the cost table that"
                    " timed run measured for it at --temperature (instead of --costs)")
    ap.add_argument("--one-rate", action="store_true", help="the chooser prices each model draft at one rate per"
                    " drafted token, not its first token apart from the rest (Chooser.split off)")
    ap.add_argument("--restart", action="store_true", help="a prompt's first choice starts at one token, not at half"
                    " the stretch its mode last ran (Chooser.resume off)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    logging.disable_progress_bar()
    dec = Decoder.load(args.pair, slim=args.slim, device="cpu")
    tables = {t["workload"]: Costs.from_dict(t) for t in json.loads(Path(args.tables).read_text())["tables"]
              if t["temperature"] == args.temperature} if args.tables else {}
    if tables:
        costs = dec.costs = next(iter(tables.values()))
    elif args.costs and Path(args.costs).exists():  # the same table for replays of two versions of the chooser
        costs = dec.costs = Costs.load(Path(args.costs))
    else:
        costs = dec.measure_costs(steps=["ar", "sd", "lookup"], temperature=args.temperature)
        if args.costs:
            Path(args.costs).write_text(json.dumps(costs.to_dict()))
    cached = json.loads(Path(args.paths).read_text()) if args.paths and Path(args.paths).exists() else {}
    fixed = [Arm("ar")] + [Arm(m, g) for m in ("sd", "lookup") for g in GAMMAS]
    calibrated = dict(dec.auto_chooser(args.temperature).calibrated)  # the priors `decode` starts its chooser from
    for name in args.workloads.split(","):
        costs = tables.get(name, costs)
        full = costs("full", 1)
        print(f"{args.pair}, {name} T={args.temperature}: full c(1) {full * 1e3:.2f} ms, c(3)/c(1) "
              f"{costs('full', 3) / full:.2f}, c(5)/c(1) {costs('full', 5) / full:.2f}; draft c(1)/full c(1) "
              f"{costs('draft', 1) / full:.3f}")
        passes = texts(dec, cached, args, name)
        # per pass: tokens and seconds of each fixed arm, and of auto (one fresh chooser per pass and seed)
        fixed_runs: dict[str, list[tuple[int, float]]] = {a.label: [] for a in fixed}
        auto_runs: list[list[tuple[int, float]]] = []
        chosen: dict[str, int] = {}
        for k, paths in enumerate(passes):
            for arm in fixed:
                draws = random.Random(10_000 + k)
                tokens, seconds = zip(*(replay(p, costs, arm, draws=draws) for p in paths), strict=True)
                fixed_runs[arm.label].append((sum(tokens), sum(seconds)))
            mine = []
            for seed in range(args.seeds):
                # the recorded paths hold no draft confidences: the rule without the draft's stop when unsure
                chooser = Chooser(costs, arms(draft=True, slim=False), calibrated=dict(calibrated), adapt=False,
                                  overhead=overhead(costs), split=not args.one_rate, stop=0.0,
                                  resume=not args.restart)
                rng, draws = random.Random(seed), random.Random(20_000 + 100 * k + seed)
                tokens = seconds = 0.0
                for p in paths:
                    made, spent = replay(p, costs, None, chooser, rng, draws)
                    tokens, seconds = tokens + made, seconds + spent
                    for label, n in chooser.chosen.items():
                        chosen[label] = chosen.get(label, 0) + n
                mine.append((tokens, seconds))
            auto_runs.append(mine)

        def pooled(runs: list[tuple[float, float]]) -> float:
            return sum(t for t, _ in runs) / sum(s for _, s in runs)

        speed = {label: pooled(runs) for label, runs in fixed_runs.items()}
        base, best = speed["ar"], max(speed, key=speed.__getitem__)
        autos = [pooled([runs[seed] for runs in auto_runs]) for seed in range(args.seeds)]
        top = sorted(speed.items(), key=lambda kv: -kv[1])[:4]
        print(f"{name}: " + ", ".join(f"{k} {v / base:.3f}x" for k, v in top)
              + f"; auto {' '.join(f'{a / base:.3f}' for a in autos)}x ar = "
              f"{sum(autos) / len(autos) / speed[best]:.3f} of {best}")
        if len(passes) > 1:  # each pass: auto (pooled over its seeds) over the best row on that pass's texts
            per = sorted(pooled(runs) / pooled([fixed_runs[best][k]]) for k, runs in enumerate(auto_runs))
            print(f"  per pass, auto / {best}: median {per[len(per) // 2]:.3f}, range [{per[0]:.3f}, {per[-1]:.3f}],"
                  f" {sum(r >= 0.95 for r in per)} of {len(per)} >= 0.95")
            # what a timed run's rows see when each samples its own text: the best row on one pass's texts over
            # itself on another's
            own = [pooled([run]) for run in fixed_runs[best]]
            luck = sorted(a / b for i, a in enumerate(own) for j, b in enumerate(own) if i != j)
            print(f"  {best} on one pass's texts over {best} on another's: median {luck[len(luck) // 2]:.3f}, 10-90%"
                  f" [{luck[len(luck) // 10]:.3f}, {luck[9 * len(luck) // 10]:.3f}]")
        print(f"  auto's choices ({sum(chosen.values())}): "
              + ", ".join(f"{k} {v}" for k, v in sorted(chosen.items(), key=lambda kv: -kv[1])))
        every_paths = [p for paths in passes for p in paths]
        every = {label: everywhere(every_paths, costs, arm, random.Random(0)) for arm in fixed
                 if (label := arm.label) in dict(top)}
        print("  a block at every position (no luck in where blocks start): "
              + ", ".join(f"{k} {v / base:.3f}x" for k, v in every.items())
              + f"; {best} on its own path is {speed[best] / max(every.values()):.3f}x the best of these")


if __name__ == "__main__":
    main()
