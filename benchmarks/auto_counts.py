"""What ``auto``'s chooser learned: per workload, one chooser over a few prompts, then its acceptance counts
per tier pair (the n-gram draft's per matched length), the arms it chose and its time against ``ar``.

    python benchmarks/auto_counts.py --pair smollm2 --slim benchmarks/results/smollm2_light.json \
        --workloads task,code --prompts 3 --temperature 0.7
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from transformers.utils import logging

from dimr.decoding import DecodeConfig, Decoder
from dimr.decoding.auto import auto

sys.path.insert(0, str(Path(__file__).parent))
from bench_tiers import workload  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", default="smollm2")
    ap.add_argument("--slim")
    ap.add_argument("--workloads", default="task,code")
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    logging.disable_progress_bar()
    dec = Decoder.load(args.pair, slim=args.slim, device="cpu")
    dec.measure_costs()
    config = DecodeConfig(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=1.0)
    for name in args.workloads.split(","):
        chooser, t_auto, t_ar = dec.auto_chooser(args.temperature), 0.0, 0.0
        for ids in (dec.encode(p) for p in workload(args.pair, name, args.prompts)):
            t = time.perf_counter()
            auto(chooser, dec.full, dec.draft, dec.slim, ids, config, dec.vocab_size)
            t_auto += time.perf_counter() - t
            t = time.perf_counter()
            dec.run(ids, "ar", config)
            t_ar += time.perf_counter() - t
        rates = ", ".join(f"{p}→{q} {a / (a + r):.2f} ({a + r:.0f} tested)"
                          for (p, q), (a, r) in sorted(chooser.counts.items()) if a + r)
        print(f"{name} T={args.temperature}: auto/ar time {t_auto / t_ar:.2f}; acceptance {rates}; "
              f"last prompt's arms {chooser.chosen}")


if __name__ == "__main__":
    main()
