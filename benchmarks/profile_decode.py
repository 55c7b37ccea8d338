"""Where decoding time goes: cProfile of one mode on a few prompts, top functions by own time.

    python benchmarks/profile_decode.py --pair mini --slim slim.json --mode sd --threads 1
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
from pathlib import Path

import torch
from transformers.utils import logging

from dimr.decoding import DecodeConfig, Decoder

sys.path.insert(0, str(Path(__file__).parent))
from sweep_sd import mini_prompts  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--pair", required=True)
    ap.add_argument("--pairs-file")
    ap.add_argument("--slim")
    ap.add_argument("--mode", default="sd")
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--top", type=int, default=15)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    logging.disable_progress_bar()
    dec = Decoder.load(args.pair, slim=args.slim, device="cpu",
                       pairs_file=Path(args.pairs_file) if args.pairs_file else None)
    config = DecodeConfig(max_new_tokens=args.max_new_tokens, gamma=args.gamma)
    prompts = [dec.encode(p) for p in mini_prompts(2)]
    dec.run(prompts[0], args.mode, config)  # warm-up
    profile = cProfile.Profile()
    profile.enable()
    results = [dec.run(ids, args.mode, config) for ids in prompts]
    profile.disable()
    cpu = sum(r.stats.cpu_seconds for r in results)
    tiers = {t: sum(r.stats.cpu_seconds_tier[t] for r in results) for t in ("draft", "slim", "full")}
    print(f"{args.mode}: {cpu:.2f} s CPU, in model forwards: "
          + ", ".join(f"{t} {s:.2f} s ({s / cpu:.0%})" for t, s in tiers.items() if s))
    pstats.Stats(profile).sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
