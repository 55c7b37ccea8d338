"""`dimr report`: one self-contained HTML page about a study (pictures inlined as PNG data, no script, no
network), and optionally each picture as a PNG file.

What it shows: convergence (every trial's cost in evaluation order, the best so far, seeds and phases marked);
layer importance (the single-skip profile when the study has masks skipping one layer, and each layer's
marginal effect across trials); the Pareto front of a Pareto study; the best masks as layer strips; the top
trials. Plus a note on why Optuna's parameter-importance panel misranks layers under a fixed budget.
"""

from __future__ import annotations

import base64
import html
import io
import math
import os
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

import optuna
from optuna.trial import FrozenTrial, TrialState

from dimr.masks import mask_from_key
from dimr.search import SETTINGS_ATTR, pareto
from dimr.studies import summarize

PHASE_COLORS = {"seed": "#d62728", "retry": "#9467bd", "random": "#7f7f7f", "bayes": "#1f77b4"}
IMPORTANCE_NOTE = (
    "Optuna's parameter-importance panel (optuna-dashboard, optuna.importance) ranks layer_NN parameters by how "
    "much of the cost's variance each one explains across the trials. Under a fixed budget the search learns to "
    "keep the layers that matter in almost every trial, so those parameters barely vary and rank last, while "
    "layers it swaps freely rank first. Read layer importance from the single-skip profile and the marginal "
    "effects on this page instead.")


@dataclass(frozen=True)
class Figure:
    name: str  # the PNG's file name and the HTML section id
    title: str
    caption: str
    png: bytes


def _complete(study: optuna.Study) -> list[FrozenTrial]:
    trials = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    return sorted((t for t in trials if "mask" in t.user_attrs), key=lambda t: t.number)


def _finite(x: float) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def single_skip_profile(trials: list[FrozenTrial], num_layers: int) -> dict[int, float]:
    """Cost of skipping layer i alone, for every layer some trial skipped alone."""
    out = {}
    for t in trials:
        mask = mask_from_key(t.user_attrs["mask"])
        if mask.count(False) == 1 and _finite(pareto.cost_of(t)):
            out[mask.index(False)] = pareto.cost_of(t)
    return {i: out[i] for i in sorted(out) if i < num_layers}


def marginal_effects(trials: list[FrozenTrial], num_layers: int) -> list[float | None]:
    """Per layer: mean log10 cost of the trials that skip it minus that of the trials that keep it (None when
    every trial does the same with it). Positive: skipping the layer costs more."""
    rows = [(mask_from_key(t.user_attrs["mask"]), math.log10(pareto.cost_of(t))) for t in trials
            if _finite(pareto.cost_of(t)) and pareto.cost_of(t) > 0]
    out: list[float | None] = []
    for i in range(num_layers):
        skipped = [c for m, c in rows if not m[i]]
        kept = [c for m, c in rows if m[i]]
        out.append(statistics.fmean(skipped) - statistics.fmean(kept) if skipped and kept else None)
    return out


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return buf.getvalue()


def _convergence(trials: list[FrozenTrial]) -> Figure:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.6))
    xs = list(range(1, len(trials) + 1))
    costs = [pareto.cost_of(t) for t in trials]
    positive = all(_finite(c) and c > 0 for c in costs)
    for phase, color in PHASE_COLORS.items():
        pts = [(x, c) for x, c, t in zip(xs, costs, trials, strict=True) if t.user_attrs.get("phase") == phase]
        if pts:
            ax.scatter(*zip(*pts, strict=True), s=18, color=color, label=phase, zorder=3)
    # A Pareto study has one best per skip count (its 1-skip seed alone would be the overall best).
    skips = [mask_from_key(t.user_attrs["mask"]).count(False) for t in trials]
    groups = sorted(set(skips)) if len(set(skips)) > 1 else [None]
    for k in groups:
        best, run = [], math.inf
        for c, sk in zip(costs, skips, strict=True):
            if _finite(c) and (k is None or sk == k):
                run = min(run, c)
            best.append(run if math.isfinite(run) else math.nan)
        ax.step(xs, best, where="post", color="black", lw=1.5, alpha=1 if k is None else 0.35 + 0.65 * k / max(groups),
                label="best so far" if k is None else f"best, skipping {k}")
    seeds = sum(t.user_attrs.get("phase") == "seed" for t in trials)
    if 0 < seeds < len(trials):
        ax.axvline(seeds + 0.5, color="#d62728", ls=":", lw=1)
    if positive:
        ax.set_yscale("log")
    ax.set_xlabel("evaluation (completed trials in order)")
    ax.set_ylabel("cost")
    ax.legend(fontsize=8, loc="upper right")
    ax.grid(alpha=0.3)
    return Figure("convergence", "Convergence",
                  f"Every completed trial's cost, coloured by phase, and the best so far; the dotted line ends "
                  f"the {seeds} heuristic seeds.", _png(fig))


