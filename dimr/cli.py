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
console = Console()
err_console = Console(stderr=True)


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
        app(args=argv, standalone_mode=False)
    except DimrError as e:
        err_console.print(f"error: {e}", markup=False, highlight=False, soft_wrap=True)
        sys.exit(2)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except typer.Abort:
        sys.exit(130)
    except Exception as e:  # click's usage errors (typer vendors click) show themselves, exit 2
        if hasattr(e, "show") and isinstance(getattr(e, "exit_code", None), int):
            e.show()
            sys.exit(e.exit_code)
        raise


if __name__ == "__main__":
    main()
