"""The reaper of a local Ray instance: ``python -m workers.ray_reaper FD TEMP_DIR``.

`workers.ray_pool.LocalRay` starts it with the read end of a pipe whose write end only the driver holds. When
the driver exits, however it exits (``kill -9`` included), the pipe reads EOF; the reaper then kills every
process whose command line names the instance's temp dir (GCS, raylet, agents, workers) and removes the dir,
which holds the instance's auth token. Nothing the driver started outlives it.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
from pathlib import Path


def processes_of(temp_dir: str) -> list[int]:
    """PIDs (not this one) whose command line mentions ``temp_dir``."""
    me, out = os.getpid(), []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if temp_dir.encode() in cmdline:
            out.append(int(entry.name))
    return out


def reap(temp_dir: str, grace_s: float = 3.0) -> None:
    """SIGTERM the instance's processes, SIGKILL what is left after ``grace_s``, then remove ``temp_dir``."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = processes_of(temp_dir)
        for pid in pids:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        deadline = time.monotonic() + grace_s
        while pids and time.monotonic() < deadline:
            time.sleep(0.1)
            pids = processes_of(temp_dir)
        if not pids:
            break
    shutil.rmtree(temp_dir, ignore_errors=True)


def main() -> None:
    fd, temp_dir = int(sys.argv[1]), sys.argv[2]
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C in the driver's terminal is the driver's to handle
    while os.read(fd, 1):  # returns b"" once every write end is closed: the driver is gone
        pass
    reap(temp_dir)


if __name__ == "__main__":
    main()
