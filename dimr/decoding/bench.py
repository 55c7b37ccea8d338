"""Side-by-side decoding benchmark: every mode on one prompt set, plus transformers' assisted generation.

``dimr bench-decode`` and ``benchmarks/bench_decode.py`` both call :func:`run_bench` and print
:func:`format_table`. Per row: tokens/s and speed-up over ``ar``; the survey's predicted speed-up
S ≈ (l_accept + 1) / (1 + γ·c_rel) next to it, generalised to three tiers as tokens / Σ_tier calls·c_tier
with c_tier = a tier's mean forward time / the full verifier's mean forward time in ``ar`` (for ``sd`` this is
exactly the survey's formula); mean accepted length, rejection rate, forward calls per token per tier,
output length, quality (mean NLL of the output under the full verifier at temperature 1; lower is better,
and for greedy decoding, how many outputs equal ``ar``'s) and the time spent in each tier.

With ``compiled=True`` every mode also runs on static caches with compiled forwards (rows ``ar+c``…, the
same models): their speed-up, c_rel and predicted S are relative to ``ar+c``, and tokens/s shows what the
compilation gained over the eager rows.
"""

from __future__ import annotations

import copy
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import torch

from dimr.decoding.costs import Costs, measure, predict_from_counts
from dimr.decoding.decoder import Decoder
from dimr.decoding.sequence import DecodeConfig
from dimr.decoding.stats import TIERS, DecodeStats
from dimr.errors import DimrError

HF = "hf-assisted"
HF_SLIM = "hf-slim"
HF_LOOKUP = "hf-lookup"
HF_PEERS = (HF, HF_SLIM, HF_LOOKUP)
COMPILED = "+c"  # suffix of the rows decoded with static caches and compiled forwards
LADDER = "ladder"  # rows ``ladder@γxΓ``: hier on the ladder decoder (a heavier slim drafts for the slim)
WARM = "auto-warm"  # auto whose chooser starts every pass as one warmed on held-out prompts (a serving process)

DEFAULT_PROMPTS = (
    "def fibonacci(n):\n",
    "import os\n\n\ndef list_files(path):\n",
    "class Stack:\n    def __init__(self):\n",
    "def is_prime(n):\n    \"\"\"Return True if n is prime.\"\"\"\n",
    "def read_json(path):\n",
    "for i in range(10):\n",
    "def merge_sort(items):\n",
    "def word_count(text):\n",
)


@dataclass
class BenchRow:
    mode: str
    stats: DecodeStats
    outputs: list[list[int]] = field(default_factory=list)
    nll: float = float("nan")
    same_as_ar: int | None = None
    speedup: float = float("nan")
    speedup_cpu: float = float("nan")
    predicted: float = float("nan")
    modelled: float = float("nan")  # tokens/s the cost table predicts from this row's calls and tokens fed
    model_speedup: float = float("nan")  # modelled / ar's modelled: the prediction of ``speedup`` (prefill included)
    speedup_median: float = float("nan")  # median over passes of the pass's tok/s ratio to ar's in that pass
    speedup_passes: list[float] = field(default_factory=list)  # each pass's tok/s ratio to ar's in that pass
    arms: dict[str, int] = field(default_factory=dict)  # auto rows: choices per arm (sd/2, lookup/1…), all passes


@dataclass
class BenchReport:
    rows: list[BenchRow]
    config: DecodeConfig
    prompts: int
    c_rel: dict[str, float]
    c_rel_compiled: dict[str, float] | None = None
    costs: Costs | None = None


