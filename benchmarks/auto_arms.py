"""``auto`` arm by arm: each arm's blocks inside ``auto`` (tokens/s as a ratio to ``ar``, tokens a block), beside
``ar`` and one fixed mode, one cold chooser per pass, the rows interleaved prompt by prompt (their order alternating);
and the time ``auto`` spent choosing. Shows which arms a loss against the fixed row comes from.

    python benchmarks/auto_arms.py --pair mini --slim benchmarks/results/mini_slim.json --workload prose \\
        --temperature 0.7 --passes 3 --fixed sd@4
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from dimr.decoding import DecodeConfig
from dimr.decoding import auto as auto_mod
from dimr.decoding.bench import parse_spec

sys.path.insert(0, str(Path(__file__).parent))
from ab import load, parser  # noqa: E402


def main() -> None:
    ap = parser(__doc__, "code", 0.7)
    ap.add_argument("--fixed", default="sd@2", help="the fixed mode beside auto (mode@gamma)")
    args = ap.parse_args()
    dec, prompts = load(args)
    dec.measure_costs()
    cold = dec.auto_chooser(args.temperature)  # the priors `decode` starts from: each pass copies them
    own, eos = auto_mod.arms(draft=True, slim=dec.slim is not None), dec.eos_token_ids()
    per: dict[str, list[float]] = {}  # arm label → [tokens, seconds, blocks]
    choosing = [0.0]
    block, choose = auto_mod._Decode.block, auto_mod.Chooser.choose

    def timed_block(self, arm):  # noqa: ANN001, ANN202
        n, began = self.out.ids.numel(), time.perf_counter()
        seen = block(self, arm)
        row = per.setdefault(arm.label, [0, 0.0, 0])
        row[0] += self.out.ids.numel() - n
        row[1] += time.perf_counter() - began
        row[2] += 1
        return seen

    def timed_choose(self, *a, **k):  # noqa: ANN001, ANN002, ANN003, ANN202
        began = time.perf_counter()
        arm = choose(self, *a, **k)
        choosing[0] += time.perf_counter() - began
        return arm

    auto_mod._Decode.block, auto_mod.Chooser.choose = timed_block, timed_choose
    rows = ("auto", args.fixed, "ar")
    total = {r: [0, 0.0] for r in rows}
    for p in range(args.passes):
        dec.choosers = {args.temperature: auto_mod.Chooser(cold.costs, own, calibrated=dict(cold.calibrated),
                                                           worth=dict(cold.worth))}
        for i, ids in enumerate(prompts):
            for row in (rows if (i + p) % 2 == 0 else rows[::-1]):
                mode, config = parse_spec(row, DecodeConfig(max_new_tokens=args.max_new_tokens, eos_token_ids=eos,
                                                            temperature=args.temperature, seed=1000 * p + i))
                began = time.perf_counter()
                result = dec.run(ids, mode, config)
                total[row][0] += len(result.tokens)
                total[row][1] += time.perf_counter() - began
    ar = total["ar"][0] / total["ar"][1]
    for row, (tokens, seconds) in total.items():
        print(f"{row}: {tokens} tokens in {seconds:.2f} s, {tokens / seconds / ar:.3f}x ar")
    print(f"choosing: {choosing[0]:.3f} s of auto's {total['auto'][1]:.2f} s")
    for label, (tokens, seconds, blocks) in sorted(per.items(), key=lambda kv: -kv[1][1]):
        print(f"{label:10s} blocks {blocks:5d}  tokens {tokens:5d}  {seconds:6.2f} s  {tokens / seconds / ar:.3f}x ar"
              f"  tokens/block {tokens / blocks:.2f}")


if __name__ == "__main__":
    main()
