"""Prompt by prompt, what a cold ``auto`` chooser ran and how it priced the model draft's γ's: the arms of its choices
on the prompt, sd/1…sd/6's tokens/s at the posterior means and current prices after it, the draft's mean acceptance,
the full verifier's current price of each verification size (ms) and the step work per verified token (ms).

    python benchmarks/auto_prices.py --pair mini --slim benchmarks/results/mini_slim.json --workload code \\
        --temperature 0.7 --prompts 16 --passes 2
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

import torch

from dimr.decoding import DecodeConfig, Decoder
from dimr.decoding.auto import Arm, auto
from dimr.decoding.costs import Sure

sys.path.insert(0, str(Path(__file__).parent))
from bench_tiers import workload  # noqa: E402

GAMMAS = (1, 2, 3, 4, 6)


def accepted(rate: float | Sure) -> float:
    """A part's acceptance: a :class:`Sure` rate's, under the draft's stop when unsure."""
    return rate.accepted if isinstance(rate, Sure) else rate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", default="mini")
    ap.add_argument("--slim")
    ap.add_argument("--workload", default="code")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dec = Decoder.load(args.pair, slim=args.slim, device="cpu")
    dec.measure_costs(steps=["ar", "sd", "auto"], temperature=args.temperature)
    config = DecodeConfig(max_new_tokens=args.max_new_tokens, temperature=args.temperature)
    prompts = [dec.encode(p) for p in workload(args.pair, args.workload, args.prompts)]
    print("table: full " + ", ".join(f"{n}: {dec.costs('full', n) * 1e3:.2f}" for n in (1, *(g + 1 for g in GAMMAS)))
          + f" ms; draft 1: {dec.costs('draft', 1) * 1e3:.2f} ms")
    for p in range(args.passes):
        dec.choosers = {}
        chooser = dec.auto_chooser(args.temperature)
        began, tokens = time.perf_counter(), 0
        for i, ids in enumerate(prompts):
            result = auto(chooser, dec.full, dec.draft, dec.slim, ids, replace(config, seed=p), dec.vocab_size)
            tokens += result.stats.tokens
            speeds = chooser.speeds([Arm("sd", g) for g in GAMMAS], chooser.means(), {"draft": 0, "slim": 0})
            ran = Counter(chooser.chosen).most_common(4)
            print(f"pass {p} prompt {i:2d}: ran {', '.join(f'{a} {n}' for a, n in ran)}; "
                  f"sd/{','.join(map(str, GAMMAS))} "
                  f"{' '.join(f'{s:.0f}' for s in speeds)} tok/s; draft (first, rest) "
                  f"{' '.join(f'{accepted(m):.2f}' for m in chooser.means()[('draft', 'full')])}; full "
                  + " ".join(f"{g + 1}:{chooser.price('full', g + 1) * 1e3:.1f}" for g in GAMMAS)
                  + "; step " + " ".join(f"{m} {v * 1e3:.2f}" for m, v in sorted(chooser.overhead.items())))
        print(f"pass {p}: {tokens / (time.perf_counter() - began):.1f} tok/s")


if __name__ == "__main__":
    main()
