"""Synthetic BSP application: a loop of fixed CPU work followed by communication (FCS paper, section 3).

``python -m storm.tools.apps.bsp [options]`` (``bsp.c`` is the same program in C, same options and output)

Options:
  --granularity T     CPU time one iteration computes on a fast rank (default 0.001; also 1ms, 100us, 2s)
  --imbalance F       slow ranks compute F x T per iteration (default 1)
  --slow WHICH        the slow ranks: odd (default), even, none, all, first-half (ranks < P/2),
                      second-half (the others), or a comma list of ranks such as 0,3
  --pattern P         communication after each computation: ring (default; MPI_Sendrecv of a small message
                      to the right neighbour, then one to the left), allreduce (MPI_Allreduce of one
                      double), barrier (MPI_Barrier), none
  --message-bytes N   size of the ring messages (default 8, at least 8)
  --iterations N      iterations to run (default 1000), or
  --seconds S         run for S seconds of wall time. Rank 0 decides when to stop and the decision travels
                      with the communication, so every rank runs the same number of iterations: in the
                      allreduce value, or in a flag bit of the ring messages (it spreads one hop per
                      iteration; every rank infers from its distance to rank 0 when rank 0 set it, and all
                      stop P//2 - 1 iterations after that). With barrier the MPI_Barrier becomes an
                      MPI_Allreduce (a barrier that can carry the decision); with none (or a ring of one
                      rank) each rank checks its own clock.
  --report PATH       rank 0 writes PATH: one JSON object per line, one line per rank in rank order, with
                      rank, size, iterations, wall_seconds, cpu_seconds (process CPU time in the loop),
                      comm_seconds (wall time inside MPI calls), compute_cpu_per_iteration (CPU time
                      actually burnt per iteration), target_cpu_per_iteration, slow, checksum, errors

The computation is a busy loop that runs until this thread's CPU clock (CLOCK_THREAD_CPUTIME_ID) has
advanced by the target, not the wall clock: a rank that is preempted or stopped (SIGSTOP) by a scheduler
still does exactly the requested work per iteration, which is what a gang or FCS scheduler measures and
must be judged on. The clock is read every ~30 us of work (the loop size is calibrated at start) and the
last stretch is sized to what remains, so the overshoot is a few microseconds. Three warm-up exchanges (not
counted) set up MPI's connections first.

Every message is checked: ring messages carry the sender's rank, the iteration and a filler byte, and the
allreduce sums rank + 1 + iteration to a known total. Rank 0 prints
``bsp: OK iterations=N ranks=P wall=X.XXXs granularity=G imbalance=F pattern=P`` (iterations and wall: rank
0's count, the slowest rank's loop time) or ``bsp: WRONG ...`` and then every rank exits with code 1. Bad
options exit with code 2 before MPI starts.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import struct
import sys
import time
from array import array
from typing import Any

WARMUP = 3
CHECK_EVERY = 30e-6  # CPU seconds of work between two reads of the CPU clock
HEADER = struct.Struct("=II")  # sender rank; iteration << 1 | stop flag
UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}
PATTERNS = ("ring", "allreduce", "barrier", "none")
SLOW_WORDS = ("odd", "even", "none", "all", "first-half", "second-half")


def nonnegative(number: str | None, scale: float, message: str) -> float:
    try:
        value = float(number or "nan") * scale
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(message)
    return value


def duration(text: str) -> float:
    """Parse seconds with an optional unit: 0.001, 5e-3, 1ms, 100us, 2s."""
    m = re.fullmatch(r"([0-9.eE+-]+)(s|ms|us)?", text)
    message = f"{text!r} is not a duration >= 0 (such as 0.001, 1ms, 100us, 2s)"
    return nonnegative(m and m[1], UNITS[m[2] or "s"] if m else 1.0, message)


def factor(text: str) -> float:
    return nonnegative(
        text if re.fullmatch(r"[0-9.eE+-]+", text) else None, 1.0, f"{text!r} is not a number >= 0"
    )


def positive_int(text: str) -> int:
    if not re.fullmatch(r"\+?[0-9]+", text) or not 1 <= int(text) < 2**30:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer >= 1 (and < 2**30)")
    return int(text)


def slow_spec(text: str) -> str:
    if text not in SLOW_WORDS and not re.fullmatch(r"[0-9]+(,[0-9]+)*", text):
        raise argparse.ArgumentTypeError(f"{text!r} is not one of {', '.join(SLOW_WORDS)} or a list like 0,3")
    return text


def slow_ranks(spec: str, size: int) -> set[int]:
    """The ranks that compute ``imbalance`` times as much; ValueError for a listed rank >= size."""
    words = {
        "odd": range(1, size, 2),
        "even": range(0, size, 2),
        "none": range(0),
        "all": range(size),
        "first-half": range(size // 2),
        "second-half": range(size // 2, size),
    }
    if spec in words:
        return set(words[spec])
    ranks = {int(r) for r in spec.split(",")}
    if max(ranks) >= size:
        raise ValueError(f"--slow names rank {max(ranks)} but there are only {size} ranks")
    return ranks


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="bsp",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    # the options are described in the module docstring, which --help prints
    parser.add_argument("--granularity", type=duration, default=0.001, metavar="T")
    parser.add_argument("--imbalance", type=factor, default=1.0, metavar="F")
    parser.add_argument("--slow", type=slow_spec, default="odd", metavar="WHICH")
    parser.add_argument("--pattern", choices=PATTERNS, default="ring", metavar="P")
    parser.add_argument("--message-bytes", type=positive_int, default=8, metavar="N")
    stop = parser.add_mutually_exclusive_group()
    stop.add_argument("--iterations", type=positive_int, default=1000, metavar="N")
    stop.add_argument("--seconds", type=duration, default=None, metavar="S")
    parser.add_argument("--report", default=None, metavar="PATH")
    args = parser.parse_args(argv)
    if args.message_bytes < HEADER.size:
        parser.error(f"argument --message-bytes: must be at least {HEADER.size}")
    if args.seconds is not None and args.seconds <= 0:
        parser.error("argument --seconds: must be > 0")
    return args


class Burner:
    """Burns exact amounts of this thread's CPU time."""

    def __init__(self) -> None:
        n = 1000
        while True:  # calibrate: steps of the inner loop per CPU second
            start = time.thread_time()
            self.spin(n)
            elapsed = time.thread_time() - start
            if elapsed >= 0.005:
                break
            n *= 2
        self.rate = n / elapsed
        self.chunk = max(1, int(self.rate * CHECK_EVERY))

    @staticmethod
    def spin(n: int) -> int:
        acc = 0
        for i in range(n):
            acc += i
        return acc

    def burn(self, target: float) -> float:
        """Run until the thread's CPU clock has advanced by ``target``; return how far it advanced."""
        clock, rate, chunk = time.thread_time, self.rate, self.chunk
        start = now = clock()
        end = start + target
        while now < end:
            n = min(chunk, int((end - now) * rate) + 1)  # the last stretch is sized to what remains
            acc = 0
            for i in range(n):
                acc += i
            now = clock()
        return now - start


