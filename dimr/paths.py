"""Where dimr keeps what it builds on this machine (converted checkpoints, the tiny-random pair)."""

from __future__ import annotations

import os
from pathlib import Path


def dimr_home() -> Path:
    """``$DIMR_HOME``, else ``~/.cache/dimr``."""
    return Path(os.environ.get("DIMR_HOME", Path.home() / ".cache" / "dimr"))
