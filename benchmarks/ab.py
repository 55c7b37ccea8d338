"""What the ``auto`` A/B scripts (``auto_prior_ab.py``, ``auto_table_ab.py``, ``auto_stretch_ab.py``,
``auto_tail_ab.py``, ``auto_probe_ab.py``) share: their command line, and passes in which every variant decodes
every prompt, the variants interleaved prompt by prompt (their order alternating), so all see the same machine
state."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import torch

from dimr.decoding import DecodeConfig, Decoder
from dimr.decoding.auto import Chooser, arms
from dimr.decoding.bench import parse_spec
from dimr.decoding.costs import Costs

sys.path.insert(0, str(Path(__file__).parent))
from bench_tiers import workload  # noqa: E402


def parser(doc: str, workload: str, temperature: float) -> argparse.ArgumentParser:
    """The A/B scripts' common options (a script adds its own before parsing)."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--pair", default="mini")
    ap.add_argument("--slim", default=None)
    ap.add_argument("--workload", default=workload, choices=("code", "prose", "task"))
    ap.add_argument("--temperature", type=float, default=temperature)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--passes", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    return ap


def load(args: argparse.Namespace) -> tuple[Decoder, list[torch.Tensor]]:
    """The decoder on the CPU at ``--threads``, and the workload's prompts encoded."""
    torch.set_num_threads(args.threads)
    dec = Decoder.load(args.pair, slim=args.slim, device="cpu")
    return dec, [dec.encode(t) for t in workload(args.pair, args.workload, args.prompts)]


def interleaved(dec: Decoder, prompts: list[torch.Tensor], args: argparse.Namespace, variants: Sequence[str],
                choosers: Callable[[], dict[str, Chooser]],
                before: Callable[[str], None] | None = None) -> Iterator[dict[str, float]]:
    """Per pass, each variant's tokens/s: a variant named in ``choosers()`` (called once a pass: cold choosers)
    decodes with ``auto`` and that chooser, any other is a row spec (``ar``, ``sd@4``); ``before(variant)``, if
    given, runs before each of its decodes (untimed)."""
    eos = dec.eos_token_ids()
    for p in range(args.passes):
        seconds, tokens = dict.fromkeys(variants, 0.0), dict.fromkeys(variants, 0)
        own = choosers()
        for i, ids in enumerate(prompts):
            for variant in (variants if (i + p) % 2 == 0 else variants[::-1]):
                config = DecodeConfig(max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                                      seed=1000 * p + i, eos_token_ids=eos)
                mode, config = parse_spec("auto" if variant in own else variant, config)
                if variant in own:
                    dec.choosers = {args.temperature: own[variant]}
                if before is not None:
                    before(variant)
                start = time.perf_counter()
                result = dec.run(ids, mode, config)
                seconds[variant] += time.perf_counter() - start
                tokens[variant] += len(result.tokens)
        yield {v: tokens[v] / seconds[v] for v in variants}


def compare(speeds: Iterator[dict[str, float]], variants: Sequence[str], a: str, b: str) -> None:
    """Print each pass's tokens/s of ``variants`` as ratios to ``ar``'s and the ratio of variant ``a`` to ``b``,
    then that ratio's median over the passes."""
    ratios = []
    for p, speed in enumerate(speeds):
        ratios.append(speed[a] / speed[b])
        print(f"pass {p}: x ar: " + ", ".join(f"{v} {speed[v] / speed['ar']:.2f}" for v in variants)
              + f"; {a} / {b} {ratios[-1]:.3f}", flush=True)
    print(f"median {a} / {b} over {len(ratios)} passes: {statistics.median(ratios):.3f}")


def tables_ab(doc: str, workload: str, temperature: float, fixed: str,
              variants: Callable[[Costs], dict[str, Costs]]) -> None:
    """The main of an A/B of two cost tables (``auto_table_ab.py``, ``auto_tail_ab.py``): ``variants`` makes them from
    the table measured now; each prices a cold chooser per pass, beside ``ar`` and ``--fixed``. Prints each table's
    rows and a 60-token catch-up (a tier's c(61) − c(1)), then :func:`compare` of the first variant to the second."""
    ap = parser(doc, workload, temperature)
    ap.add_argument("--fixed", default=fixed, help="a fixed mode to run beside them (mode@gamma)")
    args = ap.parse_args()
    dec, prompts = load(args)
    tables = variants(dec.measure_costs())
    for name, table in tables.items():
        for tier, row in table.table.items():
            print(f"{name} {tier}", " ".join(f"{n}:{c * 1e3:.2f}" for n, c in sorted(row.items())),
                  f"ms; a 60-token catch-up {(table(tier, 61) - table(tier, 1)) * 1e3:.2f} ms")
    cold = dec.auto_chooser(args.temperature)  # the priors `decode` starts from: each pass copies them
    own = arms(draft=True, slim=dec.slim is not None)

    def choosers() -> dict[str, Chooser]:
        return {v: Chooser(t, own, calibrated=dict(cold.calibrated), worth=dict(cold.worth)) for v, t in tables.items()}

    a, b = tables
    names = (a, b, "ar", args.fixed)
    compare(interleaved(dec, prompts, args, names, choosers), names, a, b)


def rules_ab(doc: str, workload: str, temperature: float, fixed: str, rules: dict[str, object],
             apply: Callable[[object], None] | None = None,
             options: Callable[[object, list], dict[str, object]] | None = None) -> None:
    """The main of an A/B of two rules of ``auto`` (``auto_stretch_ab.py``, ``auto_probe_ab.py``,
    ``auto_split_ab.py``): ``apply(rule)`` puts a variant's rule in place before each of its decodes (the first
    variant's before the fixed rows'), ``options(rule, arms)`` gives its chooser's keyword arguments; a cold chooser per
    variant and pass, beside ``ar`` and ``--fixed`` (``options`` may give its own ``arms``, a filter of the decoder's
    own). Prints :func:`compare` of the first to the second."""
    ap = parser(doc, workload, temperature)
    ap.add_argument("--fixed", default=fixed, help="a fixed mode to run beside them (mode@gamma)")
    args = ap.parse_args()
    dec, prompts = load(args)
    dec.measure_costs()
    cold = dec.auto_chooser(args.temperature)  # the priors `decode` starts from: each pass copies them
    own = arms(draft=True, slim=dec.slim is not None)
    a, b = rules

    def choosers() -> dict[str, Chooser]:
        return {v: Chooser(**{"costs": cold.costs, "arms": own, "calibrated": dict(cold.calibrated),
                              "worth": dict(cold.worth), **(options(rule, own) if options else {})})
                for v, rule in rules.items()}

    def before(variant: str) -> None:
        if apply is not None:
            apply(rules.get(variant, rules[a]))

    variants = (a, b, "ar", args.fixed)
    compare(interleaved(dec, prompts, args, variants, choosers, before), variants, a, b)
