"""A job's life on one node, on the operating-system side: start its shell, stop its ranks, sweep up.

Starting: a job directory (nm/jobdir.py), an mpihook statistics segment, and the job shell forked by the
launcher as the job's user (nm/launcher.py). Stopping: SIGCONT + SIGTERM to every rank's process group,
then after ``kill_grace`` SIGKILL to every process still in the job shell's session (which catches children
the ranks forked). Finishing: sweep what the ranks left (processes, MPICH's and mpihook's shared memory)
and prepare the report for the MM. The node manager (nm/daemon.py) does the talking.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pwd
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from storm.mm import protocol as p
from storm.mm.config import NMConfig
from storm.mpihook.stats import WAIT_POLL, HookSegment, segment_name
from storm.nm.jobdir import JobDir, job_dirs
from storm.nm.monitor import Monitor
from storm.nm.pmi import mpich_shm_names
from storm.nm.processes import Processes
from storm.nm.profile import Profiler
from storm.nm.switcher import ContextSwitcher

log = logging.getLogger("storm.nm")


def find_hook_library() -> Path | None:
    """mpihook's shared library, or None (jobs then run without statistics) if it was not built."""
    try:
        from storm.mpihook import hook_library

        library: Path = hook_library()
    except (ImportError, OSError) as exc:
        log.warning("mpihook is not available, jobs run without statistics: %s", exc)
        return None
    return library


@dataclass
class LocalJob:
    launch: p.LaunchJob
    dir: JobDir
    shell_pid: int = 0
    shell_pidfd: int = -1
    pids: dict[int, int] = field(default_factory=dict)
    exits: dict[int, p.RankExit] = field(default_factory=dict)
    killing: bool = False
    stopped_by_nm: str = ""  # why the NM stopped the ranks on its own account, if it did
    # A cross-node PMI barrier the MM has not answered yet: sent again to an MM that restarted meanwhile.
    barrier: p.PmiBarrierIn | None = None
    done: p.JobNodeDone | None = None

    @property
    def identity(self) -> bytes:
        return f"job-{self.launch.job_id}".encode()


