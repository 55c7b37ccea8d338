"""Where three tiers beat two: the cost model's region in (c_slim/c_full, slim acceptance, draft acceptance).

    python benchmarks/tier_region.py --pair smollm2 --bench smollm2_tiers.json --out docs/tier_region_smollm2.png

For this CPU's measured costs (a ``dimr bench-forward --out`` table, the ``costs`` of a ``bench_tiers.py
--out`` JSON, or measured now) and for a GPU roofline (``--gpu``, default H200, from the pair's parameter
counts), it colours the predicted speed ratio of the best ``hier`` (draft → slim → full at its best γ, Γ) to
the best two-tier mode (``sd`` or ``self`` at its best γ, or ``ar``) over x = c_slim/c_full (the slim's
forward costs this fraction of the full one at every length) and y = the slim's per-token acceptance against
the full verifier, one panel per acceptance of the draft against the slim. ``sd`` sees the draft against the
full; the model takes it as the product draft→slim × slim→full (a drafted token passes the full verifier
when it passes both, independently). Contours: ratio 1 and 1.15 (the issue's goal).

With ``--bench`` (a ``bench_tiers.py --out`` JSON whose rows carry per-tier-pair acceptance counts) the best
measured ``hier`` row of each workload and temperature is placed at its measured (c_slim/c_full, α_slim→full)
in the panel nearest its α_draft→slim, labelled with its measured ratio to the best two-tier row; ``ladder``
rows (a slim drafts) as squares. The background assumes the pair's draft model's cost, so a ladder point
reads only against its own α and x.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402

from dimr.decoding.costs import Acceptance, Costs, get_gpu, predict, roofline, tier_size  # noqa: E402

LENGTHS = (1, 2, 3, 5, 9, 13, 17)
GAMMAS = (1, 2, 3, 4, 6, 8)
HIER = [(g, w) for g in (1, 2, 3, 4, 6) for w in (4, 8, 12, 16) if w >= g]
DRAFT_ACCEPTANCE = (0.5, 0.7, 0.85, 0.95)


def with_slim(costs: Costs, ratio: float) -> Costs:
    """``costs`` with a slim tier costing ``ratio`` × the full verifier at every length."""
    return Costs({"draft": costs.table["draft"], "full": costs.table["full"],
                  "slim": {n: ratio * c for n, c in costs.table["full"].items()}}, costs.source)


def best_two(costs: Costs, a_ds: float, a_sf: float) -> float:
    acc = Acceptance({("draft", "full"): a_ds * a_sf, ("slim", "full"): a_sf})
    return max([1 / costs("full", 1)] + [predict(m, g, acc, costs) for m in ("sd", "self") for g in GAMMAS])


def best_three(costs: Costs, a_ds: float, a_sf: float) -> float:
    acc = Acceptance({("draft", "slim"): a_ds, ("slim", "full"): a_sf})
    return max(predict("hier", g, acc, costs, window=w) for g, w in HIER)


def region(costs: Costs, xs: np.ndarray, ys: np.ndarray, a_ds: float) -> np.ndarray:
    """ratio[y, x] = best hier / best two-tier, predicted."""
    out = np.empty((len(ys), len(xs)))
    for j, x in enumerate(xs):
        c = with_slim(costs, float(x))
        for i, y in enumerate(ys):
            out[i, j] = best_three(c, a_ds, float(y)) / best_two(c, a_ds, float(y))
    return out


def cpu_costs(args) -> Costs:
    if args.costs:
        data = json.loads(Path(args.costs).read_text())
        return Costs.from_dict(data.get("costs", data.get("measured", data)))
    if args.bench:
        return Costs.from_dict(json.loads(Path(args.bench).read_text())["costs"])
    from dimr.decoding import Decoder
    from dimr.decoding.costs import measure

    dec = Decoder.load(args.pair, device="cpu")
    return measure({"draft": dec.draft, "full": dec.full}, LENGTHS, reps=5)


def measured_points(path: str, costs: Costs) -> list[dict]:
    """The best hier and ladder row of each (workload, T) against the best two-tier row of the same table."""
    rows = json.loads(Path(path).read_text())["rows"]
    x = costs("slim", 1) / costs("full", 1) if "slim" in costs.table else float("nan")
    points = []
    for key in sorted({(r["workload"], r["temperature"]) for r in rows}):
        group = [r for r in rows if (r["workload"], r["temperature"]) == key]
        two = max((r["speedup"] for r in group if r["mode"].partition("@")[0] in ("ar", "sd", "self")), default=1)
        for kind in ("hier", "ladder"):
            mine = [r for r in group if r["mode"].partition("@")[0] == kind and "draft>slim" in r.get("tested", {})]
            if not mine:
                continue
            best = max(mine, key=lambda r: r["speedup"])
            (ad, td), (af, tf) = best["tested"]["draft>slim"], best["tested"]["slim>full"]
            points.append(dict(kind=kind, workload=key[0], temperature=key[1], mode=best["mode"], x=x,
                               a_ds=ad / td, a_sf=af / tf, ratio=best["speedup"] / two,
                               model_ratio=best["model_speedup"] / max(
                                   r["model_speedup"] for r in group if r["mode"].partition("@")[0] in
                                   ("ar", "sd", "self"))))
    return points


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", default="smollm2")
    ap.add_argument("--costs", help="CPU cost table JSON (bench-forward --out); default: --bench's, or measured")
    ap.add_argument("--bench", help="bench_tiers.py --out JSON: its cost table and measured points")
    ap.add_argument("--gpu", default="H200")
    ap.add_argument("--grid", type=int, default=28, help="cells per axis")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="tier_region.png")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    from dimr.pairs import get_pair, load_model

    pair = get_pair(args.pair)
    sizes = {t: tier_size(load_model(pair, role, "cpu")) for t, role in (("draft", "draft"), ("full", "verifier"))}
    profiles = {"this CPU (measured)": cpu_costs(args),
                f"{args.gpu} roofline": roofline(get_gpu(args.gpu), sizes, range(1, 18))}
    points = measured_points(args.bench, profiles["this CPU (measured)"]) if args.bench else []
    xs, ys = np.linspace(0.05, 1.0, args.grid), np.linspace(0.3, 0.99, args.grid)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import LogNorm

    fig, axes = plt.subplots(len(profiles), len(DRAFT_ACCEPTANCE), figsize=(4 * len(DRAFT_ACCEPTANCE), 3.6 * 2),
                             sharex=True, sharey=True, squeeze=False)
    norm = LogNorm(0.5, 2.0)
    print(f"pair {args.pair}: best hier / best two-tier (sd, self, ar), predicted by the cost model")
    for r, (name, costs) in enumerate(profiles.items()):
        c_draft = costs("draft", 1) / costs("full", 1)
        shape = ", ".join(f"c(full,{n})/c(full,1) {costs('full', n) / costs('full', 1):.2f}" for n in (5, 9, 17))
        print(f"\n{name}: c_draft/c_full {c_draft:.3f}; {shape}")
        for k, a_ds in enumerate(DRAFT_ACCEPTANCE):
            ratio = region(costs, xs, ys, a_ds)
            ax = axes[r, k]
            mesh = ax.pcolormesh(xs, ys, ratio.clip(0.5, 2.0), norm=norm, cmap="RdBu", shading="auto")
            lines = ax.contour(xs, ys, ratio, levels=[1.0, 1.15], colors=["k", "k"], linestyles=["-", "--"])
            ax.clabel(lines, fmt={1.0: "1", 1.15: "1.15"}, fontsize=7)
            ax.set_title(f"{name}\nα draft→slim {a_ds}", fontsize=9)
            win, goal = (ratio > 1).mean(), (ratio >= 1.15).mean()
            i, j = np.unravel_index(ratio.argmax(), ratio.shape)
            print(f"  α draft→slim {a_ds}: hier wins on {win:.0%} of the square, ≥ 1.15x on {goal:.0%}; best "
                  f"{ratio.max():.2f}x at c_slim/c_full {xs[j]:.2f}, α slim→full {ys[i]:.2f}")
            if r == 0:
                for p in points:
                    if min(DRAFT_ACCEPTANCE, key=lambda a: abs(a - p["a_ds"])) != a_ds:
                        continue
                    ax.scatter([p["x"]], [p["a_sf"]], marker="o" if p["kind"] == "hier" else "s", s=36,
                               facecolor="none" if p["kind"] == "ladder" else "y", edgecolor="k", zorder=3)
                    ax.annotate(f"{p['workload']} T{p['temperature']:g} {p['ratio']:.2f}x", (p["x"], p["a_sf"]),
                                fontsize=6, xytext=(3, 3), textcoords="offset points")
    for ax in axes[-1]:
        ax.set_xlabel("c_slim / c_full")
    for ax in axes[:, 0]:
        ax.set_ylabel("α slim→full")
    fig.colorbar(mesh, ax=axes, label="best hier / best two-tier (predicted)", shrink=0.8)
    fig.suptitle(f"{args.pair}: where three tiers beat two (blue; solid 1x, dashed 1.15x)")
    fig.savefig(args.out, dpi=110, bbox_inches="tight")
    print(f"\nwrote {args.out}")
    for p in points:
        print(f"measured {p['kind']} {p['mode']} on {p['workload']} T={p['temperature']}: α draft→slim "
              f"{p['a_ds']:.2f}, α slim→full {p['a_sf']:.2f}, c_slim/c_full {p['x']:.2f}: {p['ratio']:.2f}x the "
              f"best two-tier row (cost model on its calls {p['model_ratio']:.2f}x)")


if __name__ == "__main__":
    main()
