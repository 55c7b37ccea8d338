"""A fixed ``sd`` whose draft stops when unsure (``sd@G~P``), per drafted position: the share of drafts the draft was
sure of, of tested drafts accepted, and of accepted ones sure; then the (first, rest) rates ``auto`` prices such a block
with (:class:`dimr.decoding.costs.Sure`) and the tokens a block they predict (:func:`dimr.decoding.costs.stopped`)
beside those it made. Blocks the decode's end cuts short are left out.

    python benchmarks/stop_rates.py --pair mini --slim benchmarks/results/mini_slim.json --workload prose \\
        --temperature 0.7 --gamma 6 --stop 0.3
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import torch

from dimr.decoding import DecodeConfig, modes
from dimr.decoding.costs import Sure, stopped
from dimr.decoding.proposer import ModelProposer
from dimr.decoding.sequence import Output
from dimr.decoding.stats import DecodeStats

sys.path.insert(0, str(Path(__file__).parent))
from ab import load, parser  # noqa: E402


def main() -> None:
    ap = parser(__doc__, "prose", 0.7)
    ap.add_argument("--gamma", type=int, default=6)
    ap.add_argument("--stop", type=float, default=0.3)
    args = ap.parse_args()
    dec, prompts = load(args)
    drafted, sure, tested, accepted, kept = Counter(), Counter(), Counter(), Counter(), Counter()
    tokens = blocks = 0
    with torch.inference_mode():
        for seed in range(args.passes):
            for ids in prompts:
                config = DecodeConfig(max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=seed)
                for tier in (dec.full, dec.draft):
                    tier.reset()
                out = Output(ids, config, DecodeStats("sd", args.gamma), [dec.full, dec.draft])
                generator, proposer = config.generator(ids.device), ModelProposer(dec.draft)
                while out.remaining > args.gamma:
                    before, made = out.stats.drafted, len(out.new)
                    (_, _, a, t), = modes.sd_block(proposer, dec.full, out, args.gamma, generator, stop=args.stop)
                    d, s = out.stats.drafted - before, proposer.sure
                    tokens, blocks = tokens + len(out.new) - made, blocks + 1
                    drafted.update(range(d))
                    sure.update(range(min(s, d)))
                    tested.update(range(t))
                    accepted.update(range(a))
                    kept.update(range(min(s, a)))
    for k in sorted(drafted):
        print(f"draft {k + 1}: sure {sure[k] / drafted[k]:.3f} of {drafted[k]}, "
              f"accepted {accepted[k] / max(tested[k], 1):.3f} of {tested[k]}, "
              f"sure {kept[k] / max(accepted[k], 1):.3f} of the accepted")

    def rates(ks: range) -> Sure:
        def share(hits: Counter, of: Counter) -> float:
            return sum(hits[k] for k in ks) / max(sum(of[k] for k in ks), 1)
        return Sure(share(accepted, tested), share(kept, accepted), share(sure, drafted))

    first, rest = rates(range(1)), rates(range(1, args.gamma))
    predicted = stopped(first, rest, args.gamma, 0.0, float)[0]
    print(f"first {first}\nrest {rest}\ntokens a block: predicted {predicted:.3f}, made {tokens / blocks:.3f} over "
          f"{blocks} blocks")


if __name__ == "__main__":
    main()
