"""Three ways ``auto`` rescales its cost table by measured times, beside ``ar`` and one fixed mode: ``fade`` (each
forward size's own measured/tabled ratio, a size not run in a block fading toward its tier's: the rule in
:mod:`dimr.decoding.auto`), ``keep`` (each size's ratio kept until it runs again, the rule before) and ``level`` (a
tier's ratio, its level, times each size's own deviation from it, the deviation learnt five times slower, so a size
not run moves with its tier and keeps what was learnt of its shape). One cold chooser per variant and pass, the
variants interleaved prompt by prompt (their order alternating), so all see the same machine state. Prints each pass's
tokens/s as ratios to ``ar`` and the other variants' ratios to ``fade``, then their medians.

    python benchmarks/auto_level_ab.py --pair mini --slim benchmarks/results/mini_slim.json --workload task \\
        --temperature 0 --prompts 16 --passes 8 --fixed sd@6
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from dimr.decoding import auto
from dimr.decoding.auto import OBSERVED, RATE, RATIO_BOUNDS, STALL, Chooser, arms
from dimr.decoding.costs import FREE

sys.path.insert(0, str(Path(__file__).parent))
from ab import interleaved, load, parser  # noqa: E402

SHAPE_RATE = RATE / 5


def level_price(self: Chooser, tier: str, n: int) -> float:
    if tier == FREE:
        return 0.0
    return self.tabled(tier, n) * self.scale.get(tier, 1.0) * self.scale.get((tier, n), 1.0)


def level_observe(self: Chooser, tier: str, forwards: list[tuple[int, float]]) -> None:
    if not self.adapt:
        return
    for n, seconds in forwards:
        if seconds <= 0 or n > OBSERVED:
            continue
        ratio = min(max(seconds / self.tabled(tier, n), RATIO_BOUNDS[0]), RATIO_BOUNDS[1])
        level, shape = self.scale.get(tier, 1.0), self.scale.get((tier, n), 1.0)
        now = level * shape
        step = min(max(ratio, now / STALL), now * STALL)  # a stall moves the price by a factor ~1 + RATE at most
        level += RATE * (step / shape - level)
        self.scale[tier], self.scale[(tier, n)] = level, shape + SHAPE_RATE * (step / level - shape)


RULES = {"fade": (Chooser.price, Chooser.observe_forwards, auto.FADE),
         "keep": (Chooser.price, Chooser.observe_forwards, 0.0),
         "level": (level_price, level_observe, 0.0)}


def use(variant: str) -> None:
    Chooser.price, Chooser.observe_forwards, auto.FADE = RULES.get(variant, RULES["fade"])


def main() -> None:
    ap = parser(__doc__, "task", 0.0)
    ap.add_argument("--fixed", default="sd@6", help="a fixed mode to run beside them (mode@gamma)")
    args = ap.parse_args()
    dec, prompts = load(args)
    dec.measure_costs()
    cold = dec.auto_chooser(args.temperature)
    own = arms(draft=True, slim=dec.slim is not None)

    def choosers() -> dict[str, Chooser]:
        return {v: Chooser(cold.costs, own, calibrated=dict(cold.calibrated), worth=dict(cold.worth)) for v in RULES}

    variants = (*RULES, "ar", args.fixed)
    ratios = {v: [] for v in variants if v != "fade"}
    for p, speed in enumerate(interleaved(dec, prompts, args, variants, choosers, use)):
        for v in ratios:
            ratios[v].append(speed[v] / speed["fade"])
        print(f"pass {p}: x ar: " + ", ".join(f"{v} {speed[v] / speed['ar']:.2f}" for v in variants)
              + "; / fade: " + ", ".join(f"{v} {ratios[v][-1]:.3f}" for v in ("keep", "level")), flush=True)
    print(f"medians over {args.passes} passes, / fade: "
          + ", ".join(f"{v} {statistics.median(r):.3f}" for v, r in ratios.items()))


if __name__ == "__main__":
    main()
