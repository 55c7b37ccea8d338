"""Mask evaluations per second with and without prefix reuse, side by side on the same data and masks.

    python benchmarks/prefix_reuse.py                      # tiny-random pair
    python benchmarks/prefix_reuse.py --pair mini --seq-len 256

One evaluation = the slim verifier's logits on the calibration batch + ``evaluate_logits`` against the full
verifier's reference. Both methods reuse the cached full reference (computed once, as a worker does).

- ``slim forward``:  the slim verifier's own forward from the token ids (no prefix reuse);
- ``prefix reuse``:  ``forward_from`` starting at the mask's first skipped layer from ``layer_inputs``.

A third row, ``naive``, recomputes the full reference per mask too. The methods alternate mask by mask so
that background load hits them alike. Masks skip exactly ``--skip`` layers, uniformly at random.
"""

from __future__ import annotations

import argparse
import os
import random
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from dimr.calibration import load_calibration  # noqa: E402
from dimr.cost import evaluate_logits  # noqa: E402
from dimr.masks import first_skipped  # noqa: E402
from dimr.pairs import get_pair, load_model, load_tokenizer  # noqa: E402
from dimr.slim import forward_from, layer_inputs, num_layers, slim_verifier  # noqa: E402


def random_masks(n_layers: int, skip: int, count: int, seed: int) -> list[tuple[bool, ...]]:
    rng = random.Random(seed)
    masks = []
    for _ in range(count):
        off = set(rng.sample(range(n_layers), skip))
        masks.append(tuple(i not in off for i in range(n_layers)))
    return masks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", default="tiny-random")
    ap.add_argument("--num-sequences", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--masks", type=int, default=24, help="masks evaluated by each method")
    ap.add_argument("--skip", type=int, default=None, help="layers skipped per mask (default: a quarter)")
    ap.add_argument("--cost", default="kl")
    ap.add_argument("--device", default=None)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    pair = get_pair(args.pair)
    model = load_model(pair, "verifier", args.device)
    calib = load_calibration(pair.calibration, load_tokenizer(pair), args.num_sequences, args.seq_len)
    ids = calib.input_ids.to(model.device)
    n = num_layers(model)
    skip = args.skip if args.skip is not None else max(1, n // 4)
    masks = random_masks(n, skip, args.masks, args.seed)

    sync = torch.cuda.synchronize if model.device.type == "cuda" else (lambda: None)
    with torch.no_grad():
        sync()
        t0 = time.perf_counter()
        hidden = layer_inputs(model, ids)
        reference = forward_from(model, (True,) * n, hidden)  # full logits from hidden[n]: norm + head only
        sync()
        setup_s = time.perf_counter() - t0

        def slim_forward(mask):
            return evaluate_logits(reference, slim_verifier(model, mask)(ids).logits, args.cost)

        def prefix_reuse(mask):
            return evaluate_logits(reference, forward_from(model, mask, hidden), args.cost)

        def naive(mask):
            return evaluate_logits(model(ids).logits, slim_verifier(model, mask)(ids).logits, args.cost)

        methods = {"naive": naive, "slim forward": slim_forward, "prefix reuse": prefix_reuse}
        for fn in methods.values():  # warm-up
            fn(masks[0])
        seconds = dict.fromkeys(methods, 0.0)
        results: dict[str, list[float]] = {k: [] for k in methods}
        for mask in masks:
            for name, fn in methods.items():
                sync()
                t = time.perf_counter()
                results[name].append(fn(mask)["cost"])
                sync()
                seconds[name] += time.perf_counter() - t

    diff = max(abs(a - b) for a, b in zip(results["slim forward"], results["prefix reuse"], strict=True))
    mean_start = sum(first_skipped(m) for m in masks) / len(masks)
    print(f"pair {pair.name}: {n} layers, skip {skip}, batch {tuple(ids.shape)}, {len(masks)} masks, "
          f"mean first skipped layer {mean_start:.2f}, device {model.device}, "
          f"threads {torch.get_num_threads()}")
    print(f"setup (layer inputs + full reference, once per batch): {setup_s * 1e3:.1f} ms")
    base = len(masks) / seconds["slim forward"]
    print(f"{'method':<14} {'evals/s':>9} {'ms/eval':>9} {'vs slim forward':>16}")
    for name in methods:
        rate = len(masks) / seconds[name]
        print(f"{name:<14} {rate:>9.2f} {1e3 / rate:>9.2f} {rate / base:>15.2f}x")
    print(f"max |cost difference| prefix reuse vs slim forward: {diff:.2e}")


if __name__ == "__main__":
    main()
