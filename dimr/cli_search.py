"""CLI commands of the search side: pairs, search, studies, show, export."""

from __future__ import annotations

from enum import Enum
from pathlib import Path

import typer
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from dimr.cli import console, err_console, fmt_cost, note, print_json, quiet, status, storage_option
from dimr.errors import DimrError


class SamplerName(str, Enum):
    swap = "swap"
    tpe = "tpe"
    gp = "gp"
    random = "random"


class Granularity(str, Enum):
    layer = "layer"
    sublayer = "sublayer"


class Objective(str, Enum):
    cost = "cost"
    pareto = "pareto"


class CostName(str, Enum):
    kl = "kl"
    reverse_kl = "reverse-kl"
    js = "js"
    bridge = "bridge"


PAIRS_FILE_HELP = "TOML file with extra pairs (default: $DIMR_PAIRS or ~/.config/dimr/pairs.toml)"


def _open(url: str, create: bool = True):
    from storage import StorageError, open_storage

    try:
        return open_storage(url, create=create)
    except StorageError as e:
        raise DimrError(str(e)) from None


def _fmt(x, spec=".4f") -> str:
    return "-" if x is None else format(x, spec)


def pairs(pairs_file: Path = typer.Option(None, help=PAIRS_FILE_HELP),
          as_json: bool = typer.Option(False, "--json", help="print JSON")) -> None:
    """List the model pairs."""
    from dataclasses import asdict

    from dimr.pairs import list_pairs

    known = list_pairs(pairs_file)
    if as_json:
        print_json([asdict(p) for p in known.values()])
        return
    table = Table("pair", "draft", "verifier", "dtype", "description")
    for p in known.values():
        table.add_row(p.name, p.draft, p.verifier, p.dtype, p.description)
    console.print(table)


# The defaults of --trials, --startup-trials and --sampler are `SearchOptions`'s (tests/test_search_quality.py).
def search(
    pair: str = typer.Option(..., help="pair name (see `dimr pairs`)"),
    budget: str = typer.Option(None, help="layers to skip: a count (4) or a fraction of the layers (default "
                               "0.25); with --objective pareto, the most layers a mask may skip"),
    granularity: Granularity = typer.Option(Granularity.layer, help="layer: whole-layer masks under --budget; "
                                            "sublayer: each attention and MLP apart, under --max-cost"),
    max_cost: float = typer.Option(None, "--max-cost", help="--granularity sublayer: the slim's cost as a "
                                   "fraction of one full verifier forward, in (0, 1)"),
    costs: Path = typer.Option(None, "--costs", help="--granularity sublayer: cost table from `dimr bench-forward "
                               "--sublayers --out` (measured budget; default: FLOPs)"),
    objective: Objective = typer.Option(Objective.cost, help="cost: the best mask of one budget; pareto: the "
                                        "front of cost vs kept layers, skipping 1 to --budget layers"),
    trials: int = typer.Option(50, min=1,
                               help="completed trials wanted in the study (resuming continues to it)"),
    startup_trials: int = typer.Option(0, min=0,
                                       help="length of the random phase after the heuristic seeds (tpe, gp: ~10)"),
    sampler: SamplerName = typer.Option(SamplerName.swap, help="after the random phase: swap (surrogate-guided "
                                        "swaps, the default), tpe, gp, or random"),
    profile: bool = typer.Option(True, "--profile/--no-profile",
                                 help="score each single-layer (sublayer: attention, MLP) skip once per study, "
                                 "beside the trials: a seed and the swap model's baseline"),
    cost: CostName = typer.Option(CostName.kl, help="kl = KL(full‖slim); reverse-kl; js; bridge"),
    calibration: str = typer.Option(None, help="local .txt/.jsonl file or name:config:split:field[,...]"),
    num_sequences: int = typer.Option(16, min=1, help="calibration sequences"),
    seq_len: int = typer.Option(128, min=2, help="tokens per calibration sequence"),
    storage: str = storage_option(),
    study: str = typer.Option(None, help="study name (default: PAIR-skipK-COST)"),
    seed: int = typer.Option(0, help="seed of the samplers"),
    workers: int = typer.Option(1, min=1, help="parallel evaluators; more than 1 starts a local Ray instance"),
    ray_address: str = typer.Option(None, help="join an existing Ray cluster (an address, or auto)"),
    device: str = typer.Option(None, help="torch device of in-process workers (default: cuda if available)"),
    batch_size: int = typer.Option(4, min=1, help="calibration sequences per forward (bounds a worker's peak)"),
    gpus_per_worker: int = typer.Option(1, min=1, help="GPUs per worker: the verifier is spread over them "
                                        "(device_map=auto); for verifiers bigger than one GPU"),
    prefix_reuse: bool = typer.Option(True, "--prefix-reuse/--no-prefix-reuse",
                                      help="cache every layer's input (faster; (layers+1)x the cache memory)"),
    pairs_file: Path = typer.Option(None, help=PAIRS_FILE_HELP),
    as_json: bool = typer.Option(False, "--json", help="print the result as JSON"),
) -> None:
    """Search a layer (or sublayer) mask for the pair's verifier and store every trial in SQL."""
    from dimr.search import SearchInterrupted, run_search

    columns = [TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("best {task.fields[best]}"), TimeElapsedColumn(), TimeRemainingColumn()]
    # On a terminal only, and transient: the bar goes when the search ends (the summary line follows).
    quiet_bar = as_json or quiet() or not err_console.is_terminal
    with Progress(*columns, console=err_console, disable=quiet_bar, transient=True) as progress:
        # Loading the pair, the calibration and the reference forward comes before the first result.
        loading = progress.add_task("loading pair, calibration, reference", total=None, best="-")
        task = None

        def on_result(done: int, total: int, best: float | None) -> None:
            nonlocal task
            if task is None:
                progress.remove_task(loading)
                task = progress.add_task("search", total=total, best="-")
            progress.update(task, completed=min(done, total), best=fmt_cost(best))

        try:
            result = run_search(pair, budget, granularity=granularity.value, max_cost=max_cost, costs=costs,
                                trials=trials, storage=storage, study=study, cost=cost.value,
                                objective=objective.value, sampler=sampler.value, startup_trials=startup_trials,
                                profile=profile, seed=seed, calibration=calibration, num_sequences=num_sequences,
                                seq_len=seq_len,
                                workers=workers, ray_address=ray_address, device=device, batch_size=batch_size,
                                gpus_per_worker=gpus_per_worker, prefix_reuse=prefix_reuse, pairs_file=pairs_file,
                                on_result=on_result)
        except SearchInterrupted as e:
            r = e.result
            progress.stop()
            err_console.print(f"interrupted: study {r.study} keeps {r.complete} complete trials ({r.evaluated} "
                              "evaluated now, the trials in flight released); run the same command to resume",
                              soft_wrap=True)
            raise typer.Exit(130) from None
    if as_json:
        from dataclasses import asdict

        print_json(asdict(result))
    else:
        profiled = f" (+{result.profiled} single-skip profile evaluations)" if result.profiled else ""
        console.print(f"study {result.study}: {result.complete} complete trials, {result.evaluated} evaluated "
                      f"now{profiled}; best cost {fmt_cost(result.best_cost)} (trial {result.best_trial}, mask "
                      f"{result.best_mask})", markup=False, highlight=False, soft_wrap=True)


