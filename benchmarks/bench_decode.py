"""Decoding benchmark: all modes side by side plus HF assisted generation (same code as `dimr bench-decode`).

    python benchmarks/bench_decode.py --pair mini --slim slim.json --max-new-tokens 64 --threads 1

Arguments are those of `dimr bench-decode`; this script only forwards them to the same library function.
"""

from __future__ import annotations

import sys

from dimr.cli import main

if __name__ == "__main__":
    main(["bench-decode", *sys.argv[1:]])
