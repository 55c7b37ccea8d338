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
    draft_run: int


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


def overhead(costs: Costs) -> dict[str, float]:
    """Each mode's step time per verified token, as :meth:`Chooser.observe_overhead` keeps it: the table's steps
    are per block, measured at γ = :data:`STEP_GAMMA` (one verified token a block for ``ar``)."""
    return {m: costs.step(m) / (1 if m == "ar" else STEP_GAMMA + 1) for m in ("ar", "sd", "lookup")}


def block(arm: Arm, pos: Position, left: int, costs: Costs, steps: dict[str, float], lag: int
          ) -> tuple[int, float, list]:
    """(tokens emitted, seconds, observations) of one block of ``arm`` at ``pos`` with ``left`` tokens to go;
    ``steps``: :func:`overhead`'s."""
    step = steps[arm.mode]
    if arm.mode == "ar":
        return 1, costs("full", 1) + step, []
    gamma = drafted(arm, pos.offered)
    run = pos.lookup_run if arm.mode == "lookup" else pos.draft_run
    accepted = min(gamma, run, left - 1)
    tested = min(accepted + 1, gamma)
    seconds = costs("full", gamma + 1) + step * (gamma + 1)
    pair = ("lookup", "full") if arm.mode == "lookup" else ("draft", "full")
    if arm.mode == "sd":
        seconds += costs("draft", lag + 1) + (gamma - 1) * costs("draft", 1)
    return accepted + 1, seconds, [(*pair, accepted, tested)]


def everywhere(paths: list[list[Position]], costs: Costs, arm: Arm) -> float:
    """Tokens/s of ``arm``'s blocks averaged over every position (each at no lag), not only those its own path
    starts at: where a fixed arm's blocks start depends on its γ, and on a few hundred greedy tokens that alone
    moves its speed by several per cent, the same in every pass (greedy text does not change)."""
    tokens = seconds = 0.0
    steps = overhead(costs)
    for path in paths:
        for t, pos in enumerate(path):
            made, spent, _ = block(arm, pos, len(path) - t, costs, steps, 0)
            tokens, seconds = tokens + made, seconds + spent
    return tokens / seconds


class Replay:
    """One prompt's known outcomes walked by ``auto``'s own loop (a :class:`dimr.decoding.auto.Walk`), every block
    priced at ``costs``."""

    def __init__(self, path: list[Position], costs: Costs) -> None:
        self.path, self.costs, self.steps = path, costs, overhead(costs)
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
        made, spent, seen = block(arm, self.path[self.t], self.remaining, self.costs, self.steps, self.draft_lag)
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
           rng: random.Random | None = None) -> tuple[int, float]:
    """Tokens and seconds of one prompt decoded by ``policy`` (a fixed arm) or by ``chooser``."""
    walk = Replay(path, costs)
    if chooser is not None:
        drive(chooser, rng, walk)
    while not walk.done:
        walk.block(policy)
    return len(path), walk.seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", default="mini")
    ap.add_argument("--slim")
    ap.add_argument("--workloads", default="code,prose,task")
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--seeds", type=int, default=4, help="auto replays, each with its own draws")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--costs", help="cost table JSON: read if it exists, else measured and written there")
    ap.add_argument("--paths", help="JSON of the greedy outcomes per workload: read if it exists (extended when it"
                    " holds fewer prompts), else written")
    ap.add_argument("--tables", help="a bench_tiers.py --out JSON: price each workload at the greedy cost table that"
                    " timed run measured for it (instead of --costs)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    logging.disable_progress_bar()
    dec = Decoder.load(args.pair, slim=args.slim, device="cpu")
    tables = {t["workload"]: Costs.from_dict(t) for t in json.loads(Path(args.tables).read_text())["tables"]
              if t["temperature"] == 0} if args.tables else {}
    if tables:
        costs = dec.costs = next(iter(tables.values()))
    elif args.costs and Path(args.costs).exists():  # the same table for replays of two versions of the chooser
        costs = dec.costs = Costs.load(Path(args.costs))
    else:
        costs = dec.measure_costs(steps=["ar", "sd", "lookup"])
        if args.costs:
            Path(args.costs).write_text(json.dumps(costs.to_dict()))
    cached = json.loads(Path(args.paths).read_text()) if args.paths and Path(args.paths).exists() else {}
    fixed = [Arm("ar")] + [Arm(m, g) for m in ("sd", "lookup") for g in GAMMAS]
    calibrated = dict(dec.auto_chooser(0.0).calibrated)  # the priors `decode` would start its chooser from
    for name in args.workloads.split(","):
        costs = tables.get(name, costs)
        full = costs("full", 1)
        print(f"{args.pair}, {name}: full c(1) {full * 1e3:.2f} ms, c(3)/c(1) {costs('full', 3) / full:.2f},"
              f" c(5)/c(1) {costs('full', 5) / full:.2f}; draft c(1)/full c(1) {costs('draft', 1) / full:.3f}")
        have = cached.setdefault(name, [])  # the first N prompts' outcomes: a cache of more serves fewer
        if len(have) < args.prompts:
            have += [[astuple(x) for x in positions(dec, dec.encode(p), args.max_new_tokens)]
                     for p in workload(args.pair, name, args.prompts)[len(have):]]
            if args.paths:
                Path(args.paths).write_text(json.dumps(cached))
        paths = [[Position(*x) for x in path] for path in have[: args.prompts]]
        speed = {}
        for arm in fixed:
            tokens, seconds = zip(*(replay(p, costs, arm) for p in paths), strict=True)
            speed[arm.label] = sum(tokens) / sum(seconds)
        base = speed["ar"]
        best = max(speed, key=speed.__getitem__)
        autos, chosen = [], {}
        for seed in range(args.seeds):
            chooser = Chooser(costs, arms(draft=True, slim=False), calibrated=dict(calibrated), adapt=False,
                              overhead=overhead(costs))
            rng = random.Random(seed)
            tokens, seconds = [], []
            for p in paths:
                made, spent = replay(p, costs, None, chooser, rng)
                tokens, seconds = tokens + [made], seconds + [spent]
                for label, k in chooser.chosen.items():
                    chosen[label] = chosen.get(label, 0) + k
            autos.append(sum(tokens) / sum(seconds))
        top = sorted(speed.items(), key=lambda kv: -kv[1])[:4]
        print(f"{name}: " + ", ".join(f"{k} {v / base:.3f}x" for k, v in top)
              + f"; auto {' '.join(f'{a / base:.3f}' for a in autos)}x ar = "
              f"{sum(autos) / len(autos) / speed[best]:.3f} of {best}")
        print("  auto's choices: " + ", ".join(f"{k} {v}" for k, v in sorted(chosen.items(), key=lambda kv: -kv[1])))
        every = {label: everywhere(paths, costs, arm) for arm in fixed if (label := arm.label) in dict(top)}
        print("  a block at every position (no luck in where blocks start): "
              + ", ".join(f"{k} {v / base:.3f}x" for k, v in every.items())
              + f"; {best} on its own path is {speed[best] / max(every.values()):.3f}x the best of these")


if __name__ == "__main__":
    main()
