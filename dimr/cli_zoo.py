"""`dimr zoo`: train and evaluate the shipped ``mini`` pair."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from dimr.cli import note
from dimr.errors import DimrError

# dimr.zoo's MINI_DIR and DATA_DIR, named without importing dimr.zoo (and torch) for every command.
MINI_DIR = Path(__file__).parent / "zoo" / "mini"
DATA_DIR = Path(__file__).parent / "zoo" / "data"


def train_paths(output: Path | None, data_dir: Path | None, work: Path | None,
                quick: bool) -> tuple[Path, Path, Path]:
    """Where `train-mini` writes: the shipped pair by default, a scratch directory under $DIMR_HOME with
    ``--quick`` (a smoke test must never overwrite the shipped models)."""
    from dimr.paths import dimr_home

    if output is None:
        output = dimr_home() / "mini-quick" if quick else MINI_DIR
    if data_dir is None:
        data_dir = output / "data" if quick else DATA_DIR
    if work is None:
        work = dimr_home() / ("mini-work-quick" if quick else "mini-work")
    return output, data_dir, work


def register(app: typer.Typer) -> None:
    """Add the ``zoo`` sub-command group to ``app``."""
    zoo_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None,
                          help="The local model zoo: the shipped mini pair.")

    @zoo_app.command("train-mini")
    def train_mini(
        output: Path = typer.Option(None, help="Where the pair (both models, tokenizer) is written (default: the "
                                    "shipped mini pair; with --quick, $DIMR_HOME/mini-quick)."),
        data_dir: Path = typer.Option(None, help="Where the evaluation files are written (default: the shipped "
                                      "data; with --quick, OUTPUT/data)."),
        work: Path = typer.Option(None, help="Scratch dir for corpus and checkpoints (default: $DIMR_HOME/mini-work)."),
        seed: int = typer.Option(1234, help="Seed for data, init and batches."),
        seed_minutes: float = typer.Option(None, help="Seed (2-layer) wall-clock budget (default in train_mini.py)."),
        verifier_minutes: float = typer.Option(None, help="Verifier wall-clock budget (default in train_mini.py)."),
        draft_minutes: float = typer.Option(None, help="Draft wall-clock budget (default in train_mini.py)."),
        steps: int = typer.Option(None, help="Train each stage for exactly this many steps instead."),
        quick: bool = typer.Option(False, help="Smoke test: small data, 20 steps, small evaluation."),
    ) -> None:
        """Train the mini pair on this CPU (seeded, resumable) and evaluate it against the quality bar."""
        from dimr.zoo import train_mini as tm

        if steps is not None and steps <= 0:
            raise DimrError(f"--steps must be positive, got {steps}")
        output, data_dir, work = train_paths(output, data_dir, work, quick)
        if quick:
            note(f"--quick writes to {output} (the shipped pair stays as it is)")
        cfg = tm.quick_config(output, data_dir, work, seed) if quick else tm.RunConfig(output, data_dir, work, seed)
        if steps is not None:
            cfg.steps = steps
        if seed_minutes is not None:
            cfg.seed_minutes = seed_minutes
        if verifier_minutes is not None:
            cfg.verifier_minutes = verifier_minutes
        if draft_minutes is not None:
            cfg.draft_minutes = draft_minutes
        metrics = tm.run(cfg)
        typer.echo(json.dumps({"code": metrics["code"], "bar": metrics["bar"]}, indent=1))

    @zoo_app.command("eval-mini")
    def eval_mini(
        model_dir: Path = typer.Option(MINI_DIR, help="Directory with draft/ and verifier/."),
        data_dir: Path = typer.Option(DATA_DIR, help="Directory with the held-out files."),
        quick: bool = typer.Option(False, help="Evaluate on a few records only."),
        write: bool = typer.Option(False, help="Store the result in MODEL_DIR/metrics.json and rehash."),
    ) -> None:
        """Print the mini pair's quality numbers (code loss, task accuracy, agreement, layer-skip KL)."""
        from dimr.zoo import train_mini as tm

        if not (model_dir / "verifier").is_dir() or not (model_dir / "draft").is_dir():
            raise DimrError(f"no trained pair in {model_dir}; run `dimr zoo train-mini` first")
        if write and quick:
            raise DimrError("--write stores full evaluations only; drop --quick")
        metrics = tm.reevaluate(model_dir, data_dir) if write else tm.evaluate(model_dir, data_dir, quick=quick)
        metrics = json.loads(json.dumps(metrics))
        for m in metrics["task"].values():
            m.pop("examples", None)
        typer.echo(json.dumps(metrics, indent=1))

    app.add_typer(zoo_app, name="zoo")
