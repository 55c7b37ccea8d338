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

sys.path.insert(0, str(Path(__file__).parent))
from ab import rules_ab  # noqa: E402

if __name__ == "__main__":
    rules_ab(__doc__, "code", 0.7, "sd@2", {"apart": True, "one-rate": False},
             options=lambda split, _: {"split": split})
