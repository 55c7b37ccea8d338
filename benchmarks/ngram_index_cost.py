"""The n-gram look-ups' own time inside ``auto`` decodes: from :class:`~dimr.decoding.proposer.NgramIndex` (the
table kept up to date as the sequence grows) against the tensor search :func:`~dimr.decoding.proposer.lookup_match`
it replaces, each timed per call on the same decodes (the two interleaved prompt by prompt, their order alternating).
Prints µs per call, calls, and the look-ups' share of the decodes' wall time.

    python benchmarks/ngram_index_cost.py --pair mini --slim benchmarks/results/mini_slim.json --workload code \\
        --temperature 0.7 --passes 2
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from dimr.decoding import DecodeConfig
from dimr.decoding.proposer import NgramIndex, lookup_match

sys.path.insert(0, str(Path(__file__).parent))
from ab import load, parser  # noqa: E402

INDEXED = NgramIndex.match


def searched(self: NgramIndex, ids, gamma: int):
    return lookup_match(ids, gamma, self.max_ngram, self.min_ngram)


def main() -> None:
    args = parser(__doc__, "code", 0.7).parse_args()
    dec, prompts = load(args)
    dec.measure_costs()
    eos = dec.eos_token_ids()
    spent = {"index": [0.0, 0, 0.0], "search": [0.0, 0, 0.0]}  # look-up seconds, calls, decode seconds

    def timed(variant: str, match):
        def run(self: NgramIndex, ids, gamma: int):
            began = time.perf_counter()
            out = match(self, ids, gamma)
            spent[variant][0] += time.perf_counter() - began
            spent[variant][1] += 1
            return out
        return run

    dec.run(prompts[0], "auto", DecodeConfig(max_new_tokens=8, eos_token_ids=eos))  # first-call work, untimed
    for p in range(args.passes):
        for i, ids in enumerate(prompts):
            for variant in (("index", "search") if (i + p) % 2 == 0 else ("search", "index")):
                NgramIndex.match = timed(variant, INDEXED if variant == "index" else searched)
                config = DecodeConfig(max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                                      seed=1000 * p + i, eos_token_ids=eos)
                began = time.perf_counter()
                dec.run(ids, "auto", config)
                spent[variant][2] += time.perf_counter() - began
    NgramIndex.match = INDEXED
    for variant, (seconds, calls, wall) in spent.items():
        print(f"{variant}: {seconds / max(calls, 1) * 1e6:.1f} µs a look-up, {calls} look-ups, "
              f"{seconds / wall * 100:.2f}% of the decodes' {wall:.2f} s")


if __name__ == "__main__":
    main()
