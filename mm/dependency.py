"""Job dependencies as Slurm writes them (``--dependency afterok:123:124,afterany:125_4``) and what each
needs of the jobs it names.

A dependency is a list of conditions, each ``KIND:ID[:ID...]``, joined by ``,`` (all must hold) or by ``?``
(any one is enough); Slurm refuses a mix of both, and so does storm. ``KIND:1:2`` is ``KIND:1`` and
``KIND:2``. An ID names a job, a whole array by its id (every task), or one task (``123_4``). The kinds:

- ``after``: the job has started (or ended without starting: it never will). A whole array: no task is
  still waiting for its first start (Slurm's test of an array: none pending).
- ``afterany``: the job has ended, however. A whole array: every task has.
- ``afterok``: the job has ended COMPLETED (exit code 0). A whole array: every task has.
- ``afternotok``: the job has ended otherwise (FAILED, CANCELLED, TIMEOUT, NODE_FAIL). A whole array: every
  task has ended and one at least not COMPLETED.

A requeued job (``--requeue``) has not ended until its last run has: afterany and afterok wait for that;
``after`` holds from its first start. Each condition is monotonic: once it holds it holds for good, and
once it can never hold (afterok on a FAILED job) it never will, so a dependency is judged again only
when a job it names starts or ends, and a restarted storm-mm judges it afresh from the store.

Only the standard library and mm/states.py here: the protocol checks a submission's text with
:func:`parse_dependency`, the CLI before it sends, storm-mm (mm/holds.py) when it judges.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from storm.mm.states import JobState

KINDS = ("after", "afterany", "afterok", "afternotok")
MAX_CONDITIONS = 1000  # job ids in one dependency: enough for any script, bounded for the MM
EXAMPLES = "e.g. afterok:123, afterany:123:124, afterok:123_4,after:125 or afterok:123?afternotok:124"


class DependencyError(ValueError):
    """A ``--dependency`` that cannot be read; the text says why, for the user."""


@dataclass(frozen=True)
class Condition:
    """One kind on one job: ``task`` None names job ``job_id`` (or, when that is an array's id, the whole
    array), else task ``task`` of array ``job_id``."""

    kind: str
    job_id: int
    task: int | None = None

    @property
    def target(self) -> str:
        return str(self.job_id) if self.task is None else f"{self.job_id}_{self.task}"

    def __str__(self) -> str:
        return f"{self.kind}:{self.target}"


@dataclass(frozen=True)
class Dependency:
    """Conditions that must all hold, or (``any``) one of which must."""

    conditions: tuple[Condition, ...]
    any: bool = False

    def __str__(self) -> str:
        """The canonical text: consecutive conditions of one kind share it (``afterok:1:2``)."""
        groups: list[tuple[str, list[str]]] = []
        for c in self.conditions:
            if groups and groups[-1][0] == c.kind and not self.any:
                groups[-1][1].append(c.target)
            else:
                groups.append((c.kind, [c.target]))
        return ("?" if self.any else ",").join(f"{kind}:{':'.join(ids)}" for kind, ids in groups)


def parse_dependency(text: str) -> Dependency:
    """``--dependency``'s text; DependencyError with the reason for anything storm does not take."""
    if "," in text and "?" in text:
        raise DependencyError(
            f"--dependency {text}: use ',' (all must hold) or '?' (any one), not both (as Slurm)"
        )
    separator = "?" if "?" in text else ","
    conditions: list[Condition] = []
    for part in text.split(separator):
        kind, colon, ids = part.partition(":")
        if kind not in KINDS:
            what = "singleton, aftercorr and +time are not supported; " if kind else ""
            raise DependencyError(
                f"--dependency {text}: {part!r} is not KIND:ID[:ID...] with KIND one of {', '.join(KINDS)} "
                f"({what}{EXAMPLES})"
            )
        if not colon or not ids:
            raise DependencyError(f"--dependency {text}: {kind} needs a job id ({kind}:123)")
        for item in ids.split(":"):
            conditions.append(Condition(kind, *_target(text, item)))
    if len(conditions) > MAX_CONDITIONS:
        raise DependencyError(f"--dependency: {len(conditions)} job ids, more than {MAX_CONDITIONS}")
    return Dependency(tuple(conditions), any=separator == "?")


