"""A job's directory on a node, shared by storm-nm (root) and the job shell (the job's user).

Layout, under ``<run_dir>/jobs/<job id>/``::

    (root, 0711)    the directory itself: the user can reach what is theirs, but not list or replace it
    nm.json         root 0600: the shell's pid and start time, kvsname, node index, mpihook segment, each
                    rank's pid and start time, and why the NM stopped the job if it did. With nm.launch,
                    the only files the NM acts on (a restarted NM re-adopts the job from them, and kills that
                    session when it cannot), so only root writes them.
    nm.launch       root 0600: the NM's own copy of the launch_job message (slots, kvsname, row)
    shell/          user 0700: exits.msg (how the ranks ended, kept until the NM has reported them: an NM
                    restarted meanwhile learns them here). The NM only ever decodes it as untrusted data.

The job shell gets the launch in its message (``shell_launch``); its own log is its user's, not the job's
(``<run_dir>/shells/``, see nm/local_jobs.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path


@dataclass(frozen=True)
class JobDir:
    path: Path

    @classmethod
    def of(cls, run_dir: Path, job_id: int) -> JobDir:
        return cls(run_dir / "jobs" / str(job_id))

    # Cached: the NM uses each several times per job, and a pathlib join costs more than the system call.
    @cached_property
    def nm_record(self) -> Path:
        return self.path / "nm.json"

    @cached_property
    def nm_record_new(self) -> Path:
        return self.path / "nm.json.new"

    @cached_property
    def nm_launch(self) -> Path:
        return self.path / "nm.launch"

    @cached_property
    def shell(self) -> Path:
        return self.path / "shell"

    @cached_property
    def exits(self) -> Path:
        return self.shell / "exits.msg"

    def create(self, uid: int, gid: int, launch: bytes) -> None:
        """Lay the directory out."""
        self.path.mkdir(mode=0o711, parents=True, exist_ok=False)
        os.chmod(self.path, 0o711)  # noqa: S103 (mkdir's mode is filtered by the umask)
        _write(self.nm_launch, launch, os.O_EXCL, 0o600)
        self.shell.mkdir(mode=0o700)
        os.chown(self.shell, uid, gid)

    def save_record(self, record: dict[str, object]) -> None:
        """Replace the NM's record atomically: a crash mid-write leaves the old one, never half a file."""
        # json.dumps, not json.dump: dump streams through the pure-Python encoder, several times slower,
        # and every job saves its record twice.
        _write(self.nm_record_new, json.dumps(record).encode(), os.O_TRUNC, 0o600)
        os.replace(self.nm_record_new, self.nm_record)

    def write_exits(self, data: bytes) -> None:
        """The job shell's exits.msg."""
        _write(self.exits, data, os.O_TRUNC, 0o666)

    def load_record(self) -> dict[str, object] | None:
        """The NM's own record, only if root owns it (a file the user could have forged is ignored)."""
        data = self._load_own(self.nm_record)
        try:
            record = json.loads(data) if data is not None else None
        except ValueError:
            return None
        return record if isinstance(record, dict) else None

    def load_launch(self) -> bytes | None:
        """The NM's copy of the launch message, only if root owns it; the caller decodes it."""
        return self._load_own(self.nm_launch)

    def _load_own(self, path: Path) -> bytes | None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            return None
        with os.fdopen(fd, "rb") as f:
            if os.fstat(f.fileno()).st_uid != os.geteuid():
                return None
            return f.read()

    def remove(self) -> None:
        # The files this layout has, one call each; rmtree (a walk through descriptors, several times the
        # calls) only for a directory holding anything else, e.g. files the user left in shell/.
        try:
            for path in (self.nm_record, self.nm_launch, self.exits):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
            for path in (self.shell, self.path):
                with contextlib.suppress(FileNotFoundError):
                    os.rmdir(path)
        except OSError:
            with contextlib.suppress(FileNotFoundError):
                shutil.rmtree(self.path)


def _write(path: Path, data: bytes, flags: int, mode: int) -> None:
    """A small file written with os calls (a file object, as pathlib's write_bytes makes, costs several
    times as much); ``flags``: O_TRUNC or O_EXCL."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | flags, mode)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def job_dirs(run_dir: Path) -> list[JobDir]:
    jobs = run_dir / "jobs"
    if not jobs.is_dir():
        return []
    return [JobDir(p) for p in sorted(jobs.iterdir()) if p.is_dir() and p.name.isdigit()]
