"""Reading the text files users pass (prompts, calibration, pairs TOML, slim configs): one clear line for a
missing file, a directory, unreadable bytes or binary content, never a traceback; and writing the files dimr
hands to users (slim and decoder configs) atomically."""

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


def write_atomic(path: Path, text: str, crash_at: str | None = None) -> Path:
    """Write ``text`` to ``path`` atomically: a temp file ``.NAME.PID.*.tmp`` in the same folder, fsynced, then
    renamed over ``path``, so a failure leaves no partial file. The mode follows the umask (mkstemp makes 0600;
    what dimr writes is meant to be shared). ``crash_at``: a named crash point just before the rename."""
    import os
    import tempfile

    from storage import crash

    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp")
    except OSError as e:
        raise DimrError(f"cannot write {path} ({e.strerror or e}); pick a writable folder") from None
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if crash_at:
            crash.point(crash_at)
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise DimrError(f"cannot write {path} ({e.strerror or e}); free space or pick another folder") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def utc_now() -> str:
    """The ``created_at`` stamp of the files dimr writes: UTC, to the second, ISO 8601."""
    from datetime import datetime, timezone

    return datetime.now(timezone.utc).isoformat(timespec="seconds")