def _hf_assisted(decoder: Decoder, prompt: torch.Tensor, config: DecodeConfig,
                 name: str = HF) -> tuple[list[int], DecodeStats]:
    """transformers' own assisted generation (its default candidate schedule), with forward calls counted:
    the draft model (``hf-assisted``), the slim verifier (``hf-slim``) or prompt look-up (``hf-lookup``)
    as the assistant."""
    stats = DecodeStats(name, config.gamma)
    assistant = {HF: decoder.draft, HF_SLIM: decoder.slim, HF_LOOKUP: None}[name]
    hooks, started = [], {}
    for tier in (decoder.full, assistant):
        if tier is None:
            continue

        def pre(_m, _a, tier=tier.name):
            started[tier] = time.perf_counter(), time.process_time()

        def post(_m, args, kwargs, _o, tier=tier.name):
            stats.calls[tier] += 1
            ids = kwargs.get("input_ids", args[0] if args else None)
            n = ids.shape[-1] if ids is not None else 0
            stats.fed[tier] += n
            stats.forwards[tier][n] = stats.forwards[tier].get(n, 0) + 1
            stats.seconds[tier] += time.perf_counter() - started[tier][0]
            stats.cpu_seconds_tier[tier] += time.process_time() - started[tier][1]

        hooks += [tier.model.register_forward_pre_hook(pre),
                  tier.model.register_forward_hook(post, with_kwargs=True)]
    sample = config.temperature > 0
    kwargs = dict(do_sample=sample, temperature=config.temperature if sample else None,
                  top_p=config.top_p if sample else None, top_k=None)
    kwargs.update(prompt_lookup_num_tokens=config.gamma) if assistant is None else kwargs.update(
        assistant_model=assistant.model)
    eos = list(config.eos_token_ids) or None
    try:
        torch.manual_seed(config.seed)
        t0, c0 = time.perf_counter(), time.process_time()
        out = decoder.full.model.generate(prompt[None], max_new_tokens=config.max_new_tokens, eos_token_id=eos,
                                          pad_token_id=eos[0] if eos else None, **kwargs)
        stats.wall_seconds = time.perf_counter() - t0
        stats.cpu_seconds = time.process_time() - c0
    finally:
        for h in hooks:
            h.remove()
    tokens = out[0, prompt.numel():].tolist()
    stats.tokens = len(tokens)
    return tokens, stats


def parse_spec(name: str, config: DecodeConfig) -> tuple[str, DecodeConfig]:
    """A row name → (mode, its config): ``sd@2`` is sd at γ = 2, ``hier@2x8`` hier at γ = 2 and Γ = 8, ``sd@6~0.3``
    sd at γ = 6 whose draft stops after a token it gives less than 0.3 (``--draft-stop``)."""
    mode, _, shape = name.partition("@")
    if not shape:
        return mode, config
    shape, _, stop = shape.partition("~")
    gamma, _, window = shape.partition("x")
    return mode, replace(config, gamma=int(gamma), **({"window": int(window)} if window else {}),
                         **({"draft_stop": float(stop)} if stop else {}))


@torch.inference_mode()
def output_nll(decoder: Decoder, prompt: torch.Tensor, tokens: list[int]) -> tuple[float, int]:
    """Summed negative log-likelihood of ``tokens`` after ``prompt`` under the full verifier, and the count."""
    if not tokens:
        return 0.0, 0
    ids = torch.cat([prompt, torch.tensor(tokens, device=prompt.device)])
    logits = decoder.full.model(ids[None]).logits[0, prompt.numel() - 1:-1].float()
    nll = torch.nn.functional.cross_entropy(logits, ids[prompt.numel():], reduction="sum")
    return float(nll), len(tokens)


