"""Job arrays as Slurm writes them: ``storm submit --array 0-99%10`` runs one job per task id.

The notation is sbatch's: task ids ``N``, ranges ``N-M`` and stepped ranges ``N-M:S``, joined by commas, and
an optional ``%N`` at the end, the most tasks of the array that may run at once (``0-99%10``). Every task
is a job of its own, with its own id; the array's id is its first task's (Slurm's ArrayJobId), and users
name a task ``ARRAY_TASK`` (``123_7``).

Only the standard library here: the protocol (mm/protocol/client.py) checks a submission's ``--array`` with
:func:`parse_array`, the CLI parses with it before it sends anything, and storm-mm expands the task ids,
fills in each task's environment (:func:`task_env`) and its ``%A``/``%a`` output names
(:func:`expand_array`). A parse never expands the ranges: ``0-4000000`` costs a few tuples until storm-mm has
checked it against ``[mm] max_array_size``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Slurm's MaxArraySize may be set up to 4000001: no task id above 4000000 is ever taken, whatever the
# configuration, so that no text can make anyone expand billions of ids.
MAX_TASK_ID = 4_000_000
DEFAULT_MAX_ARRAY_SIZE = 1001  # Slurm's default MaxArraySize: task ids 0 to 1000

_ITEM = re.compile(r"(\d+)(?:-(\d+)(?::(\d+))?)?")
EXAMPLES = "e.g. 0-99, 1,3,5-7 or 0-15:4, with %N for at most N tasks at once (0-99%10)"


class ArrayError(ValueError):
    """An ``--array`` (or a task reference) that cannot be read; the text says why, for the user."""


@dataclass(frozen=True)
class ArraySpec:
    """The task ids of an array as ranges (first, last, step), not expanded, and its limit (0: none)."""

    ranges: tuple[tuple[int, int, int], ...]
    limit: int = 0

    @property
    def highest(self) -> int:
        """The largest task id, without expanding the ranges."""
        return max(first + (last - first) // step * step for first, last, step in self.ranges)

    def tasks(self) -> tuple[int, ...]:
        """Every task id once, in increasing order. O(ids): check :attr:`highest` against a bound first."""
        ids: set[int] = set()
        for first, last, step in self.ranges:
            ids.update(range(first, last + 1, step))
        return tuple(sorted(ids))

    def __str__(self) -> str:
        """The canonical text (ranges folded, duplicates gone): what storm stores and shows."""
        return fold(self.tasks(), self.limit)


def parse_array(text: str) -> ArraySpec:
    """``--array``'s text read as Slurm reads it; ArrayError with the reason for anything else."""
    body, percent, limit_text = text.partition("%")
    if not body:
        raise ArrayError(f"--array {text!r}: give task ids, {EXAMPLES}")
    limit = 0
    if percent:
        if not limit_text.isascii() or not limit_text.isdigit():
            raise ArrayError(f"--array {text}: %{limit_text} is not a number of tasks (e.g. %10)")
        limit = int(limit_text)
        if limit < 1:
            raise ArrayError(f"--array {text}: %{limit} would run no task: the limit must be at least 1")
    ranges = []
    for item in body.split(","):
        match = _ITEM.fullmatch(item) if item.isascii() else None
        if match is None:
            raise ArrayError(
                f"--array {text}: {item!r} is not a task id (N), a range (N-M) or a stepped range (N-M:S); "
                f"{EXAMPLES}"
            )
        first = int(match[1])
        last = first if match[2] is None else int(match[2])
        step = 1 if match[3] is None else int(match[3])
        if last < first:
            raise ArrayError(f"--array {text}: the range {item} ends before it starts")
        if step < 1:
            raise ArrayError(f"--array {text}: the step of {item} must be at least 1")
        if last > MAX_TASK_ID:
            raise ArrayError(f"--array {text}: task ids go up to {MAX_TASK_ID} at most (Slurm's bound)")
        ranges.append((first, last, step))
    return ArraySpec(tuple(ranges), limit)


