"""Fixed ``sd`` at several γ, each drafting all γ tokens and stopping after a token the draft gives less than a
threshold (``sd@6~0.3``, ``--draft-stop``), beside ``ar``: the rows interleaved prompt by prompt (their order
alternating), so all see the same machine state. Prints each pass's tokens/s as ratios to ``ar``, then the medians.

    python benchmarks/stop_sweep.py --pair mini --slim benchmarks/results/mini_slim.json --workload task \\
        --temperature 0 --passes 3 --gammas 3,4,6,8 --stops 0.3
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from ab import interleaved, load, parser  # noqa: E402


def main() -> None:
    ap = parser(__doc__, "task", 0.0)
    ap.add_argument("--gammas", default="3,4,6,8")
    ap.add_argument("--stops", default="0.3", help="thresholds besides 0 (every γ drafted)")
    args = ap.parse_args()
    dec, prompts = load(args)
    rows = ["ar"] + [f"sd@{g}" + (f"~{s}" if s else "") for g in args.gammas.split(",")
                     for s in ["", *args.stops.split(",")]]
    ratios = {row: [] for row in rows[1:]}
    for p, speed in enumerate(interleaved(dec, prompts, args, rows, dict)):
        for row in ratios:
            ratios[row].append(speed[row] / speed["ar"])
        print(f"pass {p}: x ar: " + ", ".join(f"{row} {r[-1]:.3f}" for row, r in ratios.items()), flush=True)
    print(f"medians over {args.passes} passes, x ar: "
          + ", ".join(f"{row} {statistics.median(r):.3f}" for row, r in ratios.items()))


if __name__ == "__main__":
    main()