def run_bench(decoder: Decoder, prompts: list[str], modes: list[str], config: DecodeConfig,
              hf: bool | Sequence[str] = True, warmup: bool = True, compiled: bool = False,
              ladder: Decoder | None = None, passes: int = 1, warm: Sequence[str] = ()) -> BenchReport:
    """Decode every prompt with every mode (``ar`` first) and the assisted-generation peer; with ``compiled``,
    every mode again on static caches and compiled forwards (compiled before the measurement). ``ladder``:
    the same verifier and slim with a heavier slim as draft tier (`Decoder.load(draft_slim=...)`), which the
    rows ``ladder@γxΓ`` decode with ``hier``; its cost table is ``decoder``'s with the draft re-measured.

    Modes are interleaved prompt by prompt, so that a change of load on a shared machine hits every row alike, in
    an order shuffled per prompt and pass (:func:`decode_order`), so that no row always decodes right after the
    same other row: on a CPU a decode starts with the previous one's weights in the caches, and ``auto``, which
    prices its arms by the times it measures, had learned from the tiers the row before it left warm (mini, prose,
    T = 0.7: 80 ``hier/1/4`` choices in 3 passes right after ``hier@2x8``, 22 right after ``sd@3``).
    ``passes``: the whole set that many times; per prompt and row the fastest pass is kept (interference only
    adds time), and ``speedup_median`` is the median over passes of each pass's own ratio to ``ar``. Each pass
    starts ``auto`` from a fresh chooser, so every pass is the same experiment. When sampling, each pass draws
    with its own seed (:func:`pass_config`), the same for every row of the pass.

    ``warm``: held-out prompts of the same workload (none of ``prompts``). The row ``auto-warm`` decodes with a
    chooser that first decoded them with ``auto`` (as a serving process's chooser has seen earlier requests):
    every pass starts from a copy of that chooser, so it learns nothing from the measured prompts but what
    ``auto`` itself learns within a pass.
    """
    modes = ["ar"] + [m for m in modes if m != "ar"]
    peers = list(HF_PEERS if hf is True else hf or [])
    if decoder.slim is None and HF_SLIM in peers:
        peers.remove(HF_SLIM)
    names = modes + peers + ([m + COMPILED for m in modes] if compiled else [])
    encoded = [decoder.encode(p) for p in prompts]
    decoders = {"": decoder}
    if compiled:
        decoders[COMPILED] = Decoder.from_models(decoder.full.model, decoder.draft.model,
                                                 decoder.slim.model if decoder.slim else None,
                                                 decoder.tokenizer, compiled=True)
        decoders[COMPILED].warm_up(max(ids.numel() for ids in encoded) + config.max_new_tokens + config.gamma + 1,
                                   modes)
    costs = decoder.costs or decoder.measure_costs()
    if ladder is not None:
        decoders[LADDER] = ladder
        lengths = sorted(costs.table["full"])
        ladder.costs = ladder.costs or replace(costs, table={**costs.table, "draft": measure(
            {"draft": ladder.draft}, lengths).table["draft"]})
    elif any(n.startswith(LADDER) for n in names):
        raise DimrError("ladder rows need a ladder: pass a draft slim (--ladder-slim)")
    rows = [BenchRow(name, DecodeStats(name, 0 if name.startswith("ar") else config.gamma)) for name in names]
    if warmup:  # first-call allocations and lazy initialisation are not part of the measurement
        for name in names:
            _decode(decoders, name, encoded[0], replace(config, max_new_tokens=min(8, config.max_new_tokens)), {})
    warmed = warm_chooser(decoder, warm, config) if WARM in names else None
    kept: dict[tuple[int, int], tuple[list[int], DecodeStats]] = {}
    totals = [[[0, 0.0] for _ in rows] for _ in range(passes)]  # per pass and row: tokens, seconds
    for p in range(passes):
        for dec in decoders.values():
            dec.choosers = {}
        choosers = {"auto": {}, WARM: copy.deepcopy(warmed)}
        for i, ids in enumerate(encoded):
            for j in decode_order(len(rows), i + p * len(encoded)):
                row = rows[j]
                tokens, stats = _decode(decoders, row.mode, ids, pass_config(config, p), choosers)
                if row.mode in choosers:
                    for arm, n in choosers[row.mode][float(config.temperature)].chosen.items():
                        row.arms[arm] = row.arms.get(arm, 0) + n
                totals[p][j][0] += stats.tokens
                totals[p][j][1] += stats.wall_seconds
                if (i, j) not in kept or stats.wall_seconds < kept[(i, j)][1].wall_seconds:
                    kept[(i, j)] = tokens, stats
    for j, row in enumerate(rows):
        for i in range(len(encoded)):
            tokens, stats = kept[(i, j)]
            row.stats, row.outputs = row.stats.merge(stats), row.outputs + [tokens]
        ratios = [(t[j][0] / t[j][1]) / (t[0][0] / t[0][1]) for t in totals if t[j][1] and t[0][1]]
        row.speedup_passes = ratios
        row.speedup_median = statistics.median(ratios) if ratios else float("nan")
    _score(decoder, rows, encoded, config)
    c_rel = _relative_costs(rows, "")
    for suffix in (k for k in decoders if k != LADDER):  # ladder rows are eager rows, beside ar
        c_tier = c_rel if suffix == "" else _relative_costs(rows, suffix)
        ar = next(r.stats for r in rows if r.mode == "ar" + suffix)
        for row in rows:
            if row.mode.endswith(COMPILED) != (suffix == COMPILED):
                continue
            s = row.stats
            row.speedup = s.tokens_per_second / ar.tokens_per_second if ar.tokens_per_second else float("nan")
            row.speedup_cpu = (s.tokens_per_cpu_second / ar.tokens_per_cpu_second if ar.tokens_per_cpu_second
                               else float("nan"))
            c = c_tier if not row.mode.startswith(LADDER) else {**c_tier, "draft": ladder.costs.relative("draft", 1)}
            cost = sum(s.calls[t] * c[t] for t in TIERS if s.calls[t])
            row.predicted = s.tokens / cost if cost else float("nan")
    for row in rows:
        table = ladder.costs if row.mode.startswith(LADDER) else costs
        step = ("hier" if row.mode.startswith(LADDER) else "auto" if row.mode == WARM
                else row.mode.removesuffix(COMPILED))
        row.modelled = predict_from_counts(row.stats.tokens, row.stats.calls, row.stats.fed, table,
                                           row.stats.forwards, row.stats.blocks, "" if row.mode in HF_PEERS else step)
    for row in rows:  # predicted against predicted, as measured against measured: the prefill both share cancels
        base = next(r for r in rows if r.mode == "ar" + (COMPILED if row.mode.endswith(COMPILED) else ""))
        row.model_speedup = row.modelled / base.modelled if base.modelled else float("nan")
    return BenchReport(rows, config, len(prompts), c_rel,
                       _relative_costs(rows, COMPILED) if compiled else None, costs)


