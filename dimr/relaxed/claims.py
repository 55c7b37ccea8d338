"""The seed papers' claims about relaxed verification, as measured evidence from ``bench-relaxed`` rows.

Each function reads the rows of one run (any number of workloads, both drafters) and returns one line per
(workload, drafter) or per method with the numbers a verdict rests on; :func:`evidence` gathers them by claim.
"A useful point" throughout: a relaxed (non-lossless) row faster than lossless decoding at its γ whose quality
stays within :data:`dimr.relaxed.transfer.TOLERANCE` of ``ar``'s (0.05 accuracy, 0.1 nats per token) and whose
outputs do not loop (:func:`dimr.relaxed.bench.collapsed`): the verifier's log-likelihood rewards repetition, so
a loop can keep it while the text is worse.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from dimr.relaxed import METHODS
from dimr.relaxed.bench import Row, collapsed, static_line_gap
from dimr.relaxed.transfer import TOLERANCE, Transfer

CLAIMS = {
    "gamma": "tuning the draft length γ matters as much as relaxing (survey)",
    "ramble": "with a weak drafter most relaxed methods lose capability and ramble (survey)",
    "controlled": "CACTUS and Mentored give controlled deviation even with weak drafters (survey)",
    "confidence": "cascades and fuzzy (trusting the drafter's confidence) give no useful trade-off with a weak "
                  "drafter (survey)",
    "contrastive": "contrastive decoding trades speed for capability with a weak drafter (survey)",
    "transfer": "a parameter tuned on one task does not transfer to another (survey)",
    "diversed": "a learned weight beats the static ensemble's line on time against quality (DIVERSED)",
    "acceptance": "the learned weight lifts acceptance from 21–45% to 70–85% (DIVERSED)",
}


def _groups(rows: Sequence[Row]) -> list[tuple[str, str]]:
    return list(dict.fromkeys((r.workload, r.drafter) for r in rows if r.mode != "ar"))


def _ar(rows: Sequence[Row], workload: str) -> Row | None:
    return next((r for r in rows if r.mode == "ar" and r.workload == workload), None)


def _lossless(rows: Sequence[Row], workload: str, drafter: str) -> dict[int, Row]:
    return {r.gamma: r for r in rows if r.workload == workload and r.drafter == drafter and r.mode != "ar"
            and r.method == "static" and r.value == METHODS["static"].off}


def _relaxed(rows: Sequence[Row], workload: str, drafter: str, methods: Sequence[str] | None = None) -> list[Row]:
    return [r for r in rows if r.workload == workload and r.drafter == drafter and r.mode != "ar" and not r.lossless
            and (methods is None or r.method in methods)]


def _keeps(rows: Sequence[Row], r: Row) -> bool:
    """``r`` is faster than lossless decoding at its γ and keeps ``ar``'s quality within the tolerance."""
    ar, off = _ar(rows, r.workload), _lossless(rows, r.workload, r.drafter).get(r.gamma)
    if ar is None or off is None or math.isnan(r.quality):
        return False
    return r.speed > off.speed and r.quality >= ar.quality - TOLERANCE[ar.metric]


def _loops(rows: Sequence[Row], r: Row) -> bool:
    return any(c is r for c, _ in collapsed(rows))


def useful(rows: Sequence[Row], r: Row) -> bool:
    """``r`` is faster than lossless decoding at its γ, keeps ``ar``'s quality within the tolerance and does
    not loop."""
    return _keeps(rows, r) and not _loops(rows, r)


def _point(r: Row, ar: Row | None) -> str:
    lost = f", lost {ar.quality - r.quality:+.3f}" if ar is not None else ""
    return f"{r.label} {r.speed:.2f}×{lost}"


def gamma_vs_relaxing(rows: Sequence[Row]) -> list[str]:
    """Per (workload, drafter): lossless speed-up at the best γ over the worst, against the best useful point
    over lossless at the same γ."""
    out = []
    for work, drafter in _groups(rows):
        off = _lossless(rows, work, drafter)
        if len(off) < 2:
            continue
        best, worst = max(off.values(), key=lambda r: r.speed), min(off.values(), key=lambda r: r.speed)
        ok = [r for r in _relaxed(rows, work, drafter) if useful(rows, r)]
        top = max(ok, key=lambda r: r.speed, default=None)
        gain = (f"the fastest useful relaxed point, γ={top.gamma} {top.label} {top.speed:.2f}×, is "
                f"{top.speed / best.speed:.2f}× the best lossless γ" if top else "no useful relaxed point")
        out.append(f"{work}/{drafter}: lossless {worst.speed:.2f}× (γ={worst.gamma}) → {best.speed:.2f}× "
                   f"(γ={best.gamma}): γ gains {best.speed / worst.speed:.2f}×; {gain}")
    return out


def gamma_per_method(rows: Sequence[Row]) -> list[str]:
    """Per (workload, drafter, relaxed point) measured at two or more γ: its speed-up at each γ (* where useful),
    what choosing γ gains it (fastest over slowest γ) and what relaxing gains it at its fastest γ (over lossless
    there)."""
    out = []
    for work, drafter in _groups(rows):
        off = _lossless(rows, work, drafter)
        at: dict[tuple[str, float], dict[int, Row]] = {}
        for r in _relaxed(rows, work, drafter):
            at.setdefault((r.method, r.value), {})[r.gamma] = r
        for by_gamma in at.values():
            if len(by_gamma) < 2:
                continue
            pts = sorted(by_gamma.values(), key=lambda r: r.gamma)
            best, worst = max(pts, key=lambda r: r.speed), min(pts, key=lambda r: r.speed)
            relax = (f", relaxing gains {best.speed / off[best.gamma].speed:.2f}× over lossless at γ={best.gamma}"
                     if best.gamma in off else "")
            out.append(f"{work}/{drafter} {best.label}: " + ", ".join(
                f"γ={r.gamma} {r.speed:.2f}×{'*' if useful(rows, r) else ''}" for r in pts)
                + f": γ gains {best.speed / worst.speed:.2f}×{relax}")
    return out


