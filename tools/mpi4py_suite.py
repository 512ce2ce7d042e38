"""mpi4py's own test suite as a test of storm: the same modules under ``mpiexec`` and as storm jobs.

mpi4py's suite (about 2,100 tests in ``test/test_*.py`` of its source release) exercises nearly every MPI
call, including the corners a resource manager and a PMPI library (mpihook) can break: intercommunicators,
dynamic processes, nonblocking collectives, threads, one-sided communication and fault tolerance. A test that
passes under plain ``mpiexec`` on this machine but fails, errors or never runs under storm is a storm bug.

How it runs (``tests/test_mpi4py_suite.py`` and ``storm bench mpi4py`` use it):

- The source release matching the installed mpi4py is fetched once with ``pip download --no-binary :all:``
  into ``$XDG_CACHE_HOME/storm/mpi4py-<version>`` (``~/.cache`` without it) and kept there;
  ``$STORM_MPI4PY_SRC`` names an unpacked tree instead. When neither can be had, SuiteUnavailable says why.
- Every test module runs on its own, as ``python driver.py EVENTS test/main.py -v MODULE``, with a time limit,
  so that a hang is a hang of that module only: under ``mpiexec -n N`` (killed with every process it started
  at the limit) and as an N-rank storm job (the job's ``time_limit``). The driver (DRIVER below) runs
  mpi4py's own ``test/main.py`` with a result class that appends every test's start, outcome and end to a
  JSON-lines file per rank, line by line, so that what a hung or killed rank did is still there; it always
  exits 0 after the run, so that a failing test never makes storm (or hydra) kill ranks that are still
  finishing.
- Per test the worst outcome over the ranks counts (OUTCOMES, best first). A test is a regression when it
  passed or was skipped under mpiexec and is worse than that under storm; tests that fail under mpiexec too
  (MPICH's own failures on this machine) are not (tools/mpi4py_compare.py finds them).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped]  # no stubs in the dev dependencies

from storm.mm.protocol import JobInfo, JobState, Policy
from storm.tools.client import Client
from storm.tools.local_cluster import LocalCluster

SOURCE_ENV = "STORM_MPI4PY_SRC"
# Outcomes of a test, best first: a test's result is the worst over its events and its ranks. "missing": a
# rank never ran it (its module crashed or hung before); "crash": it was running when its job died;
# "hang": it was running when its module reached its time limit.
OUTCOMES = ("pass", "skip", "fail", "error", "missing", "crash", "hang")
GOOD = frozenset({"pass", "skip"})
POLL = 0.05
KILL_GRACE = 5.0  # seconds between SIGTERM and SIGKILL for an mpiexec run past its limit
WAIT_SLACK = 60.0  # how long past its time limit storm gets to end a job before we cancel it ourselves
TAIL_LINES = 15

# Run by every rank instead of main.py itself, in the test directory's stead (it puts that on sys.path).
DRIVER = '''\
"""Run mpi4py's test/main.py and record this rank's test outcomes as JSON lines (see storm's mpi4py_suite)."""
import json
import os
import sys
import unittest

sys.dont_write_bytecode = True
events_dir, main_py, *args = sys.argv[1:]
sys.path.insert(0, os.path.dirname(os.path.abspath(main_py)))
import main as suite  # noqa: E402  mpi4py's test/main.py

out = None


def emit(event, test, **more):
    """One line per event, written at once: a rank that hangs or is killed keeps what it did."""
    global out
    if out is None:
        from mpi4py import MPI

        path = os.path.join(events_dir, f"rank{MPI.COMM_WORLD.Get_rank()}.jsonl")
        out = open(path, "a", buffering=1, encoding="utf-8")
    out.write(json.dumps({"e": event, "id": test.id() if test is not None else "", **more}) + "\\n")


class Result(unittest.TextTestResult):
    def startTest(self, test):
        emit("start", test)
        super().startTest(test)

    def stopTest(self, test):
        super().stopTest(test)
        emit("stop", test)

    def addSuccess(self, test):
        super().addSuccess(test)
        emit("pass", test)

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        emit("skip", test, text=str(reason))

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        emit("pass", test)

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        emit("fail", test, text="unexpected success")

    def addFailure(self, test, err):
        super().addFailure(test, err)
        emit("fail", test, text=self._exc_info_to_string(err, test)[-3000:])

    def addError(self, test, err):
        super().addError(test, err)
        emit("error", test, text=self._exc_info_to_string(err, test)[-3000:])

    def addSubTest(self, test, subtest, err):
        super().addSubTest(test, subtest, err)
        if err is not None:
            kind = "fail" if issubclass(err[0], test.failureException) else "error"
            text = subtest._subDescription() + "\\n" + self._exc_info_to_string(err, test)[-3000:]
            emit(kind, test, text=text)


class Runner(unittest.TextTestRunner):
    resultclass = Result


sys.argv = [main_py, *args]
try:
    suite.main(module=None, testRunner=Runner)
except SystemExit:
    pass
emit("done", None)
'''


class SuiteUnavailable(RuntimeError):
    """mpi4py's test suite cannot be had here (no network, no pip, a bad $STORM_MPI4PY_SRC)."""


# ---------------------------------------------------------------------------------------------- the source


def installed_version() -> str:
    return importlib.metadata.version("mpi4py")


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "storm"


def suite_source(version: str | None = None) -> Path:
    """The unpacked source tree of mpi4py ``version`` (default: the installed one), fetched at first use.

    The test suite must be the installed version's: tests of another release ask for API that is not there.
    The download goes to a private directory and is renamed into place, so concurrent first uses do not
    see a half-unpacked tree.
    """
    explicit = os.environ.get(SOURCE_ENV)
    if explicit:
        tree = Path(explicit)
        if not (tree / "test" / "main.py").is_file():
            raise SuiteUnavailable(f"${SOURCE_ENV}={explicit} has no test/main.py (an unpacked mpi4py sdist)")
        return tree
    version = version or installed_version()
    dest = cache_root() / f"mpi4py-{version}"
    if (dest / "test" / "main.py").is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".mpi4py-{version}-", dir=dest.parent) as tmp:
        argv = [sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps", "--quiet"]
        try:
            argv += [f"mpi4py=={version}", "-d", tmp]
            done = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SuiteUnavailable(f"cannot run pip download for mpi4py {version}: {exc}") from None
        archives = sorted(Path(tmp).glob(f"mpi4py-{version}.tar.gz"))
        if done.returncode != 0 or not archives:
            raise SuiteUnavailable(
                f"pip download --no-binary :all: mpi4py=={version} failed (set ${SOURCE_ENV} to an unpacked "
                f"source tree instead): {(done.stderr or done.stdout).strip()[-800:]}"
            )
        with tarfile.open(archives[0]) as tar:
            tar.extractall(tmp, filter="data")
        unpacked = Path(tmp) / f"mpi4py-{version}"
        if not (unpacked / "test" / "main.py").is_file():
            raise SuiteUnavailable(f"the mpi4py {version} source release has no test/main.py")
        with contextlib.suppress(OSError):  # another process put it there first: theirs is as good
            unpacked.rename(dest)
    if not (dest / "test" / "main.py").is_file():
        raise SuiteUnavailable(f"could not unpack mpi4py {version} into {dest}")
    return dest


def suite_modules(source: Path) -> list[str]:
    """Every test module of the suite, by name (test_address, ...)."""
    return sorted(f.stem for f in (source / "test").glob("test_*.py"))


def select_modules(modules: Iterable[str], patterns: Iterable[str]) -> list[str]:
    """The modules any of the regexes finds (re.search, as main.py's -i); all of them without patterns."""
    regexes = [re.compile(r) for r in patterns]
    return [m for m in modules if not regexes or any(r.search(m) for r in regexes)]


# ---------------------------------------------------------------------------------------------- results


def worst(outcomes: Iterable[str]) -> str:
    return max(outcomes, key=OUTCOMES.index, default="missing")


@dataclass
class ModuleRun:
    """One module's run: ``status`` "ok" (every rank finished the run), "hang" (time limit) or "crash"."""

    module: str
    status: str
    seconds: float
    limit: float
    # test id -> its worst outcome over the ranks; a traceback or skip reason (one rank's); the ranks it
    # was running on at the end (where a hang or crash happened)
    tests: dict[str, str] = field(default_factory=dict)
    texts: dict[str, str] = field(default_factory=dict)
    running: dict[str, list[int]] = field(default_factory=dict)
    note: str = ""  # the job's state and reason, or mpiexec's exit status; for a hang or crash, output tails

    def where(self) -> str:
        """Where a hang or crash happened: the tests that were running, and on which ranks."""
        if not self.running:
            return "before or after any test"
        return "; ".join(f"{t} (ranks {','.join(map(str, r))})" for t, r in sorted(self.running.items()))


@dataclass
class SuiteRun:
    """Every selected module's run under one launcher ("mpiexec", or a storm policy) at one rank count."""

    launcher: str
    ranks: int
    modules: dict[str, ModuleRun] = field(default_factory=dict)
    seconds: float = 0.0

    def counts(self) -> dict[str, int]:
        """Tests per outcome, over every module."""
        found = dict.fromkeys(OUTCOMES, 0)
        for run in self.modules.values():
            for outcome in run.tests.values():
                found[outcome] += 1
        return found

    def hung(self) -> list[str]:
        return [m for m, run in self.modules.items() if run.status == "hang"]

    def crashed(self) -> list[str]:
        return [m for m, run in self.modules.items() if run.status == "crash"]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SuiteRun:
        modules = {name: ModuleRun(**run) for name, run in data["modules"].items()}
        return cls(data["launcher"], data["ranks"], modules, data["seconds"])


Events = tuple[dict[str, str], dict[str, str], dict[str, list[int]], list[int]]


def read_events(directory: Path, ranks: int, status: str) -> Events:
    """Per test the worst outcome over the ranks' event files, a text for each bad one, the tests still
    running at the end (a hang's or crash's place) and the ranks that finished their run.

    A test a rank started and never ended is "hang" when the module hung, else "crash"; a test some ranks
    report and another never started is "missing" on that one.
    """
    per_rank: list[dict[str, str]] = []
    texts: dict[str, str] = {}
    running: dict[str, list[int]] = {}
    finished = []
    for rank in range(ranks):
        outcomes: dict[str, str] = {}
        open_tests: set[str] = set()
        path = directory / f"rank{rank}.jsonl"
        lines = path.read_text(errors="replace").splitlines() if path.exists() else []
        for line in lines:
            try:
                event = json.loads(line)
            except ValueError:
                continue  # a line cut short by a kill
            kind, test = event.get("e"), event.get("id", "")
            if kind == "done":
                finished.append(rank)
            elif kind == "start":
                open_tests.add(test)
                outcomes.setdefault(test, "pass")  # until it says otherwise
            elif kind == "stop":
                open_tests.discard(test)
            elif kind in OUTCOMES:
                outcomes[test] = worst([outcomes.get(test, "pass"), kind])
                if kind != "pass" and event.get("text") and test not in texts:
                    texts[test] = f"rank {rank}: {event['text']}"
        for test in open_tests:
            outcomes[test] = worst([outcomes[test], "hang" if status == "hang" else "crash"])
            running.setdefault(test, []).append(rank)
        per_rank.append(outcomes)
    everything = {t for outcomes in per_rank for t in outcomes}
    tests = {t: worst(outcomes.get(t, "missing") for outcomes in per_rank) for t in sorted(everything)}
    return tests, texts, running, finished


def output_tails(directory: Path) -> str:
    """The last lines of every rank's output (out-RANK.txt, or mpiexec's one out.txt), for a hang or crash."""
    parts = []
    for path in sorted(directory.glob("out*.txt")):
        lines = path.read_text(errors="replace").splitlines()[-TAIL_LINES:]
        parts.append(f"--- {path.name}\n" + "\n".join(lines))
    return "\n".join(parts)


# ---------------------------------------------------------------------------------------------- running


def tree_of(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def mapped_segments() -> set[str]:
    """Every /dev/shm file some live process maps (what MPICH ranks still use)."""
    found: set[str] = set()
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):
            found.update(m.path for m in proc.memory_maps(grouped=True) if m.path.startswith("/dev/shm/"))
    return found


def remove_orphan_segments(before: set[str]) -> None:
    """MPICH's shared memory (/dev/shm/mpich_shm_*) of ranks killed before MPI_Finalize stays behind:
    remove those that appeared during the run and that no live process maps any more."""
    new = {n for n in shm_names() - before if n.startswith("mpich_shm_")}
    if not new:
        return
    used = mapped_segments()
    for name in new:
        if f"/dev/shm/{name}" not in used:
            with contextlib.suppress(OSError):
                os.unlink(f"/dev/shm/{name}")


def shm_names() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def stop_tree(proc: subprocess.Popen[bytes]) -> None:
    """Stop an mpiexec past its limit and everything it started: hydra's proxies and the ranks each run in
    a session of their own, so a process group signal would miss them; they are signalled one by one."""
    tree = tree_of(proc.pid)
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)  # hydra passes it on to the ranks and cleans up
    _, alive = psutil.wait_procs(tree, timeout=KILL_GRACE)
    for child in alive:
        with contextlib.suppress(psutil.Error):
            child.kill()
    psutil.wait_procs(alive, timeout=KILL_GRACE)
    proc.wait(timeout=KILL_GRACE)


@dataclass
class _Job:
    module: str
    directory: Path
    limit: float
    submitted: float


class Suite:
    """Runs modules of mpi4py's suite from ``source``, each in a fresh directory under ``work``."""

    def __init__(self, source: Path, work: Path) -> None:
        self.source = source
        self.work = work
        self.main_py = source / "test" / "main.py"
        work.mkdir(parents=True, exist_ok=True)
        self.driver = work / "storm_mpi4py_driver.py"
        self.driver.write_text(DRIVER)

    def modules(self) -> list[str]:
        return suite_modules(self.source)

    def argv(self, directory: Path, module: str) -> list[str]:
        return [sys.executable, str(self.driver), str(directory), str(self.main_py), "-v", module]

    def _directory(self, label: str, ranks: int, module: str) -> Path:
        directory = self.work / f"{label}-n{ranks}" / module
        if directory.exists():
            shutil.rmtree(directory)
        directory.mkdir(parents=True)
        return directory

    def _result(
        self, module: str, where: Path, ranks: int, status: str, *, seconds: float, limit: float, note: str
    ) -> ModuleRun:
        tests, texts, running, finished = read_events(where, ranks, status)
        if status == "ok" and len(finished) < ranks:
            status = "crash"
            note += f"; ranks {sorted(set(range(ranks)) - set(finished))} did not finish their run"
        if status != "ok":
            note += "\n" + output_tails(where)
        return ModuleRun(module, status, seconds, limit, tests, texts, running, note)

    # -- mpiexec

    def mpiexec_module(self, module: str, ranks: int, limit: float) -> ModuleRun:
        directory = self._directory("mpiexec", ranks, module)
        mpiexec = str(Path(sys.executable).parent / "mpiexec")
        before = shm_names()
        t0 = time.monotonic()
        with open(directory / "out.txt", "wb") as out:
            proc = subprocess.Popen(
                [mpiexec, "-n", str(ranks), *self.argv(directory, module)],
                cwd=directory, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        try:
            code = proc.wait(timeout=limit)
            status, note = ("ok" if code == 0 else "crash"), f"mpiexec exited with {code}"
        except subprocess.TimeoutExpired:
            stop_tree(proc)
            status, note = "hang", f"still running after its limit of {limit:g} s (killed)"
        except BaseException:  # Ctrl-C, a test's time-out: it runs in a session of its own, so stop it here
            stop_tree(proc)
            remove_orphan_segments(before)
            raise
        seconds = time.monotonic() - t0
        if status != "ok":
            remove_orphan_segments(before)
        return self._result(module, directory, ranks, status, seconds=seconds, limit=limit, note=note)

    def mpiexec(self, modules: Iterable[str], ranks: int, limit: float, log: bool = False) -> SuiteRun:
        """The baseline: each module under ``mpiexec -n ranks``, one after another."""
        run = SuiteRun("mpiexec", ranks)
        t0 = time.monotonic()
        for module in modules:
            run.modules[module] = self.mpiexec_module(module, ranks, limit)
            if log:
                print(progress_line(run, run.modules[module]), flush=True)
        run.seconds = time.monotonic() - t0
        return run

    # -- storm

    def storm(
        self,
        client: Client,
        label: str,
        modules: Iterable[str],
        ranks: int,
        limits: dict[str, float],
        *,
        in_flight: int = 1,
        log: bool = False,
    ) -> SuiteRun:
        """Each module as a storm job of ``ranks`` ranks, ``in_flight`` jobs at a time (more than one lets
        gang and FCS time-share them); a job past ``limits[module]`` seconds of running time is a hang."""
        run = SuiteRun(label, ranks)
        queue = list(modules)
        active: dict[int, _Job] = {}
        t0 = time.monotonic()
        try:
            while queue or active:
                while queue and len(active) < in_flight:
                    module = queue.pop(0)
                    directory = self._directory(label, ranks, module)
                    job_id = client.submit(
                        self.argv(directory, module), ranks, cwd=str(directory), name=module,
                        time_limit=limits[module], output="out-%t.txt", env=dict(os.environ),
                    )  # fmt: skip
                    active[job_id] = _Job(module, directory, limits[module], time.monotonic())
                for polled in client.jobs(tuple(active)):
                    result = self._ended(client, active[polled.id], polled, ranks, in_flight)
                    if result is not None:
                        run.modules[result.module] = result
                        del active[polled.id]
                        if log:
                            print(progress_line(run, result), flush=True)
                if active:
                    time.sleep(POLL)
        finally:
            if active:  # an exception (Ctrl-C, a test's time-out): leave nothing running on the cluster
                client.cancel(tuple(active))
        run.seconds = time.monotonic() - t0
        run.modules = {m: run.modules[m] for m in sorted(run.modules)}
        return run

    def _ended(
        self, client: Client, job: _Job, polled: JobInfo, ranks: int, in_flight: int
    ) -> ModuleRun | None:
        """The module's run if its job has ended (or has overrun its limit so far that we cancel it)."""
        overdue = time.monotonic() - job.submitted > job.limit * in_flight + WAIT_SLACK
        ended = JobState(polled.state).terminal
        if not ended and not overdue:
            return None
        if ended:
            info = polled
            status = {JobState.COMPLETED: "ok", JobState.TIMEOUT: "hang"}.get(JobState(info.state), "crash")
            note = f"job {info.id} {info.state}" + (f": {info.reason}" if info.reason else "")
        else:  # storm did not stop it at its limit: that is a bug of its own
            client.cancel((polled.id,))
            info = client.wait(polled.id, timeout=WAIT_SLACK)
            note = f"storm did not end job {info.id} at its time limit; cancelled: {info.state}"
            status = "hang"
        seconds = (info.end_time or time.time()) - (info.start_time or info.submit_time)
        return self._result(
            job.module, job.directory, ranks, status, seconds=seconds, limit=job.limit, note=note
        )


def progress_line(run: SuiteRun, module: ModuleRun) -> str:
    bad = sum(1 for o in module.tests.values() if o not in GOOD)
    where = f" in {module.where()}" if module.status != "ok" else ""
    return (
        f"  {run.launcher:8} n={run.ranks} {module.module:22} {module.status:5} {module.seconds:6.1f} s "
        f"{len(module.tests):4} tests, {bad} not passed{where}"
    )


def storm_limits(baseline: SuiteRun, factor: float, minimum: float, default: float) -> dict[str, float]:
    """Each module's time limit under storm: ``factor`` times its mpiexec time, at least ``minimum``;
    ``default`` for modules the baseline did not finish."""
    limits = {}
    for module, run in baseline.modules.items():
        limits[module] = default if run.status == "hang" else max(minimum, factor * run.seconds)
    return limits


@contextlib.contextmanager
def storm_cluster(directory: Path, policy: str, ranks: int, mpl: int = 1) -> Iterator[LocalCluster]:
    """A throwaway local cluster for ``ranks``-rank jobs: two node managers, so that every job spans two
    NMs, with ``ranks / 2`` PEs each (4 ranks: two per NM, so ranks share NMs too)."""
    settings: dict[str, object] = {} if policy == Policy.BATCH else {"mpl": mpl}
    cluster = LocalCluster(
        dir=directory, nodes=2, pes_per_node=max(1, (ranks + 1) // 2), policy=policy, mm_settings=settings,
        nm_settings={"kill_grace": 1.0},
    )  # fmt: skip
    try:
        cluster.up()
        yield cluster
    finally:
        cluster.down()
