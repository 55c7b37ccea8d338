"""``auto`` with each choice's stretch counted in tokens (blocks until it has emitted 1, 2, 4… up to 16 tokens, a new
γ of the same mode going on with the stretch) against the rule before, counted in blocks (1, 2, 4, 4… blocks while
the same arm wins), beside ``ar`` and one fixed mode: one cold chooser per variant and pass, the variants
interleaved prompt by prompt (their order alternating), so all see the same machine state. Prints each pass's
tokens/s and the ratio of the two ``auto`` variants.

    python benchmarks/auto_stretch_ab.py --pair mini --slim benchmarks/results/mini_slim.json --workload task \
        --temperature 0 --prompts 16 --passes 16 --fixed sd@3
"""

from __future__ import annotations

import sys
from pathlib import Path

from dimr.decoding import auto

sys.path.insert(0, str(Path(__file__).parent))
from ab import rules_ab  # noqa: E402

RULES = {"tokens": (auto.RUN, auto._stretched, auto._settled),
         "blocks": (4, lambda blocks, tokens: blocks, lambda arm, last: arm == last)}


def use(rule: tuple) -> None:
    auto.RUN, auto._stretched, auto._settled = rule


if __name__ == "__main__":
    rules_ab(__doc__, "task", 0.0, "sd@3", RULES, use)
