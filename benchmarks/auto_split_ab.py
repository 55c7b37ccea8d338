"""``auto`` pricing a model draft's first token in a block apart from its later ones (``Chooser.split``) against one
rate per drafted token (the rule before), beside ``ar`` and one fixed mode: one cold chooser per variant and pass,
the variants interleaved prompt by prompt (their order alternating), so all see the same machine state. Prints each
pass's tokens/s and the ratio of the two ``auto`` variants.

    python benchmarks/auto_split_ab.py --pair mini --slim benchmarks/results/mini_slim.json --workload code \\
        --temperature 0.7 --passes 6 --fixed sd@2
"""

from __future__ import annotations

import sys
from pathlib import Path

from dimr.decoding.auto import Chooser, arms

sys.path.insert(0, str(Path(__file__).parent))
from ab import compare, interleaved, load, parser  # noqa: E402


def main() -> None:
    ap = parser(__doc__, "code", 0.7)
    ap.add_argument("--fixed", default="sd@2", help="a fixed mode to run beside them (mode@gamma)")
    args = ap.parse_args()
    dec, prompts = load(args)
    dec.measure_costs()
    cold = dec.auto_chooser(args.temperature)  # the priors `decode` starts from: each pass copies them
    own = arms(draft=True, slim=dec.slim is not None)

    def choosers() -> dict[str, Chooser]:
        return {name: Chooser(cold.costs, own, calibrated=dict(cold.calibrated), worth=dict(cold.worth), split=split)
                for name, split in (("apart", True), ("one-rate", False))}

    variants = ("apart", "one-rate", "ar", args.fixed)
    compare(interleaved(dec, prompts, args, variants, choosers), variants, "apart", "one-rate")


if __name__ == "__main__":
    main()
