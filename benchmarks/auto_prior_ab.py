"""``auto`` with the draft's calibrated prior worth what its calibration sequences' spread says
(:func:`dimr.decoding.auto.calibration_worth`) against the same means worth ``CALIBRATED`` tokens, and ``ar``:
one cold chooser per variant and pass, the variants interleaved prompt by prompt (their order alternating), so both
see the same machine state. Prints each pass's tokens/s and the ratio of the two variants.

    python benchmarks/auto_prior_ab.py --pair mini --slim benchmarks/results/mini_slim.json --workload prose \
        --temperature 0 --prompts 16 --passes 4
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from dimr.decoding.auto import Chooser, arms

sys.path.insert(0, str(Path(__file__).parent))
from ab import interleaved, load, parser  # noqa: E402


def main() -> None:
    args = parser(__doc__, "prose", 0.0).parse_args()
    dec, prompts = load(args)
    costs = dec.measure_costs()
    cold = dec.auto_chooser(args.temperature)  # the priors `decode` starts from: each pass copies them
    print("calibrated", {"/".join(p): round(m, 3) for p, m in cold.calibrated.items()},
          "worth", {"/".join(p): round(k, 1) for p, k in cold.worth.items()})
    own = arms(draft=True, slim=dec.slim is not None)

    def choosers() -> dict[str, Chooser]:
        return {"worth": Chooser(costs, own, calibrated=dict(cold.calibrated), worth=dict(cold.worth)),
                "flat": Chooser(costs, own, calibrated=dict(cold.calibrated))}

    ratios = []
    for p, speed in enumerate(interleaved(dec, prompts, args, ("worth", "flat", "ar"), choosers)):
        ratios.append(speed["worth"] / speed["flat"])
        print(f"pass {p}: tok/s worth {speed['worth']:.1f} ({speed['worth'] / speed['ar']:.2f}x ar), "
              f"flat {speed['flat']:.1f} ({speed['flat'] / speed['ar']:.2f}x ar); worth / flat {ratios[-1]:.3f}",
              flush=True)
    print(f"median worth / flat over {args.passes} passes: {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
