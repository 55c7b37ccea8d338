"""CLI commands of the decoding side: decode, bench-decode. Thin: parse, call `dimr.decoding`, print."""

from __future__ import annotations

import json
import math
from enum import Enum
from pathlib import Path

import typer

from dimr.cli import console, print_json, status
from dimr.errors import DimrError


class Mode(str, Enum):
    ar = "ar"
    sd = "sd"
    self_ = "self"
    via = "via"
    lookup = "lookup"
    hier = "hier"
    auto = "auto"


PAIRS_FILE_HELP = "TOML file with extra pairs (default: $DIMR_PAIRS or ~/.config/dimr/pairs.toml)"
def _read_prompts(prompt: str | None, prompts: Path | None) -> list[str]:
    if (prompt is None) == (prompts is None):
        raise DimrError("pass exactly one of --prompt TEXT or --prompts FILE.jsonl")
    if prompt is not None:
        return [prompt]
    from dimr.userfiles import read_text

    out = []
    for n, line in enumerate(read_text(prompts, "prompts file", "pass a JSONL file").splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError:
            raise DimrError(f"{prompts} line {n} is not JSON; write one JSON object or string per line") from None
        text = item if isinstance(item, str) else (item.get("prompt") or item.get("text")
                                                    if isinstance(item, dict) else None)
        if not isinstance(text, str):
            raise DimrError(f"{prompts} line {n} has no \"prompt\" (or \"text\") string; add one")
        out.append(text)
    if not out:
        raise DimrError(f"prompts file {prompts} holds no prompt; add one JSON line per prompt")
    return out


def _config(max_new_tokens, gamma, temperature, top_p, seed, accept, close, regen, draft_stop, window=8):
    from dimr.decoding import DecodeConfig, Thresholds

    return DecodeConfig(max_new_tokens=max_new_tokens, gamma=gamma, temperature=temperature, top_p=top_p,
                        seed=seed, draft_stop=draft_stop, window=window,
                        thresholds=Thresholds(accept=accept, close=close, regen=regen))


def _prepare(threads: int | None) -> None:
    """Quiet loading (errors must stay one line) and the requested number of torch threads."""
    from transformers.utils import logging

    logging.disable_progress_bar()
    if threads is not None and threads < 1:
        raise DimrError(f"--threads {threads} must be at least 1")
    if threads:
        import torch

        torch.set_num_threads(threads)


# Options shared by both commands (typer reads them from the signatures).
PAIR = typer.Option(..., "--pair", help="model pair (see `dimr pairs`)")
SLIM = typer.Option(None, "--slim", help="slim config JSON from `dimr export` (needed by self and via)")
MAX_NEW = typer.Option(64, "--max-new-tokens", help="tokens to generate per prompt")
GAMMA = typer.Option(4, "--gamma", help="drafted tokens per block")
WINDOW = typer.Option(8, "--window", help="hier: slim-accepted tokens the full verifier checks at once")
COSTS = typer.Option(None, "--costs", help="auto: cost table JSON from `dimr bench-forward --out` "
                                          "(default: measured at start, a few seconds)")
TEMP = typer.Option(0.0, "--temperature", help="0 = greedy")
TOP_P = typer.Option(1.0, "--top-p", help="nucleus sampling mass (with --temperature > 0)")
SEED = typer.Option(0, "--seed", help="sampling seed")
ACCEPT = typer.Option(0.8, "--accept-threshold", help="via: slim probability of the drafted token for direct accept")
CLOSE = typer.Option(0.5, "--close-threshold", help="via: min 1 - TV(draft, slim) for slim regeneration")
REGEN = typer.Option(0.9, "--regen-threshold", help="via: min slim top probability for slim regeneration")
DRAFT_STOP = typer.Option(0.0, "--draft-stop",
                          help="stop drafting after a token the draft gives less than this (0 = always gamma; "
                               "auto sets its own)")
DEVICE = typer.Option(None, "--device", help="cpu, cuda, cuda:1... (default: cuda if available)")
THREADS = typer.Option(None, "--threads", help="torch intra-op threads (default: torch's)")
PAIRS_FILE = typer.Option(None, "--pairs-file", help=PAIRS_FILE_HELP)
DRAFT_SLIM = typer.Option(None, "--draft-slim", help="the ladder: a more heavily skipped slim config as the draft "
                                                     "tier instead of the pair's draft model (no extra memory)")


def decode(pair: str = PAIR, slim: Path = SLIM, draft_slim: Path = DRAFT_SLIM,
           decoder_config: Path = typer.Option(None, "--config", help="decoder config JSON from `dimr "
                                               "tune-thresholds`: via's thresholds and gamma come from it"),
           point: int = typer.Option(None, "--point", help="with --config: the Pareto point to use "
                                     "(default: the file's default point)"),
           mode: Mode = typer.Option(Mode.via, "--mode", help="ar | sd | self | via | lookup | hier | auto"),
           prompt: str = typer.Option(None, "--prompt", help="one prompt"),
           prompts: Path = typer.Option(None, "--prompts", help="JSONL file: {\"prompt\": ...} per line"),
           max_new_tokens: int = MAX_NEW, gamma: int = GAMMA, temperature: float = TEMP, top_p: float = TOP_P,
           seed: int = SEED, accept_threshold: float = ACCEPT, close_threshold: float = CLOSE,
           regen_threshold: float = REGEN, draft_stop: float = DRAFT_STOP, window: int = WINDOW,
           costs: Path = COSTS,
           chooser_state: Path = typer.Option(None, "--chooser-state", help="auto: what its chooser learned "
                                              "(acceptance, timings), read first if the file exists and written "
                                              "back after the prompts, so the next run starts from it"),
           ignore_eos: bool = typer.Option(False, "--ignore-eos", help="do not stop at the EOS token"),
           verify: str = typer.Option("lossless", "--verify", help="verification rule (see `dimr relaxed-methods`)"),
           param: list[str] = typer.Option(None, "--param", help="rule parameter key=value (repeatable)"),
           head: Path = typer.Option(None, "--head", help="DIVERSED head .safetensors (with --verify diversed)"),
           stats: bool = typer.Option(False, "--stats", help="print decoding statistics"),
           as_json: bool = typer.Option(False, "--json", help="print JSON (text, tokens, stats)"),
           compiled: bool = typer.Option(None, "--compiled/--eager", help="static KV caches and compiled forwards "
                                         "(CUDA graphs on GPU), compiled first; default: compiled on a GPU"),
           device: str = DEVICE, threads: int = THREADS, pairs_file: Path = PAIRS_FILE) -> None:
    """Generate a continuation of each prompt with the three-tier decoder (or a baseline mode)."""
    from dataclasses import replace

    from dimr.decoding import Decoder
    from dimr.decoding.costs import Costs
    from dimr.decoding.decoder import NEEDS_SLIM

    texts = _read_prompts(prompt, prompts)
    config = _config(max_new_tokens, gamma, temperature, top_p, seed, accept_threshold, close_threshold,
                     regen_threshold, draft_stop, window)
    if mode.value in NEEDS_SLIM and slim is None:
        raise DimrError(f"mode {mode.value} needs a slim verifier; pass --slim slim.json (from `dimr export`)")
    if point is not None and decoder_config is None:
        raise DimrError("--point picks a point of a decoder config; pass --config FILE too")
    if chooser_state is not None and mode.value != "auto":
        raise DimrError(f"--chooser-state holds auto's chooser, and mode {mode.value} has none; use --mode auto "
                        "or drop --chooser-state")
    if chooser_state is not None and (chooser_state.is_dir() or not chooser_state.parent.resolve().is_dir()):
        raise DimrError(f"--chooser-state {chooser_state} is a directory or its folder does not exist; "
                        "pass a file path in an existing folder")
    if decoder_config is not None:
        from dimr.decoding.tuning import load_decoder_config
        from dimr.slim_config import load_slim_config

        if mode.value != "via":
            raise DimrError(f"a decoder config tunes via's thresholds, not mode {mode.value}; use --mode via")
        tuned = load_decoder_config(decoder_config)
        tuned.check(pair, load_slim_config(slim) if slim is not None else None)
        config = replace(config, thresholds=tuned.thresholds(point), gamma=tuned.gamma)
    table = Costs.load(costs) if costs is not None else None
    _prepare(threads)
    with status(f"loading pair {pair}"):
        decoder = Decoder.load(pair, slim=slim, device=device, pairs_file=pairs_file, compiled=compiled,
                               timed=True if stats or as_json else None, draft_slim=draft_slim)
    decoder.costs = table
    if chooser_state is not None and chooser_state.exists():
        decoder.load_choosers(chooser_state)
    compiled = decoder.full.compiled
    from dimr.relaxed import rule_from_cli

    rule = rule_from_cli(verify, param or [], head, decoder.draft.model, decoder.full.model)
    if not ignore_eos:
        config = replace(config, eos_token_ids=decoder.eos_token_ids())
    if compiled:
        encoded = [decoder.encode(text) for text in texts]
        with status("compiling the forwards (minutes on a CPU, once per shape)"):
            decoder.warm_up(max(ids.numel() for ids in encoded) + config.max_new_tokens + config.gamma + 1,
                            [mode.value])
    results = []
    for text in texts:
        result = decoder.run(decoder.encode(text), mode.value, config, rule)
        out = decoder.tokenizer.decode(result.tokens, skip_special_tokens=True)
        results.append({"prompt": text, "text": out, "tokens": result.tokens, "stats": result.stats.to_dict()})
        if not as_json:
            console.print(out, markup=False, highlight=False, soft_wrap=True)
            if stats:
                console.print("\n".join(result.stats.lines()), markup=False, highlight=False)
    if chooser_state is not None:
        decoder.save_choosers(chooser_state)
    if as_json:
        print_json(results if prompts is not None else results[0])


def bench_decode(pair: str = PAIR, slim: Path = SLIM,
                 modes: str = typer.Option("ar,sd,self,via,lookup,hier,auto", "--modes",
                                           help="comma-separated modes; sd@2 = sd at gamma 2, hier@2x8 = hier "
                                                "at gamma 2 and window 8"),
                 prompts: list[Path] = typer.Option(None, "--prompts",
                                                    help="JSONL prompt file(s), repeatable (default: built-in)"),
                 num_prompts: int = typer.Option(None, "--num-prompts", help="use the first N of each file"),
                 max_new_tokens: int = MAX_NEW, gamma: int = GAMMA, temperature: float = TEMP,
                 top_p: float = TOP_P, seed: int = SEED, accept_threshold: float = ACCEPT,
                 close_threshold: float = CLOSE, regen_threshold: float = REGEN, draft_stop: float = DRAFT_STOP,
                 window: int = WINDOW, costs: Path = COSTS,
                 hf: bool = typer.Option(True, "--hf/--no-hf", help="include transformers' assisted generation "
                                                                    "(with the draft, the slim, prompt look-up)"),
                 compiled: bool = typer.Option(False, "--compiled/--eager-only",
                                               help="also run every mode on static caches with compiled "
                                                    "forwards (rows ar+c, sd+c...)"),
                 ignore_eos: bool = typer.Option(True, "--ignore-eos/--stop-at-eos",
                                                 help="generate max-new-tokens for every prompt and mode"),
                 as_json: bool = typer.Option(False, "--json", help="print JSON"),
                 device: str = DEVICE, threads: int = THREADS, pairs_file: Path = PAIRS_FILE) -> None:
    """Benchmark all modes side by side on one prompt set, with HF assisted generation as a peer."""
    from dataclasses import replace

    from dimr.decoding import MODES, Decoder
    from dimr.decoding.bench import DEFAULT_PROMPTS, format_table, run_bench
    from dimr.decoding.costs import Costs
    from dimr.decoding.decoder import NEEDS_SLIM

    wanted = [m.strip() for m in modes.split(",") if m.strip()]
    unknown = [m for m in wanted if m.partition("@")[0] not in MODES]
    if unknown:
        raise DimrError(f"unknown mode(s) {', '.join(unknown)}; use some of {', '.join(MODES)}")
    if slim is None and any(m.partition("@")[0] in NEEDS_SLIM for m in wanted):
        raise DimrError(f"modes {', '.join(NEEDS_SLIM)} need a slim verifier; pass --slim slim.json or "
                        "leave them out of --modes")
    texts = [t for f in prompts for t in _read_prompts(None, f)[:num_prompts]] if prompts else list(DEFAULT_PROMPTS)
    config = _config(max_new_tokens, gamma, temperature, top_p, seed, accept_threshold, close_threshold,
                     regen_threshold, draft_stop, window)
    table = Costs.load(costs) if costs is not None else None
    _prepare(threads)
    with status(f"loading pair {pair}"):
        decoder = Decoder.load(pair, slim=slim, device=device, pairs_file=pairs_file)
    decoder.costs = table
    if not ignore_eos:
        config = replace(config, eos_token_ids=decoder.eos_token_ids())
    rows = len(wanted) * (2 if compiled else 1) + (1 if hf else 0)
    with status(f"benchmarking {rows} rows × {len(texts)} prompts" + (", compiling first" if compiled else "")):
        report = run_bench(decoder, texts, wanted, config, hf=hf, compiled=compiled)
    if as_json:
        rows = [{"mode": r.mode, "speedup": r.speedup, "predicted_speedup": r.predicted, "nll": r.nll,
                 "same_as_ar": r.same_as_ar, **r.stats.to_dict()} for r in report.rows]
        print_json({"rows": rows, "c_rel": report.c_rel, "prompts": report.prompts})
        return
    console.print(format_table(report), markup=False, highlight=False, soft_wrap=True)


def _floats(text: str, what: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        values = []
    if not values or not all(math.isfinite(v) and v >= 0 for v in values):
        raise DimrError(f"{what} {text!r} is not a comma-separated list of numbers ≥ 0 (above 1 = route off); "
                        "pass e.g. 0.6,0.8")
    return values


def tune_thresholds(pair: str = PAIR, slim: Path = typer.Option(..., "--slim", help="slim config JSON the "
                                                                 "thresholds are tuned for"),
                    out: Path = typer.Option(..., "--out", help="decoder config JSON to write (for `dimr decode "
                                             "--config`)"),
                    prompts: Path = typer.Option(None, "--prompts", help="held-out JSONL prompts, optionally with "
                                                 "an integer \"answer\" (default: the pair's own task)"),
                    num_prompts: int = typer.Option(4, "--num-prompts", help="use the first N prompts"),
                    accept: str = typer.Option("0.5,0.8,0.95", "--accept", help="accept thresholds to sweep"),
                    close: str = typer.Option("0,0.5", "--close", help="close thresholds to sweep"),
                    regen: str = typer.Option("0.5,0.9", "--regen", help="regen thresholds to sweep"),
                    speed: str = typer.Option("predicted", "--speed", help="the speed the Pareto set is taken on: "
                                              "predicted (cost model on the call counts) or measured"),
                    max_new_tokens: int = typer.Option(32, "--max-new-tokens", help="tokens per prompt"),
                    gamma: int = GAMMA, temperature: float = TEMP, seed: int = SEED, costs: Path = COSTS,
                    as_json: bool = typer.Option(False, "--json", help="print JSON"),
                    device: str = DEVICE, threads: int = THREADS, pairs_file: Path = PAIRS_FILE) -> None:
    """Sweep via's accept/close/regen thresholds on held-out prompts against ar; write the Pareto set of speed
    and quality (full-verifier log-likelihood, exact match on the task) as a decoder config."""
    from dimr.decoding import Decoder, tuning
    from dimr.decoding.costs import Costs
    from dimr.slim_config import load_slim_config

    if speed not in tuning.SPEEDS:
        raise DimrError(f"--speed {speed!r} is not one of {', '.join(tuning.SPEEDS)}; pass one")
    if num_prompts < 1:
        raise DimrError(f"--num-prompts {num_prompts} must be at least 1")
    if out.is_dir() or not out.resolve().parent.is_dir():
        raise DimrError(f"cannot write {out}: give a file path in an existing folder")
    settings = tuning.grid(_floats(accept, "--accept"), _floats(close, "--close"), _floats(regen, "--regen"))
    held_out = (tuning.read_prompts(prompts, num_prompts) if prompts is not None
                else tuning.task_prompts(pair, num_prompts))
    if not held_out:
        raise DimrError(f"pair {pair} has no task of its own; pass --prompts FILE.jsonl of held-out prompts")
    config = _config(max_new_tokens, gamma, temperature, 1.0, seed, 0.8, 0.5, 0.9, 0.0)
    slim_cfg = load_slim_config(slim)
    table = Costs.load(costs) if costs is not None else None
    _prepare(threads)
    with status(f"loading pair {pair}"):
        decoder = Decoder.load(pair, slim=slim, device=device, pairs_file=pairs_file)
    decoder.costs = table
    with status(f"sweeping {len(settings)} threshold settings × {len(held_out)} prompts"):
        ar, points = tuning.sweep(decoder, held_out, config, settings)
    front = tuning.pareto_set([tuning.objectives(p, speed) for p in points])
    kept = [points[i] for i in front]
    tuned = tuning.DecoderConfig(pair=pair, slim_mask=slim_cfg.mask, slim_fingerprint=slim_cfg.fingerprint,
                                 gamma=gamma, temperature=temperature, max_new_tokens=max_new_tokens,
                                 prompts=len(held_out), speed=speed, default=tuning.default_point(kept, speed, ar),
                                 ar=ar, points=kept)
    tuned.save(out)
    if as_json:
        from dataclasses import asdict

        print_json({"output": str(out), "ar": ar, "pareto": front, "default": tuned.default,
                    "points": [asdict(p) for p in points]})
        return
    console.print(format_points(ar, points, front, tuned.default), markup=False, highlight=False, soft_wrap=True)
    console.print(f"\nwrote {out}: {len(kept)} Pareto points of {len(points)}, default point {tuned.default}; "
                  f"decode with `dimr decode --pair {pair} --slim {slim} --config {out} [--point K]`",
                  markup=False, highlight=False, soft_wrap=True)


def format_points(ar: dict, points, front: list[int], default: int) -> str:
    """Markdown: every swept point, speeds as ratios to ar, the Pareto points numbered as in the file."""
    def fmt(v, spec=".3f"):
        return "-" if v is None else format(v, spec)

    lines = ["| point | accept | close | regen | tok/s | speed-up | speed-up cpu | predicted speed-up | full/tok "
             "| log-lik | = ar | task acc. |", "|" + "---|" * 12,
             f"| ar | | | | {ar['tokens_per_second']:.1f} | 1.00x | 1.00x | 1.00x | {ar['full_per_token']:.3f} | "
             f"{ar['loglik']:.3f} | {fmt(ar['same_as_ar'], '.2f')} | {fmt(ar['task_accuracy'], '.2f')} |"]
    for i, p in enumerate(points):
        k = f"**{front.index(i)}**" + ("*" if front.index(i) == default else "") if i in front else ""
        lines.append(
            f"| {k} | {p.accept:g} | {p.close:g} | {p.regen:g} | {p.tokens_per_second:.1f} | "
            f"{p.tokens_per_second / ar['tokens_per_second']:.2f}x | "
            f"{p.tokens_per_cpu_second / ar['tokens_per_cpu_second']:.2f}x | "
            f"{p.predicted_tokens_per_second / ar['predicted_tokens_per_second']:.2f}x | {p.full_per_token:.3f} | "
            f"{p.loglik:.3f} | {fmt(p.same_as_ar, '.2f')} | {fmt(p.task_accuracy, '.2f')} |")
    lines.append("\n(point: index in the written file, * = its default; = ar: fraction of outputs equal to ar's)")
    return "\n".join(lines)


def _lengths(text: str) -> list[int]:
    try:
        lo, _, hi = text.partition("-")
        lengths = list(range(int(lo), int(hi) + 1)) if hi else [int(x) for x in text.split(",")]
    except ValueError:
        lengths = []
    if not lengths or min(lengths) < 1:
        raise DimrError(f"--lengths {text!r} is not a range like 1-16 or a list like 1,2,4; pass one")
    return lengths


def bench_forward(pair: str = PAIR,
                  slim: list[Path] = typer.Option(None, "--slim", help="slim config JSON(s) to time, repeatable"),
                  kept: str = typer.Option(None, "--kept", help="also time slims keeping these many layers, "
                                                                "spread evenly (comma-separated, e.g. 8,16,22)"),
                  lengths: str = typer.Option("1-16", "--lengths", help="tokens per forward: 1-16 or 1,2,4"),
                  reps: int = typer.Option(5, "--reps", help="timed forwards per cell (the fastest counts)"),
                  sublayers: bool = typer.Option(False, "--sublayers", help="also measure one attention and one "
                                                 "MLP of the verifier apart (the budget of `dimr search "
                                                 "--granularity sublayer --costs`)"),
                  gpu: str = typer.Option(None, "--gpu", help="also print the roofline prediction for this GPU "
                                                              "(H200, H100, A100, L4, RTX4090)"),
                  out: Path = typer.Option(None, "--out", help="write the measured cost table here (JSON, "
                                                               "for `decode --costs`)"),
                  as_json: bool = typer.Option(False, "--json", help="print JSON"),
                  device: str = DEVICE, threads: int = THREADS, pairs_file: Path = PAIRS_FILE) -> None:
    """Time one forward of every tier (draft, slims, full) for 1..16 tokens on a warm cache: the cost model."""
    from dataclasses import replace

    from dimr.decoding import Decoder
    from dimr.decoding.costs import format_costs, get_gpu, measure, measure_sublayers, roofline, slim_tiers, tier_size

    steps = _lengths(lengths)
    counts = [int(k) for k in kept.split(",") if k.strip()] if kept else []
    the_gpu = get_gpu(gpu) if gpu else None
    if reps < 1:
        raise DimrError(f"--reps {reps} must be at least 1")
    _prepare(threads)
    decoder = Decoder.load(pair, device=device, pairs_file=pairs_file)
    tiers = {"draft": decoder.draft, **slim_tiers(decoder.full.model, slim or [], counts), "full": decoder.full}
    costs = measure(tiers, steps, reps)
    if sublayers:
        costs = replace(costs, sublayers=measure_sublayers(decoder.full.model, pair, steps, reps))
    predicted = roofline(the_gpu, {n: tier_size(t.model) for n, t in tiers.items()}, steps) if the_gpu else None
    if out is not None:
        out.write_text(json.dumps(costs.to_dict(), indent=1))
    if as_json:
        console.print_json(json.dumps({"measured": costs.to_dict(),
                                       "roofline": predicted.to_dict() if predicted else None}))
        return
    console.print(format_costs(costs, {n: tier_size(t.model)[1] for n, t in tiers.items()}, predicted),
                  markup=False, highlight=False, soft_wrap=True)


def register(app: typer.Typer) -> None:
    app.command("decode")(decode)
    app.command("bench-decode")(bench_decode)
    app.command("bench-forward")(bench_forward)
    app.command("tune-thresholds")(tune_thresholds)