def rambling(rows: Sequence[Row]) -> list[str]:
    """Per drafter: the share of relaxed rows that lose capability (quality below ar − tolerance), the share
    flagged as collapses (much longer or more repetitive than ar), and the mean length and rep4 against ar."""
    flagged = {id(r) for r, _ in collapsed(rows)}
    out = []
    for drafter in dict.fromkeys(d for _, d in _groups(rows)):
        rel = [r for w, d in _groups(rows) if d == drafter for r in _relaxed(rows, w, d)]
        if not rel:
            continue
        lost = [r for r in rel
                if (a := _ar(rows, r.workload)) is not None and r.quality < a.quality - TOLERANCE[a.metric]]
        loops = [r for r in rel if id(r) in flagged]
        length = [r.output_length / a.output_length for r in rel if (a := _ar(rows, r.workload)) is not None]
        rep = [r.repetition - a.repetition for r in rel if (a := _ar(rows, r.workload)) is not None]
        out.append(f"{drafter} draft: {len(lost)}/{len(rel)} relaxed points lose capability, {len(loops)}/{len(rel)} "
                   f"flagged as collapses; output length {sum(length) / len(length):.2f}× ar's (max "
                   f"{max(length):.2f}×), rep4 {sum(rep) / len(rep):+.3f} against ar's (max {max(rep):+.3f})")
    return out


def grid_points(rows: Sequence[Row], methods: Sequence[str]) -> list[str]:
    """Per (workload, drafter, method): every point of its grid as speed-up and quality lost against ar, in
    order of relaxation, and how many are useful."""
    out = []
    for work, drafter in _groups(rows):
        ar = _ar(rows, work)
        for method in methods:
            pts = sorted(_relaxed(rows, work, drafter, [method]), key=lambda r: (r.gamma, METHODS[method].grid.index(
                r.value) if r.value in METHODS[method].grid else 0))
            if pts:
                looping = sum(_keeps(rows, r) and _loops(rows, r) for r in pts)
                note = f"; {looping} more keep the quality but loop" if looping else ""
                out.append(f"{work}/{drafter} {method}: " + "; ".join(f"γ={r.gamma} {_point(r, ar)}" for r in pts)
                           + f" ({sum(useful(rows, r) for r in pts)}/{len(pts)} useful{note})")
    return out


def transfer_summary(moved: Sequence[Transfer]) -> list[str]:
    """Per method: how often the value tuned on one workload keeps the criterion on another, and what it loses
    where it does not (only transfers whose tuned value is a relaxed one: a lossless value always transfers)."""
    out = []
    for method in dict.fromkeys(t.method for t in moved):
        relaxed = [t for t in moved if t.method == method and t.tuned != METHODS[method].off]
        if not relaxed:
            out.append(f"{method}: the criterion picked the lossless value on every source")
            continue
        failed = [t for t in relaxed if not t.holds]
        worst = max(relaxed, key=lambda t: t.lost)
        out.append(f"{method}: {len(relaxed) - len(failed)}/{len(relaxed)} tuned relaxed values hold on the other "
                   f"workload; worst {worst.source} → {worst.target} ({worst.drafter}, γ={worst.gamma}, value "
                   f"{worst.tuned:g}) loses {worst.lost:+.3f}")
    return out


def against_static_line(rows: Sequence[Row], methods: Sequence[str]) -> list[str]:
    """Each point of ``methods`` against the static line at its speed-up (quality minus the line's)."""
    return [f"{r.workload}/{r.drafter} γ={r.gamma} {r.label}: {r.speed:.2f}×, {g:+.3f} against the static line"
            + (" (outside its speed range)" if math.isnan(g) else "")
            for r, g in static_line_gap(rows) if r.method in methods]


def acceptance(rows: Sequence[Row]) -> list[str]:
    """DIVERSED's acceptance beside lossless decoding's at the same γ, and the static ensemble's at a similar
    speed-up."""
    out = []
    for r in (r for r in rows if r.method == "diversed" and r.mode != "ar"):
        off = _lossless(rows, r.workload, r.drafter).get(r.gamma)
        static = [s for s in rows if s.method == "static" and not s.lossless and s.mode != "ar"
                  and (s.workload, s.drafter, s.gamma) == (r.workload, r.drafter, r.gamma)]
        near = min(static, key=lambda s: abs(s.speed - r.speed), default=None)
        out.append(f"{r.workload} γ={r.gamma} {r.label}: acceptance {r.acceptance:.2f}"
                   + (f" (lossless {off.acceptance:.2f})" if off is not None else "")
                   + (f"; static {near.label} at {near.speed:.2f}×: {near.acceptance:.2f}" if near else ""))
    return out


def evidence(rows: Sequence[Row], moved: Sequence[Transfer] = ()) -> dict[str, list[str]]:
    """Every claim of :data:`CLAIMS` with the lines of evidence these rows hold for it (empty: not measured)."""
    return {
        "gamma": gamma_vs_relaxing(rows) + gamma_per_method(rows),
        "ramble": rambling(rows),
        "controlled": grid_points(rows, ("cactus", "mentored")) + against_static_line(rows, ("cactus", "mentored")),
        "confidence": grid_points(rows, ("cascade", "fuzzy")),
        "contrastive": grid_points(rows, ("contrastive",)),
        "transfer": transfer_summary(moved),
        "diversed": against_static_line(rows, ("diversed",)),
        "acceptance": acceptance(rows),
    }
