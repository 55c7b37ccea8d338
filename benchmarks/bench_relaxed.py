"""Relaxed-verification benchmark: the whole pipeline behind docs/relaxed.md, one command.

    python benchmarks/bench_relaxed.py --pair mini --temperature 0.5

1. trains a DIVERSED head on the arithmetic task (``dimr diversed train``, ``--reward``: exact match by default)
   unless ``--head`` exists already, trained for that reward;
2. runs ``dimr bench-relaxed`` four times, in two single-threaded processes: held-out arithmetic with every
   rule swept over its whole grid at γ = 5; HumanEval code prompts likewise; arithmetic and code at γ = 3 and 8
   with lossless decoding and the middle value of every rule;
3. merges them into ``docs/relaxed_bench.json``, ``docs/relaxed_table.md`` and the speed–quality figure
   ``docs/relaxed_pareto.png`` (γ = 5).

Speed-ups are CPU-time ratios against ``ar`` measured in the same process.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def dimr(*args: str) -> list[str]:
    return [sys.executable, "-m", "dimr", *args]


def merge(work: Path, out: Path, pair: str, temperature: str) -> None:
    """Every ``work/*.json`` part into one table, JSON and figure; one ``ar`` row per workload (from a γ = 5 part)."""
    from dimr.relaxed import bench as rb
    from dimr.relaxed.workloads import WORKLOADS

    rows, meta, ar_seen = [], {}, set()
    for path in sorted(work.glob("*.json")):
        part, meta[path.stem] = rb.load_rows(path)
        for r in part:
            if r.mode == "ar":
                if r.workload in ar_seen or 5 not in meta[path.stem].get("gammas", []):
                    continue
                ar_seen.add(r.workload)
            rows.append(r)
    rows.sort(key=lambda r: (WORKLOADS.index(r.workload), r.mode != "ar", r.gamma, r.method))
    rb.save_json(rows, out / "relaxed_bench.json", meta)
    rb.plot(rows, out / "relaxed_pareto.png", 5, title=f"{pair}: speed vs quality, T={temperature}")
    table = rb.format_table(rows) + "\n\n" + "\n".join(f"- collapse? {n}" for n in rb.collapses(rows))
    (out / "relaxed_table.md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pair", default="mini")
    parser.add_argument("--temperature", default="0.5")
    parser.add_argument("--head", type=Path, default=ROOT / "benchmarks" / "results" / "diversed_mini.safetensors")
    parser.add_argument("--train-steps", default="30")
    parser.add_argument("--reward", default="exact", help="the head's reward; a head trained for another is retrained")
    parser.add_argument("--n-arith", default="8")
    parser.add_argument("--n-code", default="6")
    parser.add_argument("--grid-points", default="0", help="values per method grid at γ = 5 (0 = the whole grid)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs")
    parser.add_argument("--merge-only", action="store_true", help="only merge the parts already written")
    args = parser.parse_args()
    work = args.out / "relaxed_parts"
    work.mkdir(parents=True, exist_ok=True)
    if args.merge_only:
        merge(work, args.out, args.pair, args.temperature)
        raise SystemExit(0)
    config = args.head.with_suffix(".json")
    trained_for = json.loads(config.read_text()).get("reward") if config.is_file() else None
    if not args.head.is_file() or trained_for != args.reward:
        subprocess.run(dimr("diversed", "train", "--pair", args.pair, "--task", "arithmetic", "--steps",
                            args.train_steps, "--temperature", args.temperature, "--reward", args.reward,
                            "--out", str(args.head)), check=True)
    common = ["bench-relaxed", "--pair", args.pair, "--temperature", args.temperature, "--head", str(args.head),
              "--grid-points", args.grid_points, "--n-arith", args.n_arith, "--n-code", args.n_code,
              "--code-tokens", "48"]
    parts = {
        "arith5": [*common, "--workloads", "arithmetic", "--gammas", "5", "--sweep-gamma", "5"],
        "code5": [*common, "--workloads", "code", "--gammas", "5", "--sweep-gamma", "5"],
        "arith38": [*common, "--workloads", "arithmetic", "--gammas", "3,8", "--sweep-gamma", "0"],
        "code38": [*common, "--workloads", "code", "--gammas", "3,8", "--sweep-gamma", "0"],
    }
    for key in parts:  # a fresh run of every part (bench-relaxed refuses to overwrite a saved run)
        (work / f"{key}.json").unlink(missing_ok=True)
    logs = {k: open(work / f"{k}.log", "w") for k in parts}  # noqa: SIM115
    first = subprocess.Popen(dimr(*parts["arith5"], "--json-out", str(work / "arith5.json")),
                             stdout=logs["arith5"], stderr=subprocess.STDOUT)
    for key in ("code5", "arith38", "code38"):
        subprocess.run(dimr(*parts[key], "--json-out", str(work / f"{key}.json")), stdout=logs[key],
                       stderr=subprocess.STDOUT, check=True)
    if first.wait():
        raise SystemExit(f"arith5 failed; see {work / 'arith5.log'}")

    merge(work, args.out, args.pair, args.temperature)
