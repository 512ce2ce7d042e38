"""One daemon per directory: storm-mm per state directory, storm-nm per run directory.

Two daemons on one directory would each believe they own its jobs (the MM's SQLite store, the NM's job
directories). An flock is released by the kernel however its holder ends, so a crash never leaves a stale
lock behind, unlike a pid file.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


def take_lock(path: Path, *, busy: str) -> int:
    """Lock ``path`` (created if need be) for as long as the returned descriptor stays open; exit with the
    message ``busy`` if another process holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise SystemExit(busy) from None
    return fd
