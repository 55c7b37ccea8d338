"""Does a relaxation parameter tuned on one workload transfer to another? (the survey says it does not)

Tuning criterion, per (drafter, γ, method) on the source workload: the grid value with the largest measured
speed-up whose quality stays within :data:`TOLERANCE` of ``ar``'s on that workload (quality ≥ q_ar − tol); the
lossless setting when no relaxed value qualifies. That value is then applied to the target workload, where the
bench ran the same grid, and we report its speed-up, its quality and the capability lost q_ar − q (in the target's
metric: accuracy points or nats per token), beside the value the same criterion picks on the target itself.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from dimr.errors import DimrError
from dimr.relaxed import METHODS
from dimr.relaxed.bench import Row

TOLERANCE = {"exact": 0.05, "loglik": 0.1}  # accuracy points; nats per token


@dataclass
class Transfer:
    drafter: str
    gamma: int
    method: str
    source: str
    target: str
    tuned: float  # the value tuned on the source
    source_speedup: float
    target_speedup: float  # that value on the target
    target_quality: float
    target_ar_quality: float
    lost: float  # q_ar − q on the target at the transferred value
    holds: bool  # the transferred value meets the criterion on the target too
    target_best: float  # the value the criterion picks on the target itself
    target_best_speedup: float


def _off_row(rows: Sequence[Row], drafter: str, gamma: int) -> Row | None:
    """The lossless row at γ (static w = 1): every rule's "off" setting decodes exactly like it."""
    return next((r for r in rows if r.method == "static" and r.value == METHODS["static"].off
                 and r.drafter == drafter and r.gamma == gamma), None)


def tune(grid: dict[float, Row], ar: Row, tol: float) -> float | None:
    """The value of ``grid`` (value → row) with the fastest row whose quality ≥ ar's − ``tol`` (None if none)."""
    ok = [v for v, r in grid.items() if not math.isnan(r.quality) and r.quality >= ar.quality - tol]
    return max(ok, key=lambda v: grid[v].speed) if ok else None


def transfers(rows: Sequence[Row], source: str, target: str, tolerance: dict[str, float] | None = None
              ) -> list[Transfer]:
    """One :class:`Transfer` per (drafter, γ, method) that ran on both workloads."""
    tolerance = {**TOLERANCE, **(tolerance or {})}
    ar = {r.workload: r for r in rows if r.mode == "ar"}
    for w in (source, target):
        if w not in ar:
            raise DimrError(f"--transfer {source}:{target}: the bench did not run workload {w!r}; add it to "
                            "--workloads")
    out = []
    keys = dict.fromkeys((r.drafter, r.gamma, r.method) for r in rows if r.mode != "ar")
    for drafter, gamma, method in keys:
        def grid(work: str, drafter=drafter, gamma=gamma, method=method) -> dict[float, Row]:
            sel = {r.value: r for r in rows if r.workload == work and r.drafter == drafter and r.gamma == gamma
                   and r.method == method}
            off = _off_row([r for r in rows if r.workload == work], drafter, gamma)
            if off is not None:
                sel.setdefault(METHODS[method].off, off)
            return sel

        src, dst = grid(source), grid(target)
        if not src or not dst:
            continue
        picked = tune(src, ar[source], tolerance[ar[source].metric])
        if picked is None or picked not in dst:
            continue
        applied, tol = dst[picked], tolerance[ar[target].metric]
        best = tune(dst, ar[target], tol)
        out.append(Transfer(drafter, gamma, method, source, target, picked, src[picked].speed, applied.speed,
                            applied.quality, ar[target].quality, ar[target].quality - applied.quality,
                            applied.quality >= ar[target].quality - tol,
                            math.nan if best is None else best, math.nan if best is None else dst[best].speed))
    return out


def format_transfers(items: Sequence[Transfer]) -> str:
    """A Markdown table of :func:`transfers`."""
    lines = ["| draft | γ | method | tuned on → applied to | value | speed-up there → here | quality here (ar) | "
             "lost | holds | tuned here (speed-up) |", "|" + "---|" * 10]
    for t in items:
        lines.append(f"| {t.drafter} | {t.gamma} | {t.method} | {t.source} → {t.target} | {t.tuned:g} | "
                     f"{t.source_speedup:.2f} → {t.target_speedup:.2f} | {t.target_quality:.3f} "
                     f"({t.target_ar_quality:.3f}) | {t.lost:+.3f} | {'yes' if t.holds else 'no'} | "
                     f"{t.target_best:g} ({t.target_best_speedup:.2f}) |")
    return "\n".join(lines)


def parse_transfer(spec: str, workloads: Sequence[str]) -> list[tuple[str, str]]:
    """``"task:instruct,instruct:task"`` or ``"all"`` (every ordered pair of ``workloads``) → (source, target)s."""
    if spec == "all":
        return [(a, b) for a in workloads for b in workloads if a != b]
    out = []
    for item in spec.split(","):
        a, sep, b = item.strip().partition(":")
        if not sep or a not in workloads or b not in workloads or a == b:
            raise DimrError(f"--transfer {item!r}: write SOURCE:TARGET with two different workloads of this run "
                            f"({', '.join(workloads)}), or all")
        out.append((a, b))
    return out
