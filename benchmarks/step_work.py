"""A fixed ``sd`` decode's time outside its forwards, per block, at each γ; and the draft's first forward in a block
against its later ones. ``auto`` prices a block's step work per verified token (γ + 1) and every draft forward of a
size alike; this shows how far each holds.

    python benchmarks/step_work.py --pair mini --slim benchmarks/results/mini_slim.json --workload task
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from transformers.utils import logging

from dimr.decoding import DecodeConfig, Decoder
from dimr.decoding.bench import parse_spec

sys.path.insert(0, str(Path(__file__).parent))
from bench_tiers import workload  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", default="mini")
    ap.add_argument("--slim")
    ap.add_argument("--workload", default="task", choices=("code", "prose", "task"))
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--gammas", default="1,2,3,4,6,8")
    ap.add_argument("--reps", type=int, default=2)
    args = ap.parse_args()
    logging.disable_progress_bar()
    torch.set_num_threads(1)
    dec = Decoder.load(args.pair, slim=args.slim, device="cpu")
    prompts, eos = [dec.encode(t) for t in workload(args.pair, args.workload, args.prompts)], dec.eos_token_ids()
    for rep in range(args.reps):
        for gamma in map(int, args.gammas.split(",")):
            total = forwards = 0.0
            blocks, first, later, full = 0, [], [], []
            for i, ids in enumerate(prompts):
                mode, config = parse_spec(f"sd@{gamma}", DecodeConfig(max_new_tokens=args.max_new_tokens, seed=i,
                                                                      temperature=args.temperature, eos_token_ids=eos))
                dec.draft.log, dec.full.log = [], []
                began = time.perf_counter()
                result = dec.run(ids, mode, config)
                total += time.perf_counter() - began
                forwards += sum(s for t in (dec.draft, dec.full) for _, s in t.log)
                blocks += result.stats.blocks
                drafts = dec.draft.log[1:]  # after the prompt's prefill: γ forwards a block (the last may be cut)
                for b in range(0, len(drafts), gamma):
                    first.append(drafts[b][1])
                    later += [s for _, s in drafts[b + 1:b + gamma]]
                full += [s for _, s in dec.full.log[1:]]
                dec.draft.log = dec.full.log = None
            print(f"rep {rep} sd@{gamma}: outside forwards {1e3 * (total - forwards) / blocks:.3f} ms a block, "
                  f"{1e3 * (total - forwards) / blocks / (gamma + 1):.3f} per verified token; draft forward first "
                  f"{1e3 * statistics.mean(first):.3f} ms, later "
                  f"{1e3 * statistics.mean(later) if later else float('nan'):.3f}; "
                  f"full {1e3 * statistics.mean(full):.3f}; {blocks} blocks", flush=True)


if __name__ == "__main__":
    main()