def studies(storage: str = storage_option(),
            as_json: bool = typer.Option(False, "--json", help="print JSON")) -> None:
    """List the studies in a database."""
    from dimr.studies import list_studies

    rows = list_studies(_open(storage, create=False))
    if as_json:
        print_json(rows)
        return
    table = Table("study", "pair", "cost", "budget", "trials", "best cost", "best mask", "started")
    for r in rows:
        pareto = r.get("front_size") is not None  # a Pareto study has a front, not one best mask
        budget = (f"cost ≤ {r['max_cost']:g}" if r.get("max_cost") is not None
                  else f"{'1-' if pareto else ''}{r['skip']}/{r['num_layers']}")
        table.add_row(r["study"], str(r["pair"]), str(r["cost"]), budget, str(r["trials"]), fmt_cost(r["best_cost"]),
                      f"front of {r['front_size']} masks" if pareto else str(r["best_mask"] or "-"),
                      str(r["started"] or "-"))
    console.print(table)


def show(study: str = typer.Argument(..., help="study name"),
         storage: str = storage_option(),
         top: int = typer.Option(5, min=1, help="how many best masks to list"),
         pareto_front: bool = typer.Option(False, "--pareto", help="print the front of cost vs kept layers"),
         as_json: bool = typer.Option(False, "--json", help="print JSON")) -> None:
    """Best masks, costs, agreement, expected acceptance, trial counts and timings of a study."""
    from dimr.studies import front_rows, load_study, summarize

    loaded = load_study(_open(storage, create=False), study)
    if pareto_front:
        rows = front_rows(loaded)
        if as_json:
            print_json(rows)
            return
        table = Table("trial", "skipped", "kept", "mask (1 = keep)", "cost", "top-1 agreement", "1 − TV")
        for r in rows:
            table.add_row(str(r["trial"]), str(r["skipped"]), f"{r['kept_fraction']:.3f}", str(r["mask"]),
                          fmt_cost(r["cost"]), _fmt(r["top1_agreement"]), _fmt(r["expected_acceptance"]))
        console.print(f"{study}: Pareto front of cost vs kept layers ({len(rows)} masks)")
        console.print(table)
        return
    s = summarize(loaded, top=top)
    if as_json:
        print_json(s)
        return
    cfg, t = s["settings"], s["timings"]
    budget = (f"sublayers, max cost {cfg.get('max_cost'):g} ({cfg.get('cost_model')})"
              if cfg.get("granularity") == "sublayer" else f"skip {cfg.get('skip')}/{cfg.get('num_layers')}")
    console.print(f"{s['study']}  pair {cfg.get('pair')}  cost {cfg.get('cost')}  {budget}  calibration "
                  f"{cfg.get('num_sequences')}×{cfg.get('seq_len')} tokens ({cfg.get('calibration_hash')})")
    console.print("trials: " + ", ".join(f"{k} {v}" for k, v in s["counts"].items())
                  + "  phases: " + ", ".join(f"{k} {v}" for k, v in s["phases"].items()))
    console.print(f"timings: {t['evaluations']} evaluations, mean {_fmt(t['mean_eval_s'], '.3f')} s, "
                  f"total {_fmt(t['total_eval_s'], '.1f')} s, wall {_fmt(t['wall_s'], '.1f')} s")
    table = Table("trial", "mask (1 = keep)", "cost", "top-1 agreement", "1 − TV", "phase")
    for r in s["best"]:
        table.add_row(str(r["trial"]), str(r["mask"]), fmt_cost(r["cost"]), _fmt(r["top1_agreement"]),
                      _fmt(r["expected_acceptance"]), str(r["phase"]))
    console.print(table)


