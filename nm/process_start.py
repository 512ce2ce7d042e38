"""How the job shell starts a rank (or a spawned process): posix_spawn, not subprocess.Popen.

The job shell starts a process for every rank of every job, on the path from a job's launch to its end.
Popen spent 120-130 µs of the shell's CPU on each (its error pipe, file handles and bookkeeping, in
Python), posix_spawn (glibc's clone with CLONE_VFORK, which reports a failed exec as an error) 67-73, and
`true` went from its start to being reaped 50-60 µs sooner (`python -m storm.nm.process_start` times both).
What Popen did for the shell that posix_spawn does not, done here instead:

- The working directory: glibc's posix_spawn_file_actions_addchdir_np is not in Python's os.posix_spawn,
  so the shell (single-threaded, and between two awaits) enters ``cwd`` for the call and goes back after.
- The program's search: posix_spawnp, like execvp, searches the caller's PATH, not that of the child's
  environment, so the caller's PATH is the job's for the call (unset if the job has none: both then search
  the same default).
- Only the descriptors asked for reach the program: Python opens every descriptor close-on-exec (PEP 446);
  the one passed on is inheritable for the call, and 0-2 are replaced by file actions.
- SIGPIPE and SIGXFSZ, which Python ignores, are the default again (Popen's restore_signals).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping

RESTORED_SIGNALS = (signal.SIGPIPE, signal.SIGXFSZ)


def start_process(
    argv: list[str], env: Mapping[str, str], cwd: str, *, outputs: tuple[int, int], keep_fd: int
) -> int:
    """Start ``argv`` in ``cwd`` with ``env``, in a session of its own: stdin from /dev/null, stdout and
    stderr on the ``outputs`` descriptors, ``keep_fd`` open as it is; return its pid. Raises OSError (with
    the errno of the failed exec, chdir or open) or ValueError (a NUL in an argument or the environment)."""
    home = os.getcwd()
    path = os.environ.get("PATH")
    os.chdir(cwd)
    try:
        _set_path(env.get("PATH"))
        os.set_inheritable(keep_fd, True)
        return os.posix_spawnp(
            argv[0],
            argv,
            env,
            file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_DUP2, outputs[0], 1),
                (os.POSIX_SPAWN_DUP2, outputs[1], 2),
            ],
            setsid=True,
            setsigdef=RESTORED_SIGNALS,
        )
    finally:
        os.set_inheritable(keep_fd, False)
        _set_path(path)
        os.chdir(home)


def _set_path(path: str | None) -> None:
    if path is None:
        os.environ.pop("PATH", None)
    else:
        os.environ["PATH"] = path


def _compare(count: int = 500) -> None:
    """The shell's CPU and the wall time per process, Popen against start_process, alternating."""
    import resource
    import socket
    import subprocess
    import time

    env = dict(os.environ)
    null = os.open(os.devnull, os.O_WRONLY)

    def popen(child: socket.socket) -> int:
        started = subprocess.Popen(
            ["true"], env=env, cwd="/tmp", stdin=subprocess.DEVNULL, stdout=null, stderr=null,
            pass_fds=(child.fileno(),), start_new_session=True,
        )  # fmt: skip
        started.returncode = 0  # reaped below, as the shell reaps (else Popen's __del__ may reap it first)
        return started.pid

    def spawn(child: socket.socket) -> int:
        return start_process(["true"], env, "/tmp", outputs=(null, null), keep_fd=child.fileno())

    for _ in range(2):
        for name, start in (("Popen", popen), ("posix_spawn", spawn)):
            usage, wall = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
            for _ in range(count):
                parent, child = socket.socketpair()
                pid = start(child)
                child.close()
                os.waitpid(pid, 0)
                parent.close()
            after = resource.getrusage(resource.RUSAGE_SELF)
            cpu = after.ru_utime + after.ru_stime - usage.ru_utime - usage.ru_stime
            wall = (time.perf_counter() - wall) / count
            print(f"{name:12} CPU {cpu / count * 1e6:6.0f} µs, wall {wall * 1e6:6.0f} µs")


if __name__ == "__main__":
    _compare()
