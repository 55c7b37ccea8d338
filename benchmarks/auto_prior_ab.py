"""``auto`` with the draft's calibrated prior worth what its calibration sequences' spread says
(:func:`dimr.decoding.auto.calibration_worth`) against the same means worth ``CALIBRATED`` tokens, and ``ar``:
one cold chooser per variant and pass, the variants interleaved prompt by prompt (their order alternating), so both
see the same machine state. Prints each pass's tokens/s and the ratio of the two variants.

    python benchmarks/auto_prior_ab.py --pair mini --slim benchmarks/results/mini_slim.json --workload prose \
        --temperature 0 --prompts 16 --passes 4
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from dimr.decoding import DecodeConfig, Decoder
from dimr.decoding.auto import Chooser, arms

sys.path.insert(0, str(Path(__file__).parent))
from bench_tiers import workload  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", default="mini")
    ap.add_argument("--slim", default=None)
    ap.add_argument("--workload", default="prose", choices=("code", "prose", "task"))
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--passes", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dec = Decoder.load(args.pair, slim=args.slim, device="cpu")
    costs = dec.measure_costs()
    cold = dec.auto_chooser(args.temperature)  # the priors `decode` starts from: each pass copies them
    print("calibrated", {"/".join(p): round(m, 3) for p, m in cold.calibrated.items()},
          "worth", {"/".join(p): round(k, 1) for p, k in cold.worth.items()})
    prompts = [dec.encode(t) for t in workload(args.pair, args.workload, args.prompts)]
    eos, ratios = dec.eos_token_ids(), []
    for p in range(args.passes):
        seconds, tokens = dict.fromkeys(("worth", "flat", "ar"), 0.0), dict.fromkeys(("worth", "flat", "ar"), 0)
        own = arms(draft=True, slim=dec.slim is not None)
        choosers = {"worth": Chooser(costs, own, calibrated=dict(cold.calibrated), worth=dict(cold.worth)),
                    "flat": Chooser(costs, own, calibrated=dict(cold.calibrated))}
        for i, ids in enumerate(prompts):
            for variant in (("worth", "flat", "ar") if (i + p) % 2 == 0 else ("ar", "flat", "worth")):
                config = DecodeConfig(max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                                      seed=1000 * p + i, eos_token_ids=eos)
                if variant != "ar":
                    dec.choosers = {args.temperature: choosers[variant]}
                start = time.perf_counter()
                result = dec.run(ids, "ar" if variant == "ar" else "auto", config)
                seconds[variant] += time.perf_counter() - start
                tokens[variant] += len(result.tokens)
        speed = {v: tokens[v] / seconds[v] for v in seconds}
        ratios.append(speed["worth"] / speed["flat"])
        print(f"pass {p}: tok/s worth {speed['worth']:.1f} ({speed['worth'] / speed['ar']:.2f}x ar), "
              f"flat {speed['flat']:.1f} ({speed['flat'] / speed['ar']:.2f}x ar); worth / flat {ratios[-1]:.3f}",
              flush=True)
    print(f"median worth / flat over {args.passes} passes: {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