def _relative_costs(rows: list[BenchRow], suffix: str) -> dict[str, float]:
    """c_tier: a tier's mean forward CPU time over the rows with ``suffix`` / the full verifier's in ``ar``."""
    ours = [r for r in rows if r.mode not in HF_PEERS and not r.mode.startswith(LADDER)  # another draft tier
            and r.mode.endswith(COMPILED) == (suffix == COMPILED)]
    ar = next(r.stats for r in ours if r.mode == "ar" + suffix)
    full_call = ar.cpu_seconds_tier["full"] / max(ar.calls["full"], 1)
    c_rel = {"full": 1.0}
    for tier in ("draft", "slim"):
        calls = sum(r.stats.calls[tier] for r in ours)
        seconds = sum(r.stats.cpu_seconds_tier[tier] for r in ours)
        c_rel[tier] = seconds / calls / full_call if calls and full_call else float("nan")
    return c_rel


def decode_order(rows: int, k: int) -> list[int]:
    """The order the ``rows`` rows decode the ``k``-th prompt of a run in (counted over passes): the first prompt in
    row order, every later one shuffled with seed ``k``, the same in every run. (A rotation would keep each row
    after the same row whenever it is not first.)"""
    order = list(range(rows))
    if k:
        random.Random(k).shuffle(order)
    return order


def pass_config(config: DecodeConfig, p: int) -> DecodeConfig:
    """Pass ``p``'s config: when sampling, seed + ``p``. With one seed for every pass a sampled row replays one
    sample path per prompt, whose luck is part of its speed (mini, code, T = 0.7: sd@4's tokens per block 2.31–2.59
    over seeds 0–7, seed 0 the luckiest), and the best fixed row is then the row with the luckiest path."""
    return replace(config, seed=config.seed + p) if config.temperature > 0 else config


