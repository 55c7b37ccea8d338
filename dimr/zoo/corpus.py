"""The mini pair's code corpus: the running interpreter's standard-library source, without tests.

Files are split into train and held-out by a hash of their path relative to the stdlib root, so the
split does not depend on file order or on the machine. The held-out files become
``heldout_code.jsonl`` (one record per chunk, field ``text``).
"""

from __future__ import annotations

import hashlib
import sysconfig
from pathlib import Path

SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}


def stdlib_root() -> Path:
    """The running interpreter's stdlib directory."""
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(root: Path | None = None) -> list[Path]:
    """Every ``*.py`` under the stdlib root outside test and package directories, sorted."""
    root = root or stdlib_root()
    return sorted(p for p in root.rglob("*.py")
                  if not SKIP_DIRS.intersection(p.relative_to(root).parts[:-1]))


def is_heldout(rel_path: str, fraction: float) -> bool:
    """Deterministic held-out membership of a file, from the sha256 of its relative path."""
    h = int(hashlib.sha256(rel_path.encode()).hexdigest()[:8], 16)
    return h < fraction * 16**8


def split_files(fraction: float, root: Path | None = None) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(train, heldout) lists of ``(relative path, source text)``."""
    root = root or stdlib_root()
    train, heldout = [], []
    for p in stdlib_files(root):
        rel = p.relative_to(root).as_posix()
        text = p.read_text(encoding="utf-8", errors="replace")
        (heldout if is_heldout(rel, fraction) else train).append((rel, text))
    return train, heldout


def chunk(text: str, max_chars: int) -> list[str]:
    """Split source text at line boundaries into pieces of at most about ``max_chars`` characters."""
    pieces, cur, size = [], [], 0
    for line in text.splitlines(keepends=True):
        if size + len(line) > max_chars and cur:
            pieces.append("".join(cur))
            cur, size = [], 0
        cur.append(line)
        size += len(line)
    if cur:
        pieces.append("".join(cur))
    return [p for p in pieces if p.strip()]
