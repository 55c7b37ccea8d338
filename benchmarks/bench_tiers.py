"""Every lossless mode at several γ (Γ), lossy via, auto and transformers' assisted generation (with the
draft, the slim verifier and prompt look-up as assistant), on three workloads, greedy and T = 0.7.

    python benchmarks/bench_tiers.py --pair mini --slim benchmarks/results/mini_slim.json --threads 1
    python benchmarks/bench_tiers.py ... --ladder-slim heavy.json   # + rows ladder@γxΓ (see below)

One run: the cost table is measured once (``dimr bench-forward``'s numbers), then per workload and
temperature one ``run_bench`` table, and a summary of the best row per mode as ratios to ``ar`` with the
cost model's prediction beside it. ``--out`` writes every row as JSON.

``--ladder-slim``: the nested ladder beside the draft-model rows: rows ``ladder@γxΓ`` run ``hier`` with this
(more heavily skipped) slim of the same verifier as the draft tier and ``--slim`` as the middle tier (both
from one Pareto study: ``dimr export STUDY --budget K``); no draft model, no extra weights.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from types import SimpleNamespace

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from scipy import stats  # noqa: E402
from transformers.utils import logging  # noqa: E402

from dimr.decoding import DecodeConfig, Decoder  # noqa: E402
from dimr.decoding.bench import WARM, best_rows, format_table, run_bench  # noqa: E402
from dimr.zoo import DATA_DIR  # noqa: E402

MODES = ("ar,sd@1,sd@2,sd@4,self@2,self@4,lookup@2,lookup@4,hier@1x4,hier@2x8,hier@4x12,via,auto")
LADDER_MODES = "ladder@1x4,ladder@2x8,ladder@4x12"
PROSE = ("The history of the printing press begins in", "Once upon a time, in a small village by the sea,",
         "The main causes of the French Revolution were", "Photosynthesis is the process by which",
         # held out (--warm): the first four are the measured set at --prompts 4
         "The first railways in England were built to", "In the winter of that year, the old lighthouse keeper",
         "The human heart has four chambers, and", "Most of the water on Earth is found in",
         # more openings for larger runs (--prompts 16 --warm 4): on a few hundred greedy tokens, where a fixed
         # mode's blocks happen to start moves its speed by several per cent
         "The Roman roads were built so that", "When the storm finally passed, the fishermen",
         "A volcano forms when", "The library in our town was founded by",
         "Bees communicate with each other by", "The recipe for bread has only a few ingredients:",
         "During the nineteenth century, the population of London", "The old clock in the hallway had stopped at",
         "Rivers carry sediment from the mountains to", "The students walked into the classroom and saw",
         "Electric current flows through a wire when", "On the morning of the race, the runners")


def workload(pair: str, name: str, n: int, skip: int = 0) -> list[str]:
    """``n`` prompts of workload ``name`` after its first ``skip``: the SmolLM2 pair's own held-out chat
    prompts, prose and addition task (chat-formatted), else HumanEval, built-in prose openings and the mini
    pair's arithmetic task."""
    if skip:
        out = workload(pair, name, skip + n)[skip:]
        if len(out) < n:
            raise SystemExit(f"workload {name} has {skip + len(out)} prompts, fewer than --prompts + --warm")
        return out
    if pair == "smollm2":
        file, keep = {"code": ("prompts_heldout.jsonl", lambda r: r.get("kind") == "code"),
                      "prose": ("prose_heldout.jsonl", lambda r: True),
                      "task": ("task_addition.jsonl", lambda r: True)}[name]
        rows = [json.loads(line) for line in (DATA_DIR / "smollm2" / file).read_text().splitlines()]
        texts = [r["text"] for r in rows if keep(r)][:n]
        return [" ".join(t.split()[:60]) if name == "prose" else t for t in texts]
    if name == "prose":
        return list(PROSE[:n])
    path = DATA_DIR / {"code": "humaneval_prompts.jsonl", "task": "heldout_task.jsonl"}[name]
    rows = [json.loads(line) for line in path.read_text().splitlines()[:n]]
    return [r.get("prompt") or r["text"] for r in rows]


AUTO_ROWS = ("auto", WARM)
FIXED_LOSSLESS = ("ar", "sd", "self", "lookup", "hier", "ladder")


