"""Whether a model draft's acceptance is i.i.d. past its first draft, as ``auto`` prices it: blocks of ``sd`` at one γ
(``auto`` with that one arm, so each block's emitted tokens are traced), and P(draft k accepted | the k − 1 before
were) for k = 1…γ from the accepted lengths (the decode's last block, cut by its end, left out).

    python benchmarks/draft_runs.py --pair mini --slim benchmarks/results/mini_slim.json --workload prose \\
        --temperature 0.7 --passes 2 --gamma 6
"""

from __future__ import annotations

import sys
from pathlib import Path

from dimr.decoding import DecodeConfig
from dimr.decoding.auto import Arm, Chooser, auto
from dimr.decoding.costs import Costs

sys.path.insert(0, str(Path(__file__).parent))
from ab import load, parser  # noqa: E402


def main() -> None:
    ap = parser(__doc__, "prose", 0.7)
    ap.add_argument("--gamma", type=int, default=6)
    args = ap.parse_args()
    dec, prompts = load(args)
    costs = Costs({t: {1: 1.0} for t in ("draft", "slim", "full")}, "flat")  # one arm: the prices do not matter
    lengths = [0] * (args.gamma + 1)  # blocks by accepted drafts
    for p in range(args.passes):
        for i, ids in enumerate(prompts):
            chooser = Chooser(costs, [Arm("sd", args.gamma)], adapt=False, stop=0.0)
            chooser.counts[("draft", "full")] = [1e3, 0.0]  # past the γ cap from the first block
            trace: list = []
            config = DecodeConfig(max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                                  seed=1000 * p + i, eos_token_ids=dec.eos_token_ids())
            auto(chooser, dec.full, dec.draft, dec.slim, ids, config, dec.vocab_size, trace)
            for *_, emitted in trace[:-1]:
                lengths[min(len(emitted) - 1, args.gamma)] += 1
    reach = sum(lengths)
    print(f"{reach} blocks of sd@{args.gamma}; accepted drafts: {lengths}")
    for k in range(1, args.gamma + 1):
        further = sum(lengths[k:])
        print(f"P(draft {k} accepted | {k - 1} before were) = {further / reach:.3f}  ({reach} blocks)")
        reach = further


if __name__ == "__main__":
    main()
