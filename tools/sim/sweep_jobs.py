"""``storm sim sweep --submit``: every point of a sweep as a one-rank job on a storm cluster, so that storm
schedules its own experiments when one machine is not enough.

Each job runs ``python -m storm.tools.sim.cli point`` (the interpreter that runs the sweep, so the nodes run
the same storm), which reads the trace itself, runs :func:`storm.tools.sim.sweep.run_point` and writes what
it returns, whole, as JSON into the results directory. The sweep reads those files back as the jobs end and
reports them exactly as a local sweep would: JSON keeps every float exactly, and the simulator is
deterministic, so only the ``wall`` figures differ. The trace and the results directory must therefore be
the same paths on the nodes as here (a shared filesystem; a local cluster shares this one), and a point
checks the trace's sha256 before it runs, so a different file under the same name is an error, not a result.

Collection: a second connection to storm-mm sends one ``wait_job`` per job and reads the answers as the jobs
end (no polling). Every :data:`RECHECK_SECONDS` without an answer, the jobs still out are listed once and
waited for again, so answers lost to a restarted storm-mm do not hang the sweep.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from storm.mm import protocol as p
from storm.tools.client import Client, ClientError
from storm.tools.sim.engine import Machine
from storm.tools.sim.sweep import Point, read_point

RECHECK_SECONDS = 10.0
# storm-mm's rate_limited error says when a token is back; without that, try again after this long.
DEFAULT_RETRY_SECONDS = 1.0
_RETRY_AFTER = re.compile(r"try again in ([0-9.]+) s")


class SubmitError(RuntimeError):
    """The sweep could not use the cluster at all (no storm-mm, no results directory)."""


@dataclass(frozen=True)
class SweepInputs:
    """What every point's job reads besides its point: the inputs of the local sweep, as paths and flags."""

    trace: str  # absolute: jobs run in the results directory
    sha256: str
    machine: Machine
    estimate: str
    first_jobs: int | None
    scale: str


# ---------------------------------------------------------------------------------------------- one point


def point_argv(inputs: SweepInputs, point: Point, out: Path) -> list[str]:
    """The command of one point's job (parsed by ``storm.tools.sim.cli``'s hidden ``point`` command)."""
    machine = inputs.machine
    argv = [
        sys.executable, "-m", "storm.tools.sim.cli", "point",
        "--trace", inputs.trace, "--sha256", inputs.sha256,
        "--nodes", str(machine.nodes), "--pes-per-node", str(machine.pes_per_node),
        "--estimate", inputs.estimate, "--scale", inputs.scale,
        # repr: the shortest text that reads back as the same float, so the job scales by the same factor.
        "--policy", point.policy, "--load", repr(point.target_load), "--seed", str(point.seed),
        "--out", str(out),
    ]  # fmt: skip
    if inputs.first_jobs is not None:
        argv += ["--jobs", str(inputs.first_jobs)]
    return argv


# ---------------------------------------------------------------------------------------------- the sweep


def results_directory(given: str | None, outputs: list[str | None]) -> tuple[Path, bool]:
    """Where the jobs write: ``given``, else NAME.points beside the first of --json/--markdown/--png, else
    a new temporary directory in the current one. True when it is temporary (removed after a clean run)."""
    if given:
        return Path(given).absolute(), False
    for output in outputs:
        if output:
            path = Path(output).absolute()
            return path.with_name(path.stem + ".points"), False
    return Path(tempfile.mkdtemp(prefix="storm-sweep-", dir=os.getcwd())), True


@dataclass
class PointJob:
    index: int
    point: Point
    result_path: Path
    stderr_path: Path
    job_id: int = 0

    def label(self) -> str:
        return f"{self.point.policy} load {self.point.target_load:g} seed {self.point.seed}"


@dataclass
class Failure:
    """A point whose job did not give a result: what storm said, and where its stderr is."""

    label: str
    job_id: int | None
    state: str
    reason: str
    stderr: str

    def line(self) -> str:
        job = f"job {self.job_id} {self.state}" if self.job_id is not None else self.state
        where = f"; stderr: {self.stderr}" if self.stderr else ""
        return f"{self.label}: {job}: {self.reason}{where}"

    def to_json(self) -> dict[str, Any]:
        return {
            "point": self.label,
            "job_id": self.job_id,
            "state": self.state,
            "reason": self.reason,
            "stderr": self.stderr,
        }


