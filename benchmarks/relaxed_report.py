"""The table, collapses, transfer and both figures of a ``dimr bench-relaxed --json-out`` file, finished or not.

    python benchmarks/relaxed_report.py benchmarks/results/relaxed_smollm2_T0.7.json --transfer all \\
        --plot docs/relaxed_smollm2_T0.7.png

A run that is still going (or was interrupted, to be continued with ``--resume``) is reported on the rows it has:
the first lines say how many, and which workloads have no row yet. No model is loaded.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from dimr.relaxed import bench as rb
from dimr.relaxed import claims
from dimr.relaxed import transfer as rt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json", type=Path)
    ap.add_argument("--transfer", default="", help="SOURCE:TARGET[,…] or all (only workloads with rows)")
    ap.add_argument("--plot", type=Path, help="speed–quality PNG (and NAME_length.PNG: output length vs speed)")
    args = ap.parse_args()
    rows, meta = rb.load_rows(args.json)
    have = list(dict.fromkeys(r.workload for r in rows))
    missing = [w for w in meta.get("workloads", {}) if w not in have]
    print(f"{args.json}: {len(rows)} rows; workloads {', '.join(have)}"
          + (f"; none yet for {', '.join(missing)}" if missing else "") + f"; T = {meta.get('temperature')}")
    print(rb.format_table(rows))
    for note in rb.warnings(rows):
        print(note)
    by_loglik = dict((id(r), g) for r, g in rb.static_line_gap(rows, "loglik"))
    gaps = [(r, g) for r, g in rb.static_line_gap(rows) if g == g]
    if gaps:
        print("\nagainst the static line (quality, and log-likelihood per token, minus the line's at the same "
              "speed-up, same workload/draft/γ):")
        for r, g in gaps:
            print(f"  {r.workload:9s} {r.drafter:6s} γ={r.gamma} {r.label:26s} speed-up {r.speed:.2f}  {g:+.3f}"
                  f"  loglik {by_loglik[id(r)]:+.3f}")
    moved = []
    if args.transfer and len(have) > 1:
        pairs = rt.parse_transfer(args.transfer, have)
        moved = [t for a, b in pairs for t in rt.transfers(rows, a, b)]
        print(f"\ntransfer (tuned: fastest with quality ≥ ar − tol, tol {rt.TOLERANCE}):")
        print(rt.format_transfers(moved))
    print("\nthe claims, measured (useful: faster than lossless at its γ, quality within tol of ar):")
    for key, lines in claims.evidence(rows, moved).items():
        print(f"\n- {claims.CLAIMS[key]}")
        for line in lines or ["not measured in these rows"]:
            print(f"    {line}")
    if args.plot:
        rb.plots(rows, args.plot, None, f"{meta.get('pair')}, T={meta.get('temperature')}")
        print(f"wrote {args.plot} and its _length figure")


if __name__ == "__main__":
    main()
