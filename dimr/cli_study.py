"""CLI commands about one stored study as a whole: report (HTML and PNG pictures) and delete."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from dimr.cli import console, note, storage_option
from dimr.cli_search import _open
from dimr.errors import DimrError


def delete(study: str = typer.Argument(..., help="study name"),
           storage: str = storage_option(),
           yes: bool = typer.Option(False, "-y", "--yes", help="delete without asking")) -> None:
    """Delete a study: its trials and its mask-ledger rows (`optuna delete-study` leaves the ledger behind)."""
    from dimr.studies import delete_study, load_study

    st = _open(storage, create=False)
    load_study(st, study)  # a missing study is one line, before any question
    if not yes:
        if not sys.stdin.isatty():
            raise DimrError(f"deleting study {study!r} needs --yes when stdin is not a terminal")
        typer.confirm(f"delete study {study!r} and all its trials?", abort=True)
    n = delete_study(st, study)
    console.print(f"deleted study {study} ({n} trials)", markup=False, highlight=False, soft_wrap=True)


def report(study: str = typer.Argument(..., help="study name"),
           output: Path = typer.Option(..., "-o", "--output", help="the HTML file to write (self-contained)"),
           png: Path = typer.Option(None, "--png", help="also write each picture as a PNG into this directory"),
           storage: str = storage_option(),
           top: int = typer.Option(10, min=1, help="rows of the top-trials table")) -> None:
    """A self-contained HTML report of a study: convergence, layer importance, Pareto front, best masks."""
    from dimr.report import write_report
    from dimr.studies import load_study

    if not output.parent.resolve().is_dir():
        raise DimrError(f"cannot write {output}: directory {output.parent} does not exist; create it")
    if png is not None and png.exists() and not png.is_dir():
        raise DimrError(f"--png {png} exists and is not a directory; pick a directory")
    written = write_report(load_study(_open(storage, create=False), study), output, png_dir=png)
    console.print(f"wrote {output}" + (f" and {len(written)} PNGs in {png}" if png is not None else ""),
                  markup=False, highlight=False, soft_wrap=True)
    note("open it in a browser; it needs no network")


def register(app: typer.Typer) -> None:
    for fn in (report, delete):
        app.command(fn.__name__)(fn)