@dataclass
class Outcome:
    """The results collected, in the sweep's point order, and the points that gave none."""

    results: list[dict[str, Any]]
    failures: list[Failure]
    directory: Path


class _Waiter(Client):
    """A connection that only waits: many ``wait_job`` requests in flight, answered as the jobs end.

    Client.call drops answers to requests other than its own, so the control connection cannot also carry
    these; this one never calls."""

    def ask_wait(self, job_id: int) -> None:
        self._sock.send(p.encode(p.WaitJob(job_id=job_id, req=next(self._reqs))))


@dataclass
class _Sweep:
    inputs: SweepInputs
    jobs: list[PointJob]
    control: Client
    waiter: _Waiter
    time_limit: float | None
    log: TextIO
    results: dict[int, dict[str, Any]] = field(default_factory=dict)
    failures: dict[int, Failure] = field(default_factory=dict)
    by_job: dict[int, PointJob] = field(default_factory=dict)

    # -- submitting

    def submit_all(self) -> None:
        for job in self.jobs:
            try:
                job.job_id = self._submit(job)
            except ClientError as exc:
                # Nothing lost: this point and the ones after it are reported as not submitted, and the
                # jobs already queued are still collected.
                text = f"not submitted ({exc.code}): {exc}"
                for rest in self.jobs[job.index :]:
                    self.failures[rest.index] = Failure(rest.label(), None, "NOT SUBMITTED", text, "")
                self.say(f"{job.label()}: {text}; {len(self.jobs) - job.index} point(s) not submitted")
                return
            self.by_job[job.job_id] = job
            self.waiter.ask_wait(job.job_id)
        ids = [job.job_id for job in self.jobs]
        self.say(f"{len(ids)} points submitted to storm-mm at {self.control.endpoint} as jobs {_ids(ids)}")

    def _submit(self, job: PointJob) -> int:
        # This point's own names only: a file left by an earlier sweep into the same directory is never read.
        for stale in (job.result_path, job.stderr_path, job.result_path.with_suffix(".out")):
            stale.unlink(missing_ok=True)
        argv = point_argv(self.inputs, job.point, job.result_path)
        point = job.point
        while True:
            try:
                return self.control.submit(
                    argv, 1, cwd=str(job.result_path.parent), env=dict(os.environ),
                    name=f"sim-{point.policy}-{point.target_load:g}-s{point.seed}",
                    time_limit=self.time_limit, output=str(job.result_path.with_suffix(".out")),
                    error=str(job.stderr_path), hook=False,  # not MPI: nothing for mpihook to measure
                )  # fmt: skip
            except ClientError as exc:
                if exc.code != "rate_limited":
                    raise
                found = _RETRY_AFTER.search(str(exc))
                delay = float(found[1]) if found else DEFAULT_RETRY_SECONDS
                self.say(f"storm-mm limits submissions: collecting for {delay:.2f} s, then submitting again")
                # The wait storm-mm asks for is spent taking in the points that end meanwhile.
                self._collect_until(time.monotonic() + delay)

    # -- collecting

    def outstanding(self) -> list[int]:
        return [job.job_id for job in self.jobs if job.job_id and job.index not in self._ended()]

    def _ended(self) -> set[int]:
        return self.results.keys() | self.failures.keys()

    def collect_all(self) -> None:
        while self.outstanding():
            if not self._receive(RECHECK_SECONDS):
                self._recheck()

    def _collect_until(self, deadline: float) -> None:
        while (left := deadline - time.monotonic()) > 0:
            self._receive(left)

    def _receive(self, timeout: float) -> bool:
        """Take one answer (False: none within ``timeout``)."""
        try:
            reply = self.waiter.receive(timeout)
        except ClientError as exc:
            if exc.code == "timeout":
                return False
            raise
        if isinstance(reply, p.JobList):
            for info in reply.jobs:
                self._ended_job(info)
        return True  # an error answers a wait for a job storm-mm forgot: the recheck reports it

    def _recheck(self) -> None:
        """List the jobs still out; end those that ended, and wait again for the others (a restarted
        storm-mm has forgotten the waits the old one held)."""
        ids = tuple(self.outstanding())
        infos = {info.id: info for info in self.control.jobs(ids)}
        for job_id in ids:
            info = infos.get(job_id)
            if info is None:
                job = self.by_job[job_id]
                self._end(job, Failure(job.label(), job_id, "UNKNOWN", "storm-mm has no such job", ""))
            elif p.JobState(info.state).terminal:
                self._ended_job(info)
            else:
                self.waiter.ask_wait(job_id)

    def _ended_job(self, info: p.JobInfo) -> None:
        job = self.by_job.get(info.id)
        if job is None or job.index in self._ended():
            return  # an answer to a wait sent twice
        if info.state == p.JobState.COMPLETED:
            try:
                self._end(job, read_point(job.result_path, job.point, self.inputs.sha256))
            except ValueError as exc:
                self._end(job, Failure(job.label(), info.id, info.state, str(exc), str(job.stderr_path)))
            return
        reason = info.reason or "no reason given"
        if info.exit_code is not None:
            reason = f"exit code {info.exit_code}: {reason}"
        self._end(job, Failure(job.label(), info.id, info.state, reason, str(job.stderr_path)))

    def _end(self, job: PointJob, outcome: dict[str, Any] | Failure) -> None:
        if isinstance(outcome, Failure):
            self.failures[job.index] = outcome
            how = f"job {job.job_id} {outcome.state}, no result"
        else:
            self.results[job.index] = outcome
            how = f"job {job.job_id} COMPLETED"
        done = sum(1 for j in self.jobs if j.job_id and j.index in self._ended())
        self.say(f"{done} of {len(self.jobs)} points done ({job.label()}, {how})")

    def cancel_outstanding(self) -> None:
        ids = tuple(self.outstanding())
        if not ids:
            return
        try:
            self.control.cancel(ids)
        except ClientError as exc:
            self.say(f"could not cancel jobs {_ids(ids)}: {exc} (storm cancel {' '.join(map(str, ids))})")
            return
        self.say(f"cancelled jobs {_ids(ids)}")

    def say(self, text: str) -> None:
        print(f"storm sim sweep: {text}", file=self.log, flush=True)


