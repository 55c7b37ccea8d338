"""What each relaxed rule costs per verification on a vocabulary of the real pair's size, beside the forward.

    python benchmarks/rule_cost.py --vocab 49152 --gamma 2 --threads 1

Random distributions (softmax of scaled Gaussian logits) for γ drafted positions; every rule at the middle of its
grid, `lossless` for reference; the fastest of ``--reps`` calls. `bench-relaxed` times each rule the same way
(`dimr.relaxed.bench.rule_seconds`) and adds its work beyond lossless verification's to its cost-model column: a
rule whose own work is a sizeable share of a forward (Mentored beside smollm2's ≈ 55 ms verifier step) runs slower
than its forwards alone predict.
"""

from __future__ import annotations

import argparse
import time

import torch

from dimr.decoding.sampling import Sampler
from dimr.decoding.verify import Context, lossless
from dimr.relaxed import METHODS, EnsembleHead


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--gamma", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=576, help="hidden size the DIVERSED head reads (smollm2: 576)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    n, v = args.gamma, args.vocab
    sampler = Sampler(temperature=0.7)
    draft_logits, full_logits = torch.randn(n, v) * 3, torch.randn(n + 1, v) * 3
    draft_probs, full_probs = sampler.probs(draft_logits), sampler.probs(full_logits)
    tokens = torch.multinomial(draft_probs, 1)[:, 0]
    context = Context(tokens, draft_logits, full_logits, sampler, torch.randn(n, args.hidden),
                      torch.randn(n + 1, args.hidden))
    head = EnsembleHead(args.hidden, args.hidden)
    rules = {"lossless": lossless}
    for name, m in METHODS.items():
        if name == "lossless":
            continue
        grid = [x for x in m.grid if x != m.off]
        value = grid[len(grid) // 2]
        rules[f"{name} {m.param}={value:g}"] = m.build(head, **{**dict(m.fixed), m.param: value})
    print(f"vocabulary {v}, γ = {n}, {args.threads} thread(s); ms per verification (fastest of {args.reps})")
    for label, rule in rules.items():
        best = float("inf")
        for _ in range(args.reps):
            t0 = time.perf_counter()
            rule(draft_probs, full_probs, context)
            best = min(best, time.perf_counter() - t0)
        print(f"  {label:28s} {best * 1e3:8.2f}")


if __name__ == "__main__":
    main()
