"""``auto`` priced by the cost table as measured against the same table made non-decreasing in n (each cell lowered
to the cheapest longer one, the rule before), beside ``ar`` and one fixed mode: one cold chooser per variant and
pass, the variants interleaved prompt by prompt (their order alternating), so all see the same machine state.
Prints each pass's tokens/s and the ratio of the two ``auto`` variants.

    python benchmarks/auto_table_ab.py --pair mini --slim benchmarks/results/mini_slim.json --workload code \
        --temperature 0.7 --prompts 16 --passes 4 --fixed sd@4
"""

from __future__ import annotations

import math
import sys
from dataclasses import replace
from pathlib import Path

from dimr.decoding.auto import Chooser, arms

sys.path.insert(0, str(Path(__file__).parent))
from ab import compare, interleaved, load, parser  # noqa: E402


def envelope(row: dict[int, float]) -> dict[int, float]:
    """The row made non-decreasing in n: each cell lowered to the cheapest cell at or after it."""
    out, low = {}, math.inf
    for n in sorted(row, reverse=True):
        low = min(low, row[n])
        out[n] = low
    return dict(sorted(out.items()))


def main() -> None:
    ap = parser(__doc__, "code", 0.7)
    ap.add_argument("--fixed", default="sd@4", help="a fixed mode to run beside them (mode@gamma)")
    args = ap.parse_args()
    dec, prompts = load(args)
    measured = dec.measure_costs()
    tables = {"measured": measured, "envelope": replace(measured, table={
        tier: envelope(dict(row)) for tier, row in measured.table.items()})}
    for tier, row in measured.table.items():
        print(tier, " ".join(f"{n}:{c * 1e3:.2f}" for n, c in sorted(row.items())), "ms")
    cold = dec.auto_chooser(args.temperature)  # the priors `decode` starts from: each pass copies them
    own = arms(draft=True, slim=dec.slim is not None)

    def choosers() -> dict[str, Chooser]:
        return {v: Chooser(t, own, calibrated=dict(cold.calibrated), worth=dict(cold.worth))
                for v, t in tables.items()}

    variants = ("measured", "envelope", "ar", args.fixed)
    compare(interleaved(dec, prompts, args, variants, choosers), variants, "measured", "envelope")


if __name__ == "__main__":
    main()
