"""Where ``auto``'s time goes: a cold chooser per pass, every block timed and filed under its arm's mode and the
mode of the block before it (a switch makes the incoming tier catch up), beside the fixed modes' tokens/s, and the
time ``auto`` spends outside its blocks (the choice, the n-gram look-up, the bookkeeping). Per arm, the tokens the
first block of each choice was expected to make (at the posterior means the choice drew from) and the seconds it was
priced at (its forwards at the chooser's measured prices plus its mode's work outside them; not the catch-up of a
tier that sat out), beside what it made and took: an arm that makes fewer than expected, or takes longer, is priced
too well.

    python benchmarks/auto_anatomy.py --pair mini --slim benchmarks/results/mini_slim.json --workload code \
        --temperature 0 --passes 3 --fixed sd@2,lookup@4
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import torch
from transformers.utils import logging

from dimr.decoding import DecodeConfig, Decoder
from dimr.decoding.auto import STOPPED, auto, drafted, verified
from dimr.decoding.bench import parse_spec
from dimr.decoding.costs import Acceptance, block, expected_drafts

sys.path.insert(0, str(Path(__file__).parent))
from bench_tiers import workload  # noqa: E402


class Clocked(list):
    """A trace that stamps each block's end: ``auto`` appends one entry per block."""

    def __init__(self) -> None:
        super().__init__()
        self.ends: list[float] = []
        self.choices: list[tuple[float, float]] = []  # (start, end) of each choice
        self.expected: list[tuple[float, float]] = []  # tokens, seconds each choice's arm was priced at for one block

    def append(self, entry) -> None:
        self.ends.append(time.perf_counter())
        super().append(entry)


