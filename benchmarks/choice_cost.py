"""The decoder's own work per step, outside the forwards: one ``auto`` choice on a warmed chooser (30 arms, drawn
counts, measured time ratios and step work, lags and n-gram offers varying per choice), with the modes far behind
sitting out choices (``Chooser.nap``) and with every mode priced at every choice, and one sampled token by
``dimr.decoding.sampling.sample`` beside ``torch.multinomial`` at mini's and smollm2's vocabularies.

    python benchmarks/choice_cost.py
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import torch

from dimr.decoding.auto import NAP, Chooser, arms, lookup_pair
from dimr.decoding.costs import Costs
from dimr.decoding.sampling import sample

TABLE = Path(__file__).parent / "results" / "bench_tiers_mini_16c.json"  # a measured mini cost table


def warmed(seed: int = 0) -> Chooser:
    """A chooser with every tier pair seen, time ratios off the table and step work per mode."""
    r = random.Random(seed)
    chooser = Chooser(Costs.from_dict(json.loads(TABLE.read_text())["costs"]), arms(True, True))
    for pair in (("draft", "full"), ("slim", "full"), ("draft", "slim")):
        accepted = r.uniform(0, 200)
        chooser.counts[pair] = [accepted, r.uniform(0, 256 - accepted)]
    for ngram in range(4):
        for rest in (False, True):
            chooser.counts[lookup_pair(ngram, rest)] = [r.uniform(0, 100), r.uniform(0, 100)]
    for tier in ("draft", "slim", "full"):
        chooser.scale[tier] = r.uniform(0.8, 1.5)
        chooser.scale.update({(tier, n): r.uniform(0.8, 1.5) for n in (1, 2, 3, 5, 9) if r.random() < 0.7})
    chooser.overhead = {mode: r.uniform(5e-5, 3e-4) for mode in ("ar", "sd", "self", "lookup", "hier")}
    return chooser


def per_call(fn, n: int) -> float:
    for _ in range(min(n, 50)):
        fn()
    began = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - began) / n


def main() -> None:
    torch.set_num_threads(1)
    for nap in (NAP, 0):
        chooser, rng, k = warmed(), random.Random(1), [0]
        chooser.nap = nap

        def choose(chooser=chooser, rng=rng, k=k) -> None:
            i = k[0] = k[0] + 1
            if i % 64 == 0:  # a prompt of 64 choices, over which the tiers' lags grow (as while their modes sit out)
                chooser.new_prompt()
            chooser.choose(rng, {"draft": i % 64 // 8, "slim": i % 64 // 4}, lookup_len=i % 9, ngram=i % 4,
                           remaining=64 - i % 64)

        print(f"auto choice ({'modes far behind sit out' if nap else 'every mode priced'}): "
              f"{per_call(choose, 3000) * 1e6:.0f} us")
    gen = torch.Generator().manual_seed(0)
    for vocab in (4096, 49152):  # mini, smollm2
        probs = torch.softmax(torch.randn(vocab, generator=gen) / 0.7, -1)
        ours = per_call(lambda probs=probs: sample(probs, gen), 2000)
        theirs = per_call(lambda probs=probs: torch.multinomial(probs, 1, generator=gen), 2000)
        print(f"one token of {vocab}: sample {ours * 1e6:.0f} us, torch.multinomial {theirs * 1e6:.0f} us "
              f"({theirs / ours:.1f}x)")


if __name__ == "__main__":
    main()
