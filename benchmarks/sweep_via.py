"""Sweep VIA's thresholds (accept, close, regen) against ar and sd; prints one markdown row per grid point.

    python benchmarks/sweep_via.py --pair mini --slim slim.json --max-new-tokens 64 --threads 1

The chosen defaults (dimr.decoding.Thresholds) and the table this printed are in docs/decoding.md.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import torch
from transformers.utils import logging

from dimr.decoding import DecodeConfig, Decoder
from dimr.decoding.bench import format_table, sweep_thresholds

ACCEPT = (0.6, 0.8, 0.9, 0.95)
CLOSE = (0.5,)
REGEN = (0.7, 0.9, 2.0)  # 2.0: regeneration off


sys.path.insert(0, str(Path(__file__).parent))
from sweep_sd import mini_prompts  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--pair", required=True)
    ap.add_argument("--slim", required=True)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--prompts", type=int, default=4, help="first N HumanEval + first N arithmetic prompts")
    ap.add_argument("--pairs-file")
    ap.add_argument("--json", help="also write the points to this file")
    ap.add_argument("--accept", type=float, nargs="*", default=ACCEPT)
    ap.add_argument("--close", type=float, nargs="*", default=CLOSE)
    ap.add_argument("--regen", type=float, nargs="*", default=REGEN)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    logging.disable_progress_bar()
    decoder = Decoder.load(args.pair, slim=args.slim, device="cpu",
                           pairs_file=Path(args.pairs_file) if args.pairs_file else None)
    config = DecodeConfig(max_new_tokens=args.max_new_tokens, gamma=args.gamma, temperature=args.temperature)
    grid = [(a, c, r) for a, c, r in itertools.product(args.accept, args.close, args.regen)
            if not (r > 1 and c != args.close[0])]
    base, points = sweep_thresholds(decoder, mini_prompts(args.prompts), config, grid)
    print(format_table(base))
    print("\n| accept | close | regen | wall vs sd | cpu vs sd | predicted vs sd | full/tok | direct | regen "
          "| NLL | = ar |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for p in points:
        print(f"| {p['accept']} | {p['close']} | {p['regen']} | {p['speedup_vs_sd']:.2f}x | "
              f"{p['cpu_speedup_vs_sd']:.2f}x | "
              f"{p['predicted_vs_sd']:.2f}x | {p['full_per_token']:.3f} | {p['direct']:.2f} | "
              f"{p['regenerated']:.2f} | {p['nll']:.3f} (sd {p['sd_nll']:.3f}) | {p['same_as_ar']} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(points, f, indent=1)


if __name__ == "__main__":
    main()
