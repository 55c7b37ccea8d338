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
from dataclasses import dataclass
from pathlib import Path

from dimr.decoding.costs import Costs

sys.path.insert(0, str(Path(__file__).parent))
from ab import tables_ab  # noqa: E402

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


def before(measured: Costs) -> Costs:
    """The table as it was measured before: 1-9, 13 and 17 tokens, extended from its last segment."""
    rows = {tier: {n: c for n, c in row.items() if n <= BEFORE} for tier, row in measured.table.items()}
    return LastSegment(rows, measured.source)


def main() -> None:
    tables_ab(__doc__, "task", 0.0, "sd@6", lambda measured: {"chord": measured, "segment": before(measured)})


if __name__ == "__main__":
    main()
