"""The GPU memory one search worker needs per built-in pair, from the shipped configs (docs/gpu.md's table).

    python benchmarks/memory_table.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dimr import memory  # noqa: E402
from dimr.pairs import BUILTIN, model_dtype  # noqa: E402

GPUS = {"H100 80 GB": 80 * 10**9, "H200 141 GB": 141 * 10**9}


def main() -> None:
    print("| pair | verifier | weights | 16×128 (default) | 128×512 | 128×512, cache on the host |")
    print("|---|---|---|---|---|---|")
    for pair in BUILTIN.values():
        config = memory.hub_config(pair.verifier)
        dtype = model_dtype(pair, torch.device("cuda"))
        small, big = (memory.estimate(config, n, t, 4, dtype) for n, t in ((16, 128), (128, 512)))
        hosted = memory.estimate(config, 128, 512, 4, dtype, cache_on_host=True)
        g = memory.GiB
        print(f"| {pair.name} | {pair.verifier} | {small.weights / g:.1f} GiB | {small.device / g:.1f} GiB | "
              f"{big.device / g:.1f} GiB | {hosted.device / g:.1f} GiB + {hosted.host / g:.1f} GiB host |")


if __name__ == "__main__":
    main()
