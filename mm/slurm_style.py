"""Slurm's notations, which storm's users already know: output file name patterns (``%j``, ``%t``...) and
durations (``D-HH:MM:SS``).

Used by storm-mm (a job's output paths, time limit reasons), by storm-nm's job shell (each rank's output
file) and by the CLI (what it shows, what it checks before submitting).
"""

from __future__ import annotations


def format_duration(seconds: float | None) -> str:
    """Slurm's style: H:MM:SS, or D-HH:MM:SS from a day on; '-' for none."""
    if seconds is None:
        return "-"
    s = max(0, round(seconds))
    days, s = divmod(s, 86400)
    if days:
        return f"{days}-{s // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}"
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def expand_path(
    pattern: str, *, job_id: int, user: str, name: str, rank: int | None = None, node: str | None = None
) -> str:
    """Slurm-style output file names: %j job id, %t rank, %N node, %u user, %x job name, %% a percent sign.

    Without a rank or node, %t and %N stay as they are (for showing a job's output pattern).
    """
    values = {"j": str(job_id), "u": user, "x": name, "%": "%"}
    if rank is not None:
        values["t"] = str(rank)
    if node is not None:
        values["N"] = node
    out = []
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "%" and i + 1 < len(pattern) and pattern[i + 1] in values:
            out.append(values[pattern[i + 1]])
            i += 2
        else:
            out.append(ch)
            i += 1
    return "".join(out)
