"""Random-weight models built on the GPU from the shipped real configs (`dimr/hub_configs`), no hub needed:

1. forward costs of the decoder's tiers by new tokens and kept layers (a 256-token prefix in the KV cache,
   median of a few runs; the input of the decoder's cost model), for gemma-2-2b and gemma-2-9b, and, when two
   GPUs are visible, the device map of a 2-GPU-sized verifier (Qwen3-32B) planned for them;
2. the scorer's memory estimate (`dimr.memory.estimate`) against ``torch.cuda.max_memory_allocated`` for a
   `MaskScorer` on gemma-2-2b with random weights (saved to a temp dir first) at 16 × 128.

    python benchmarks/gpu_models.py [--models gemma-2-2b,gemma-2-9b] [--skip-memory]

Prints one line per measurement, ``forward ...`` and ``memory ...`` (docs/gpu.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dimr import memory  # noqa: E402
from dimr.decoding.tiers import Tier  # noqa: E402
from dimr.slim import slim_verifier  # noqa: E402

TOKENS = (1, 2, 4, 8, 16, 64)
KEPT = (1.0, 0.75, 0.5)
PREFIX = 256


def _build(name: str):
    """A random-weight model of the shipped config ``name``, built on the GPU (no host copy)."""
    from transformers import AutoModelForCausalLM

    with torch.device("cuda"):
        return AutoModelForCausalLM.from_config(memory.hub_config(_repo(name)), dtype=torch.bfloat16).eval()


def _repo(name: str) -> str:
    index = json.loads((memory.CONFIG_DIR / "index.json").read_text())
    return next(repo for repo, f in index.items() if f == f"{name}.json")


@torch.inference_mode()
def forward_costs(name: str, model) -> None:
    n = model.config.num_hidden_layers
    for kept in KEPT:
        k = max(1, round(kept * n))
        mask = tuple(i < k for i in range(n))  # the kept count is what costs; which layers does not
        tier = Tier("full", model if k == n else slim_verifier(model, mask), timed=True)
        dev = next(model.parameters()).device
        for tokens in TOKENS:
            times = []
            for _ in range(5):
                tier.reset()
                tier.forward(torch.randint(0, 1000, (PREFIX,), device=dev), keep=1)
                t0 = time.perf_counter()
                tier.forward(torch.randint(0, 1000, (tokens,), device=dev), keep=tokens)
                torch.cuda.synchronize()
                times.append(time.perf_counter() - t0)
            print(f"forward {name} kept {k}/{n} tokens {tokens} ms {1000 * statistics.median(times[1:]):.2f}",
                  flush=True)


def memory_check(name: str = "gemma-2-2b", n: int = 16, t: int = 128, batch: int = 4) -> None:
    from dimr.pairs import Pair
    from workers import EvalSpec
    from workers.local import MaskScorer

    with tempfile.TemporaryDirectory() as tmp:
        model = _build(name)
        model.save_pretrained(tmp)
        del model
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        pair = Pair(f"{name}-random", tmp, tmp, dtype="bfloat16", local=True)
        ids = torch.randint(0, 256000, (n, t))
        scorer = MaskScorer(EvalSpec(pair=pair, input_ids=ids, device="cuda", batch_size=batch, cache_on_host=False))
        layers = scorer.num_layers
        for k in range(3):
            scorer.score(tuple(i not in (k, layers - 1 - k) for i in range(layers)))
        peak = torch.cuda.max_memory_allocated() - base
        p = scorer.plan
        print(f"memory {name} {n}x{t} batch {batch}: estimate {p.device / memory.GiB:.2f} GiB (weights "
              f"{p.weights / memory.GiB:.2f}, cache {p.cache / memory.GiB:.2f}, work {p.work / memory.GiB:.2f}), "
              f"max_memory_allocated {peak / memory.GiB:.2f} GiB, ratio {peak / p.device:.2f}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="gemma-2-2b,gemma-2-9b")
    ap.add_argument("--skip-memory", action="store_true")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("gpu_models.py needs a CUDA device")
    if not args.skip_memory:
        memory_check()
    for name in args.models.split(","):
        model = _build(name)
        forward_costs(name, model)
        del model
        torch.cuda.empty_cache()
    if torch.cuda.device_count() >= 2:
        config = memory.hub_config(_repo("qwen3-32b"))
        free = min(torch.cuda.mem_get_info(i)[0] for i in range(2))
        device_map = memory.plan_device_map(config, 2, int(free * memory.DEVICE_HEADROOM), 4 * memory.GiB,
                                            torch.bfloat16)
        per = {d: sum(1 for k, v in device_map.items() if v == d and ".layers." in k) for d in (0, 1)}
        print(f"plan qwen3-32b over 2 GPUs: decoder layers per device {per}", flush=True)


if __name__ == "__main__":
    main()
