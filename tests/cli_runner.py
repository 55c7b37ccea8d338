"""Run the `dimr` CLI in-process, as a test sees it: exit code, stdout, stderr."""

from __future__ import annotations

from dimr.cli import main


def cli(capsys, *args: str) -> tuple[int, str, str]:
    try:
        main(list(args))
        code = 0
    except SystemExit as e:
        code = e.code or 0
    out = capsys.readouterr()
    return code, out.out, out.err