class ExportFormat(str, Enum):
    slim = "slim"
    hf = "hf"


def export(study: str = typer.Argument(..., help="study name"),
           output: str = typer.Option(..., "-o", "--output", help="slim: the JSON file to write (- for stdout); "
                                      "hf: a new directory for the checkpoint"),
           fmt: ExportFormat = typer.Option(ExportFormat.slim, "--format", help="slim: the slim config (JSON); hf: "
                                            "a standalone Hugging Face checkpoint of the slim verifier"),
           trial: int = typer.Option(None, help="export this trial instead of the best"),
           budget: str = typer.Option(None, help="pick from the study's front the lowest-cost mask skipping at "
                                      "least this many layers (a count, or a fraction of the layers)"),
           storage: str = storage_option(),
           device: str = typer.Option("cpu", help="--format hf: where the verifier is loaded to cut it"),
           pairs_file: Path = typer.Option(None, help=PAIRS_FILE_HELP),
           as_json: bool = typer.Option(False, "--json", help="print what was exported as JSON")) -> None:
    """Publish a study's mask: a slim config, or a standalone checkpoint (--format hf)."""
    from dimr.search import pareto
    from dimr.studies import load_study, pick_for_budget, slim_config_for

    to_stdout = output == "-"
    if to_stdout and (fmt is ExportFormat.hf or as_json):
        raise DimrError("-o - writes the slim config itself to stdout; give a directory for --format hf, "
                        "and drop --json")
    if fmt is ExportFormat.hf:
        from dimr.serving import check_output_dir

        check_output_dir(output)
    elif not to_stdout and not Path(output).parent.resolve().is_dir():
        raise DimrError(f"cannot write {output}: directory {Path(output).parent} does not exist; create it")
    loaded = load_study(_open(storage, create=False), study)
    if budget is not None:
        if trial is not None:
            raise DimrError("give --trial or --budget, not both")
        trial = pick_for_budget(loaded, budget).number
    elif trial is None and len(loaded.directions) > 1:
        trial = pareto.knee(loaded).number
        note(f"study {study} is a Pareto study: exporting the knee of its front (trial {trial}); pass --budget "
             f"to pick another point (`dimr show {study} --pareto` lists the front)")
    cfg = slim_config_for(loaded, trial)
    if to_stdout:
        typer.echo(cfg.to_json(), nl=False)
        return
    if fmt is ExportFormat.hf:
        from dimr.serving import export_hf

        with status("exporting") as spinner:
            export_hf(cfg, output, pairs_file=pairs_file, device=device, on_step=spinner and spinner.update)
    else:
        cfg.save(output)
    summary = {"output": str(output), "format": fmt.value, "study": cfg.study, "trial": cfg.trial, "mask": cfg.mask,
               "kept_layers": cfg.kept_layers, "num_layers": cfg.num_layers, "cost": cfg.metrics.get("cost")}
    if as_json:
        print_json(summary)
    else:
        console.print(f"wrote {output}: trial {cfg.trial}, "
                      + (f"sublayer mask {cfg.mask}, " if cfg.is_sublayer else "")
                      + f"kept {len(cfg.kept_layers)}/{cfg.num_layers} layers, "
                      f"cost {fmt_cost(cfg.metrics.get('cost'))}", markup=False, highlight=False, soft_wrap=True)


def register(app: typer.Typer) -> None:
    for fn in (pairs, search, studies, show, export):
        app.command(fn.__name__)(fn)