def timed_choices(chooser, clock: Clocked) -> None:
    """Stamp the start and end of every choice of ``chooser`` (an instance attribute: the class is untouched)."""
    choose = type(chooser).choose

    def stamped(rng, lag, lookup_len, ngram, remaining):
        began = time.perf_counter()
        arm = choose(chooser, rng, lag, lookup_len, ngram, remaining)
        clock.choices.append((began, time.perf_counter()))
        means = chooser.means(ngram)
        gamma = drafted(arm, lookup_len)
        mode = arm.step if arm.stop and STOPPED in means else arm.mode  # a stop arm: priced as the chooser does
        tokens, seconds = block(mode, gamma, Acceptance(means), chooser.price, arm.window)
        work = expected_drafts(*means[STOPPED], gamma)[gamma] + 1 if mode != arm.mode else verified(arm, gamma)
        clock.expected.append((tokens, seconds + chooser.overhead.get(arm.step, chooser.overhead.get(arm.mode, 0.0))
                               * work))
        return arm

    chooser.choose = stamped


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", default="mini")
    ap.add_argument("--slim")
    ap.add_argument("--workload", default="code")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--fixed", default="sd@2,lookup@4", help="fixed modes decoded beside auto, prompt by prompt")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--arms", action="store_true", help="file blocks by arm (sd/4, hier/4/12) instead of by mode")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    logging.disable_progress_bar()
    dec = Decoder.load(args.pair, slim=args.slim, device="cpu")
    fixed = ["ar"] + [m for m in args.fixed.split(",") if m and m != "ar"]
    dec.measure_costs(steps=[m.partition("@")[0] for m in fixed] + ["auto"], temperature=args.temperature)
    config = DecodeConfig(max_new_tokens=args.max_new_tokens, temperature=args.temperature)
    prompts = [dec.encode(p) for p in workload(args.pair, args.workload, args.prompts)]
    for mode in fixed:  # first-call allocations are not part of the measurement
        dec.run(prompts[0], *parse_spec(mode, replace(config, max_new_tokens=8)))
    totals = defaultdict(lambda: [0, 0.0])  # mode → tokens, seconds
    blocks = defaultdict(lambda: [0, 0, 0.0])  # (mode, mode before) → blocks, tokens, seconds
    outside = [0.0, 0]  # seconds outside blocks, choices
    # arm → choices, first blocks' tokens expected, made; seconds priced, taken (after the same arm / after another)
    firsts = defaultdict(lambda: [0, 0.0, 0, 0.0, 0.0, 0.0, 0.0, 0])
    choose_seconds = 0.0
    for p in range(args.passes):  # when sampling, pass p draws with seed p (every mode alike)
        dec.choosers = {}
        chooser = dec.auto_chooser(args.temperature)
        for ids in prompts:
            for mode in fixed:
                began = time.perf_counter()
                stats = dec.run(ids, *parse_spec(mode, replace(config, seed=p))).stats
                totals[mode][0] += stats.tokens
                totals[mode][1] += time.perf_counter() - began
            clock = Clocked()
            timed_choices(chooser, clock)
            began = time.perf_counter()
            result = auto(chooser, dec.full, dec.draft, dec.slim, ids, replace(config, seed=p), dec.vocab_size,
                          trace=clock)
            wall = time.perf_counter() - began
            del chooser.choose
            totals["auto"][0] += result.stats.tokens
            totals["auto"][1] += wall
            # a block starts where the last block (or the choice that precedes it) ended
            marks = sorted([(end, "choice") for _, end in clock.choices] + [(end, "block") for end in clock.ends])
            starts, first = {}, set()
            last, last_kind = began, "choice"
            for stamp, kind in marks:
                if kind == "block":
                    starts[stamp] = last
                    if last_kind == "choice":
                        first.add(stamp)
                last, last_kind = stamp, kind
            expected, previous = iter(clock.expected), None
            for (arm, _, _, emitted), end in zip(clock, clock.ends, strict=True):
                if end in first:
                    row, (tokens, priced) = firsts[arm.label], next(expected)
                    row[0], row[1], row[2] = row[0] + 1, row[1] + tokens, row[2] + len(emitted)
                    same = 0 if arm == previous else 2  # the block's own tier caches are current only after itself
                    row[3 + same], row[4 + same] = row[3 + same] + priced, row[4 + same] + end - starts[end]
                    row[7] += arm == previous
                previous = arm
            before = "start"
            in_blocks = 0.0
            for (arm, _, _, emitted), end in zip(clock, clock.ends, strict=True):
                seconds = end - starts[end]
                row = blocks[(arm.label if args.arms else arm.mode, before)]
                row[0], row[1], row[2] = row[0] + 1, row[1] + len(emitted), row[2] + seconds
                in_blocks += seconds
                before = arm.label if args.arms else arm.mode
            outside[0] += wall - in_blocks
            outside[1] += len(clock.choices)
            choose_seconds += sum(end - start for start, end in clock.choices)
    ar = totals["ar"][0] / totals["ar"][1]
    print(f"\n{args.pair} {args.workload} T={args.temperature}, {args.passes} cold passes of {len(prompts)} prompts:")
    for mode, (tokens, seconds) in totals.items():
        print(f"  {mode:10s} {tokens / seconds:7.1f} tok/s  {tokens / seconds / ar:.2f}x ar")
    print("  auto's blocks, by mode and the mode of the block before (start: the prompt's first block):")
    for (mode, before), (n, tokens, seconds) in sorted(blocks.items()):
        print(f"    {mode:9s} after {before:9s} {n:5d} blocks  {tokens / n:5.2f} tok/block  "
              f"{seconds / n * 1e3:6.2f} ms/block  {tokens / seconds:7.1f} tok/s")
    fastest = max((m for m in totals if m != "auto"), key=lambda m: totals[m][0] / totals[m][1])
    speed = totals[fastest][0] / totals[fastest][1]
    print(f"  seconds each {'arm' if args.arms else 'mode'}'s blocks lost against {fastest}'s speed (their tokens at "
          f"{speed:.0f} tok/s; the rest of auto's loss is outside the blocks):")
    by_label = defaultdict(lambda: [0, 0.0])
    for (label, _), (_, tokens, seconds) in blocks.items():
        by_label[label][0] += tokens
        by_label[label][1] += seconds
    for label, (tokens, seconds) in sorted(by_label.items(), key=lambda item: item[1][0] / speed - item[1][1]):
        print(f"    {label:9s} {tokens:6d} tokens  {seconds:7.3f} s  lost {seconds - tokens / speed:+7.3f} s")
    print("  the first block of each choice, by arm: tokens expected at the posterior means, and made; ms priced and "
          "taken, after the same arm | after another (which includes catching up):")
    for label, (n, expected, made, p_same, t_same, p_other, t_other, same) in sorted(firsts.items(),
                                                                                   key=lambda item: -item[1][0]):
        def ms(priced: float, taken: float, k: int) -> str:
            return f"{priced / k * 1e3:6.2f} / {taken / k * 1e3:6.2f}" if k else " " * 15

        print(f"    {label:9s} {n:5d} choices  expected {expected / n:5.2f}  made {made / n:5.2f} tok/block  "
              f"ms {ms(p_same, t_same, same)} | {ms(p_other, t_other, n - same)}")
    sizes = sorted(k for k in chooser.scale if isinstance(k, tuple))
    print("  the last chooser's prices (ms, table -> price now) of the forward sizes it ran: "
          + ", ".join(f"{t} {n}: {chooser.tabled(t, n) * 1e3:.2f} -> {chooser.price(t, n) * 1e3:.2f}"
                      for t, n in sizes))
    wall = totals["auto"][1]
    print(f"  outside blocks: {outside[0] * 1e3:.0f} ms of {wall * 1e3:.0f} ms ({outside[0] / wall:.1%}), "
          f"{outside[0] / max(outside[1], 1) * 1e6:.0f} us per choice over {outside[1]} choices; "
          f"the choices themselves {choose_seconds * 1e3:.0f} ms ({choose_seconds / wall:.1%})")


if __name__ == "__main__":
    main()
