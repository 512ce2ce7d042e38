"""MPI jobs as mpihook's benchmark (tools/bench_hook.py) and tests run them: no storm daemons, the
environment's mpicc and mpiexec, the hook preloaded in the ranks only and each rank given its record of a
segment this process creates, as storm-nm would.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from storm import mpihook
from storm.mpihook import SPIN_BLOCK_ENVIRONMENT
from storm.mpihook.stats import WAIT_POLL, HookSegment, segment_name
from storm.nm import procfs
from storm.tools import apps

BIN = Path(sys.executable).parent
APPS = Path(apps.__file__).parent
SPIN_NS = 120_000  # the FCS paper's T_spin
RUN_TIMEOUT = 120.0

# bsp.c's measured loop sits between its only MPI_Barrier (after the warm-up) and its only MPI_Gather.
PROBE_HEADER = r"""
/* Compiled into bsp.c (mpicc -include): this rank's mpihook record, copied after the warm-up and after the
 * measured loop, written to $STORM_PROBE_OUT.RANK as JSON (tools/bench_hook.py). */
#include <mpi.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include "record.h"

static struct storm_hook_stats probe_snapshots[2];
static unsigned long long probe_sched[2][3]; /* ns on a CPU, ns waiting for one, involuntary switches */

static void probe_sched_take(unsigned long long *out)
{
    char line[256];
    FILE *f = fopen("/proc/thread-self/schedstat", "r");
    if (!f || fscanf(f, "%llu %llu", &out[0], &out[1]) != 2)
        MPI_Abort(MPI_COMM_WORLD, 3);
    fclose(f);
    if (!(f = fopen("/proc/thread-self/status", "r")))
        MPI_Abort(MPI_COMM_WORLD, 3);
    while (fgets(line, sizeof line, f))
        sscanf(line, "nonvoluntary_ctxt_switches: %llu", &out[2]);
    fclose(f);
}

static void probe_take(struct storm_hook_stats *out)
{
    char path[512];
    const char *name = getenv("STORM_HOOK_SEGMENT"), *index = getenv("STORM_HOOK_INDEX");
    snprintf(path, sizeof path, "/dev/shm%s", name ? name : "/none");
    int fd = open(path, O_RDONLY);
    off_t at = (off_t) (sizeof(struct storm_hook_header) +
                        (size_t) atoi(index ? index : "0") * sizeof(struct storm_hook_record));
    if (fd < 0 || pread(fd, out, sizeof *out, at) != (ssize_t) sizeof *out)
        MPI_Abort(MPI_COMM_WORLD, 3);
    close(fd);
}

static void probe_print(FILE *f, const char *key, const struct storm_hook_stats *s,
                        const unsigned long long *sched, const char *end)
{
    fprintf(f, "\"%s\": {\"pid\": %d, \"flags\": %u, \"calls\": %llu, \"events\": %llu, ", key, s->pid,
            s->flags, (unsigned long long) s->calls, (unsigned long long) s->events);
    fprintf(f, "\"comm_ns\": %llu, \"spin_ns\": %llu, \"block_ns\": %llu, ", (unsigned long long) s->comm_ns,
            (unsigned long long) s->spin_ns, (unsigned long long) s->block_ns);
    fprintf(f, "\"run_ns\": %llu, \"runqueue_ns\": %llu, \"preempted\": %llu}%s", sched[0], sched[1],
            sched[2], end);
}

static int probe_barrier(MPI_Comm comm)
{
    static int calls;
    int rc = MPI_Barrier(comm);
    if (calls++ == 0) {
        probe_take(&probe_snapshots[0]);
        probe_sched_take(probe_sched[0]);
    }
    return rc;
}

static int probe_gather(const void *sbuf, int scount, MPI_Datatype stype, void *rbuf, int rcount,
                        MPI_Datatype rtype, int root, MPI_Comm comm)
{
    char path[512];
    int rank;
    probe_take(&probe_snapshots[1]);
    probe_sched_take(probe_sched[1]);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    snprintf(path, sizeof path, "%s.%d", getenv("STORM_PROBE_OUT"), rank);
    FILE *f = fopen(path, "w");
    if (!f)
        MPI_Abort(MPI_COMM_WORLD, 3);
    fputc('{', f);
    probe_print(f, "before", &probe_snapshots[0], probe_sched[0], ", ");
    probe_print(f, "after", &probe_snapshots[1], probe_sched[1], "}\n");
    fclose(f);
    return MPI_Gather(sbuf, scount, stype, rbuf, rcount, rtype, root, comm);
}

