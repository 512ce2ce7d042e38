"""A job on one node as its job shell serves it: the job shell runs as the job's user and serves every job
of that user on the node (nm/shell_server.py is the process; this module is one job in it).

It opens the job's output files (with the user's own permissions, so ``--output /etc/passwd`` fails as it
should), spawns the node's ranks each in a session of its own pinned to its PE, serves their PMI-1 wire-up
(cross-node barriers go through the NM to the MM), reaps them, and reports every exit to the NM.
It also starts and serves the processes that ranks spawn with MPI_Comm_spawn, each world of them wired up
on this node alone (nm/spawner.py; semantics in nm/spawn.py), and relays MPI's name requests
(MPI_Publish_name ...) to the NM, which asks the MM. The job's part on the node ends when its ranks and
every process they spawned have exited, as mpiexec waits for them.
Keeping this out of the NM means a flood of PMI traffic never delays the NM's time slices, a bug in PMI
parsing never runs as root, and an NM restart does not take the ranks' parent with it.

Each rank (and spawned process) leads a session of its own: the NM stops what a rank leaves behind by that
session, and the rank's autogroup gets the priority time slicing gives it. The job shell's own session is
shared by the user's jobs on the node and holds none of their processes.

After a reconnection (to a restarted NM) the job shell sends each job's whole state again: its ranks'
pids, every exit so far, an abort, the PMI barrier it waits for, the spawned worlds and their exits, and its
final report (the NM treats all of them as idempotent). How the ranks ended is also written to the job
directory before the final report, for an NM that comes back only after the job shell exited.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field

from storm.mm import protocol as p
from storm.mm.config import NMConfig
from storm.mm.slurm_style import expand_path
from storm.nm.jobdir import JobDir
from storm.nm.output import StreamedOutput
from storm.nm.pmi import MAX_LINE, NameRequest, Outcome, Wireup, process_mapping
from storm.nm.process_start import start_process
from storm.nm.spawn import SpawnRequest
from storm.nm.spawner import NAME_TIMEOUT, PendingNames, Proc, Spawner

Rank = Proc  # a rank of the job is a process the shell serves, of world 0


@dataclass(frozen=True)
class Hook:
    """mpihook for this job's ranks: the library to preload, the statistics segment the NM made ("" if
    it could not make one: the hook then passes calls through), and MPICH settings that let their waits
    spin-block (mpihook.SPIN_BLOCK_ENVIRONMENT, on nodes whose policy may ask for it; a variable the job
    set itself wins)."""

    library: str
    segment: str
    environment: Mapping[str, str] = field(default_factory=dict)


def rank_environment(
    launch: p.LaunchJob, rank: int, node: str, pmi_fd: int, hook: Hook | None = None
) -> dict[str, str]:
    env = {
        k: v for k, v in launch.env.items() if not k.startswith(("PMI_", "PMIX_", "HYDRA_", "STORM_HOOK_"))
    }
    env.update(
        PMI_FD=str(pmi_fd),
        PMI_RANK=str(rank),
        PMI_SIZE=str(launch.size),
        STORM_JOB_ID=str(launch.job_id),
        STORM_RANK=str(rank),
        STORM_SIZE=str(launch.size),
        STORM_NODE=node,
    )
    if hook is not None:
        index = [s.rank for s in launch.slots].index(rank)
        # Preloaded in the ranks only: the job shell and its launcher never load it.
        preload = " ".join(filter(None, (hook.library, env.get("LD_PRELOAD", ""))))
        env["LD_PRELOAD"] = preload
        env.update({k: v for k, v in hook.environment.items() if k not in env})
        if hook.segment:
            env.update(STORM_HOOK_SEGMENT=hook.segment, STORM_HOOK_INDEX=str(index))
    return env


class Shell:
    """One job in its job shell. ``send`` puts a message on the job shell's connection to the NM."""

    def __init__(
        self,
        launch: p.LaunchJob,
        node: str,
        cpus: list[int],
        send: Callable[[p.Message], Coroutine[object, object, None]],
        jobdir: JobDir,
        *,
        hook: Hook | None = None,
        spawn_limit: int = NMConfig.spawn_limit,
        forward: Callable[[p.JobOutput], None] | None = None,
    ) -> None:
        self.launch = launch
        # A streamed job's ranks write into pipes this shell reads (nm/output.py); the others, their files.
        self.output = (
            StreamedOutput(launch.job_id, node, forward) if launch.stream and forward is not None else None
        )
        self.hook = hook
        self.node = node
        self.cpus = cpus
        self.send = send
        self.jobdir = jobdir
        self.ranks = {s.rank: Rank(rank=s.rank, pe=s.pe) for s in launch.slots}
        self.wireup = Wireup(
            kvsname=launch.kvsname,
            size=launch.size,
            local_ranks=list(self.ranks),
            process_mapping=process_mapping(launch.ranks_per_node, launch.hosts),
        )
        self.all_exited = asyncio.Event()
        self.acked = asyncio.Event()
        self.stopping = False
        # What a restarted NM is told again (see the module's docstring).
        self.started: p.RanksStarted | None = None
        self.reported = asyncio.Event()  # ranks_started is out: spawned worlds may be reported after it
        self.barrier: p.PmiBarrierIn | None = None  # sent to the NM, not yet answered
        self.done: p.ShellDone | None = None
        self.on_done: Callable[[], None] = lambda: None  # the job shell's: the final report is out
        self._tasks: set[asyncio.Task[None]] = set()
        self.spawner = Spawner(self, spawn_limit, self.send)
        self.names = PendingNames()

    # ------------------------------------------------------------------------------------------- start-up

    def _open_outputs(self) -> dict[int, tuple[int, int]]:
        """stdout and stderr descriptors per rank; a path shared by several ranks is opened once."""
        opened: dict[str, int] = {}
        result: dict[int, tuple[int, int]] = {}
        for rank in self.ranks:
            result[rank] = self._outputs_of(rank, opened)
        return result

    def open_outputs(self, rank: int) -> tuple[int, int]:
        """Job rank ``rank``'s stdout and stderr files, opened anew (a spawn's processes write there)."""
        opened: dict[str, int] = {}
        try:
            return self._outputs_of(rank, opened)
        except OSError:
            for fd in opened.values():
                os.close(fd)
            raise

    def _outputs_of(self, rank: int, opened: dict[str, int]) -> tuple[int, int]:
        def open_path(pattern: str, rank: int) -> int:
            path = expand_path(
                pattern,
                job_id=self.launch.job_id,
                rank=rank,
                node=self.node,
                user=self.launch.user,
                name=self.launch.name,
            )
            path = os.path.join(self.launch.cwd, path)
            if path not in opened:
                opened[path] = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
            return opened[path]

        out = open_path(self.launch.output, rank)
        err = open_path(self.launch.error, rank) if self.launch.error else out
        return out, err

    def _spawn(self, r: Rank, out: int, err: int) -> None:
        env = rank_environment(self.launch, r.rank, self.node, 0, self.hook)
        if self.output is None:
            problem = self.start_process(r, list(self.launch.argv), env, self.launch.cwd, (out, err))
        else:
            ends = self.output.open(r.rank, out, err)
            try:
                problem = self.start_process(r, list(self.launch.argv), env, self.launch.cwd, ends)
            finally:
                for fd in ends:  # the rank has them now: its exit closes the pipes
                    os.close(fd)
            self.output.watch(r.rank)
        if problem:
            r.exit = p.RankExit(rank=r.rank, error=problem)

    def start_process(
        self, proc: Proc, argv: list[str], env: dict[str, str], cwd: str, outputs: tuple[int, int]
    ) -> str:
        """Start a rank or a spawned process, pinned to its PE in a session (and process group) of its own,
        and serve its PMI; "" or why it could not start."""
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        env["PMI_FD"] = str(child.fileno())
        try:
            pid = start_process(argv, env, cwd, outputs=outputs, keep_fd=child.fileno())
        except (OSError, ValueError) as exc:
            parent.close()
            why = exc.strerror if isinstance(exc, OSError) else str(exc)
            return f"cannot execute {argv[0]}: {why}"
        finally:
            child.close()
        if len(set(self.cpus)) > 1:
            # Pinned once started. Moving this thread onto the PE's CPU for the fork instead (the child
            # inherits it) made every spawn wait until that CPU was free: with ranks on several CPUs, the
            # soak ran 3% slower (see README). Pinning after the fork on a one-CPU node cost the launch
            # benchmark 5-7% instead: a job shell there lives on that CPU and its children inherit it
            # (nm/shell_server.py).
            with contextlib.suppress(ProcessLookupError):
                os.sched_setaffinity(pid, {self.cpus[proc.pe % len(self.cpus)]})
        proc.pid = pid
        proc.pidfd = os.pidfd_open(proc.pid)
        loop = asyncio.get_running_loop()
        loop.add_reader(proc.pidfd, self._reap, proc)
        # Served once it says something: most programs that are not MPI never do, and their socket then only
        # ever reads its end (a reader costs much less than a stream).
        loop.add_reader(parent.fileno(), self._pmi_ready, proc, parent)
        return ""

    def notice(self, proc: Proc, text: str) -> None:
        """A line for the job's user in ``proc``'s stderr file (the job rank's it writes to), and the log."""
        print(text, file=sys.stderr, flush=True)
        try:
            out, err = self.open_outputs(proc.out_rank)
        except OSError:
            return
        with contextlib.suppress(OSError):
            os.write(err, (text + "\n").encode())
        for fd in {out, err}:
            os.close(fd)

    def kill(self, proc: Proc) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)

    # ------------------------------------------------------------------------------------------- PMI

    def _wireup(self, r: Proc) -> Wireup:
        return self.wireup if r.world == 0 else self.spawner.worlds[r.world].wireup

    def _procs(self, world: int) -> dict[int, Proc]:
        return self.ranks if world == 0 else self.spawner.worlds[world].procs

    def _pmi_ready(self, r: Proc, sock: socket.socket) -> None:
        asyncio.get_running_loop().remove_reader(sock.fileno())
        try:
            said = sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            said = b"?"  # woken for nothing: let the stream read it
        except OSError:
            said = b""
        if said:
            self._background(self._serve_pmi(r, sock))
        else:  # the rank is gone without a word of PMI
            self._wireup(r).rank_gone(r.rank)
            sock.close()

    async def _serve_pmi(self, r: Proc, sock: socket.socket) -> None:
        reader, writer = await asyncio.open_unix_connection(sock=sock, limit=MAX_LINE)
        r.writer = writer
        wireup = self._wireup(r)
        try:
            while True:
                try:
                    raw = await reader.readline()
                except (ValueError, ConnectionError):
                    break  # an over-long line or a reset: the rank is misbehaving or gone
                if not raw:
                    break
                r.talked_pmi = True
                outcome = wireup.handle(r.rank, raw.decode("utf-8", "replace"))
                await self._reply(r.world, outcome.replies)
                await self._outcome(r, wireup, outcome)
        finally:
            wireup.rank_gone(r.rank)
            r.writer = None
            writer.close()

    async def _outcome(self, r: Proc, wireup: Wireup, outcome: Outcome) -> None:
        if outcome.finished is not None:
            finished = outcome.finished
            r.finalized = not finished.aborted
            if finished.aborted and r.abort is None:
                text = "called MPI_Abort" + (f": {finished.message}" if finished.message else "")
                r.abort = p.RankExit(rank=r.rank, exit_code=finished.exit_code & 0xFF, error=text)
                if r.world == 0:
                    await self.send(p.RankAborted(job_id=self.launch.job_id, exit=r.abort))
                elif self.spawner.reportable(r):
                    await self.send(
                        p.SpawnExited(job_id=self.launch.job_id, world=r.world, exit=r.abort, aborted=True)
                    )
        if outcome.barrier is not None:
            # A spawned world is all on this node: its barriers are node-local.
            if r.world > 0 or len(self.launch.ranks_per_node) == 1:
                await self._reply(r.world, wireup.barrier_done(outcome.barrier.seq, outcome.barrier.puts))
            else:
                self.barrier = p.PmiBarrierIn(
                    job_id=self.launch.job_id,
                    node=self.node,
                    seq=outcome.barrier.seq,
                    kvs=outcome.barrier.puts,
                )
                await self.send(self.barrier)
        if outcome.spawn is not None:
            self._background(self._spawn_request(r, outcome.spawn))
        if outcome.name is not None:
            await self._name_request(r, outcome.name)

    async def _spawn_request(self, r: Proc, request: SpawnRequest) -> None:
        await self.reported.wait()  # the NM knows the ranks before it hears of what they spawned
        reply = await self.spawner.spawn(r, request)
        await self._write(r, reply)

    async def _name_request(self, r: Proc, request: NameRequest) -> None:
        seq = self.names.add(r, request, time.monotonic())
        msg = p.PmiName(
            job_id=self.launch.job_id, node=self.node, seq=seq, action=request.op, service=request.service,
            port=request.port,
        )  # fmt: skip
        asyncio.get_running_loop().call_later(NAME_TIMEOUT, self._names_expired)
        await self.send(msg)

    def _names_expired(self) -> None:
        for proc, line in self.names.expire(time.monotonic()):
            self._background(self._write(proc, line))

    async def _reply(self, world: int, replies: list[tuple[int, str]]) -> None:
        procs = self._procs(world)
        for rank, line in replies:
            await self._write(procs[rank], line)

    async def _write(self, proc: Proc, line: str) -> None:
        writer = proc.writer
        if writer is not None:
            writer.write(line.encode())
            with contextlib.suppress(ConnectionError):
                await writer.drain()

    # ------------------------------------------------------------------------------------------- exits

    def _reap(self, r: Proc) -> None:
        user = system = None
        try:
            # wait4, not waitpid: its rusage is the rank's CPU time (and its reaped children's), which the
            # exit carries to storm-mm for `storm history` (mm/accounting.py).
            got, status, rusage = os.wait4(r.pid, os.WNOHANG)
        except ChildProcessError:
            got, status = r.pid, 255 << 8
        else:
            if r.world == 0:  # (a spawned process's CPU time is not counted: see mm/accounting.py)
                user, system = rusage.ru_utime, rusage.ru_stime
        if got == 0:
            return
        loop = asyncio.get_running_loop()
        loop.remove_reader(r.pidfd)
        os.close(r.pidfd)
        r.pidfd = -1
        if r.abort is not None:
            # It was killed for its abort: the abort is what it asked to exit with (a spawned process's
            # exactly as reported: the NM takes a second, different exit for a contradiction).
            r.exit = (
                dataclasses.replace(r.abort, cpu_user=user, cpu_system=system) if r.world == 0 else r.abort
            )
        elif os.WIFSIGNALED(status):
            r.exit = p.RankExit(rank=r.rank, signal=os.WTERMSIG(status), cpu_user=user, cpu_system=system)
        else:
            code = os.waitstatus_to_exitcode(status)
            early = code == 0 and r.talked_pmi and not r.finalized and not self.stopping
            error = "exited without calling MPI_Finalize" if early else ""
            r.exit = p.RankExit(rank=r.rank, exit_code=code, error=error, cpu_user=user, cpu_system=system)
        last = self._check_done()
        if r.world == 0 and not last:  # the last exit goes with the final report, which follows at once
            self._background(self.send(p.RankExited(job_id=self.launch.job_id, exit=r.exit)))
        elif r.world > 0 and self.spawner.reportable(r):
            self._background(self.send(p.SpawnExited(job_id=self.launch.job_id, world=r.world, exit=r.exit)))

    def _background(self, coroutine: Coroutine[object, object, None]) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)  # the loop keeps only weak references to tasks
        task.add_done_callback(self._tasks.discard)

    def _check_done(self) -> bool:
        """Whether every process of the job has ended (then the final report goes out)."""
        procs = [*self.ranks.values(), *self.spawner.procs()]
        if all(r.exit is not None or (r.world > 0 and not r.pid) for r in procs):
            self.all_exited.set()
        return self.all_exited.is_set()

    def stop(self) -> None:
        """shell_stop: stop every rank and spawned process (the NM follows up with SIGKILL if they linger)."""
        self.stopping = True
        for r in [*self.ranks.values(), *self.spawner.procs()]:
            if r.pid and r.exit is None:
                for sig in (signal.SIGCONT, signal.SIGTERM):
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(r.pid, sig)
        self._check_done()

    # ------------------------------------------------------------------------------------------- main

    def from_nm_now(self, msg: p.Ack | p.ShellStop) -> None:
        """An acknowledgement or a stop from the NM, which writes nothing to the ranks: handled at once."""
        if isinstance(msg, p.Ack):
            if msg.what == p.ShellDone.op:
                self.acked.set()
        else:
            self.stop()

    async def from_nm(self, msg: p.Message) -> None:
        """A message from the NM about this job."""
        if isinstance(msg, p.Ack | p.ShellStop):
            self.from_nm_now(msg)
        elif isinstance(msg, p.PmiBarrierOut):
            try:
                replies = self.wireup.barrier_done(msg.seq, msg.kvs)
            except ValueError as exc:  # a repeated answer (the MM restarted): the ranks already have it
                print(f"storm-shell: job {self.launch.job_id}: ignored: {exc}", file=sys.stderr)
                return
            if self.barrier is not None and self.barrier.seq == msg.seq:
                self.barrier = None
            await self._reply(0, replies)
        elif isinstance(msg, p.PmiNameResult):
            answer = self.names.answer(msg)
            if answer is not None:
                await self._write(*answer)

    async def send_state(self) -> None:
        """Everything the NM knows of the job, again (to a restarted NM)."""
        if self.acked.is_set():
            return  # the NM has everything: it may even have forgotten the job by now
        job_id = self.launch.job_id
        await self.send(p.ShellHello(job_id=job_id, pid=os.getpid()))
        if self.started is None:
            return  # still spawning: ranks_started and the exits follow as usual
        await self.send(self.started)
        for r in self.ranks.values():
            if r.abort is not None and r.exit is None:
                await self.send(p.RankAborted(job_id=job_id, exit=r.abort))
            if r.exit is not None:
                await self.send(p.RankExited(job_id=job_id, exit=r.exit))
        for msg in self.spawner.state():
            await self.send(msg)
        if self.barrier is not None:
            await self.send(self.barrier)
        if self.done is not None:
            await self.send(self.done)

    async def run(self) -> None:
        """Start the ranks, serve them until every process of the job has ended, report that, and wait for
        the NM's acknowledgement."""
        try:
            outputs = self._open_outputs()
        except OSError as exc:
            text = f"cannot open output file {exc.filename}: {exc.strerror}"
            for r in self.ranks.values():
                r.exit = p.RankExit(rank=r.rank, error=text)
        else:
            for r in self.ranks.values():
                if not self.stopping:
                    self._spawn(r, *outputs[r.rank])
                elif r.exit is None:
                    r.exit = p.RankExit(rank=r.rank, error="cancelled before it started")
            for fd in {fd for pair in outputs.values() for fd in pair}:
                os.close(fd)
        started = {str(r.rank): r.pid for r in self.ranks.values() if r.pid}
        self.started = p.RanksStarted(job_id=self.launch.job_id, pids=started)
        await self.send(self.started)
        self.reported.set()
        for r in self.ranks.values():
            if r.exit is not None and not r.pid:
                await self.send(p.RankExited(job_id=self.launch.job_id, exit=r.exit))
        self._check_done()
        await self.all_exited.wait()
        if self.output is not None:
            self.output.drain()
        await self.finish()
        await self.acked.wait()

    async def finish(self, failure: str = "") -> None:
        """Every process of the job has ended (or, with ``failure``, the job shell could not run it): the
        exits are written to the job directory, then reported."""
        exits = tuple(
            r.exit if r.exit is not None else p.RankExit(rank=r.rank, error=failure or "did not start")
            for r in sorted(self.ranks.values(), key=lambda r: r.rank)
        )
        done = p.ShellDone(job_id=self.launch.job_id, exits=exits)
        # Written first so that an NM restarted meanwhile can still learn how the ranks ended.
        with contextlib.suppress(OSError):
            self.jobdir.write_exits(p.encode(done))
        self.done = done
        await self.send(done)
        self.on_done()

    def close(self) -> None:
        """The job shell exits: nothing of this job is watched any more."""
        if self.output is not None:
            self.output.close()
        loop = asyncio.get_running_loop()
        for r in [*self.ranks.values(), *self.spawner.procs()]:
            if r.pidfd >= 0:
                loop.remove_reader(r.pidfd)
                os.close(r.pidfd)
                r.pidfd = -1
        for task in self._tasks:
            task.cancel()