def _target(text: str, item: str) -> tuple[int, int | None]:
    head, underscore, tail = item.partition("_")
    if (
        not (head.isascii() and head.isdigit() and 0 < len(head) <= 18 and int(head) > 0)
        or (underscore and not (tail.isascii() and tail.isdigit() and len(tail) <= 9))
    ):  # fmt: skip
        raise DependencyError(f"--dependency {text}: {item!r} is not a job id (123) or an array task (123_4)")
    return int(head), int(tail) if underscore else None


class Verdict(Enum):
    WAIT = "wait"  # may still hold
    MET = "met"  # holds, for good
    NEVER = "never"  # can never hold


@dataclass
class ArrayCounts:
    """What a whole-array condition looks at: how many tasks the array has, how many have not ended, how
    many of those never started, how many ended other than COMPLETED (and the first of these: job id,
    task, state). mm/holds.py keeps them up to date while the array has tasks that have not ended."""

    tasks: int = 0
    unfinished: int = 0
    unstarted: int = 0
    failed: int = 0
    first_failed: tuple[int, int, str] | None = None


def judge_job(kind: str, job_id: int, state: JobState, started: bool) -> tuple[Verdict, str]:
    """One condition on a job in ``state`` (``started``: it has started once): its verdict, and for NEVER
    why, naming the job and its state."""
    if kind == "after":
        return (Verdict.MET if started or state.terminal else Verdict.WAIT), ""
    if not state.terminal:
        return Verdict.WAIT, ""
    if kind == "afterany":
        return Verdict.MET, ""
    ok = state is JobState.COMPLETED
    if (kind == "afterok") == ok:
        return Verdict.MET, ""
    needs = "ended COMPLETED" if kind == "afterok" else "ended FAILED, CANCELLED, TIMEOUT or NODE_FAIL"
    return Verdict.NEVER, f"job {job_id} ended {state.value} ({kind}:{job_id} needs it {needs})"


def judge_array(kind: str, array_id: int, counts: ArrayCounts) -> tuple[Verdict, str]:
    """One condition on every task of array ``array_id``: its verdict, and for NEVER why."""
    if kind == "after":
        return (Verdict.MET if counts.unstarted == 0 else Verdict.WAIT), ""
    if kind == "afterok" and counts.first_failed is not None:
        job_id, task, state = counts.first_failed
        return Verdict.NEVER, (
            f"task {array_id}_{task} (job {job_id}) ended {state} (afterok:{array_id} needs every task of "
            "the array to end COMPLETED)"
        )
    if counts.unfinished:
        return Verdict.WAIT, ""
    if kind == "afternotok" and counts.failed == 0:
        return Verdict.NEVER, (
            f"every task of array {array_id} ended COMPLETED (afternotok:{array_id} needs one that did not)"
        )
    return Verdict.MET, ""


def combine(verdicts: list[tuple[Verdict, str]], any_: bool) -> tuple[Verdict, str]:
    """The dependency's verdict from its conditions': all must hold (``any_``: one is enough)."""
    if any_:
        if any(v is Verdict.MET for v, _ in verdicts):
            return Verdict.MET, ""
        if all(v is Verdict.NEVER for v, _ in verdicts):
            return Verdict.NEVER, "; ".join(why for _, why in verdicts)
        return Verdict.WAIT, ""
    never = next((why for v, why in verdicts if v is Verdict.NEVER), None)
    if never is not None:
        return Verdict.NEVER, never
    if all(v is Verdict.MET for v, _ in verdicts):
        return Verdict.MET, ""
    return Verdict.WAIT, ""
