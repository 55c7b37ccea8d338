"""Reading the text files users pass (prompts, calibration, pairs TOML, slim configs): one clear line for a
missing file, a directory, unreadable bytes or binary content, never a traceback."""

from __future__ import annotations

from pathlib import Path

from dimr.errors import DimrError


def read_text(path: Path, what: str, fix: str) -> str:
    """The UTF-8 text of ``path``; DimrError naming ``what`` (e.g. "prompts file") and ``fix`` otherwise."""
    path = Path(path)
    if path.is_dir():
        raise DimrError(f"{what} {path} is a directory, not a file; {fix}")
    if not path.is_file():
        raise DimrError(f"{what} {path} does not exist; {fix}")
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise DimrError(f"cannot read {what} {path} ({e.strerror}); check its permissions") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is None or "\0" in text:
        raise DimrError(f"{what} {path} is binary, not UTF-8 text; {fix}")
    return text
