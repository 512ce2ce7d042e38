"""The job shell process: one per user on a node, started by storm-nm's launcher as that user, serving every
job of the user the NM gives it (each job: nm/shell.py).

A new process per job cost about 5 ms of CPU before its first rank even started (a fork of the pre-imported
launcher, an event loop, a ZeroMQ context and its threads): with the rank's own start and the NM's part,
that capped storm near 100 one-rank jobs per second on two cores. A job shell that stays and starts only the
ranks (with posix_spawn: nm/process_start.py; the job shell runs as the user already) costs a message per
job.

It connects to the NM's Unix socket (nm/shell_link.py: the NM knows its shells by pid, which the kernel
vouches for) and says ``shell_ready``; then the NM sends it ``shell_launch`` for each
job, the answers to the jobs' requests (PMI barriers, names, acknowledgements) and ``shell_stop`` to stop a
job. It exits:

- once idle after ``shell_retire`` (the NM retires a job shell that has had no job for a while, and every
  job shell when it shuts down): at once without jobs, else when no process of its jobs runs any more (their
  exits are in the jobs' directories for the next NM);
- when it has no job and its NM goes away (killed, or exiting), or once its last job is acknowledged by a
  restarted NM, which gives it no new job (it did not start it); after such a reconnection, also once no
  process of its jobs has run for ORPHAN_WAIT seconds (a report nobody acknowledges: its exits are on disk).

It outlives a restart of its NM: it connects again once a new storm-nm listens on the same socket, then says
``shell_ready`` and sends each job's state again (nm/shell.py). SIGTERM stops the processes of every job. For
debugging, ``python -m storm.nm.shell_server --endpoint PATH --node NAME --cpus 0,1`` runs one by hand.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import traceback
from pathlib import Path

from storm.mm import protocol as p
from storm.mm.config import NMConfig
from storm.nm.jobdir import JobDir
from storm.nm.shell import Hook, Shell
from storm.nm.shell_link import NmLink

ORPHAN_WAIT = 30.0
SEND_WAIT = 2.0  # seconds an exiting job shell waits for sends the kernel could not take yet


class ShellServer:
    def __init__(self, endpoint: str, node: str, cpus: list[int], spawn_limit: int) -> None:
        self.node = node
        self.cpus = cpus
        self.spawn_limit = spawn_limit
        self.link = NmLink(
            endpoint.removeprefix("ipc://"), p.MAX_NODE_MESSAGE, self._nm_message, self._connected, self._lost
        )
        # Messages for jobs that may write to their ranks (PMI answers), in order, for _job_messages.
        self.for_jobs: asyncio.Queue[tuple[Shell, p.Message]] = asyncio.Queue()
        self.jobs: dict[int, Shell] = {}
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self.retired = False  # shell_retire: no more jobs come
        self.orphaned = False  # connected to an NM that did not start it: no more jobs come either
        self.connected = False
        self.finished = asyncio.Event()
        self._orphan_timer: asyncio.TimerHandle | None = None
        self._resend: asyncio.Task[None] | None = None  # the states sent again to a restarted NM

    async def send(self, msg: p.Message) -> None:
        self.link.send(p.encode(msg))  # never waits (a coroutine for the callers in nm/shell.py)

    def forward(self, msg: p.JobOutput) -> None:
        """A streamed job's output for the NM, dropped when the link is backed up (nm/output.py)."""
        if self.link.backed_up and not msg.eof:
            return
        self.link.send(p.encode(msg))

    def _check_finished(self) -> None:
        """Exit when no more work can come (see the module's docstring)."""
        no_more = self.retired or self.orphaned or not self.connected
        idle = all(job.done is not None for job in self.jobs.values())  # only acknowledgements awaited
        if (not self.jobs and no_more) or (self.retired and idle):
            self.finished.set()
        elif self.orphaned and idle and self._orphan_timer is None:
            self._orphan_timer = asyncio.get_running_loop().call_later(ORPHAN_WAIT, self._orphan_wait_over)
        elif not idle and self._orphan_timer is not None:
            self._orphan_timer.cancel()
            self._orphan_timer = None

    def _orphan_wait_over(self) -> None:
        self._orphan_timer = None
        if self.orphaned and all(job.done is not None for job in self.jobs.values()):
            print("storm-shell: no acknowledgement from storm-nm; exiting", file=sys.stderr)
            self.finished.set()

    # ---------------------------------------------------------------------------------------------- jobs

    def launch(self, msg: p.ShellLaunch) -> None:
        job_id = msg.launch.job_id
        if job_id in self.jobs:
            return  # a repeated launch: the first one is under way
        hook = Hook(msg.hook_library, msg.hook_segment, msg.hook_environment) if msg.hook_library else None
        shell = Shell(
            msg.launch, self.node, self.cpus, self.send, JobDir(Path(msg.jobdir)), hook=hook,
            spawn_limit=self.spawn_limit, forward=self.forward,
        )  # fmt: skip
        shell.on_done = self._check_finished
        self.jobs[job_id] = shell
        task = asyncio.get_running_loop().create_task(self._run(shell))
        self._tasks[job_id] = task

    async def _run(self, shell: Shell) -> None:
        job_id = shell.launch.job_id
        try:
            await shell.run()
        except Exception as exc:
            # A bug here must not take the user's other jobs down: this job's ranks are stopped and it ends.
            traceback.print_exc()
            shell.stop()
            if shell.done is None:
                await shell.finish(f"job shell error: {exc.__class__.__name__}: {exc}")
            await shell.acked.wait()
        finally:
            shell.close()
            del self.jobs[job_id]
            self._tasks.pop(job_id, None)
            self._check_finished()

    def _nm_message(self, message: bytes) -> None:
        try:
            msg = p.decode(message, p.MAX_NODE_MESSAGE)
        except p.ProtocolError as exc:
            print(f"storm-shell: bad message from the NM: {exc}", file=sys.stderr)
            return
        job = self.jobs.get(getattr(msg, "job_id", -1))
        if isinstance(msg, p.ShellLaunch):
            self.launch(msg)
        elif isinstance(msg, p.ShellRetire):
            self.retired = True
        elif job is not None and isinstance(msg, p.Ack | p.ShellStop) and self.for_jobs.empty():
            job.from_nm_now(msg)  # (most messages: no task, no wait)
        elif job is not None:
            self.for_jobs.put_nowait((job, msg))
        self._check_finished()

    async def _job_messages(self) -> None:
        """Messages that may write to a job's ranks, which can wait: one at a time, in order."""
        while True:
            job, msg = await self.for_jobs.get()
            try:
                await job.from_nm(msg)
            except Exception:
                traceback.print_exc()  # this job's message is lost, not the ones after it
            self._check_finished()

    def _connected(self, connections: int) -> None:
        """Every connection after the first is to a restarted NM: tell it everything again."""
        self.connected = True
        if connections > 1:
            print("storm-shell: reconnected to storm-nm; sending each job's state again", file=sys.stderr)
            self.orphaned = True
            self._resend = asyncio.get_running_loop().create_task(self._send_states())
        self._check_finished()

    async def _send_states(self) -> None:
        await self.send(p.ShellReady(pid=os.getpid()))
        for job in list(self.jobs.values()):
            await job.send_state()

    def _lost(self) -> None:
        self.connected = False
        self._check_finished()

    def _stop_all(self) -> None:
        for job in self.jobs.values():
            job.stop()

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, self._stop_all)
        listener = loop.create_task(self._job_messages())
        self.connected = True  # until it says otherwise: the NM that started it is there
        self.link.start()
        await self.send(p.ShellReady(pid=os.getpid()))
        await self.finished.wait()
        tasks = [listener, *self._tasks.values()]
        if self._resend is not None:
            tasks.append(self._resend)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.link.drained(SEND_WAIT)
        self.link.stop()
        return 0


def run_shell_server(
    *, endpoint: str, node: str, cpus: list[int], spawn_limit: int = NMConfig.spawn_limit
) -> int:
    """Serve the user's jobs on this node until retired (see the module's docstring)."""
    if len(set(cpus)) == 1:
        # Every rank it starts runs on that one CPU: it lives there too, and they inherit it (nm/shell.py).
        os.sched_setaffinity(0, set(cpus))
    return asyncio.run(ShellServer(endpoint, node, cpus, spawn_limit).run())


def main(argv: list[str] | None = None) -> int:
    """For running a job shell by hand while debugging; storm-nm forks them through nm/launcher.py."""
    parser = argparse.ArgumentParser(prog="storm-shell")
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--node", required=True)
    parser.add_argument("--cpus", required=True, help="CPU of each PE, comma-separated")
    args = parser.parse_args(argv)
    cpus = [int(c) for c in args.cpus.split(",") if c]
    return run_shell_server(endpoint=args.endpoint, node=args.node, cpus=cpus)


if __name__ == "__main__":
    sys.exit(main())