def _importance(trials: list[FrozenTrial], num_layers: int) -> Figure:
    import matplotlib.pyplot as plt

    profile = single_skip_profile(trials, num_layers)
    effects = marginal_effects(trials, num_layers)
    panels = 2 if profile else 1
    fig, axes = plt.subplots(1, panels, figsize=(8 if panels == 2 else 5.5, 3.2), squeeze=False)
    layers = list(range(num_layers))
    if profile:
        ax = axes[0][0]
        ax.bar(list(profile), list(profile.values()), color="#1f77b4")
        ax.set_title("cost of skipping one layer alone", fontsize=9)
        ax.set_xlabel("layer")
        if all(v > 0 for v in profile.values()):
            ax.set_yscale("log")
    ax = axes[0][-1]
    ax.bar(layers, [e if e is not None else 0 for e in effects],
           color=["#d62728" if (e or 0) > 0 else "#2ca02c" for e in effects])
    ax.axhline(0, color="black", lw=0.8)
    ax.set_title("marginal effect: mean log10 cost, skipped − kept", fontsize=9)
    ax.set_xlabel("layer")
    for a in axes[0]:
        a.set_xticks(layers if num_layers <= 32 else layers[::4])
        a.grid(alpha=0.3, axis="y")
    caption = ("Left: the single-skip profile, from the study's trials that skip exactly one layer. " if profile
               else "No trial of this study skips exactly one layer, so there is no single-skip profile "
                    "(a Pareto study has one). ")
    caption += ("Right: each" if profile else "Each") + (
        " layer's marginal effect across the trials (positive: trials that skip it cost more; 0 where every trial "
        "keeps or skips it).")
    return Figure("importance", "Layer importance", caption, _png(fig))


def _front(study: optuna.Study, trials: list[FrozenTrial], num_layers: int) -> Figure:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    kept = [sum(mask_from_key(t.user_attrs["mask"])) for t in trials]
    ax.scatter(kept, [pareto.cost_of(t) for t in trials], s=14, color="#bbbbbb", label="trials")
    front = pareto.front(study)
    ax.plot([sum(mask_from_key(t.user_attrs["mask"])) for t in front], [pareto.cost_of(t) for t in front],
            "o-", color="#1f77b4", label="front")
    if front:
        knee = pareto.knee(study)
        ax.scatter([sum(mask_from_key(knee.user_attrs["mask"]))], [pareto.cost_of(knee)], s=120,
                   facecolors="none", edgecolors="#d62728", lw=2, label=f"knee (trial {knee.number})", zorder=4)
    if all(_finite(pareto.cost_of(t)) and pareto.cost_of(t) > 0 for t in trials):
        ax.set_yscale("log")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_xlabel(f"kept layers (of {num_layers})")
    ax.set_ylabel("cost")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return Figure("pareto", "Pareto front", f"Cost against kept layers: {len(front)} masks on the front; "
                  "`dimr export --budget K` picks from it, without --budget the knee.", _png(fig))


def _strips(rows: list[dict], num_layers: int) -> Figure:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(4, 0.3 * num_layers + 2), 0.35 * len(rows) + 0.8))
    grid = [[1 if c == "1" else 0 for c in r["mask"]] for r in rows]
    ax.imshow(grid, cmap="Blues", vmin=-0.3, vmax=1, aspect="auto")
    ax.set_yticks(range(len(rows)), [f"trial {r['trial']}" for r in rows])
    ax.set_xticks(range(num_layers) if num_layers <= 32 else range(0, num_layers, 4))
    ax.set_xlabel("layer (dark: kept, light: skipped)")
    return Figure("strips", "Best masks", "The best masks, one strip each: dark layers run, light ones are skipped.",
                  _png(fig))


def build_figures(study: optuna.Study, top: int = 10) -> tuple[list[Figure], dict]:
    """The report's pictures and the study summary (`dimr.studies.summarize`) they come with."""
    import matplotlib

    matplotlib.use("Agg")
    summary = summarize(study, top=top)
    num_layers = int(summary["settings"].get("num_layers") or len(summary["best"][0]["mask"]))
    trials = _complete(study)
    figures = [_convergence(trials), _importance(trials, num_layers)]
    if len(study.directions) > 1:
        figures.append(_front(study, trials, num_layers))
    figures.append(_strips(summary["best"], num_layers))
    return figures, summary


def _fmt(x, spec: str = ".4g") -> str:
    return "-" if x is None else html.escape(format(x, spec))