#define MPI_Barrier probe_barrier
#define MPI_Gather probe_gather
"""


def mpicc(source: Path, output: Path, *flags: str, libs: Sequence[str] = ()) -> str:
    """Compile with the environment's mpicc (-O2 -Wall -Wextra); returns the compiler's messages."""
    built = subprocess.run(
        [str(BIN / "mpicc"), "-O2", "-Wall", "-Wextra", *flags, "-o", str(output), str(source), *libs],
        capture_output=True, text=True, timeout=RUN_TIMEOUT, check=False,
    )  # fmt: skip
    if built.returncode != 0:
        raise RuntimeError(f"mpicc {source.name} failed:\n{built.stderr}")
    return built.stderr


def build_bsp(directory: Path, probe: bool = False) -> Path:
    """bsp.c, plain or with the probe header compiled in."""
    flags: list[str] = []
    if probe:
        header = directory / "bsp_probe.h"
        header.write_text(PROBE_HEADER)
        flags = ["-include", str(header), "-I", str(Path(mpihook.__file__).parent)]
    binary = directory / ("bsp_probe" if probe else "bsp")
    mpicc(APPS / "bsp.c", binary, *flags, libs=["-lm"])
    return binary


def build_pingpong(directory: Path) -> Path:
    binary = directory / "pingpong"
    mpicc(APPS / "pingpong.c", binary)
    return binary


def python_bsp(probe: bool = False) -> list[str]:
    if probe:
        return [sys.executable, "-m", "storm.tools.bench_hook", "--probe-bsp"]
    return [sys.executable, "-m", "storm.tools.apps.bsp"]


@contextlib.contextmanager
def hook_segment(nranks: int = 2, mode: int = WAIT_POLL, spin_ns: int = SPIN_NS) -> Iterator[HookSegment]:
    """A job's segment as storm-nm makes it, every rank in ``mode``; removed on the way out."""
    segment = HookSegment.create(segment_name(os.getpid(), 0), 0, nranks, os.getuid(), os.getgid())
    try:
        set_mode(segment, mode, spin_ns)
        yield segment
    finally:
        segment.close()
        segment.unlink()


def set_mode(segment: HookSegment, mode: int, spin_ns: int = SPIN_NS) -> None:
    for index in range(segment.nranks):
        segment.set_wait(index, mode, spin_ns)


def command(
    program: Sequence[str],
    nranks: int = 2,
    *,
    hook: Path | None = None,
    segment: str | None = None,
    env: Mapping[str, str] | None = None,
) -> list[str]:
    """An mpiexec command line that preloads ``hook`` in the ranks only (never in mpiexec or its proxies,
    which -genv does not reach) and gives each rank its record of ``segment``. Ranks get what storm gives
    them on a node that may ask them to spin-block (MPICH's collectives over point-to-point messages), hooked
    or not, so that a comparison isolates the hook."""
    argv = [str(BIN / "mpiexec")]
    variables = {**SPIN_BLOCK_ENVIRONMENT, **(env or {})}
    if hook is not None:
        variables["LD_PRELOAD"] = str(hook)
    if segment is not None:
        variables["STORM_HOOK_SEGMENT"] = segment
    for name, value in variables.items():
        argv += ["-genv", name, value]
    if segment is None:
        return [*argv, "-n", str(nranks), *program]
    for index in range(nranks):
        argv += [*([":"] if index else []), "-n", "1", "-env", "STORM_HOOK_INDEX", str(index), *program]
    return argv


def kill_tree(pid: int) -> None:
    """SIGKILL a process and its descendants, by pid (MPI ranks are in sessions of their own)."""
    children: dict[int, list[int]] = {}
    for child in procfs.pids():
        parent = procfs.parent(child)
        if parent is not None:
            children.setdefault(parent, []).append(child)
    todo, found = [pid], []
    while todo:
        found.append(todo.pop())
        todo += children.get(found[-1], [])
    for victim in reversed(found):
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGCONT)
            os.kill(victim, signal.SIGKILL)


def run(
    argv: Sequence[str], cwd: Path | None = None, timeout: float = RUN_TIMEOUT
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(list(argv), proc.returncode, out, err)


def check(done: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    if done.returncode != 0:
        raise RuntimeError(
            f"{' '.join(done.args)} exited with {done.returncode}:\n{done.stdout}\n{done.stderr}"
        )
    return done
