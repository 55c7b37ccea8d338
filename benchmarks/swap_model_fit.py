"""How well the swap proposer's model ranks a mask's swap neighbours, from a search-quality cost table.

    python benchmarks/swap_model_fit.py --table benchmarks/results/search_quality_smollm2_table.json --skip 8

For the single-skip-rank seed of ``--skip`` (needs the L single-layer skips in the table) and its neighbours in
the table: fit the model (`dimr.search.proposers.swap`) to the seed and ``n`` random neighbours, then report,
over ``--repeats`` draws of those ``n``, Spearman's ρ between predicted and true cost on the other neighbours
and the true cost of the neighbour the acquisition would pick: the posterior mean's or one posterior draw's,
with and without the profile's additive baseline. No model is loaded: every number comes from the table.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dimr.masks import Budget, mask_key, swaps  # noqa: E402
from dimr.search import heuristics  # noqa: E402
from dimr.search.proposers import swap  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--table", type=Path, required=True)
    ap.add_argument("--key", default=None, help="the table's key (default: the one with the most masks)")
    ap.add_argument("--skip", type=int, default=8)
    ap.add_argument("--fits", default="5,15,30", help="neighbours the model is fit to")
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args(argv)
    tables = json.loads(args.table.read_text())
    costs = tables[args.key or max(tables, key=lambda k: len(tables[k]["costs"]))]["costs"]
    layers = len(next(iter(costs)))
    profile = [costs[mask_key(m)] for m in heuristics.single_skip_masks(layers)]
    seed = heuristics.single_skip_rank(Budget(layers, args.skip), profile)
    near = [m for m in swaps(seed) if mask_key(m) in costs]
    truth = np.array([costs[mask_key(m)] for m in near])
    rng = np.random.default_rng(0)
    p = swap.SwapProposer()
    out = {"seed": mask_key(seed), "seed_cost": costs[mask_key(seed)], "neighbours": len(near),
           "best_neighbour": float(truth.min()),
           "baseline_rho": float(spearmanr(swap.baseline(near, profile), truth).statistic), "rows": []}
    for n in (int(x) for x in args.fits.split(",")):
        for base in (None, profile):
            for explore in (0.0, 1.0):
                rho, picked = [], []
                for _ in range(args.repeats):
                    idx = rng.permutation(len(near))
                    fit, rest = [seed] + [near[i] for i in idx[:n]], idx[n:]
                    w = p.sample_weights_batch(fit, [costs[mask_key(m)] for m in fit], [rng], base, explore)[:, 0]
                    pool = [near[i] for i in rest]
                    pred = swap.features(pool) @ w + swap.baseline(pool, base)
                    rho.append(spearmanr(pred, truth[rest]).statistic)
                    picked.append(truth[rest][int(np.argmin(pred))])
                out["rows"].append({"fit": n, "baseline": base is not None, "acquisition":
                                    "mean" if explore == 0 else "draw", "rho": float(np.mean(rho)),
                                    "picked_median": float(np.median(picked))})
    print(f"skip {args.skip}: seed {out['seed']} ({out['seed_cost']:.4g}), {len(near)} neighbours in the table "
          f"(best {out['best_neighbour']:.4g}); the additive baseline alone ranks them at "
          f"ρ = {out['baseline_rho']:.2f}")
    print("| fit to | baseline | acquisition | ρ | picked (median true cost) |\n|---|---|---|---|---|")
    for r in out["rows"]:
        print(f"| {r['fit']} | {'yes' if r['baseline'] else 'no'} | {r['acquisition']} | {r['rho']:.2f} | "
              f"{r['picked_median']:.4g} |")
    return out


if __name__ == "__main__":
    main()
