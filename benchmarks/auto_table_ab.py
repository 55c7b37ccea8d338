"""``auto`` priced by the cost table as measured against the same table made non-decreasing in n (each cell lowered
to the cheapest longer one, the rule before), beside ``ar`` and one fixed mode: one cold chooser per variant and
pass, the variants interleaved prompt by prompt (their order alternating), so all see the same machine state.
Prints each pass's tokens/s and the ratio of the two ``auto`` variants.

    python benchmarks/auto_table_ab.py --pair mini --slim benchmarks/results/mini_slim.json --workload code \
        --temperature 0.7 --prompts 16 --passes 4 --fixed sd@4
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from dimr.decoding import DecodeConfig, Decoder
from dimr.decoding.auto import Chooser, arms
from dimr.decoding.bench import parse_spec

sys.path.insert(0, str(Path(__file__).parent))
from bench_tiers import workload  # noqa: E402


def envelope(row: dict[int, float]) -> dict[int, float]:
    """The row made non-decreasing in n: each cell lowered to the cheapest cell at or after it."""
    out, low = {}, math.inf
    for n in sorted(row, reverse=True):
        low = min(low, row[n])
        out[n] = low
    return dict(sorted(out.items()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", default="mini")
    ap.add_argument("--slim", default=None)
    ap.add_argument("--workload", default="code", choices=("code", "prose", "task"))
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--passes", type=int, default=4)
    ap.add_argument("--fixed", default="sd@4", help="a fixed mode to run beside them (mode@gamma)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dec = Decoder.load(args.pair, slim=args.slim, device="cpu")
    measured = dec.measure_costs()
    tables = {"measured": measured, "envelope": replace(measured, table={
        tier: envelope(dict(row)) for tier, row in measured.table.items()})}
    for tier, row in measured.table.items():
        print(tier, " ".join(f"{n}:{c * 1e3:.2f}" for n, c in sorted(row.items())), "ms")
    cold = dec.auto_chooser(args.temperature)  # the priors `decode` starts from: each pass copies them
    prompts = [dec.encode(t) for t in workload(args.pair, args.workload, args.prompts)]
    variants = ("measured", "envelope", "ar", args.fixed)
    eos, ratios = dec.eos_token_ids(), []
    for p in range(args.passes):
        seconds, tokens = dict.fromkeys(variants, 0.0), dict.fromkeys(variants, 0)
        own = arms(draft=True, slim=dec.slim is not None)
        choosers = {v: Chooser(tables[v], own, calibrated=dict(cold.calibrated), worth=dict(cold.worth))
                    for v in tables}
        for i, ids in enumerate(prompts):
            for variant in (variants if (i + p) % 2 == 0 else variants[::-1]):
                config = DecodeConfig(max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                                      seed=1000 * p + i, eos_token_ids=eos)
                mode, config = parse_spec(variant if variant in ("ar", args.fixed) else "auto", config)
                if mode == "auto":
                    dec.choosers = {args.temperature: choosers[variant]}
                start = time.perf_counter()
                result = dec.run(ids, mode, config)
                seconds[variant] += time.perf_counter() - start
                tokens[variant] += len(result.tokens)
        speed = {v: tokens[v] / seconds[v] for v in seconds}
        ratios.append(speed["measured"] / speed["envelope"])
        print(f"pass {p}: x ar: " + ", ".join(f"{v} {speed[v] / speed['ar']:.2f}" for v in variants)
              + f"; measured / envelope {ratios[-1]:.3f}", flush=True)
    print(f"median measured / envelope over {args.passes} passes: {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
