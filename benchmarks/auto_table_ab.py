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

sys.path.insert(0, str(Path(__file__).parent))
from ab import tables_ab  # noqa: E402


def envelope(row: dict[int, float]) -> dict[int, float]:
    """The row made non-decreasing in n: each cell lowered to the cheapest cell at or after it."""
    out, low = {}, math.inf
    for n in sorted(row, reverse=True):
        low = min(low, row[n])
        out[n] = low
    return dict(sorted(out.items()))


def main() -> None:
    tables_ab(__doc__, "code", 0.7, "sd@4", lambda measured: {"measured": measured, "envelope": replace(
        measured, table={tier: envelope(dict(row)) for tier, row in measured.table.items()})})


if __name__ == "__main__":
    main()
