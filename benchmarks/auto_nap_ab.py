"""``auto`` whose model-drafted modes sit out choices after their draws priced them far below the best
(``Chooser.nap``, ``DORMANT``), against pricing every mode at every choice (``nap = 0``), beside ``ar`` and one fixed
mode: one cold chooser per variant and pass, the variants interleaved prompt by prompt (their order alternating), so
all see the same machine state. Prints each pass's tokens/s and the ratio of the two ``auto`` variants.

    python benchmarks/auto_nap_ab.py --pair mini --slim benchmarks/results/mini_slim.json --workload prose \\
        --temperature 0 --passes 4 --fixed lookup@4
"""

from __future__ import annotations

import sys
from pathlib import Path

from dimr.decoding.auto import NAP

sys.path.insert(0, str(Path(__file__).parent))
from ab import rules_ab  # noqa: E402

if __name__ == "__main__":
    rules_ab(__doc__, "prose", 0.0, "lookup@4", {"nap": NAP, "every": 0}, options=lambda nap, own: {"nap": nap})
