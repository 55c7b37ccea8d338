"""``auto`` whose first choice on a prompt resumes at half the stretch its mode last ran on an earlier prompt
against one that starts it at one token (``Chooser(resume=False)``), beside ``ar`` and one fixed
mode: one cold chooser per variant and pass, the variants interleaved prompt by prompt (their order alternating), so
all see the same machine state. Prints each pass's tokens/s and the ratio of the two ``auto`` variants.

    python benchmarks/auto_resume_ab.py --pair mini --slim benchmarks/results/mini_slim.json --workload prose \\
        --temperature 0 --passes 6 --fixed lookup@4
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from ab import rules_ab  # noqa: E402

if __name__ == "__main__":
    rules_ab(__doc__, "prose", 0.0, "lookup@4", {"resume": True, "restart": False},
             options=lambda resume, own: {"resume": resume})