def fill(rank: int) -> int:
    return (rank * 37 + 11) & 0xFF


class Rank:
    """One rank's loop: its computation target, its communication, and what it measured."""

    def __init__(self, args: argparse.Namespace, comm: Any, mpi: Any) -> None:
        self.args, self.comm, self.mpi = args, comm, mpi
        self.rank, self.size = rank, size = comm.Get_rank(), comm.Get_size()
        self.slow = rank in slow_ranks(args.slow, size)
        self.target = args.granularity * (args.imbalance if self.slow else 1.0)
        self.left, self.right = (rank - 1) % size, (rank + 1) % size
        self.pattern = "none" if args.pattern == "ring" and size == 1 else args.pattern
        if self.pattern == "barrier" and args.seconds is not None:
            self.pattern = "allreduce"  # a barrier that carries rank 0's decision to stop
        nbytes = args.message_bytes
        self.send = bytearray([fill(rank)]) * nbytes
        self.from_left, self.from_right = bytearray(nbytes), bytearray(nbytes)
        self.want_left = bytes([fill(self.left)]) * (nbytes - HEADER.size)
        self.want_right = bytes([fill(self.right)]) * (nbytes - HEADER.size)
        self.value, self.total = array("d", [0.0]), array("d", [0.0])
        self.errors = self.checksum = 0
        self.comm_seconds = 0.0

    def exchange(self, it: int, flag: bool) -> bool:
        """One iteration's communication, checked; returns whether a stop flag arrived."""
        comm, mpi = self.comm, self.mpi
        t0 = time.perf_counter()
        seen = False
        if self.pattern == "ring":
            HEADER.pack_into(self.send, 0, self.rank, it << 1 | flag)
            comm.Sendrecv([self.send, mpi.BYTE], self.right, 0, [self.from_left, mpi.BYTE], self.left, 0)
            comm.Sendrecv([self.send, mpi.BYTE], self.left, 1, [self.from_right, mpi.BYTE], self.right, 1)
            self.comm_seconds += time.perf_counter() - t0
            for buf, src, want in (
                (self.from_left, self.left, self.want_left),
                (self.from_right, self.right, self.want_right),
            ):
                sender, word = HEADER.unpack_from(buf)
                self.errors += sender != src or word >> 1 != it or buf[HEADER.size :] != want
                self.checksum += sender + (word >> 1)
                seen = seen or bool(word & 1)
        elif self.pattern == "allreduce":
            self.value[0] = self.rank + 1 + it + (0.5 if flag else 0.0)  # the stop flag travels as a half
            comm.Allreduce([self.value, mpi.DOUBLE], [self.total, mpi.DOUBLE], op=mpi.SUM)
            self.comm_seconds += time.perf_counter() - t0
            seen = self.total[0] % 1.0 == 0.5
            result = int(self.total[0])
            self.errors += result != self.size * (self.size + 1) // 2 + self.size * it
            self.checksum += result
        elif self.pattern == "barrier":
            comm.Barrier()
            self.comm_seconds += time.perf_counter() - t0
        return seen

    def run(self) -> dict[str, Any]:
        """Warm up, then the measured loop; returns this rank's report line (as a dict)."""
        args, pattern = self.args, self.pattern
        burner = Burner()
        for it in range(WARMUP):
            self.exchange(it, False)
        self.errors = self.checksum = 0
        self.comm_seconds = 0.0
        self.comm.Barrier()

        decides = pattern == "none" or self.rank == 0
        distance, farthest = min(self.rank, self.size - self.rank), self.size // 2
        deadline = None if args.seconds is None else time.perf_counter() + args.seconds
        stop_at: int | None = None  # with --seconds: the last iteration, once known
        computed = 0.0
        wall0, cpu0 = time.perf_counter(), time.process_time()
        it = 0
        while True:
            computed += burner.burn(self.target)
            if deadline is not None and stop_at is None and decides and time.perf_counter() >= deadline:
                stop_at = it + farthest - 1 if pattern == "ring" else it
            if self.exchange(it, stop_at is not None) and stop_at is None:
                # Ring: the flag moves one hop per iteration, so it reaches this rank `distance - 1`
                # iterations after rank 0 set it; everyone stops `farthest - 1` iterations after that.
                stop_at = it - distance + farthest if pattern == "ring" else it
            it += 1
            if it == args.iterations if deadline is None else stop_at is not None and it > stop_at:
                break
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        return {
            "rank": self.rank,
            "size": self.size,
            "iterations": it,
            "wall_seconds": round(wall, 9),
            "cpu_seconds": round(cpu, 9),
            "comm_seconds": round(self.comm_seconds, 9),
            "compute_cpu_per_iteration": round(computed / it, 9),
            "target_cpu_per_iteration": round(self.target, 9),
            "slow": self.slow,
            "checksum": (self.checksum if args.pattern in {"ring", "allreduce"} else it) & 0xFFFFFFFFFFFFFFFF,
            "errors": self.errors,
        }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)  # before MPI starts: a usage error exits with code 2 on every rank alike
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    try:
        slow_ranks(args.slow, comm.Get_size())
    except ValueError as e:
        if comm.Get_rank() == 0:
            print(f"bsp: error: {e}", file=sys.stderr)
        return 2
    line = Rank(args, comm, MPI).run()
    lines = comm.gather(line, root=0)
    status = 0
    if comm.Get_rank() == 0:
        assert lines is not None
        errors = sum(x["errors"] for x in lines)
        status = 1 if errors else 0
        if args.report is not None:
            try:
                with open(args.report, "w", encoding="utf-8") as f:
                    f.writelines(json.dumps(x) + "\n" for x in lines)
            except OSError as e:
                print(f"bsp: cannot write the report: {e}", file=sys.stderr)
                status = 1
        wall = max(x["wall_seconds"] for x in lines)
        print(
            f"bsp: {'WRONG' if errors else 'OK'} iterations={line['iterations']} ranks={len(lines)} "
            f"wall={wall:.3f}s granularity={args.granularity:g} imbalance={args.imbalance:g} "
            f"pattern={args.pattern}" + (f" errors={errors}" if errors else ""),
            flush=True,
        )
    return int(comm.bcast(status, root=0))


if __name__ == "__main__":
    sys.exit(main())
