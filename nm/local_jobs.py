"""A job's life on one node, on the operating-system side: start it in a job shell, stop its ranks, sweep up.

Starting: a job directory (nm/jobdir.py), an mpihook statistics segment, and the launch sent to the job
shell of the job's user on this node (nm/shell_server.py), which the launcher forks as that user
(nm/launcher.py) when none runs (nm/shells.py keeps them). Each rank leads a session of its own. Stopping:
``shell_stop`` to the job shell and SIGCONT + SIGTERM to every rank's process group, then after
``kill_grace`` SIGKILL to every process still in a rank's session (which catches children the ranks
forked). Finishing: sweep what the ranks left (processes still in their process groups or sessions,
MPICH's and mpihook's shared memory) and prepare the report for the MM. The node manager (nm/daemon.py)
does the talking; what goes to job shells is queued in :attr:`LocalJobs.outbox`.

Spawned processes (MPI_Comm_spawn; nm/children.py): the NM learns them from the shell, follows them in time
slicing with the job's rank on their PE, signals them with the ranks when it stops the job, and removes their
worlds' shared memory when it ends; they are in the shell's session, so the final sweep catches them too.

Restarting: job shells and ranks outlive their storm-nm (SIGTERM or SIGKILL; systemd's KillMode=process).
A new storm-nm re-adopts every job it finds in its run directory whose shell is still the process the record
names (same pid *and* kernel start time): its ranks and spawned processes (checked the same way), its mpihook
segment, time slicing and measurements; it learns of the shell's exit through a pidfd, since the shell is no
longer its child. A job whose shell has ended meanwhile is finished from the exits the shell left in its
directory. The job shell re-sends its state when it reconnects (nm/shell.py), so nothing it reported in
between is lost. Reading the records, and sweeping a job nobody can follow, is nm/left_jobs.py's.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pwd
import signal
from dataclasses import dataclass, field
from pathlib import Path

from storm.mm import protocol as p
from storm.mm.config import NMConfig
from storm.mpihook import SPIN_BLOCK_ENVIRONMENT
from storm.mpihook.stats import segment_name
from storm.nm.children import Spawns
from storm.nm.jobdir import JobDir, job_dirs
from storm.nm.left_jobs import integer, live_ranks, optional_integer, sweep
from storm.nm.monitor import Measurements
from storm.nm.pmi import mpich_shm_names
from storm.nm.processes import Processes
from storm.nm.profile import Profiler
from storm.nm.shells import JobShell, JobShells
from storm.nm.switcher import ContextSwitcher

log = logging.getLogger("storm.nm")


UCX_SHM_PREFIX = "ucx_shm_posix_"


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
    shell_start: int | None = None  # the kernel's start time of the shell, to tell it from a reused pid
    shell_pidfd: int = -1
    pids: dict[int, int] = field(default_factory=dict)
    starts: dict[int, int] = field(default_factory=dict)  # each rank's kernel start time, for the same
    hook_segment: str = ""
    ranks_known: bool = False  # the shell's ranks_started was handled (by this NM or the one before)
    exits: dict[int, p.RankExit] = field(default_factory=dict)
    killing: bool = False
    stopped_by_nm: str = ""  # why the NM stopped the ranks on its own account, if it did
    # A cross-node PMI barrier the MM has not answered yet: sent again to an MM that restarted meanwhile.
    barrier: p.PmiBarrierIn | None = None
    done: p.JobNodeDone | None = None
    # The routing id of the shell's connection to this NM, learned from its messages (whose sender the
    # kernel vouches for by pid): replies go there. Empty until the shell has spoken to this NM.
    peer: bytes = b""
    spawns: Spawns = field(default_factory=Spawns)  # what its ranks spawned here (MPI_Comm_spawn)
    # /dev/shm entries its processes mapped when the NM set out to kill them: UCX's (ucx_shm_posix_*, named
    # at random, unlinked only by a process that ends normally) are swept with MPICH's.
    mapped_shm: set[str] = field(default_factory=set)
    # The PMI barrier its shell may enter next; None for a re-adopted job until its shell has entered one.
    next_barrier: int | None = None
    # Preemption holds its ranks stopped (suspend_job): kept in its record, so that neither this NM leaving
    # nor the next one re-adopting it continues them before the MM says so.
    suspended: bool = False
    shell_log: str = ""  # its job shell's stderr
    # Started by a storm-nm from before job shells served several jobs: its shell's session holds its ranks,
    # and the shell is stopped with SIGTERM.
    own_shell: bool = False

    @property
    def job_id(self) -> int:
        return self.launch.job_id


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
        monitor: Measurements,
        profiler: Profiler | None = None,
        cluster: str = "",
    ) -> None:
        self.config = config
        self.node = node
        self.cpus = cpus
        self.run_dir = run_dir
        self.os = processes
        self.switcher = switcher
        self.monitor = monitor
        self.profiler = profiler
        self.cluster = cluster  # mpihook.stats.cluster_token: in the names of the jobs' segments
        self.jobs: dict[int, LocalJob] = {}
        self.hook_library = find_hook_library()
        # The MM's policy may ask ranks to spin-block (sb, fcs): their collectives then use MPICH's
        # algorithms that can (mpihook.SPIN_BLOCK_ENVIRONMENT), which cost small collectives ~1 us otherwise.
        self.spin_blocking = False
        self.shells_endpoint = ""
        self.shells = JobShells(config.shell_idle)
        self.outbox: list[tuple[bytes, p.Message]] = []  # for job shells: (routing id, message)
        self.new_shells: list[JobShell] = []  # started, for the daemon to watch their end

    def take_messages(self) -> list[tuple[bytes, p.Message]]:
        out, self.outbox = self.outbox, []
        return out

    # ------------------------------------------------------------------------------------------- start

    def launch(self, msg: p.LaunchJob) -> LocalJob:
        """Start the node's ranks of a job; a failure leaves the job done, with every rank failed. The
        caller watches ``shell_pidfd`` for the shell's end."""
        job = LocalJob(launch=msg, dir=JobDir.of(self.run_dir, msg.job_id), next_barrier=0)
        self.jobs[msg.job_id] = job
        self.switcher.add(msg.job_id, [(s.rank, s.pe) for s in msg.slots], msg.row)
        try:
            self._start_shell(job)
        except (OSError, ValueError, KeyError) as exc:
            log.warning("job %d: launch failed: %s", msg.job_id, exc)
            text = f"launch failed on {self.node}: {exc}"
            self.finish(job, tuple(p.RankExit(rank=s.rank, error=text) for s in msg.slots))
            return job
        # At DEBUG: storm-mm logs each job's end and where it ran, and this NM what goes wrong.
        log.debug(
            "job %d: shell %d starting ranks %s", msg.job_id, job.shell_pid, [s.rank for s in msg.slots]
        )
        return job

    def _start_shell(self, job: LocalJob) -> None:
        msg = job.launch
        bad = [s.pe for s in msg.slots if s.pe >= len(self.cpus)]
        if bad:
            raise ValueError(f"PE(s) {bad} do not exist on this node ({len(self.cpus)} PEs)")
        if self.shells.for_user(msg.uid, msg.gid) is None:  # (one that runs vouches for its uid)
            try:
                pwd.getpwuid(msg.uid)  # a lookup reads the password database: once per job shell
            except KeyError:
                raise ValueError(f"uid {msg.uid} is unknown on this node") from None
        launch = p.encode(msg)
        try:
            job.dir.create(msg.uid, msg.gid, launch)
        except FileExistsError:  # left by a crash, for a job id the MM reuses after losing its store
            job.dir.remove()
            job.dir.create(msg.uid, msg.gid, launch)
        library = self._hook_library(msg)
        segment = self._hook_segment(msg) if library is not None else None
        job.hook_segment = segment or ""
        environment = dict(SPIN_BLOCK_ENVIRONMENT) if library is not None and self.spin_blocking else {}
        shell = self.shells.for_user(msg.uid, msg.gid) or self._new_shell(msg.uid, msg.gid)
        job.shell_pid, job.shell_start, job.shell_log = shell.pid, shell.start, str(shell.log)
        self.shells.took(shell, msg.job_id)
        # Without a segment the hook only passes calls through (and still spin-blocks nothing).
        order = p.ShellLaunch(
            launch=msg, jobdir=str(job.dir.path), hook_library=str(library or ""), hook_segment=segment or "",
            hook_environment=environment,
        )  # fmt: skip
        self.outbox.extend(self.shells.send(shell, order))
        self.save_record(job)

    def _new_shell(self, uid: int, gid: int) -> JobShell:
        """Start the user's job shell (through the launcher), its stderr in a log of its own."""
        logs = self.run_dir / "shells"
        logs.mkdir(mode=0o700, exist_ok=True)
        log_path = logs / f"{uid}-{gid}-{os.urandom(4).hex()}.log"
        # Root opens it in a directory only root can write: no symlink of the user's can redirect it.
        log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.fchown(log_fd, uid, gid)
            kwargs: dict[str, object] = {
                "endpoint": self.shells_endpoint, "node": self.node, "cpus": self.cpus,
                "spawn_limit": self.config.spawn_limit,
            }  # fmt: skip
            pid, pidfd = self.os.start_shell(kwargs, uid=uid, gid=gid, log=log_fd)
        except BaseException:
            log_path.unlink(missing_ok=True)
            raise
        finally:
            os.close(log_fd)
        shell = JobShell(uid=uid, gid=gid, pid=pid, start=self.os.start_time(pid), pidfd=pidfd, log=log_path)
        self.shells.add(shell)
        self.new_shells.append(shell)
        log.info("job shell %d started for uid %d", pid, uid)
        return shell

    def shell_ended(self, pid: int) -> JobShell | None:
        """A job shell this NM started has exited: forgotten, its log removed unless a job of it was left
        without its report (the caller ends those jobs, and their end logs the tail)."""
        shell = self.shells.ended(pid)
        if shell is not None and not any(j.shell_pid == pid and j.done is None for j in self.jobs.values()):
            shell.log.unlink(missing_ok=True)
        return shell

    def save_record(self, job: LocalJob) -> None:
        """What a restarted storm-nm needs to re-adopt the job (nm/jobdir.py's nm.json)."""
        job.dir.save_record(
            {
                "job_id": job.launch.job_id,
                "shell_pid": job.shell_pid,
                "shell_start": job.shell_start,
                "kvsname": job.launch.kvsname,
                "mpi_node": job.launch.mpi_node,
                "hook_segment": job.hook_segment,
                "ranks": {str(rank): [pid, job.starts.get(rank)] for rank, pid in job.pids.items()},
                "stopped_by_nm": job.stopped_by_nm,
                "spawns": job.spawns.record(),
                "suspended": job.suspended,
                "shell_log": job.shell_log,
                "own_shell": job.own_shell,
            }
        )

    def _hook_library(self, msg: p.LaunchJob) -> Path | None:
        """mpihook for the job's ranks, unless the job (storm submit --no-hook) or the node ([nm] hook)
        runs without it."""
        return self.hook_library if msg.hook and self.config.hook else None

    def _hook_segment(self, msg: p.LaunchJob) -> str | None:
        """The name of the job's mpihook statistics segment, made before its ranks start; None if none."""
        name = segment_name(msg.job_id, msg.node_index, cluster=self.cluster, run=msg.kvsname)
        return (
            name
            if self.monitor.create(msg.job_id, name, [s.rank for s in msg.slots], msg.uid, msg.gid)
            else None
        )

    def started(self, job: LocalJob, pids: dict[int, int]) -> bool:
        """The shell spawned the ranks: time slices and measurements now apply to them.

        False for a repeated report (a shell re-sending its state to a restarted NM): nothing changes. A
        restarted NM knows the ranks from its record, and a rank missing from them has ended (or its pid was
        reused): never signal it.
        """
        if job.ranks_known:
            return False
        job.ranks_known = True
        job.pids = pids
        job.starts = {}
        for rank, pid in pids.items():
            start = self.os.start_time(pid)
            if start is not None:
                job.starts[rank] = start
        with contextlib.suppress(OSError):
            self.save_record(job)  # the directory is gone only if the job already ended
        if job.killing:
            self._signal_ranks(job, (signal.SIGCONT, signal.SIGTERM))
        else:
            self.switcher.started(job.launch.job_id, pids)
        self.monitor.started(job.launch.job_id, pids)
        return True

    def dynamic(
        self, job: LocalJob, msg: p.Spawned | p.SpawnExited | p.JobSpawned | p.PmiName
    ) -> list[p.Message]:
        """What a job shell says of spawned processes and names (nm/spawner.py), checked already
        (nm/checks.py); returns what goes to the MM."""
        job_id = job.launch.job_id
        match msg:
            case p.Spawned():
                if not self.spawned(job, msg):
                    return []
                log.info("job %d: spawn %d started %d process(es)", job_id, msg.world, len(msg.pids))
                return [p.JobSpawned(job_id=job_id, node=self.node, world=msg.world, processes=len(msg.pids))]
            case p.SpawnExited():
                self.spawn_exited(job, msg)
                if not msg.exit.failed or job.killing or job.spawns.failure is not None:
                    return []
                parent = job.spawns.worlds[msg.world]
                failure = p.SpawnFailed(
                    job_id=job_id, node=self.node, world=msg.world, parent=parent, exit=msg.exit
                )
                job.spawns.failure = failure
                log.info("job %d: %s", job_id, failure.describe())
                self.kill(job, failure.describe())
                return [failure]
            case p.JobSpawned():
                log.info("job %d: %s", job_id, msg.refused)
        return [msg]  # a refused spawn, counted by the MM, or a name request for it

    def spawned(self, job: LocalJob, msg: p.Spawned) -> bool:
        """The shell started the processes of one spawn: they are stopped, continued and killed with the job
        from now on. False for a world already known (a shell re-sending its state): nothing changes."""
        added = job.spawns.add(msg, self.os.start_time)
        if not added:
            return False
        with contextlib.suppress(OSError):
            self.save_record(job)
        for child in added:
            if not child.live:
                continue
            if job.killing:
                for sig in (signal.SIGCONT, signal.SIGTERM):
                    self.os.signal_group(child.pid, sig)
            else:
                self.switcher.follow(job.launch.job_id, child.pid, child.pe)
        return True

    def spawn_exited(self, job: LocalJob, msg: p.SpawnExited) -> None:
        """A spawned process ended: never signal its process group again."""
        child = job.spawns.children.get((msg.world, msg.exit.rank))
        if child is not None and not msg.aborted:
            child.exit = msg.exit
            self.switcher.unfollow(child.pid)

    # ------------------------------------------------------------------------------------------- stop

    def kill(self, job: LocalJob, reason: str) -> bool:
        """Stop the job's ranks: SIGCONT + SIGTERM now; True if the caller is to :meth:`escalate` after
        ``kill_grace`` (False: the job was already being killed, or is done)."""
        if job.killing or job.done is not None:
            return False
        job.killing = True
        self.switcher.remove(job.launch.job_id)  # no more time slices: it is continued to be terminated
        log.info("job %d: stopping its ranks (%s)", job.launch.job_id, reason)
        if job.shell_pid:
            # Frozen first: UCX names a segment, maps it and unlinks it later, so a rank still running could
            # create one after the list is taken and leave it behind when the SIGTERM below ends it.
            self._signal_ranks(job, (signal.SIGSTOP,))
            members = [pid for pid in self._members(job) if pid != job.shell_pid]
            job.mapped_shm = {n for n in self.os.mapped_shm(members) if n.startswith(UCX_SHM_PREFIX)}
        self._signal_ranks(job, (signal.SIGCONT, signal.SIGTERM))
        if job.own_shell and job.shell_pid:
            self.os.signal(job.shell_pid, signal.SIGTERM)
        elif job.shell_pid:
            self._to_shell(job, p.ShellStop(job_id=job.job_id))
        return True

    def _to_shell(self, job: LocalJob, msg: p.Message) -> None:
        """A message for the job's shell: on the connection it speaks for the job on, else the one it said
        shell_ready on (after its launch, if that is still held back)."""
        if job.peer:
            self.outbox.append((job.peer, msg))
            return
        shell = self.shells.by_pid.get(job.shell_pid)
        if shell is not None:
            self.outbox.extend(self.shells.send(shell, msg))

    def escalate(self, job: LocalJob) -> None:
        """The grace period of a kill is over: SIGKILL what is left."""
        if job.done is None:
            log.info("job %d: ranks outlived the grace period, sending SIGKILL", job.launch.job_id)
            self._signal_ranks(job, (signal.SIGKILL,))
            self._signal_sessions(job, signal.SIGKILL)

    def _signal_ranks(self, job: LocalJob, signals: tuple[int, ...]) -> None:
        """Signal the job's ranks and spawned processes, each through its process group."""
        # Only ranks still running: the group of one that exited may be empty and its number reused.
        live = [pid for rank, pid in job.pids.items() if rank not in job.exits]
        for pid in live + [child.pid for child in job.spawns.live()]:
            for sig in signals:
                self.os.signal_group(pid, sig)

    def _leaders(self, job: LocalJob) -> list[int]:
        """The pids that lead the job's sessions: its ranks' and spawned processes' (its shell's, for a job
        of an older storm-nm). Only those that are still the same process, or gone: a session's id is not
        handed out again while any process is in it, but a later process may have the pid of a leader that
        ended with its session."""
        if job.own_shell:
            return [job.shell_pid] if job.shell_pid else []
        leaders = []
        for rank, pid in job.pids.items():
            now = self.os.start_time(pid)
            if now is None or now == job.starts.get(rank):
                leaders.append(pid)
        leaders += [child.pid for child in job.spawns.children.values()]
        return leaders

    def _members(self, job: LocalJob) -> list[int]:
        """Every process in the job's sessions: its ranks and anything they forked."""
        return [pid for leader in self._leaders(job) for pid in self.os.session_members(leader)]

    def _signal_sessions(self, job: LocalJob, sig: int) -> None:
        """Signal everything in the job's sessions (never its job shell)."""
        for pid in self._members(job):
            if pid != job.shell_pid:
                self.os.signal(pid, sig)

    def _leftovers(self, job: LocalJob) -> bool:
        """Whether a process of the job may still run once every rank has been reported ended: one of its
        process groups still has a member (a group's id is not reused while it has one)."""
        if job.own_shell:
            return True
        return any(self.os.signal_group(pid, 0) for pid in self._leaders(job))

    # ------------------------------------------------------------------------------------------- end

    def shell_gone(self, job: LocalJob, why: str) -> None:
        """The shell died before reporting: use its exits file if it wrote one, else fail what is missing."""
        with contextlib.suppress(OSError, p.ProtocolError):
            saved = p.decode(job.dir.exits.read_bytes(), p.MAX_NODE_MESSAGE)
            if isinstance(saved, p.ShellDone):
                job.exits.update((e.rank, e) for e in saved.exits)
        self._signal_sessions(job, signal.SIGKILL)
        tail = _tail(job.shell_log)
        if tail:
            log.warning("job %d: job shell log:\n%s", job.launch.job_id, tail)
        exits = tuple(job.exits.get(s.rank) or p.RankExit(rank=s.rank, error=why) for s in job.launch.slots)
        self.finish(job, exits)

    def finish(self, job: LocalJob, exits: tuple[p.RankExit, ...]) -> None:
        """All ranks are gone: sweep what they left behind and prepare the report for the MM."""
        self.switcher.remove(job.launch.job_id)
        self.monitor.remove(job.launch.job_id)
        if self._leftovers(job):  # what the ranks left running (a /proc walk: only when something is left)
            self._signal_sessions(job, signal.SIGKILL)
        self.shells.released(job.shell_pid, job.job_id)
        shm = [
            *mpich_shm_names(job.launch.kvsname, job.launch.mpi_node),
            *job.spawns.shm_names(job.launch),
            *sorted(job.mapped_shm),
        ]
        removed = self.os.remove_shm(shm)
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

    # ------------------------------------------------------------------------------------------- restart

    def leave(self) -> int:
        """This NM exits and its jobs run on for the next one: continue every rank time slicing stopped
        (nobody would continue it meanwhile), but not those of a suspended job, whose PEs another job has.
        Returns how many jobs run on."""
        running = 0
        for job in self.jobs.values():
            if job.done is None:
                running += 1
                if not job.suspended:
                    self._signal_ranks(job, (signal.SIGCONT,))
        return running

    def recover(self) -> list[LocalJob]:
        """Re-adopt the jobs a previous storm-nm of this node left (restarted, or crashed).

        A job whose records are missing or unreadable cannot be followed: its processes are killed and its
        leftovers removed; the MM ends it NODE_FAIL when this NM registers without it.
        """
        adopted = []
        for jobdir in job_dirs(self.run_dir):
            record = jobdir.load_record()
            job: LocalJob | None = None
            if record is not None:
                try:
                    job = self._adopt(jobdir, record)
                except (KeyError, TypeError, ValueError, OSError, p.ProtocolError) as exc:
                    log.warning("job %s: cannot re-adopt it: %s", jobdir.path.name, exc)
            if job is None:
                sweep(self.os, jobdir, record)
            else:
                adopted.append(job)
        # The logs of job shells that serve none of these jobs: those shells exit once idle, if they run.
        kept = {job.shell_log for job in adopted}
        shells = self.run_dir / "shells"
        for path in shells.glob("*.log") if shells.is_dir() else ():
            if str(path) not in kept:
                path.unlink(missing_ok=True)
        return adopted

    def _adopt(self, jobdir: JobDir, record: dict[str, object]) -> LocalJob | None:
        data = jobdir.load_launch()
        launch = None if data is None else p.decode(data, p.MAX_NODE_MESSAGE)
        if not isinstance(launch, p.LaunchJob) or str(launch.job_id) != jobdir.path.name:
            return None
        shell, shell_start = integer(record["shell_pid"]), optional_integer(record.get("shell_start"))
        ranks, starts = live_ranks(self.os, record)
        # The last check that may refuse the record: nothing is held yet.
        spawns = Spawns.from_record(record.get("spawns"), self.os.start_time)
        # The pidfd first, then the check: if the start time matches, the pidfd names our shell.
        pidfd = self.os.pidfd(shell)
        now = self.os.start_time(shell)
        alive = pidfd is not None and shell_start is not None and now == shell_start
        if pidfd is not None and not alive:
            os.close(pidfd)
        job = LocalJob(
            launch=launch,
            dir=jobdir,
            # A reused pid is someone else's: never signal it (nor its session, which cannot be ours).
            shell_pid=shell if alive or now is None else 0,
            shell_start=shell_start,
            shell_pidfd=pidfd if alive and pidfd is not None else -1,
            hook_segment=str(record.get("hook_segment") or ""),
            stopped_by_nm=str(record.get("stopped_by_nm") or ""),
            spawns=spawns,
            suspended=bool(record.get("suspended")),
            shell_log=str(record.get("shell_log") or ""),
            own_shell=bool(record.get("own_shell", True)),  # absent: written before shells were shared
        )
        self.jobs[launch.job_id] = job
        self.switcher.add(launch.job_id, [(s.rank, s.pe) for s in launch.slots], launch.row)
        # Suspended by preemption: it stays stopped (its ranks are put in that state once known, below) until
        # the MM, as it registers this NM, says otherwise.
        self.switcher.set_suspended(launch.job_id, job.suspended)
        self._attach_segment(job)  # also when the shell is gone: finishing the job then removes the segment
        if not alive:
            log.info("job %d: its shell ended while storm-nm was down", launch.job_id)
            job.pids, job.starts = ranks, starts  # what is left of them is stopped
            self.shell_gone(job, "the job shell ended while storm-nm was down, leaving no exits")
            return job
        for pid in [*ranks.values(), *(child.pid for child in spawns.live())]:
            # Stopped by time slicing when the old NM went: nobody would continue it. Slices resume with the
            # next heartbeat; until then everything runs, as when heartbeats stop. A suspended job's ranks
            # stay stopped.
            if not job.suspended:
                self.os.signal_group(pid, signal.SIGCONT)
            self.os.set_nice(pid, 0)
            # The old NM may have left the session's autogroup at the background nice; the new switcher takes
            # it for 0 (ContextSwitcher.group_nice), so it would never set it back.
            self.os.set_group_nice(pid, 0)
        if record.get("ranks"):
            self.started(job, ranks)
            self.monitor.backdate(
                launch.job_id, {rank: job.starts[rank] for rank in ranks if rank in job.starts}
            )
        for child in spawns.live():
            self.switcher.follow(launch.job_id, child.pid, child.pe)
        log.info(
            "job %d: re-adopted shell %d and ranks %s left by a previous storm-nm",
            launch.job_id, shell, sorted(ranks),
        )  # fmt: skip
        return job

    def _attach_segment(self, job: LocalJob) -> None:
        """Measure the job again from its mpihook segment, each rank polling as a new NM assumes."""
        if job.hook_segment:
            self.monitor.attach(job.launch.job_id, job.hook_segment, [s.rank for s in job.launch.slots])


def _tail(path: str, limit: int = 2000) -> str:
    if not path:
        return ""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - limit))
            return f.read().decode(errors="replace").strip()
    except OSError:
        return ""
