"""``auto`` testing an untested model draft at the γ its accepted drafts allow (:func:`dimr.decoding.auto.probe_arm`)
against testing it at γ = 1 throughout (the rule before), beside ``ar`` and one fixed mode: one cold chooser per
variant and pass, the variants interleaved prompt by prompt (their order alternating), so all see the same machine
state. Prints each pass's tokens/s and the ratio of the two ``auto`` variants.

    python benchmarks/auto_probe_ab.py --pair mini --slim benchmarks/results/mini_slim.json --workload task \\
        --temperature 0 --prompts 16 --passes 12 --fixed sd@6
"""

from __future__ import annotations

import sys
from pathlib import Path

from dimr.decoding import auto
from dimr.decoding.auto import Chooser, arms

sys.path.insert(0, str(Path(__file__).parent))
from ab import compare, interleaved, load, parser  # noqa: E402

RULES = {"grow": auto.probe_arm, "gamma1": lambda probe, own, accepted, rejected: probe}


def main() -> None:
    ap = parser(__doc__, "task", 0.0)
    ap.add_argument("--fixed", default="sd@6", help="a fixed mode to run beside them (mode@gamma)")
    args = ap.parse_args()
    dec, prompts = load(args)
    dec.measure_costs()
    cold = dec.auto_chooser(args.temperature)  # the priors `decode` starts from: each pass copies them
    own = arms(draft=True, slim=dec.slim is not None)

    def choosers() -> dict[str, Chooser]:
        return {v: Chooser(cold.costs, own, calibrated=dict(cold.calibrated), worth=dict(cold.worth)) for v in RULES}

    def before(variant: str) -> None:
        auto.probe_arm = RULES.get(variant, RULES["grow"])

    variants = ("grow", "gamma1", "ar", args.fixed)
    compare(interleaved(dec, prompts, args, variants, choosers, before), variants, "grow", "gamma1")


if __name__ == "__main__":
    main()
