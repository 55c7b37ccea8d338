"""Sweep sd's gamma and draft early-stop against ar (CPU time per token, the steadier clock on a shared box).

    python benchmarks/sweep_sd.py --pair mini --threads 1

Prompts: the first 4 HumanEval prompts and the first 4 held-out arithmetic problems shipped with `mini`.
"""

from __future__ import annotations

import argparse
import itertools
from dataclasses import replace

import torch
from transformers.utils import logging

from dimr.decoding import DecodeConfig, Decoder
from dimr.decoding.bench import run_bench
from dimr.zoo import DATA_DIR


def mini_prompts(n: int = 4) -> list[str]:
    import json

    out = []
    for name, key in (("humaneval_prompts.jsonl", "text"), ("heldout_task.jsonl", "prompt")):
        lines = (DATA_DIR / name).read_text().splitlines()[:n]
        out += [json.loads(line)[key] for line in lines]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--pair", required=True)
    ap.add_argument("--pairs-file")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--gamma", type=int, nargs="*", default=[2, 3, 4, 6])
    ap.add_argument("--draft-stop", type=float, nargs="*", default=[0.0, 0.3, 0.5])
    ap.add_argument("--prompts", type=int, default=4, help="first N HumanEval + first N arithmetic prompts")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    logging.disable_progress_bar()
    from pathlib import Path

    decoder = Decoder.load(args.pair, device="cpu", pairs_file=Path(args.pairs_file) if args.pairs_file else None)
    prompts = mini_prompts(args.prompts)
    base = DecodeConfig(max_new_tokens=args.max_new_tokens)
    print("| gamma | draft stop | cpu speed-up vs ar | wall speed-up | mean acc. len | draft/tok | full/tok |")
    print("|---|---|---|---|---|---|---|")
    for gamma, stop in itertools.product(args.gamma, args.draft_stop):
        report = run_bench(decoder, prompts, ["sd"], replace(base, gamma=gamma, draft_stop=stop), hf=False)
        s = report.rows[1]
        print(f"| {gamma} | {stop} | {s.speedup_cpu:.2f}x | {s.speedup:.2f}x | {s.stats.mean_accepted_length:.2f} | "
              f"{s.stats.calls_per_token('draft'):.2f} | {s.stats.calls_per_token('full'):.2f} |", flush=True)


if __name__ == "__main__":
    main()
