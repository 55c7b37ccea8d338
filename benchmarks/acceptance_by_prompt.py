"""How a model draft's acceptance varies by prompt, and whether one per-token rate prices its blocks: fixed ``sd@γ``
decodes, every block's accepted count recorded, per prompt and pooled. Printed per row: the mean accepted length,
the first drafted token's acceptance (p1), a later one's once those before it were accepted (p2), the i.i.d. rate
``auto`` estimates (accepted / tested, a block testing min(k + 1, γ) tokens), and the accepted length each
predicts (:func:`dimr.decoding.costs.expected_tokens` − 1) beside the realised one. With ``--by-match``, also the
first drafted token's acceptance by the length of the n-gram match at the block's position (what ``auto``'s n-gram
arms are priced by; none: the proposer has nothing to offer), over ``--passes`` seeds.

    python benchmarks/acceptance_by_prompt.py --pair smollm2 --slim benchmarks/results/smollm2_light.json \
        --workload code --prompts 6 --gammas 1,2,4
    python benchmarks/acceptance_by_prompt.py --pair smollm2 --slim benchmarks/results/smollm2_light.json \
        --workload task --temperature 0.7 --gammas 1 --passes 2 --by-match
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

import torch
from transformers.utils import logging

from dimr.decoding import DecodeConfig, Decoder, modes
from dimr.decoding.auto import GAMMAS
from dimr.decoding.bench import parse_spec
from dimr.decoding.costs import expected_tokens
from dimr.decoding.proposer import lookup_match

sys.path.insert(0, str(Path(__file__).parent))
from bench_tiers import workload  # noqa: E402


def summary(label: str, ks: list[int], gamma: int) -> str:
    """One row: the blocks' accepted counts ``ks`` at γ = ``gamma`` against the two acceptance models."""
    first = sum(k >= 1 for k in ks) / len(ks)
    rest_tested = sum(min(k + 1, gamma) - 1 for k in ks if k >= 1)
    rest = sum(k - 1 for k in ks if k >= 1) / rest_tested if rest_tested else float("nan")
    iid = sum(ks) / sum(min(k + 1, gamma) for k in ks)
    markov = expected_tokens((first, rest if rest_tested else 0.0), gamma) - 1
    return (f"  {label:<12} blocks {len(ks):4d}  accepted {sum(ks) / len(ks):.2f}  p1 {first:.2f}  p2 {rest:.2f}  "
            f"i.i.d. {iid:.2f}  predicted: i.i.d. {expected_tokens(iid, gamma) - 1:.2f}, (p1, p2) {markov:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", default="smollm2")
    ap.add_argument("--slim")
    ap.add_argument("--workload", default="code")
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--gammas", default="1,2,4")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--passes", type=int, default=1, help="decode the prompts this many times (seed = pass)")
    ap.add_argument("--by-match", action="store_true", help="first-token acceptance by n-gram match length")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    logging.disable_progress_bar()
    dec = Decoder.load(args.pair, slim=args.slim, device="cpu")
    prompts = [dec.encode(p) for p in workload(args.pair, args.workload, args.prompts)]
    config = DecodeConfig(max_new_tokens=args.max_new_tokens, temperature=args.temperature)
    accepted: list[int] = []
    matches: list[int] = []  # per block: the n-gram match length at its position (-1: no proposal)
    block = modes.sd_block

    def recorded(proposer, full, out, gamma, *a, **k):  # sd's blocks, each one's accepted count kept
        proposal, ngram = lookup_match(out.ids, GAMMAS[-1])  # as auto looks it up
        matches.append(ngram if proposal.numel() else -1)
        seen = block(proposer, full, out, gamma, *a, **k)
        accepted.append(seen[0][2])
        return seen

    modes.sd_block = recorded
    try:
        for gamma in (int(g) for g in args.gammas.split(",")):
            print(f"{args.pair} {args.workload} T={args.temperature} sd@{gamma}:")
            pooled, matched = [], []
            for p in range(args.passes):
                for i, ids in enumerate(prompts):
                    accepted.clear()
                    matches.clear()
                    dec.run(ids, *parse_spec(f"sd@{gamma}", replace(config, seed=p)))
                    print(summary(f"prompt {i}" + (f" pass {p}" if args.passes > 1 else ""), accepted, gamma))
                    pooled += accepted
                    matched += matches
            print(summary("all", pooled, gamma))
            if args.by_match:
                for length in sorted(set(matched)):
                    firsts = [min(k, 1) for k, m in zip(pooled, matched, strict=True) if m == length]
                    label = "no match" if length < 0 else f"match {length}"
                    print(f"  first drafted token after {label:<9} {sum(firsts) / len(firsts):.2f} of {len(firsts)}")
    finally:
        modes.sd_block = block


if __name__ == "__main__":
    main()
