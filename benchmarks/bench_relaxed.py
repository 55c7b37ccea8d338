"""Relaxed-verification benchmark: the whole pipeline behind docs/relaxed.md, one command.

    python benchmarks/bench_relaxed.py --pair mini --temperature 0.5

1. trains a DIVERSED head on the arithmetic task (``dimr diversed train``) unless ``--head`` exists already;
2. runs ``dimr bench-relaxed`` with it (every rule swept at γ = 5; lossless and each rule's middle value at
   γ = 3 and 8) on held-out arithmetic problems and HumanEval prompts;
3. writes ``docs/relaxed_bench.json``, ``docs/relaxed_table.md`` and the speed–quality figure
   ``docs/relaxed_pareto.png``.

Everything runs on one CPU thread (the box is shared). Other ``bench-relaxed`` options pass through after ``--``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
from pathlib import Path

import torch

from dimr.cli import main

ROOT = Path(__file__).resolve().parent.parent


def run(args: list[str]) -> str:
    """Run a dimr command, echo and return its stdout."""
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        try:
            main(args)
        except SystemExit as e:
            if e.code:
                raise
    sys.stdout.write(buffer.getvalue())
    return buffer.getvalue()


if __name__ == "__main__":
    torch.set_num_threads(1)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pair", default="mini")
    parser.add_argument("--temperature", default="0.5")
    parser.add_argument("--head", type=Path, default=ROOT / "benchmarks" / "results" / "diversed_mini.safetensors")
    parser.add_argument("--train-steps", default="30")
    parser.add_argument("--docs", type=Path, default=ROOT / "docs")
    args, rest = parser.parse_known_args()
    rest = [a for a in rest if a != "--"]
    if not args.head.is_file():
        run(["diversed", "train", "--pair", args.pair, "--task", "arithmetic", "--steps", args.train_steps,
             "--temperature", args.temperature, "--out", str(args.head)])
    out = run(["bench-relaxed", "--pair", args.pair, "--temperature", args.temperature, "--head", str(args.head),
               "--json-out", str(args.docs / "relaxed_bench.json"), "--plot", str(args.docs / "relaxed_pareto.png"),
               *rest])
    table = "\n".join(line for line in out.splitlines() if line.startswith("|") or line.startswith("collapse?"))
    (args.docs / "relaxed_table.md").write_text(table + "\n")