def auto_goal(rows, mode: str = "auto") -> str:
    """``mode``'s (auto or auto-warm) speed over the best fixed lossless row's (the goal: ≥ 0.95), by both
    measures."""
    auto = next((r for r in rows if r.mode == mode), None)
    fixed = [r for r in rows if r.mode.partition("@")[0] in FIXED_LOSSLESS]
    if auto is None or not fixed:
        return "no auto row"
    best = max(fixed, key=lambda r: r.speedup)
    best_median = max(fixed, key=lambda r: r.speedup_median)
    out = (f"{auto.speedup / best.speedup:.2f} of {best.mode} (fastest pass); "
           f"{auto.speedup_median / best_median.speedup_median:.2f} of {best_median.mode} (median)")
    paired = by_pass(auto, fixed)
    if len(paired) >= 4:  # passes share the machine's state: the ratio within a pass, its median's interval
        ci = stats.bootstrap((paired,), np.median, confidence_level=0.95, method="percentile", random_state=0)
        out += (f"; paired by pass {np.median(paired):.2f} [{ci.confidence_interval.low:.2f}, "
                f"{ci.confidence_interval.high:.2f}]")
    if len(paired) >= 2:
        out += f"; best row picked on other passes {held_out(auto, fixed):.3f}"
    return out


def by_pass(auto, fixed) -> list[float]:
    """``auto``'s speed-up over the best fixed row's (by median over passes), pass by pass."""
    best = max(fixed, key=lambda r: r.speedup_median)
    return [a / b for a, b in zip(getattr(auto, "speedup_passes", []), getattr(best, "speedup_passes", []),
                                  strict=True)]