def warm_chooser(decoder: Decoder, prompts: Sequence[str], config: DecodeConfig) -> dict:
    """``auto``'s choosers (:attr:`Decoder.choosers`) after decoding ``prompts`` (held out from the measurement)
    with ``auto``."""
    if not prompts:
        raise DimrError(f"the {WARM} row needs held-out prompts to warm its chooser on; pass warm prompts "
                        "(benchmarks/bench_tiers.py --warm N)")
    decoder.choosers = {}
    for prompt in prompts:
        decoder.run(decoder.encode(prompt), "auto", config)
    warmed, decoder.choosers = decoder.choosers, {}
    return warmed


def _decode(decoders: dict[str, Decoder], name: str, ids: torch.Tensor, config: DecodeConfig,
            choosers: dict | None = None) -> tuple[list[int], DecodeStats]:
    """One row's decode of ``ids``; ``choosers``: the auto rows' choosers (``auto``, ``auto-warm``: each a
    :attr:`Decoder.choosers`), each kept across the prompts of a pass."""
    if name in HF_PEERS:
        return _hf_assisted(decoders[""], ids, config, name)
    suffix = COMPILED if name.endswith(COMPILED) else LADDER if name.startswith(LADDER) else ""
    mode, config = parse_spec(name.removesuffix(COMPILED), config)
    if name == WARM and choosers is None:
        raise DimrError(f"the {WARM} row needs a warmed chooser (run_bench(..., warm=prompts))")
    if choosers is not None and name in choosers:
        decoders[""].choosers = choosers[name]
    result = decoders[suffix].run(ids, "hier" if mode == LADDER else "auto" if mode == WARM else mode, config)
    if choosers is not None and name in choosers:
        choosers[name] = decoders[""].choosers
    result.stats.mode = name
    return result.tokens, result.stats


def _score(decoder: Decoder, rows: list[BenchRow], encoded: list[torch.Tensor], config: DecodeConfig) -> None:
    for row in rows:
        total, count = 0.0, 0
        for ids, tokens in zip(encoded, row.outputs, strict=True):
            nll, n = output_nll(decoder, ids, tokens)
            total, count = total + nll, count + n
        row.nll = total / count if count else float("nan")
        if config.temperature == 0:
            row.same_as_ar = sum(a == b for a, b in zip(row.outputs, rows[0].outputs, strict=True))


COLUMNS = ("mode", "tok/s", "speed-up", "tok/cpu-s", "speed-up cpu", "predicted S", "model tok/s", "model S",
           "mean acc. len",
           "rej. rate", "full/tok", "slim/tok", "draft/tok", "out len", "NLL", "= ar", "cpu s draft", "cpu s slim",
           "cpu s full")


def table_rows(report: BenchReport) -> list[list[str]]:
    out = []
    for r in report.rows:
        s = r.stats
        sd_like = not r.mode.startswith("ar")
        hf = r.mode in HF_PEERS
        acc_len = s.tokens / s.calls["full"] - 1 if hf and s.calls["full"] else s.mean_accepted_length
        out.append([
            r.mode, f"{s.tokens_per_second:.1f}", f"{r.speedup:.2f}x", f"{s.tokens_per_cpu_second:.1f}",
            f"{r.speedup_cpu:.2f}x", f"{r.predicted:.2f}x", f"{r.modelled:.1f}", f"{r.model_speedup:.2f}x",
            f"{acc_len:.2f}" if sd_like else "-", f"{s.rejection_rate:.3f}" if sd_like and not hf else "-",
            *(f"{s.calls_per_token(t):.3f}" for t in ("full", "slim", "draft")),
            f"{s.tokens / report.prompts:.1f}", f"{r.nll:.3f}",
            "-" if r.same_as_ar is None else f"{r.same_as_ar}/{report.prompts}",
            *(f"{s.cpu_seconds_tier[t]:.2f}" for t in TIERS),
        ])
    return out


