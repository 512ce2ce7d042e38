"""A job's directory on a node, shared by storm-nm (root) and the job shell (the job's user).

Layout, under ``<run_dir>/jobs/<job id>/``::

    (root, 0711)    the directory itself: the user can reach what is theirs, but not list or replace it
    nm.json         root 0600: the shell's pid and start time, kvsname, node index. The only file the NM
                    acts on (it kills that session when cleaning up after a crash), so only root writes it.
    launch.msg      user 0600: the launch_job message, for the shell to read (it holds the user's environment)
    shell/          user 0700: shell.log (the shell's own stderr) and exits.msg (how the ranks ended). The
                    NM only ever decodes these as untrusted data.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class JobDir:
    path: Path

    @classmethod
    def of(cls, run_dir: Path, job_id: int) -> JobDir:
        return cls(run_dir / "jobs" / str(job_id))

    @property
    def nm_record(self) -> Path:
        return self.path / "nm.json"

    @property
    def launch(self) -> Path:
        return self.path / "launch.msg"

    @property
    def shell(self) -> Path:
        return self.path / "shell"

    @property
    def log(self) -> Path:
        return self.shell / "shell.log"

    @property
    def exits(self) -> Path:
        return self.shell / "exits.msg"

    def create(self, uid: int, gid: int, launch: bytes) -> int:
        """Lay the directory out; return the shell's log, opened for writing."""
        self.path.mkdir(mode=0o711, parents=True, exist_ok=False)
        os.chmod(self.path, 0o711)  # noqa: S103 (mkdir's mode is filtered by the umask)
        self.shell.mkdir(mode=0o700)
        fd = os.open(self.launch, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(launch)
        # Opened before the user owns the directory, so no symlink of theirs can redirect root's writes.
        log = os.open(self.log, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        os.fchown(log, uid, gid)
        for path in (self.shell, self.launch):
            os.chown(path, uid, gid)
        return log

    def save_record(self, record: dict[str, object]) -> None:
        fd = os.open(self.nm_record, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(record, f)

    def load_record(self) -> dict[str, object] | None:
        """The NM's own record, only if root owns it (a file the user could have forged is ignored)."""
        try:
            if self.nm_record.stat().st_uid != os.geteuid():
                return None
            data = json.loads(self.nm_record.read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def log_tail(self, limit: int = 2000) -> str:
        try:
            return self.log.read_bytes()[-limit:].decode(errors="replace").strip()
        except OSError:
            return ""

    def remove(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(self.path)


def job_dirs(run_dir: Path) -> list[JobDir]:
    jobs = run_dir / "jobs"
    if not jobs.is_dir():
        return []
    return [JobDir(p) for p in sorted(jobs.iterdir()) if p.is_dir() and p.name.isdigit()]
