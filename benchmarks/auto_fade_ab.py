"""``auto`` with the measured/tabled time ratio of each forward size it did not just run fading toward its tier's
(:data:`dimr.decoding.auto.FADE`) against each size keeping its own until it runs again (the rule before), beside
``ar`` and one fixed mode: one cold chooser per variant and pass, the variants interleaved prompt by prompt (their
order alternating), so all see the same machine state. Prints each pass's tokens/s and the ratio of the two
``auto`` variants.

    python benchmarks/auto_fade_ab.py --pair mini --slim benchmarks/results/mini_slim.json --workload code \\
        --temperature 0.7 --prompts 16 --passes 8 --fixed sd@4
"""

from __future__ import annotations

import sys
from pathlib import Path

from dimr.decoding import auto

sys.path.insert(0, str(Path(__file__).parent))
from ab import rules_ab  # noqa: E402

RULES = {"fade": auto.FADE, "keep": 0.0}


def use(rule: object) -> None:
    auto.FADE = rule


if __name__ == "__main__":
    rules_ab(__doc__, "code", 0.7, "sd@4", RULES, use)
