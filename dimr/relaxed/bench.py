"""``dimr bench-relaxed``: every relaxed rule, its main parameter swept, on two held-out workloads.

Workloads (the pair's shipped data, ``dimr/zoo/data``): ``arithmetic`` (the verifiable task; quality = exact-match
accuracy) and ``code`` (HumanEval prompts; quality = the full verifier's mean log-likelihood per output token at
temperature 1, higher is better). Every run decodes the same prompts with the same seed. Per row: acceptance
rate (accepted / tested drafted tokens), mean accepted length (per block) and its prediction
E[Σ_k Π_{t≤k} β_t], output length, tokens/s, speed-up over ``ar`` (end-to-end time for the whole workload, so
longer answers cost what they cost; CPU time of this process when the decoder records it, else wall time) and
the survey's predicted S = (L̄_AR/L̄)·(l̄ + 1)/(1 + γ·c_rel) from the predicted accepted length, quality, and a
repetition score (share of repeated 4-grams) to flag rambling.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from dimr.decoding.decoder import Decoder
from dimr.decoding.sequence import DecodeConfig
from dimr.decoding.stats import DecodeStats
from dimr.decoding.verify import TargetsFn, lossless
from dimr.relaxed import METHODS, EnsembleHead
from dimr.relaxed.predict import Recorder, survey_speedup

WORKLOADS = ("arithmetic", "code")


@dataclass
class Workload:
    name: str
    prompts: list[str]
    answers: list[int | None]
    max_new_tokens: int


def load_workload(name: str, n: int, max_new_tokens: int | None = None, data_dir: Path | None = None) -> Workload:
    """The first ``n`` held-out prompts of ``arithmetic`` or ``code`` (generated if the data is not shipped)."""
    from dimr.zoo import DATA_DIR, task

    data_dir = data_dir or DATA_DIR
    if name == "arithmetic":
        path = data_dir / "heldout_task.jsonl"
        if path.is_file():
            rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()][:n]
        else:  # the generator with the held-out seed of the mini recipe
            rows = [{"prompt": p.prompt, "answer": p.answer} for p in task.generate(1235, n)]
        return Workload(name, [r["prompt"] for r in rows], [int(r["answer"]) for r in rows], max_new_tokens or 96)
    if name == "code":
        path = data_dir / "humaneval_prompts.jsonl"
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()][:n]
        return Workload(name, [r.get("text") or r["prompt"] for r in rows], [None] * len(rows), max_new_tokens or 64)
    raise ValueError(f"unknown workload {name!r}; use one of {WORKLOADS}")


_STEP = re.compile(r"(\d+)([+*-])(\d+)(\+1)?=(\d+)")


def step_accuracy(text: str) -> float:
    """Share of the worked steps (``6+8=14``, ``9+1+1=11``, ``12-6=6``, ``3*7=21``) that are right; 0 if none.

    A graded check of the task's chain of thought, for when exact match is too sparse to compare methods.
    """
    steps = _STEP.findall(text)
    ok = 0
    for a, op, b, carry, c in steps:
        x, y = int(a), int(b)
        value = x + y if op == "+" else x - y if op == "-" else x * y
        ok += value + (1 if carry else 0) == int(c)
    return ok / len(steps) if steps else 0.0


def repetition(tokens: Sequence[int], n: int = 4) -> float:
    """Share of n-grams that already occurred earlier in the output (0 = none; rambling loops approach 1)."""
    grams = [tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]
    return 1 - len(set(grams)) / len(grams) if grams else 0.0


@torch.inference_mode()
def full_loglik(decoder: Decoder, prompt: torch.Tensor, tokens: Sequence[int]) -> tuple[float, int]:
    """Σ log p_full(y_t | ·) at temperature 1 over the output, and its length."""
    if not tokens:
        return 0.0, 0
    y = torch.tensor(tokens, device=prompt.device)
    logits = decoder.full.model(input_ids=torch.cat([prompt, y])[None], logits_to_keep=len(tokens) + 1).logits[0]
    logp = torch.log_softmax(logits[:-1].float(), -1)
    return float(logp[torch.arange(len(tokens)), y].sum()), len(tokens)


@dataclass
class Row:
    workload: str
    method: str
    param: str
    value: float
    gamma: int
    mode: str
    tokens: int = 0
    prompts: int = 0
    acceptance: float = math.nan
    accepted_length: float = math.nan
    predicted_accepted_length: float = math.nan
    output_length: float = math.nan
    tokens_per_second: float = math.nan
    seconds: float = math.nan
    speedup: float = math.nan
    predicted_speedup: float = math.nan
    quality: float = math.nan
    steps: float = math.nan
    loglik: float = math.nan
    repetition: float = math.nan
    c_rel: float = math.nan
    outputs: list[list[int]] = field(default_factory=list, repr=False)

    @property
    def label(self) -> str:
        if self.mode == "ar":
            return "ar"
        lossless = " (lossless sd)" if self.method == "static" and self.value == 1.0 else ""
        return f"{self.method} {self.param}={self.value:g}{lossless}"


def _seconds(stats: DecodeStats) -> float:
    return getattr(stats, "cpu_seconds", 0.0) or stats.wall_seconds


def run_one(decoder: Decoder, work: Workload, config: DecodeConfig, mode: str, rule: TargetsFn,
            check: Callable[[str, int | None], float]) -> tuple[DecodeStats, Recorder | None, Row]:
    """Decode every prompt of ``work`` with ``rule``; return summed stats, β recorder and a partial row."""
    recorder = Recorder(rule) if mode != "ar" else None
    total, quality, steps, loglik, tok_count, rep, outputs = None, 0.0, 0.0, 0.0, 0, 0.0, []
    config = replace(config, max_new_tokens=work.max_new_tokens)
    for k, (text, answer) in enumerate(zip(work.prompts, work.answers, strict=True)):
        prompt = decoder.encode(text)
        per_prompt = replace(config, seed=config.seed + k)  # one seed per prompt: independent draws across prompts
        result = decoder.run(prompt, mode, per_prompt, recorder if recorder is not None else lossless)
        total = result.stats if total is None else total.merge(result.stats)
        out_text = decoder.tokenizer.decode(result.tokens, skip_special_tokens=True)
        quality += check(out_text, answer)
        steps += step_accuracy(out_text)
        ll, n = full_loglik(decoder, prompt, result.tokens)
        loglik, tok_count = loglik + ll, tok_count + n
        rep += repetition(result.tokens)
        outputs.append(result.tokens)
    k = len(work.prompts)
    row = Row(work.name, "", "", math.nan, config.gamma, mode, tokens=total.tokens, prompts=k,
              output_length=total.tokens / k, tokens_per_second=total.tokens / max(_seconds(total), 1e-9),
              seconds=_seconds(total), quality=quality / k, steps=steps / k, loglik=loglik / max(tok_count, 1),
              repetition=rep / k, outputs=outputs)
    if mode != "ar":
        tested = total.accepted + total.rejected
        row.acceptance = total.accepted / tested if tested else math.nan
        row.accepted_length = total.mean_accepted_length
        row.predicted_accepted_length = recorder.predicted_accepted_length
    return total, recorder, row


def sweep(method: str, gammas: Sequence[int], full_grid_gamma: int, points: int | None = None
          ) -> list[tuple[int, float]]:
    """(γ, value) pairs: the grid (``points`` values of it, spread evenly) at ``full_grid_gamma``, its middle else.

    Every "off" value is the same lossless decoder, so it runs once per γ, as the static ensemble's w = 1.
    """
    m = METHODS[method]
    grid = [v for v in m.grid if v != m.off]
    middle = grid[len(grid) // 2]
    if points is not None:  # the reference line and the learned head keep at least 3 and 2 points
        points = max(points, {"static": 3, "diversed": 2}.get(method, 1))
        if points == 1:
            grid = [middle]
        elif points < len(grid):
            grid = [grid[round(k * (len(grid) - 1) / (points - 1))] for k in range(points)]
    off = [m.off] if method == "static" else []
    out = []
    for g in gammas:
        values = off + grid if g == full_grid_gamma else off + [middle]
        out += [(g, v) for v in dict.fromkeys(values)]
    return out


def run_bench(decoder: Decoder, workloads: Sequence[Workload], methods: Sequence[str], config: DecodeConfig,
              gammas: Sequence[int] = (3, 5, 8), full_grid_gamma: int = 5, head: EnsembleHead | None = None,
              progress: Callable[[Row], None] | None = None, points: int | None = None,
              gamma_methods: Sequence[str] | None = None) -> list[Row]:
    """Every (workload, γ, method, value) row plus ``ar`` per workload; speed-ups relative to that ``ar``.

    ``points`` thins each grid; ``gamma_methods`` limits which methods run at the γ other than ``full_grid_gamma``.
    """
    rows: list[Row] = []
    for work in workloads:
        check = _checker(work.name)
        _, _, ar_row = run_one(decoder, work, config, "ar", lossless, check)
        ar_row.method, ar_row.speedup = "ar", 1.0
        rows.append(ar_row)
        if progress:
            progress(ar_row)
        c_rel_by_gamma: dict[int, float] = {}
        for method in methods:
            m = METHODS[method]
            if m.needs_head and head is None:
                continue
            for gamma, value in sweep(method, gammas, full_grid_gamma, points):
                if gamma != full_grid_gamma and gamma_methods is not None and method not in gamma_methods:
                    continue
                params = {**dict(m.fixed), m.param: value}
                rule = m.build(head, **params)
                stats, recorder, row = run_one(decoder, work, replace(config, gamma=gamma), "sd", rule, check)
                row.method, row.param, row.value = method, m.param, value
                if gamma not in c_rel_by_gamma:  # draft/full cost per forward, from the first sd run at γ
                    spent = getattr(stats, "cpu_seconds_tier", None) or stats.seconds
                    per_call = {t: spent[t] / max(stats.calls[t], 1) for t in ("draft", "full")}
                    c_rel_by_gamma[gamma] = per_call["draft"] / max(per_call["full"], 1e-12)
                row.c_rel = c_rel_by_gamma[gamma]
                row.speedup = ar_row.seconds / max(row.seconds, 1e-12)
                row.predicted_speedup = survey_speedup(ar_row.output_length, row.output_length,
                                                       row.predicted_accepted_length, gamma, row.c_rel)
                rows.append(row)
                if progress:
                    progress(row)
    return rows


def _checker(workload: str) -> Callable[[str, int | None], float]:
    if workload == "arithmetic":
        from dimr.zoo.task import is_correct

        return lambda text, answer: float(is_correct(text, answer))
    return lambda text, answer: math.nan


def quality_of(row: Row, metric: str | None = None) -> float:
    """A y axis of the figure: ``exact`` or ``steps`` for the task, ``loglik`` (default for code)."""
    metric = metric or ("exact" if row.workload == "arithmetic" else "loglik")
    return {"exact": row.quality, "steps": row.steps, "loglik": row.loglik}[metric]


PANELS = (("arithmetic", "exact", "accuracy (exact match)"),
          ("arithmetic", "steps", "share of correct worked steps"),
          ("code", "loglik", "full-verifier log-lik / token"))


COLUMNS = ("workload", "γ", "method", "acc.rate", "acc.len", "pred.len", "out.len", "tok/s", "speedup",
           "pred.S", "exact", "steps", "loglik", "rep4")


def format_table(rows: Sequence[Row]) -> str:
    """A Markdown table, one line per row."""
    def f(x: float, p: int = 2) -> str:
        return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{p}f}"

    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in rows:
        q, st = (f(r.quality, 3), f(r.steps, 3)) if r.workload == "arithmetic" else ("–", "–")
        lines.append("| " + " | ".join([
            r.workload, str(r.gamma) if r.mode != "ar" else "–", r.label, f(r.acceptance), f(r.accepted_length),
            f(r.predicted_accepted_length), f(r.output_length, 1), f(r.tokens_per_second, 0), f(r.speedup),
            f(r.predicted_speedup), q, st, f(r.loglik, 3), f(r.repetition)]) + " |")
    return "\n".join(lines)


def collapses(rows: Sequence[Row], length_factor: float = 1.3, rep_margin: float = 0.15) -> list[str]:
    """Rows whose outputs are much longer or much more repetitive than ``ar``'s on the same workload."""
    ar = {r.workload: r for r in rows if r.mode == "ar"}
    notes = []
    for r in rows:
        base = ar.get(r.workload)
        if r.mode == "ar" or base is None or (r.method == "static" and r.value == 1.0):  # lossless: noise only
            continue
        longer = r.output_length > length_factor * base.output_length
        loops = r.repetition > base.repetition + rep_margin
        if longer or loops:
            notes.append(f"{r.workload} γ={r.gamma} {r.label}: output length {r.output_length:.1f} vs ar "
                         f"{base.output_length:.1f}, repeated 4-grams {r.repetition:.2f} vs {base.repetition:.2f}")
    return notes


