"""What shared-prefix escalation saves: the full verifier's forward over a window the slim verifier has
already run, plain against started at the slim's first skipped layer (same tokens, same cache state).

    python benchmarks/shared_prefix.py --pair mini --slim benchmarks/results/mini_slim.json --threads 1
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from transformers.utils import logging  # noqa: E402

from dimr.decoding import Decoder  # noqa: E402
from dimr.decoding.shared import SharedPrefix  # noqa: E402

PREFIX = 64


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", default="mini")
    ap.add_argument("--slim", required=True)
    ap.add_argument("--windows", default="4,8,16")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    logging.disable_progress_bar()
    dec = Decoder.load(args.pair, slim=args.slim, device="cpu")
    share = SharedPrefix(dec.full, dec.slim)
    print(f"pair {args.pair}: first skipped layer {share.f} of {share.layers}; ms per full forward of Γ + 1 "
          f"tokens after a {PREFIX}-token prefix the slim verifier saw all but the last of")
    print("| Γ | plain | shared prefix | saved |\n|---|---|---|---|")
    for window in (int(w) for w in args.windows.split(",")):
        ids = torch.arange(PREFIX + window + 1) % 50 + 3
        times = {"plain": [], "shared": []}
        for rep in range(args.reps + 1):
            for name, forward in (("plain", dec.full.forward), ("shared", share.forward)):
                for tier in (dec.full, dec.slim):
                    tier.reset(ids.numel() + 1)
                dec.slim.forward(ids[:-1], keep=1)
                dec.full.forward(ids[:PREFIX], keep=1)
                t0 = time.perf_counter()
                forward(ids[PREFIX:], keep=window + 1)
                if rep:
                    times[name].append(time.perf_counter() - t0)
        plain, shared = (sorted(times[k])[len(times[k]) // 2] * 1e3 for k in ("plain", "shared"))
        print(f"| {window} | {plain:.2f} ms | {shared:.2f} ms | {1 - shared / plain:.0%} |")


if __name__ == "__main__":
    main()
