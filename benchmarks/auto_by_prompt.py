"""``auto`` (a cold chooser per pass) against one fixed mode, prompt by prompt, with other rows' decodes interleaved
between them or not: the rows decode each prompt in turn (their order alternating), and the script prints ``auto``'s
speed over the fixed mode's and the seconds ``auto`` lost on each prompt (its tokens at the fixed mode's speed on that
prompt). Losses in the first prompts of a pass are a cold chooser's; losses spread over all prompts come with the
decodes between ``auto``'s. It also prints ``auto``'s choices per arm (how many of its ``ar`` choices had no n-gram
proposal on offer, how many n-gram choices drafted fewer tokens than were offered), each arm's blocks (tokens/s as a
ratio to the fixed mode's, tokens a block: which arms a loss comes from), the time spent choosing, and the last
chooser's time ratios.

    python benchmarks/auto_by_prompt.py --pair mini --slim benchmarks/results/mini_slim.json --workload task \\
        --temperature 0 --prompts 16 --passes 4 --fixed sd@6 --others ar,hier@4x12
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

from dimr.decoding import DecodeConfig
from dimr.decoding.auto import Arm, Chooser, _Decode, arms
from dimr.decoding.bench import parse_spec

sys.path.insert(0, str(Path(__file__).parent))
from ab import load, parser  # noqa: E402


def main() -> None:
    ap = parser(__doc__, "task", 0.0)
    ap.add_argument("--fixed", default="sd@6", help="the fixed mode auto is measured against (mode@gamma)")
    ap.add_argument("--others", default="", help="more rows decoded between them, comma-separated (default: none)")
    args = ap.parse_args()
    dec, prompts = load(args)
    dec.measure_costs()
    cold = dec.auto_chooser(args.temperature)  # the priors `decode` starts from: each pass copies them
    own, eos = arms(draft=True, slim=dec.slim is not None), dec.eos_token_ids()
    rows = ("auto", args.fixed, *[r for r in args.others.split(",") if r])
    seconds = {r: [0.0] * len(prompts) for r in rows}
    tokens = {r: [0] * len(prompts) for r in rows}
    chosen: dict[str, int] = {}  # auto's choices per arm, all passes
    per: dict[str, list[float]] = {}  # arm label → [tokens, seconds, blocks] of its blocks inside auto, all passes
    choosing = [0.0]  # seconds auto spent choosing
    block = _Decode.block

    def timed(self: _Decode, arm: Arm) -> list:
        n, began = self.out.ids.numel(), time.perf_counter()
        seen = block(self, arm)
        row = per.setdefault(arm.label, [0, 0.0, 0])
        row[0], row[1], row[2] = row[0] + self.out.ids.numel() - n, row[1] + time.perf_counter() - began, row[2] + 1
        return seen

    _Decode.block = timed
    short: dict[str, int] = {}  # ... of them, those drafting fewer n-gram tokens than were on offer (ar: none offered)
    for p in range(args.passes):
        chooser = Chooser(cold.costs, own, calibrated=dict(cold.calibrated), worth=dict(cold.worth))
        choose = chooser.choose

        def logged(rng: random.Random, lag: dict, lookup_len: int = 8, *rest: int, choose=choose) -> Arm:
            began = time.perf_counter()
            arm = choose(rng, lag, lookup_len, *rest)
            choosing[0] += time.perf_counter() - began
            if (arm.mode == "ar" and lookup_len == 0) or (arm.mode == "lookup" and lookup_len > arm.gamma):
                short[arm.label] = short.get(arm.label, 0) + 1
            return arm

        chooser.choose = logged
        dec.choosers = {args.temperature: chooser}
        for i, ids in enumerate(prompts):
            for row in (rows if (i + p) % 2 == 0 else rows[::-1]):
                mode, config = parse_spec(row, DecodeConfig(max_new_tokens=args.max_new_tokens, eos_token_ids=eos,
                                                            temperature=args.temperature, seed=1000 * p + i))
                start = time.perf_counter()
                result = dec.run(ids, mode, config)
                seconds[row][i] += time.perf_counter() - start
                tokens[row][i] += len(result.tokens)
                if row == "auto":
                    for arm, n in dec.choosers[args.temperature].chosen.items():
                        chosen[arm] = chosen.get(arm, 0) + n
    speed = {r: sum(tokens[r]) / sum(seconds[r]) for r in rows}
    print(f"auto / {args.fixed}: {speed['auto'] / speed[args.fixed]:.3f};",
          ", ".join(f"{r} {speed[r] / speed[args.fixed]:.3f}" for r in rows))
    lost = [seconds["auto"][i] - tokens["auto"][i] * seconds[args.fixed][i] / tokens[args.fixed][i]
            for i in range(len(prompts))]
    print("seconds lost by prompt:", " ".join(f"{x:+.3f}" for x in lost),
          f"total {sum(lost):.3f} of {sum(seconds['auto']):.2f}")
    print("auto's choices:", ", ".join(f"{a} {n}" for a, n in sorted(chosen.items(), key=lambda x: -x[1])))
    print("of them, ar with no n-gram proposal on offer and n-gram arms drafting fewer tokens than offered:",
          ", ".join(f"{a} {n} of {chosen[a]}" for a, n in sorted(short.items(), key=lambda x: -x[1])))
    print("auto's blocks by arm, tokens/s over the fixed mode's, tokens a block:", ", ".join(
        f"{a} {n / s / speed[args.fixed]:.2f} {n / b:.2f}" for a, (n, s, b) in
        sorted(per.items(), key=lambda x: -x[1][1])))
    print(f"choosing: {choosing[0]:.3f} s of auto's {sum(seconds['auto']):.2f}")
    print("the last chooser's time ratios:", ", ".join(f"{k if isinstance(k, str) else f'{k[0]}|{k[1]}'} {v:.2f}"
                                                      for k, v in sorted(chooser.scale.items(), key=str)))


if __name__ == "__main__":
    main()