def save_json(rows: Sequence[Row], path: Path, meta: dict) -> None:
    data = {"meta": meta, "rows": [{k: v for k, v in asdict(r).items() if k != "outputs"} for r in rows]}
    path.write_text(json.dumps(data, indent=1, default=lambda x: None if isinstance(x, float) else str(x)) + "\n")


def load_rows(path: Path) -> tuple[list[Row], dict]:
    """Rows and meta written by :func:`save_json` (to merge runs made in separate processes)."""
    data = json.loads(Path(path).read_text())
    rows = [Row(**{k: (math.nan if v is None and k not in ("method", "param", "mode", "workload") else v)
                   for k, v in r.items()}) for r in data["rows"]]
    return rows, data["meta"]


def plot(rows: Sequence[Row], path: Path, gamma: int, title: str = "") -> Path:
    """Speed–quality plot per workload: the static ensemble as the reference line, every other rule on it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [p for p in PANELS if any(r.workload == p[0] for r in rows)]
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 5), squeeze=False)
    markers = dict(zip(METHODS, "o*sDv^<>ph", strict=False))
    for ax, (work, metric, ylabel) in zip(axes[0], panels, strict=True):
        sel = [r for r in rows if r.workload == work and (r.gamma == gamma or r.mode == "ar")]
        for method in METHODS:
            lossless = [r for r in sel if r.method == "static" and r.value == 1.0]
            grid = METHODS[method].grid  # connect points in order of relaxation, from lossless
            pts = (lossless if method != "static" else []) + sorted(
                (r for r in sel if r.method == method), key=lambda r: grid.index(r.value) if r.value in grid else 0)
            if len(pts) <= len(lossless):
                continue
            xs, ys = [r.speedup for r in pts], [quality_of(r, metric) for r in pts]
            if method == "static":
                ax.plot(xs, ys, "-o", color="black", lw=2, label="static ensemble (reference)", zorder=3)
                for r in pts:
                    ax.annotate(f"w={r.value:g}", (r.speedup, quality_of(r, metric)), fontsize=7, xytext=(3, 3),
                                textcoords="offset points")
            elif method == "diversed":
                ax.plot(xs, ys, "-*", color="crimson", ms=12, lw=2, label="DIVERSED (trained head)", zorder=4)
            else:
                ax.plot(xs, ys, ":", marker=markers[method], alpha=0.8, label=method)
        ar = [r for r in sel if r.mode == "ar"]
        if ar:
            ax.scatter([1.0], [quality_of(ar[0], metric)], marker="x", s=80, color="grey", label="ar", zorder=5)
        ax.set_xlabel("speed-up over ar (end-to-end CPU time)")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{work}, γ={gamma}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
