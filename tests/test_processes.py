"""The real kernel behind nm/processes.py where the fakes cannot say what Linux does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from storm.nm.processes import LinuxProcesses

HOLDER = """
import mmap, os, sys
opened = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)  # open, never mapped
mapped_fd = os.open(sys.argv[2], os.O_RDWR | os.O_CREAT, 0o600)
os.ftruncate(mapped_fd, 4096)
mapping = mmap.mmap(mapped_fd, 4096)
os.close(mapped_fd)  # mapped, no longer open
print("ready", flush=True)
sys.stdin.read()
"""


def test_a_segment_counts_whether_it_is_mapped_or_only_held_open() -> None:
    """UCX opens a segment before it maps it: a process killed in between leaves the name behind too."""
    names = [f"storm-test-{os.getpid()}-open", f"storm-test-{os.getpid()}-mapped"]
    paths = [Path("/dev/shm") / name for name in names]
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, *map(str, paths)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "ready\n"
        found = LinuxProcesses().mapped_shm([holder.pid])
        assert set(names) <= found
    finally:
        holder.communicate("")
        for path in paths:
            path.unlink(missing_ok=True)
    assert LinuxProcesses().mapped_shm([holder.pid]) == set()  # gone: it holds nothing