def held_out(auto, fixed, splits: int = 200) -> float:
    """The paired ratio without the winner's curse: pick the best fixed row (by median) on a random half of the
    passes, take auto's median ratio to it on the other half; the median over ``splits`` halvings (of two passes:
    each held out in turn, the mean of the two ratios)."""
    a = np.array(auto.speedup_passes)
    rows = {r.mode: np.array(r.speedup_passes) for r in fixed}
    rng, out = np.random.default_rng(0), []
    orders = [np.array([0, 1]), np.array([1, 0])] if len(a) == 2 else (rng.permutation(len(a)) for _ in range(splits))
    for order in orders:
        pick, test = order[: len(a) // 2], order[len(a) // 2:]
        best = max(rows, key=lambda m: np.median(rows[m][pick]))
        out.append(np.median(a[test] / rows[best][test]))
    return float(np.mean(out) if len(a) == 2 else np.median(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", default="mini")
    ap.add_argument("--slim")
    ap.add_argument("--ladder-slim", help="a heavier slim config: adds the ladder rows (draft = this slim)")
    ap.add_argument("--ladder-modes", default=LADDER_MODES)
    ap.add_argument("--modes", default=MODES)
    ap.add_argument("--workloads", default="code,prose,task")
    ap.add_argument("--temperatures", default="0,0.7")
    ap.add_argument("--prompts", type=int, default=2, help="prompts per workload")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--passes", type=int, default=1,
                    help="decode the prompt set this many times; per prompt and row the fastest pass counts")
    ap.add_argument("--warm", type=int, default=0, metavar="N",
                    help="add the row auto-warm: auto with a chooser warmed on the workload's next N prompts "
                         "(held out from the measured ones), as a serving process's chooser is")
    ap.add_argument("--no-hf", action="store_true")
    ap.add_argument("--out")
    ap.add_argument("--report", metavar="JSON", nargs="+",
                    help="print the auto goal lines of runs' --out files, and each auto row's per-pass ratios to the "
                         "best fixed row pooled over all their workloads; decode nothing")
    args = ap.parse_args()
    if args.report:
        pooled: dict[str, list[float]] = {mode: [] for mode in AUTO_ROWS}
        missing = [r for r in args.report if not Path(r).is_file()]
        if missing:
            ap.exit(2, f"error: --report {missing[0]}: no such file; pass the --out file of a finished run\n")
        for report in args.report:
            print(report)
            rows = [SimpleNamespace(**r) for r in json.loads(Path(report).read_text())["rows"]]
            for key in dict.fromkeys((r.workload, r.temperature) for r in rows):
                picked = [r for r in rows if (r.workload, r.temperature) == key]
                fixed = [r for r in picked if r.mode.partition("@")[0] in FIXED_LOSSLESS]
                for auto in (r for r in picked if r.mode in AUTO_ROWS):
                    print(f"  {key[0]:<6} T={key[1]} {auto.mode:<9}: " + auto_goal(picked, auto.mode))
                    pooled[auto.mode] += by_pass(auto, fixed)
        for mode, ratios in pooled.items():
            if ratios:
                print(f"{mode} per pass over the best fixed row, {len(ratios)} passes: median {np.median(ratios):.3f}, "
                      f"mean {np.mean(ratios):.3f}, {min(ratios):.2f}–{max(ratios):.2f}, "
                      f"{sum(r >= 0.95 for r in ratios)} ≥ 0.95")
        return
    torch.set_num_threads(args.threads)
    logging.disable_progress_bar()
    t0 = time.time()
    decoder = Decoder.load(args.pair, slim=args.slim, device="cpu")
    modes = [m for m in args.modes.split(",") if decoder.slim or m.partition("@")[0] not in ("self", "via", "hier")]
    if args.warm and WARM not in modes:
        modes.append(WARM)
    ladder = None
    if args.ladder_slim:
        ladder = decoder.ladder(args.ladder_slim)
        modes += args.ladder_modes.split(",")
    summary, dump, goal, tables = [], [], [], []
    for temperature in (float(t) for t in args.temperatures.split(",")):
        for name in args.workloads.split(","):
            config = DecodeConfig(max_new_tokens=args.max_new_tokens, temperature=temperature, top_p=1.0)
            # The table is measured beside the rows it prices: one measured at the start of a long run drifts
            # with the machine's speed (c(full, 1) moved by up to 1.8× between runs on the shared CPU).
            costs = decoder.measure_costs(steps=modes, temperature=temperature)
            tables.append({"workload": name, "temperature": temperature, **costs.to_dict()})
            if ladder is not None:
                ladder.costs = None
            print(f"\npair {args.pair}, {name} T={temperature}: cost table (ms) " + ", ".join(
                f"{t} c(1) {costs(t, 1) * 1e3:.2f} c(5) {costs(t, 5) * 1e3:.2f} c(9) {costs(t, 9) * 1e3:.2f}"
                for t in costs.table) + "; step work per block (ms) " + ", ".join(
                f"{m} {v * 1e3:.2f}" for m, v in (costs.steps or {}).items()), flush=True)
            warm = workload(args.pair, name, args.warm, skip=args.prompts) if WARM in modes else ()
            report = run_bench(decoder, workload(args.pair, name, args.prompts), modes, config, hf=not args.no_hf,
                               ladder=ladder, passes=args.passes, warm=warm)
            print(f"\n## {args.pair} {name} T={temperature}\n\n{format_table(report)}", flush=True)
            best = best_rows(report)
            summary.append((name, temperature, {m: (r.mode, r.speedup, r.model_speedup) for m, r in best.items()}))
            goal.append([(mode, auto_goal(report.rows, mode)) for mode in AUTO_ROWS
                         if any(r.mode == mode for r in report.rows)])
            dump += [{"workload": name, "temperature": temperature, "mode": r.mode, "speedup": r.speedup,
                      "speedup_median": r.speedup_median,
                      "speedup_passes": r.speedup_passes, "model_speedup": r.model_speedup, "nll": r.nll,
                      "same_as_ar": r.same_as_ar, **({"arms": r.arms} if r.arms else {}),
                      **r.stats.to_dict()} for r in report.rows]
    print(f"\n## summary {args.pair}: best row per mode, tok/s ratio to ar (cost-model prediction)\n")
    modes_seen = list(summary[0][2])
    print("| workload | T | " + " | ".join(modes_seen) + " |\n|---|---|" + "---|" * len(modes_seen))
    for name, temperature, best in summary:
        print(f"| {name} | {temperature} | " + " | ".join(
            f"{best[m][1]:.2f}x ({best[m][2]:.2f}x) {best[m][0].partition('@')[2]}" if m in best else "-"
            for m in modes_seen) + " |")
    print("\n`auto` against the best fixed lossless row (fastest pass per prompt; median over passes):\n")
    for (name, temperature, _), lines in zip(summary, goal, strict=True):
        for mode, line in lines:
            print(f"  {name:<6} T={temperature} {mode:<9}: " + line)
    print(f"\n{time.time() - t0:.0f} s in all")
    if args.out:
        extra = {"ladder_costs": ladder.costs.to_dict()} if ladder is not None and ladder.costs else {}
        Path(args.out).write_text(json.dumps({"costs": tables[0], "tables": tables, **extra, "rows": dump}, indent=1))


if __name__ == "__main__":
    main()
