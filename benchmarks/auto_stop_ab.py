"""``auto`` offering ``sd`` arms whose blocks stop drafting after a token the draft gives less than ``Chooser.stop``
(priced with the draft's rates of sure tokens) beside those drafting every one of γ, against only the latter (the
stop off), beside ``ar`` and one fixed mode:
one cold chooser per variant and pass, the variants interleaved prompt by prompt (their order alternating), so all see
the same machine state. Prints each pass's tokens/s and the ratio of the two ``auto`` variants.

    python benchmarks/auto_stop_ab.py --pair mini --slim benchmarks/results/mini_slim.json --workload task \\
        --temperature 0 --passes 6 --fixed sd@6
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from ab import rules_ab  # noqa: E402

if __name__ == "__main__":
    rules_ab(__doc__, "task", 0.0, "sd@6", {"stop": 0.3, "all": 0.0}, options=lambda stop, _: {"stop": stop})