def _strip_html(mask: str) -> str:
    cells = "".join(f'<span class="{"k" if c == "1" else "s"}" title="layer {i}: {"kept" if c == "1" else "skipped"}">'
                    "</span>" for i, c in enumerate(mask))
    return f'<span class="strip">{cells}</span>'


CSS = """
body{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;color:#222}
h1{font-size:1.5rem}h2{font-size:1.15rem;margin-top:2rem;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:.85rem}td,th{padding:.2rem .6rem;border-bottom:1px solid #eee;text-align:left}
td.num{text-align:right;font-variant-numeric:tabular-nums}code{font-size:.85rem}
img{max-width:100%}.caption{font-size:.85rem;color:#555}
.note{background:#fff8e1;border-left:4px solid #f0b400;padding:.6rem 1rem;font-size:.9rem}
.strip{display:inline-flex;gap:1px}.strip span{width:10px;height:14px;display:inline-block}
.strip .k{background:#2b6cb0}.strip .s{background:#dbe8f6}
"""


def render_html(figures: list[Figure], summary: dict) -> str:
    s, t = summary["settings"], summary["timings"]
    esc = html.escape
    settings_rows = "".join(f"<tr><th>{esc(str(k))}</th><td><code>{esc(str(v))}</code></td></tr>"
                            for k, v in s.items())
    counts = ", ".join(f"{k} {v}" for k, v in summary["counts"].items())
    phases = ", ".join(f"{k} {v}" for k, v in summary["phases"].items())
    parts = [f"<!DOCTYPE html><html lang=en><head><meta charset=utf-8><title>dimr report: {esc(summary['study'])}"
             f"</title><style>{CSS}</style></head><body>",
             f"<h1>Study <code>{esc(summary['study'])}</code></h1>",
             f"<p id=counts>trials: {esc(counts)}; phases: {esc(phases)}; {t['evaluations']} evaluations, mean "
             f"{_fmt(t['mean_eval_s'], '.3f')} s each, wall {_fmt(t['wall_s'], '.1f')} s.</p>",
             f"<details><summary>settings</summary><table id=settings>{settings_rows}</table></details>"]
    for f in figures:
        data = base64.b64encode(f.png).decode()
        parts.append(f'<section id="{f.name}"><h2>{esc(f.title)}</h2><img alt="{esc(f.title)}" '
                     f'src="data:image/png;base64,{data}"><p class=caption>{esc(f.caption)}</p>')
        if f.name == "importance":
            parts.append(f'<p class=note id="importance-note">{esc(IMPORTANCE_NOTE)}</p>')
        parts.append("</section>")
    rows = "".join(
        f"<tr><td class=num>{r['trial']}</td><td>{_strip_html(r['mask'])} <code>{esc(r['mask'])}</code></td>"
        f"<td class=num>{_fmt(r['cost'])}</td><td class=num>{_fmt(r['top1_agreement'], '.4f')}</td>"
        f"<td class=num>{_fmt(r['expected_acceptance'], '.4f')}</td><td>{esc(str(r['phase']))}</td></tr>"
        for r in summary["best"])
    parts.append(f'<section id="top-trials"><h2>Top trials</h2><table><thead><tr><th>trial</th><th>mask (1 = keep)'
                 f'</th><th>cost</th><th>top-1 agreement</th><th>1 − TV</th><th>phase</th></tr></thead><tbody>{rows}'
                 f"</tbody></table><p class=caption>Export one with <code>dimr export {esc(summary['study'])} "
                 "--trial N -o slim.json</code>.</p></section></body></html>")
    return "\n".join(parts)


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes it private; a report is an ordinary file
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_report(study: optuna.Study, output: str | Path, png_dir: str | Path | None = None,
                 top: int = 10) -> list[Path]:
    """Write the HTML report to ``output`` (and each picture to ``png_dir``); returns the PNGs written."""
    from dimr.errors import DimrError

    if not study.user_attrs.get(SETTINGS_ATTR):
        raise DimrError(f"study {study.study_name!r} was not made by dimr; nothing to report")
    if not _complete(study):
        raise DimrError(f"study {study.study_name!r} has no completed trial yet; run `dimr search` first")
    if study.user_attrs[SETTINGS_ATTR].get("granularity", "layer") != "layer":
        raise DimrError(f"study {study.study_name!r} searched sublayer masks, and the report draws whole-layer "
                        f"studies only; see `dimr show {study.study_name}`")
    figures, summary = build_figures(study, top)
    page = render_html(figures, summary)
    written = []
    if png_dir is not None:
        png_dir = Path(png_dir)
        png_dir.mkdir(parents=True, exist_ok=True)
        for f in figures:
            _atomic_write(png_dir / f"{f.name}.png", f.png)
            written.append(png_dir / f"{f.name}.png")
    _atomic_write(Path(output), page.encode())
    return written