def fold(tasks: tuple[int, ...] | list[int], limit: int = 0) -> str:
    """Sorted, distinct task ids as short as Slurm shows them: ``0-99``, ``1,3,5-7``, ``0-12:4``, and
    ``%N`` after them for a limit. Consecutive ids make ranges; three or more evenly spaced ids left between
    them make a stepped range. O(ids)."""
    parts: list[str] = []
    singles: list[int] = []
    i, n = 0, len(tasks)
    while i <= n:
        j = i
        while j + 1 < n and tasks[j + 1] == tasks[j] + 1:
            j += 1
        if i < n and j == i:
            singles.append(tasks[i])
        else:
            parts.extend(_stepped(singles))
            singles = []
            if i < n:
                parts.append(f"{tasks[i]}-{tasks[j]}")
        i = j + 1
    return ",".join(parts) + (f"%{limit}" if limit else "")


def _stepped(ids: list[int]) -> list[str]:
    """Ids none of which is next to another: runs of three or more at one step as ``a-b:s``."""
    parts = []
    i, n = 0, len(ids)
    while i < n:
        j = i
        while j + 1 < n and ids[j + 1] - ids[j] == ids[i + 1] - ids[i]:
            j += 1
        if j >= i + 2:
            parts.append(f"{ids[i]}-{ids[j]}:{ids[i + 1] - ids[i]}")
            i = j + 1
        else:
            parts.append(str(ids[i]))
            i += 1
    return parts


def parse_job_ref(text: str) -> tuple[int, tuple[int, ...] | None]:
    """A job as users name it: ``123`` (a job, or a whole array by its id), ``123_7`` (task 7 of array 123)
    or ``123_[1-3,7]`` (those tasks, as scancel takes them). Returns (id, task ids or None)."""
    head, underscore, tail = text.partition("_")
    if not head.isascii() or not head.isdigit() or len(head) > 18:
        raise ArrayError(f"{text!r} is not a job id: give 123, or 123_7 for task 7 of array 123")
    if not underscore:
        return int(head), None
    if tail.startswith("[") and tail.endswith("]"):
        try:
            spec = parse_array(tail[1:-1])
        except ArrayError as exc:
            raise ArrayError(f"{text}: {str(exc).removeprefix('--array ')}") from None
        if spec.limit:
            raise ArrayError(f"{text}: a %N limit belongs in --array, not in a task reference")
        return int(head), spec.tasks()
    if not tail.isascii() or not tail.isdigit() or int(tail) > MAX_TASK_ID:
        raise ArrayError(f"{text!r}: the task after '_' must be a task id (123_7) or a list (123_[1-3,7])")
    return int(head), (int(tail),)


def expand_array(pattern: str, array_id: int, task: int) -> str:
    """``%A`` (the array's id) and ``%a`` (the task id) filled into an output file pattern, everything else
    left for mm/slurm_style.py's expand_path (``%%`` too: ``%%a`` stays a literal ``%a``)."""
    if "%" not in pattern:
        return pattern
    out = []
    i, n = 0, len(pattern)
    while i < n:
        ch = pattern[i]
        if ch == "%" and i + 1 < n:
            nxt = pattern[i + 1]
            out.append(str(array_id) if nxt == "A" else str(task) if nxt == "a" else ch + nxt)
            i += 2
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def task_env(array_id: int, task: int, tasks: tuple[int, ...]) -> dict[str, str]:
    """A task's environment, Slurm's SLURM_ARRAY_* under storm's prefix (``tasks``: every task id)."""
    return {
        "STORM_ARRAY_JOB_ID": str(array_id),
        "STORM_ARRAY_TASK_ID": str(task),
        "STORM_ARRAY_TASK_COUNT": str(len(tasks)),
        "STORM_ARRAY_TASK_MIN": str(tasks[0]),
        "STORM_ARRAY_TASK_MAX": str(tasks[-1]),
    }