class LocalJobs:
    """The node's jobs, from launch to the report of their end."""

    def __init__(
        self,
        config: NMConfig,
        node: str,
        cpus: list[int],
        run_dir: Path,
        *,
        processes: Processes,
        switcher: ContextSwitcher,
        monitor: Monitor,
        profiler: Profiler | None = None,
    ) -> None:
        self.config = config
        self.node = node
        self.cpus = cpus
        self.run_dir = run_dir
        self.os = processes
        self.switcher = switcher
        self.monitor = monitor
        self.profiler = profiler
        self.jobs: dict[int, LocalJob] = {}
        self.hook_library = find_hook_library()
        self.spin_ns = 120_000  # T_spin until the MM says otherwise (NodeRegistered.fcs.spin)
        self.shells_endpoint = ""

    # ------------------------------------------------------------------------------------------- start

    def launch(self, msg: p.LaunchJob, on_shell_exit: Callable[[LocalJob], None]) -> LocalJob:
        """Start the node's ranks of a job; a failure leaves the job done, with every rank failed."""
        job = LocalJob(launch=msg, dir=JobDir.of(self.run_dir, msg.job_id))
        self.jobs[msg.job_id] = job
        self.switcher.add(msg.job_id, [(s.rank, s.pe) for s in msg.slots], msg.row)
        try:
            self._start_shell(job)
        except (OSError, ValueError, KeyError) as exc:
            log.warning("job %d: launch failed: %s", msg.job_id, exc)
            text = f"launch failed on {self.node}: {exc}"
            self.finish(job, tuple(p.RankExit(rank=s.rank, error=text) for s in msg.slots))
            return job
        asyncio.get_running_loop().add_reader(job.shell_pidfd, on_shell_exit, job)
        log.info("job %d: shell %d starting ranks %s", msg.job_id, job.shell_pid, [s.rank for s in msg.slots])
        return job

    def _start_shell(self, job: LocalJob) -> None:
        msg = job.launch
        bad = [s.pe for s in msg.slots if s.pe >= len(self.cpus)]
        if bad:
            raise ValueError(f"PE(s) {bad} do not exist on this node ({len(self.cpus)} PEs)")
        try:
            pwd.getpwuid(msg.uid)
        except KeyError:
            raise ValueError(f"uid {msg.uid} is unknown on this node") from None
        job.dir.remove()  # a directory left by a crash, for a job id the MM reuses after losing its store
        log_fd = job.dir.create(msg.uid, msg.gid, p.encode(msg))
        shell: dict[str, object] = {
            "jobdir": str(job.dir.path),
            "endpoint": self.shells_endpoint,
            "node": self.node,
            "cpus": self.cpus,
        }
        segment = self._hook_segment(msg)
        if self.hook_library is not None:
            # Every rank of a job runs the hook or none does: it turns blocking collectives into
            # nonblocking ones, and MPICH never matches the two kinds. Without a segment it only passes
            # calls through.
            shell.update(
                hook_library=str(self.hook_library), hook_segment="" if segment is None else segment.name
            )
        try:
            job.shell_pid, job.shell_pidfd = self.os.start_shell(shell, uid=msg.uid, gid=msg.gid, log=log_fd)
        finally:
            os.close(log_fd)
        job.dir.save_record(
            {
                "job_id": msg.job_id,
                "shell_pid": job.shell_pid,
                "shell_start": self.os.start_time(job.shell_pid),
                "kvsname": msg.kvsname,
                "node_index": msg.node_index,
                "hook_segment": "" if segment is None else segment.name,
            }
        )

    def _hook_segment(self, msg: p.LaunchJob) -> HookSegment | None:
        """The job's mpihook statistics segment, made before its ranks start; None without the hook."""
        if self.hook_library is None:
            return None
        try:
            name = segment_name(msg.job_id, msg.node_index)
            segment = HookSegment.create(name, msg.job_id, len(msg.slots), msg.uid, msg.gid)
        except (OSError, ValueError) as exc:
            log.warning("job %d: no mpihook statistics: %s", msg.job_id, exc)
            return None
        for index in range(len(msg.slots)):
            segment.set_wait(index, WAIT_POLL, self.spin_ns)
        self.monitor.add(msg.job_id, segment, [s.rank for s in msg.slots])
        return segment

    def started(self, job: LocalJob, pids: dict[int, int]) -> None:
        """The shell spawned the ranks: time slices and measurements now apply to them."""
        job.pids = pids
        if job.killing:
            self._signal_ranks(job, (signal.SIGCONT, signal.SIGTERM))
        else:
            self.switcher.started(job.launch.job_id, pids)
        self.monitor.started(job.launch.job_id, pids)

    # ------------------------------------------------------------------------------------------- stop

    def kill(self, job: LocalJob, reason: str) -> None:
        if job.killing or job.done is not None:
            return
        job.killing = True
        self.switcher.remove(job.launch.job_id)  # no more time slices: it is continued to be terminated
        log.info("job %d: stopping its ranks (%s)", job.launch.job_id, reason)
        self._signal_ranks(job, (signal.SIGCONT, signal.SIGTERM))
        if job.shell_pid:
            self.os.signal(job.shell_pid, signal.SIGTERM)
        asyncio.get_running_loop().call_later(self.config.kill_grace, self._escalate, job)

    def _escalate(self, job: LocalJob) -> None:
        if job.done is None:
            log.info("job %d: ranks outlived the grace period, sending SIGKILL", job.launch.job_id)
            self._signal_ranks(job, (signal.SIGKILL,))
            self._signal_session(job, signal.SIGKILL, spare_shell=True)

    def _signal_ranks(self, job: LocalJob, signals: tuple[int, ...]) -> None:
        # Only ranks still running: the group of one that exited may be empty and its number reused.
        for rank, pid in job.pids.items():
            if rank not in job.exits:
                for sig in signals:
                    self.os.signal_group(pid, sig)

    def _signal_session(self, job: LocalJob, sig: int, spare_shell: bool = False) -> None:
        """Signal everything in the job shell's session: the ranks and anything they forked.

        Safe against pid reuse: the kernel does not hand out a number while a session still uses it.
        """
        if not job.shell_pid:
            return
        for pid in self.os.session_members(job.shell_pid):
            if not (spare_shell and pid == job.shell_pid):
                self.os.signal(pid, sig)

    # ------------------------------------------------------------------------------------------- end

    def shell_gone(self, job: LocalJob, why: str) -> None:
        """The shell died before reporting: use its exits file if it wrote one, else fail what is missing."""
        with contextlib.suppress(OSError, p.ProtocolError):
            saved = p.decode(job.dir.exits.read_bytes(), p.MAX_NODE_MESSAGE)
            if isinstance(saved, p.ShellDone):
                job.exits.update((e.rank, e) for e in saved.exits)
        self._signal_session(job, signal.SIGKILL)
        tail = job.dir.log_tail()
        if tail:
            log.warning("job %d: job shell log:\n%s", job.launch.job_id, tail)
        exits = tuple(job.exits.get(s.rank) or p.RankExit(rank=s.rank, error=why) for s in job.launch.slots)
        self.finish(job, exits)

    def finish(self, job: LocalJob, exits: tuple[p.RankExit, ...]) -> None:
        """All ranks are gone: sweep what they left behind and prepare the report for the MM."""
        self.switcher.remove(job.launch.job_id)
        self.monitor.remove(job.launch.job_id)
        self._signal_session(job, signal.SIGKILL, spare_shell=True)  # what the ranks left running
        removed = self.os.remove_shm(mpich_shm_names(job.launch.kvsname, job.launch.node_index))
        if removed:
            log.info("job %d: removed shared memory left behind: %s", job.launch.job_id, ", ".join(removed))
        profile = self.profiler.entries(job.launch.job_id) if self.profiler is not None else ()
        job.done = p.JobNodeDone(
            job_id=job.launch.job_id, node=self.node, exits=exits, reason=job.stopped_by_nm, profile=profile
        )

    def forget(self, job: LocalJob) -> None:
        """The MM has the report: nothing of the job remains on the node."""
        del self.jobs[job.launch.job_id]
        job.dir.remove()

    def sweep_leftovers(self) -> None:
        """Stop the jobs a previous storm-nm of this node left when it died: nobody tracks them any more.

        The MM ends them NODE_FAIL when this NM registers without them.
        """
        for jobdir in job_dirs(self.run_dir):
            record = jobdir.load_record()
            if record is not None:
                shell = int(record["shell_pid"])  # type: ignore[call-overload]
                started = self.os.start_time(shell)
                # Our shell, or no process at all with its pid: then its session's members are its ranks
                # (a pid is not reused while a session still carries it). Another process: the pid was reused.
                if started is None or started == record.get("shell_start"):
                    victims = self.os.session_members(shell)
                    for pid in victims:
                        self.os.signal(pid, signal.SIGKILL)
                    log.warning(
                        "job %s: killed %d process(es) left by a previous storm-nm",
                        record["job_id"],
                        len(victims),
                    )
                kvsname, index = str(record["kvsname"]), int(record["node_index"])  # type: ignore[call-overload]
                leftovers = list(mpich_shm_names(kvsname, index))
                if record.get("hook_segment"):
                    leftovers.append(str(record["hook_segment"]).lstrip("/"))
                self.os.remove_shm(leftovers)
            jobdir.remove()
