"""The `dimr` command line. Thin: it parses, calls the library, prints tables or JSON.

Commands live next to what they drive: search/show/export in `dimr.cli_search`, report/delete in
`dimr.cli_study`, decoding in `dimr.cli_decode`, the model zoo in `dimr.cli_zoo`. Every `DimrError` becomes
one line on stderr and exit code 2. Listing commands import neither torch nor transformers.

Conventions: results go to stdout (tables, or strict JSON with ``--json``), notes and progress to stderr
(``-q`` silences them); tables are never cut when stdout is not a terminal; ``$DIMR_STORAGE`` is the default
``--storage``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
from typing import Any

import typer
from rich.console import Console, ConsoleDimensions

from dimr import __version__
from dimr.errors import DimrError

DEFAULT_STORAGE = "sqlite:///dimr.db"
STORAGE_HELP = "SQLAlchemy URL of the study database (sqlite:///dimr.db, postgresql+psycopg://...)"

app = typer.Typer(no_args_is_help=True, pretty_exceptions_enable=False, rich_markup_mode=None,
                  help="Search slim verifiers for speculative decoding, and decode with them.")


class _Console(Console):
    """A rich console that never cuts a table to 80 columns when it does not write to a terminal."""

    @property
    def size(self) -> ConsoleDimensions:
        size = super().size
        return size if self.is_terminal else ConsoleDimensions(10_000, size.height)  # COLUMNS too: it is inherited

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        Console.size.fset(self, new_size)


# User strings (study names, masks, prompts) print verbatim: no markup, no emoji codes (":fire:"), no highlighting.
console = _Console(markup=False, emoji=False, highlight=False)
err_console = _Console(stderr=True, markup=False, emoji=False, highlight=False)
_state = {"quiet": False}


def storage_option() -> Any:
    """The ``--storage`` option of every command that reads or writes studies (default ``$DIMR_STORAGE``)."""
    return typer.Option(DEFAULT_STORAGE, "--storage", envvar="DIMR_STORAGE", help=STORAGE_HELP)


def quiet() -> bool:
    """True under ``dimr -q``: no progress and no notes, only results and errors."""
    return _state["quiet"]


def note(message: str) -> None:
    """A line for the person at the terminal (stderr), unless ``-q``."""
    if not quiet():
        err_console.print(message, markup=False, highlight=False, soft_wrap=True)


def status(message: str) -> Any:
    """A spinner with ``message`` on stderr while a long step runs (only on a terminal, and not under ``-q``)."""
    import contextlib

    return contextlib.nullcontext() if quiet() or not err_console.is_terminal else err_console.status(message)


def strict(obj: Any) -> Any:
    """``obj`` with every non-finite float written as a string ("inf", "nan"): strict JSON has neither."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {k: strict(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict(v) for v in obj]
    return obj


def print_json(obj: Any) -> None:
    """Strict JSON on stdout (no Infinity/NaN), never wrapped."""
    typer.echo(json.dumps(strict(obj), indent=2, allow_nan=False))


def fmt_cost(x: float | None) -> str:
    """A cost in four significant digits (2e-05, not 0.0000); "-" for none."""
    return "-" if x is None else format(x, ".4g")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"dimr {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="print dimr's version and exit"),
    quiet_: bool = typer.Option(False, "-q", "--quiet", help="results and errors only: no progress, no notes"),
    verbose: int = typer.Option(0, "-v", "--verbose", count=True,
                                help="log what dimr and Optuna do (-v: info, -vv: debug)"),
) -> None:
    _state["quiet"] = quiet_
    if quiet_:
        # transformers' and the hub's own progress bars ("Loading weights", downloads) read this at import, and
        # neither is imported yet: the command modules import them lazily.
        os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
        if "transformers" in sys.modules:
            sys.modules["transformers"].utils.logging.disable_progress_bar()
    if verbose:
        level = logging.INFO if verbose == 1 else logging.DEBUG
        logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s", stream=sys.stderr)
        logging.getLogger("dimr").setLevel(level)
        import optuna

        optuna.logging.set_verbosity(level)


_registered = False


def _register() -> None:
    import importlib

    global _registered
    if _registered:
        return
    _registered = True
    for name in ("dimr.cli_search", "dimr.cli_study", "dimr.cli_decode", "dimr.cli_zoo", "dimr.cli_relaxed"):
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name != name:
                raise
            continue
        module.register(app)


def main(argv: list[str] | None = None) -> None:
    _register()
    _state["quiet"] = False
    try:
        # A typer.Exit (e.g. 130 on Ctrl-C) comes back as its code.
        code = app(args=argv, prog_name="dimr", standalone_mode=False)
        if isinstance(code, int) and code:
            sys.exit(code)
    except DimrError as e:
        err_console.print(f"error: {e}", markup=False, highlight=False, soft_wrap=True)
        sys.exit(2)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except typer.Abort:
        sys.exit(130)
    except Exception as e:  # click's usage errors (typer vendors click): one line too, exit 2
        if hasattr(e, "format_message") and isinstance(getattr(e, "exit_code", None), int):
            ctx = getattr(e, "ctx", None)
            where = f"; see `{ctx.command_path} --help`" if ctx is not None else ""
            message = " ".join(e.format_message().split()).rstrip(".")
            err_console.print(f"error: {message}{where}", soft_wrap=True)
            sys.exit(e.exit_code)
        raise


if __name__ == "__main__":
    main()
