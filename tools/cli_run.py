"""``storm run``: submit a job, stream its ranks' output to this terminal as they write it, and exit with its
exit code, as ``srun``, ``mpiexec`` and ``flux run`` do.

The job is submitted as ``storm submit`` would (the same options) and attached to: its ranks write into
pipes on their nodes, their job shells copy everything to the job's files as for any job and forward it
through the node managers and storm-mm to this client (mm/protocol/output.py). Every hop drops
what the next one cannot take rather than hold a rank up; the gaps are counted here and said on stderr.

While it waits the client says it is still there every IDLE seconds (``attach_output``, which also
acknowledges what it received and reattaches after a restart of storm-mm: the answer names storm-mm's epoch
and the job's state, which tells it when the job waits in the queue).

Ctrl-C cancels the job; a second one detaches and leaves the job to its fate.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from storm.mm import protocol as p

if TYPE_CHECKING:  # imported when a job is run: every storm command builds this parser, and starts faster
    import socket  # (socket.py costs some 2 ms: the one-shot client uses _socket, see tools/zmtp.py)

    from storm.tools.run_output import Assembler

IDLE = 1.0  # seconds without a message after which the client says it is still there
QUEUED_AFTER = 0.5  # a job still pending this long after its submission is said to be waiting
SILENT_MM = 10.0  # seconds without any answer from storm-mm after which the client says so
ACKS_PER_WINDOW = 4  # acknowledgements per p.OUTPUT_WINDOW bytes received

RUN_DESCRIPTION = (
    "Submit a job, show its ranks' output here as they write it (stdout to stdout, stderr to stderr), "
    "and exit with its exit code. The output also goes to the job's files, as with storm submit. "
    "Ctrl-C cancels the job; a second Ctrl-C detaches from it and leaves it running."
)


def add_run_command(sub: Any, add_submit_options: Callable[[argparse.ArgumentParser], None]) -> None:
    r = sub.add_parser(
        "run", help="run a job with its output on this terminal (as srun)", description=RUN_DESCRIPTION
    )
    add_submit_options(r)
    r.add_argument(
        "--label", "-l", action="store_true", help="prefix each line with its rank, '0: text' (srun --label)"
    )
    r.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    r.set_defaults(func=cmd_run)


def cmd_run(args: argparse.Namespace) -> int:
    from storm.tools.cli import UsageError, submission
    from storm.tools.client import Client

    if args.array:  # one job's output on one terminal; srun has no --array either
        raise UsageError("storm run runs one job: submit an array with storm submit --array")
    argv, ranks, fields = submission(args)
    import secrets

    from storm.tools.run_output import Assembler

    token = secrets.token_hex(8)
    with Client(args.mm) as client:
        job_id = client.submit(argv, ranks, attach=token, **fields)
        return Follower(client, job_id, token, Assembler(label=args.label), str(fields["output"])).run()


class Follower:
    """One job followed to its end: its output written, its state watched, Ctrl-C handled."""

    def __init__(self, client: Any, job_id: int, token: str, assembler: Assembler, output: str) -> None:
        self.client = client
        self.job_id = job_id
        self.token = token
        self.assembler = assembler
        self.output = output
        self.submitted = time.monotonic()
        self.epoch = ""
        self.base = 0  # assembler.received when this storm-mm attached us (it counts from there)
        self.acked = 0
        self.wait_req = 0
        self.queued = False  # "queued and waiting" said
        self.started = False
        self.interrupts = 0
        self.cancelled = False
        self.heard = time.monotonic()  # the last answer from storm-mm
        self.silence_said = False
        self.closed: set[str] = set()  # streams of ours that nobody reads any more (a closed pipe)

    def run(self) -> int:
        import socket

        wake_read, wake_write = socket.socketpair()
        wake_read.setblocking(False)
        wake_write.setblocking(False)
        previous = signal.signal(signal.SIGINT, self._interrupted)
        old_fd = signal.set_wakeup_fd(wake_write.fileno(), warn_on_full_buffer=False)
        try:
            return self._follow(wake_read)
        finally:
            signal.set_wakeup_fd(old_fd)
            signal.signal(signal.SIGINT, previous)
            wake_read.close()
            wake_write.close()

    def _interrupted(self, signum: int, frame: object) -> None:
        self.interrupts += 1  # acted on in the loop, never in the middle of a write

    def _follow(self, wake: socket.socket) -> int:
        self._attach()
        self.wait_req = self.client.send(p.WaitJob(job_id=self.job_id))
        handled = 0
        while True:
            if self.interrupts > handled:
                handled = self.interrupts
                if handled >= 2:
                    return self._detach()
                self._cancel()
            msg = self.client.next_message(IDLE, wake.fileno())
            if msg is None:
                with contextlib.suppress(BlockingIOError):
                    wake.recv(64)
                if self.interrupts == handled:  # (else it was Ctrl-C that woke us)
                    self._idle()
                continue
            if isinstance(msg, p.JobOutput):
                self._output(msg)
            elif isinstance(msg, p.OutputAttached):
                self._attached(msg)
            elif isinstance(msg, p.JobList) and msg.req == self.wait_req and msg.jobs:
                return self._ended(msg.jobs[0])
            elif isinstance(msg, p.Error):
                self.heard = time.monotonic()
                if msg.req == self.wait_req or msg.code == "unknown_job":
                    self._say(f"job {self.job_id}: {msg.text}")
                    return 1
                self._say(f"storm-mm: {msg.text}")

    def _attach(self) -> None:
        received = self.assembler.received - self.base
        self.client.send(p.AttachOutput(job_id=self.job_id, token=self.token, received=received))
        self.acked = self.assembler.received

    def _idle(self) -> None:
        silent = time.monotonic() - self.heard
        if silent > SILENT_MM and not self.silence_said:
            self.silence_said = True
            self._say(
                f"storm-mm has not answered for {silent:.0f} s; still waiting for job {self.job_id}"
                f" (Ctrl-C cancels it, a second Ctrl-C detaches)"
            )
        self._attach()

    def _attached(self, msg: p.OutputAttached) -> None:
        self.heard = time.monotonic()
        self.silence_said = False
        if self.epoch and msg.mm_epoch != self.epoch:
            # Its waiters and attachments went with the old one: wait again, and count from here.
            self.wait_req = self.client.send(p.WaitJob(job_id=self.job_id))
            self._say(
                "storm-mm restarted: output the job wrote meanwhile may be missing here (its files have all"
                f" of it: {self.output})"
            )
        if msg.mm_epoch != self.epoch:
            self.epoch = msg.mm_epoch
            self.base = self.assembler.received
        state = p.JobState(msg.state)
        if state is p.JobState.PENDING:
            if not self.queued and time.monotonic() - self.submitted >= QUEUED_AFTER:
                self.queued = True
                why = f" ({msg.reason})" if msg.reason else ""
                self._say(f"job {self.job_id} queued and waiting for resources{why}")
        elif self.queued and not self.started:
            self._started()

    def _started(self) -> None:
        self.started = True
        if self.queued:
            self._say(f"job {self.job_id} has been allocated resources")

    def _output(self, msg: p.JobOutput) -> None:
        if not self.started:
            self._started()
        for stream, data in self.assembler.chunk(msg):
            self._write(stream, data)
        if self.assembler.received - self.acked >= p.OUTPUT_WINDOW // ACKS_PER_WINDOW:
            self._attach()

    def _write(self, stream: str, data: bytes) -> None:
        if stream in self.closed:
            return
        target = sys.stdout if stream == "out" else sys.stderr
        try:
            target.flush()
            target.buffer.write(data)
            target.buffer.flush()
        except (BrokenPipeError, ValueError):
            self.closed.add(stream)  # e.g. `storm run ... | head`: the rest goes to the files only

    def _cancel(self) -> None:
        self.cancelled = True
        self._say(f"cancelling job {self.job_id} (Ctrl-C again to detach and leave it running)")
        self.client.send(p.CancelJobs(job_ids=(self.job_id,)))

    def _detach(self) -> int:
        self._say(
            f"detached from job {self.job_id}; it runs on without this terminal: follow it with `storm show"
            f" {self.job_id}` (its output: {self.output})",
        )
        return 130

    def _ended(self, job: p.JobInfo) -> int:
        from storm.mm.jobs import WAIT_EXIT_CODES  # the MM's job model: only the end needs it

        for stream, data in self.assembler.finish():
            self._write(stream, data)
        if self.assembler.missed:
            self._say(
                f"{self.assembler.missed} bytes of the job's output did not reach this terminal (it was too"
                f" slow to take them); the job's files have everything: {self.output}"
            )
        state = p.JobState(job.state)
        if state is p.JobState.COMPLETED:
            return 0
        never = "" if job.start_time is not None else " before it started"
        self._say(f"job {self.job_id} {job.state}{never}: {job.reason}")
        return WAIT_EXIT_CODES.get(state) or job.exit_code or 1

    def _say(self, text: str) -> None:
        """A line of storm's own on stderr, after what the job wrote to stdout."""
        with contextlib.suppress(BrokenPipeError, ValueError):
            sys.stdout.flush()
        print(f"storm: {text}", file=sys.stderr, flush=True)
