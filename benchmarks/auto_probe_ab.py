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

sys.path.insert(0, str(Path(__file__).parent))
from ab import rules_ab  # noqa: E402

RULES = {"grow": auto.probe_arm, "gamma1": lambda probe, own, accepted, rejected: probe}


def use(rule: object) -> None:
    auto.probe_arm = rule


if __name__ == "__main__":
    rules_ab(__doc__, "task", 0.0, "sd@6", RULES, use)
