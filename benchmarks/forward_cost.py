"""What one forward costs, per tier and input length, eager (dynamic cache) against compiled (static cache).

    python benchmarks/forward_cost.py --pair mini --slim benchmarks/results/mini_slim.json --threads 1

The survey's speed-up model S = (l_accept + 1) / (1 + γ·c_rel) assumes a verification forward over γ + 1
tokens costs one decode step and a draft step costs c_rel of it; this prints both, measured, side by side
(ms per forward after a 100-token prefix, and each as a multiple of the full verifier's 1-token forward).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from transformers.utils import logging

from dimr.decoding import Decoder
from dimr.decoding.tiers import Tier

LENGTHS = (1, 2, 4, 5, 8, 16)
PREFIX = 100


@torch.inference_mode()
def cost_ms(tier: Tier, n: int, reps: int) -> float:
    device = tier.model.device
    tier.reset(PREFIX + 2 * LENGTHS[-1])
    tier.forward(torch.arange(PREFIX, device=device) + 3, keep=1)
    x = torch.arange(n, device=device) + 7
    for _ in range(3):
        tier.forward(x, keep=n)
        tier.crop(PREFIX)
    t0 = time.perf_counter()
    for _ in range(reps):
        tier.forward(x, keep=n)
        tier.crop(PREFIX)
    return (time.perf_counter() - t0) / reps * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--pair", required=True)
    ap.add_argument("--slim")
    ap.add_argument("--pairs-file")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=100)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    logging.disable_progress_bar()
    eager = Decoder.load(args.pair, slim=args.slim, device=args.device,
                         pairs_file=Path(args.pairs_file) if args.pairs_file else None)
    compiled = Decoder.from_models(eager.full.model, eager.draft.model, eager.slim.model if eager.slim else None,
                                   compiled=True)
    compiled.warm_up(PREFIX + 2 * LENGTHS[-1])
    rows = []
    for name in ("full", "slim", "draft"):
        for label, dec in (("eager", eager), ("compiled", compiled)):
            tier = getattr(dec, name)
            if tier is not None:
                rows.append((name, label, [cost_ms(tier, n, args.reps) for n in LENGTHS]))
    base = {label: ms[0] for name, label, ms in rows if name == "full"}
    print("| tier | forward | " + " | ".join(f"{n} token{'s' * (n > 1)}" for n in LENGTHS) + " |")
    print("|---|---|" + "---|" * len(LENGTHS))
    for name, label, ms in rows:
        cells = [f"{m:.2f} ms ({m / base[label]:.2f})" for m in ms]
        print(f"| {name} | {label} | " + " | ".join(cells) + " |")
    print(f"\n(in brackets: the multiple of the full verifier's 1-token forward in the same column group; "
          f"{args.device}, {args.threads} thread(s), after a {PREFIX}-token prefix)")


if __name__ == "__main__":
    main()