def best_rows(report: BenchReport) -> dict[str, BenchRow]:
    """The fastest row of each mode over its γ (Γ) variants (``sd@2``, ``sd@4``… → ``sd``)."""
    best: dict[str, BenchRow] = {}
    for row in report.rows:
        mode = row.mode.partition("@")[0]
        if mode not in best or row.stats.tokens_per_second > best[mode].stats.tokens_per_second:
            best[mode] = row
    return best


def format_table(report: BenchReport) -> str:
    """A markdown table (the format of docs/decoding.md) plus one line with the measured relative costs."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(row) + " |" for row in table_rows(report)]
    c = report.c_rel
    cfg = report.config
    lines.append(f"\nc_rel (mean forward CPU time / the full verifier's in ar): draft {c['draft']:.3f}, "
                 f"slim {c['slim']:.3f}; "
                 f"{report.prompts} prompts, max {cfg.max_new_tokens} new tokens, gamma {cfg.gamma}, "
                 f"temperature {cfg.temperature}, top-p {cfg.top_p}, thresholds {cfg.thresholds}")
    if report.c_rel_compiled:
        c = report.c_rel_compiled
        lines.append(f"c_rel of the {COMPILED} rows (static caches, compiled forwards; speed-up and predicted S "
                     f"relative to ar{COMPILED}): draft {c['draft']:.3f}, slim {c['slim']:.3f}")
    lines += ["", "best row per mode (tok/s as a ratio to ar; model = the cost table's prediction):",
              *(f"  {mode:<12} {row.mode:<14} {row.speedup:.2f}x  model {row.model_speedup:.2f}x"
                for mode, row in best_rows(report).items())]
    for row in report.rows:  # the same per-run summary `dimr decode --stats` prints
        lines += ["", *row.stats.lines()]
    return "\n".join(lines)


def sweep_thresholds(decoder: Decoder, prompts: list[str], config: DecodeConfig,
                     grid: list[tuple[float, float, float]]) -> tuple[BenchReport, list[dict]]:
    """``via`` at every (accept, close, regen) of ``grid`` against ``ar`` and ``sd`` on the same prompts.

    Returns the baseline report and one dict per grid point: measured and predicted speed-up over ``sd``,
    full-verifier calls per token, NLL under the full verifier and outputs equal to ``ar``'s (greedy).
    """
    from dimr.decoding.sequence import Thresholds

    base = run_bench(decoder, prompts, ["sd"], config, hf=False)
    ar_row, sd_row = base.rows
    encoded = [decoder.encode(p) for p in prompts]
    points = []
    for accept, close, regen in grid:
        cfg = replace(config, thresholds=Thresholds(accept, close, regen))
        row = BenchRow("via", DecodeStats("via", config.gamma))
        for ids in encoded:
            tokens, stats = _decode({"": decoder}, "via", ids, cfg)
            row.stats, row.outputs = row.stats.merge(stats), row.outputs + [tokens]
        _score(decoder, [ar_row, row], encoded, cfg)
        s = row.stats
        full_call = ar_row.stats.cpu_seconds_tier["full"] / ar_row.stats.calls["full"]
        c_rel = {**base.c_rel, "slim": s.cpu_seconds_tier["slim"] / max(s.calls["slim"], 1) / full_call}
        cost = sum(s.calls[t] * c_rel[t] for t in TIERS if s.calls[t])
        points.append(dict(
            accept=accept, close=close, regen=regen,
            speedup_vs_sd=s.tokens_per_second / sd_row.stats.tokens_per_second,
            cpu_speedup_vs_sd=s.tokens_per_cpu_second / sd_row.stats.tokens_per_cpu_second,
            predicted_vs_sd=(s.tokens / cost) / sd_row.predicted if cost else float("nan"),
            full_per_token=s.calls_per_token("full"), direct=s.accepted_direct / max(s.tokens, 1),
            regenerated=s.regenerated / max(s.tokens, 1), nll=row.nll, sd_nll=sd_row.nll,
            same_as_ar=row.same_as_ar))
    return base, points
