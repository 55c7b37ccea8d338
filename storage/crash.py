"""Named crash points for fault-injection tests: ``DIMR_CRASH_AT=name`` kills this process with SIGKILL when
it reaches `point(name)`, the way a power cut or ``kill -9`` would (no cleanup, no ``finally``)."""

from __future__ import annotations

import os
import signal

ENV = "DIMR_CRASH_AT"


def point(name: str) -> None:
    """Die here if the environment asks for it; otherwise nothing."""
    if os.environ.get(ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)
