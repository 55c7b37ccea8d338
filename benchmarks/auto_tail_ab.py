"""``auto`` priced past the cost table's last length along the chord from the row's middle, never falling, on a table
that also times 33 tokens (the rule now) against the table of 1–9, 13 and 17 tokens extended from its last
segment (the rule before), beside ``ar`` and one fixed mode: one cold chooser per variant and pass, the variants
interleaved prompt by prompt (their order alternating), so all see the same machine state. The forwards priced past
the table are a tier's catch-up after it sat out. Prints each pass's tokens/s and the ratio of the two ``auto``
variants.

    python benchmarks/auto_tail_ab.py --pair mini --slim benchmarks/results/mini_slim.json --workload task \
        --temperature 0 --prompts 16 --passes 16 --fixed sd@6
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path

from dimr.decoding.auto import Chooser, arms
from dimr.decoding.costs import Costs

sys.path.insert(0, str(Path(__file__).parent))
from ab import compare, interleaved, load, parser  # noqa: E402

BEFORE = 17  # the table's last length before


@dataclass(frozen=True)
class LastSegment(Costs):
    """A table priced past its last length by extending its last segment (the rule before)."""

    def __call__(self, tier: str, n: float) -> float:
        points = sorted(self.table.get(tier, {}).items())
        if tier not in self.table or len(points) < 2 or n <= points[-1][0]:
            return super().__call__(tier, n)
        (n0, c0), (n1, c1) = points[-2], points[-1]
        return c1 + (c1 - c0) * (n - n1) / (n1 - n0)


def main() -> None:
    ap = parser(__doc__, "task", 0.0)
    ap.add_argument("--fixed", default="sd@6", help="a fixed mode to run beside them (mode@gamma)")
    args = ap.parse_args()
    dec, prompts = load(args)
    measured = dec.measure_costs()
    before = LastSegment({t: {n: c for n, c in row.items() if n <= BEFORE} for t, row in measured.table.items()},
                         measured.source)
    tables = {"chord": measured, "segment": before}
    for tier, row in measured.table.items():
        print(tier, " ".join(f"{n}:{c * 1e3:.2f}" for n, c in sorted(row.items())), "ms;",
              "a 60-token catch-up", " ".join(f"{v} {t(tier, 61) * 1e3 - t(tier, 1) * 1e3:.2f}"
                                                for v, t in tables.items()), "ms")
    cold = dec.auto_chooser(args.temperature)  # the priors `decode` starts from: each pass copies them
    own = arms(draft=True, slim=dec.slim is not None)

    def choosers() -> dict[str, Chooser]:
        return {v: Chooser(replace(t, steps=measured.steps) if t is before else t, own,
                           calibrated=dict(cold.calibrated), worth=dict(cold.worth)) for v, t in tables.items()}

    variants = ("chord", "segment", "ar", args.fixed)
    compare(interleaved(dec, prompts, args, variants, choosers), variants, "chord", "segment")


if __name__ == "__main__":
    main()