def _ids(ids: tuple[int, ...] | list[int]) -> str:
    """``5-8, 10``: job ids in runs (other users' jobs may fall between a sweep's own)."""
    runs: list[list[int]] = []
    for job_id in ids:
        if runs and job_id == runs[-1][-1] + 1:
            runs[-1].append(job_id)
        else:
            runs.append([job_id])
    return ", ".join(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}" for run in runs)


def submit_sweep(
    inputs: SweepInputs,
    points: list[Point],
    directory: Path,
    *,
    endpoint: str | None = None,
    time_limit: float | None = None,
    log: TextIO | None = None,
) -> Outcome:
    """Run every point as a job, collect them as they end; Ctrl-C cancels the jobs still out.

    Progress goes to ``log``, by default the sys.stderr of the moment (not of import time)."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SubmitError(f"cannot make the results directory {directory}: {exc.strerror}") from None
    if not os.access(directory, os.W_OK | os.X_OK):
        raise SubmitError(f"the results directory {directory} is not writable")
    jobs = []
    for i, point in enumerate(points):
        stem = f"{i:03d}-{point.policy}-{point.target_load:g}-{point.seed}"
        jobs.append(PointJob(i, point, directory / f"{stem}.json", directory / f"{stem}.err"))
    try:
        control = Client(endpoint)
        waiter = _Waiter(control.endpoint)
    except ClientError as exc:
        raise SubmitError(str(exc)) from None
    with control, waiter:
        sweep = _Sweep(inputs, jobs, control, waiter, time_limit, log or sys.stderr)
        try:
            sweep.say(f"{len(jobs)} points; results in {directory}")
            sweep.submit_all()
            sweep.collect_all()
        except KeyboardInterrupt:
            sweep.cancel_outstanding()
            raise
        except ClientError as exc:
            left = tuple(sweep.outstanding())
            still = f"; jobs {_ids(left)} go on (storm cancel {' '.join(map(str, left))})" if left else ""
            raise SubmitError(f"lost storm-mm at {control.endpoint}: {exc}{still}") from None
    return Outcome(
        results=[sweep.results[i] for i in sorted(sweep.results)],
        failures=[sweep.failures[i] for i in sorted(sweep.failures)],
        directory=directory,
    )


def remove_directory(directory: Path) -> None:
    """Remove a temporary results directory (only after a run whose every point gave its result)."""
    with contextlib.suppress(FileNotFoundError):
        shutil.rmtree(directory)
