"""``auto`` offering each γ of ``sd`` both drafting every one of γ and stopping after a token the draft is unsure of
(``sd/γ~``), against offering only the stopping arms (every ``sd`` block stops), beside ``ar`` and one fixed mode:
one cold chooser per variant and pass, the variants interleaved prompt by prompt (their order alternating), so all
see the same machine state. Prints each pass's tokens/s and the ratio of the two ``auto`` variants.

    python benchmarks/auto_stop_arms_ab.py --pair mini --slim benchmarks/results/mini_slim.json --workload code \\
        --temperature 0.7 --passes 6 --fixed sd@2
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from ab import rules_ab  # noqa: E402

if __name__ == "__main__":
    rules_ab(__doc__, "code", 0.7, "sd@2", {"both": False, "stop-only": True},
             options=lambda only, own: {"arms": [a for a in own if not (only and a.mode == "sd" and not a.stop)]})
