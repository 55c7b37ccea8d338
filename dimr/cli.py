"""The `dimr` command line. Thin: it parses, calls the library, prints tables or JSON.

Commands live next to what they drive: search/show/export here, decoding in `dimr.cli_decode`,
the model zoo in `dimr.cli_zoo`. Every `DimrError` becomes one line on stderr and exit code 2.
"""

from __future__ import annotations

import sys

import typer
from rich.console import Console

from dimr.errors import DimrError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Search slim verifiers for speculative decoding, and decode with them.")
# User strings (study names, masks, prompts) print verbatim: no markup, no emoji codes (":fire:"), no highlighting.
console = Console(markup=False, emoji=False, highlight=False)
err_console = Console(stderr=True, markup=False, emoji=False, highlight=False)


_registered = False


def _register() -> None:
    import importlib

    global _registered
    if _registered:
        return
    _registered = True
    for name in ("dimr.cli_search", "dimr.cli_decode", "dimr.cli_zoo", "dimr.cli_relaxed"):
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name != name:
                raise
            continue
        module.register(app)


def main(argv: list[str] | None = None) -> None:
    _register()
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
