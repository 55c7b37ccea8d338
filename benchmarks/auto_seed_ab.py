"""``auto`` with a model-drafted pair's acceptance kept per prompt, as the n-gram proposer's is: each prompt's posterior
starts from the pooled counts scaled to ``--seed`` tested tokens, plus the prompt's own; against the pooled posterior
alone (faded to :data:`dimr.decoding.auto.HORIZON` tokens, the rule in ``auto``), beside ``ar`` and one fixed mode:
one cold chooser per variant and pass, the variants interleaved prompt by prompt (their order alternating), so all see
the same machine state. Prints each pass's tokens/s and the ratio of the two variants. With ``--replay``, each
variant's choices are instead replayed without the clock (``auto_replay.py``, whose options follow) on greedy outcomes
and a saved cost table.

    python benchmarks/auto_seed_ab.py --pair smollm2 --slim benchmarks/results/smollm2_light.json --workload code \\
        --temperature 0 --prompts 6 --max-new-tokens 48 --passes 4 --fixed sd@4 --seed 24
    python benchmarks/auto_seed_ab.py --replay --seed 24 --pair smollm2 --slim benchmarks/results/smollm2_light.json \\
        --workloads code,task --prompts 12 --max-new-tokens 48 --seeds 8 \\
        --tables benchmarks/results/bench_tiers_smollm2_6k.json --paths paths_smollm2.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dimr.decoding.auto import LOOKUP, Chooser, _count

sys.path.insert(0, str(Path(__file__).parent))
from ab import rules_ab  # noqa: E402

POOLED = Chooser.evidence, Chooser.observe, Chooser.seeded


def evidence(self: Chooser, pair: tuple[str, str], ngram: int = 0, rest: bool = False) -> tuple[float, float]:
    if pair == LOOKUP:
        return POOLED[0](self, pair, ngram, rest)
    return tuple(self.seeded(pair))


def seeded(self: Chooser, pair: tuple[str, str]) -> list[float]:
    if pair[0].startswith("lookup") or pair in self.local:
        return POOLED[2](self, pair)
    counts = self.counts.get(pair, [0.0, 0.0])
    self.local[pair] = [c * min(1.0, OPTS.seed / max(sum(counts), 1e-9)) for c in counts]
    return self.local[pair]


def observe(self: Chooser, observations: list) -> None:
    for proposer, target, accepted, tested in observations:
        own = self.seeded((proposer, target))
        for c in (self.counts.setdefault((proposer, target), [0.0, 0.0]), own):
            _count(c, accepted, tested - accepted)
        self._check((proposer, target))


def use(rule: object) -> None:
    Chooser.evidence, Chooser.observe, Chooser.seeded = POOLED if rule == "pooled" else (evidence, observe, seeded)


# this script's own options; the rest go to the shared parser (or to auto_replay.py's)
_own = argparse.ArgumentParser(add_help=False)
_own.add_argument("--seed", type=float, default=24.0, help="tested tokens of pooled evidence a prompt starts from")
_own.add_argument("--replay", action="store_true", help="replay greedy outcomes without the clock (auto_replay.py)")
OPTS, sys.argv[1:] = _own.parse_known_args()

if __name__ == "__main__":
    rules = {f"prompt{OPTS.seed:g}": "prompt", "pooled": "pooled"}
    if OPTS.replay:
        from auto_replay import main

        for name, rule in rules.items():
            print(f"== {name}", flush=True)
            use(rule)
            main()
    else:
        rules_ab(__doc__, "code", 0.0, "sd@4", rules, use)
