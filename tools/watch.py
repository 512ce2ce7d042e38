"""storm watch: the matrix, the active row, each process's FCS class, and the queue, refreshed live.

Every refresh asks the MM for the matrix, the classes and the queue (three requests) and redraws the screen.
Cells are coloured by class (CS green, F yellow, DC blue) when the output is a terminal; ``--once`` prints a
single frame without clearing the screen, for scripts and screenshots.
"""

from __future__ import annotations

import sys
import time

from storm.mm import protocol as p
from storm.tools.client import Client
from storm.tools.views import ranks_text, state_text

COLOURS: dict[str, str] = {p.Klass.CS: "\033[42;30m", p.Klass.F: "\033[43;30m", p.Klass.DC: "\033[44;37m"}
RESET = "\033[0m"
CLEAR = "\033[H\033[2J"
ALT_SCREEN_ON = "\033[?1049h\033[?25l"  # the alternate screen, cursor hidden
ALT_SCREEN_OFF = "\033[?25h\033[?1049l"


def frame(view: p.MatrixView, processes: tuple[p.RankStats, ...], jobs: list[p.JobInfo], colour: bool) -> str:
    """One screen: the matrix with the active row marked '*', each cell "job class", then the queue."""
    klass = {(r.node, r.pe, r.job_id): r.klass for r in processes}
    width = max(
        [9, *(len(c) + 1 for c in view.columns), *(len(str(j)) + 4 for row in view.cells for j in row)]
    )
    when = time.strftime("%H:%M:%S")
    if p.Policy(view.policy).cycles:
        active = "-" if view.active_row is None else str(view.active_row)
        head = f"policy {view.policy}, MPL {view.mpl}, {view.slice * 1000:g} ms slices, active row {active}"
    else:
        head = f"policy {view.policy}, MPL {view.mpl}"
    lines = [f"storm watch  {head}  {when}", "", "ROW   " + "".join(c.ljust(width) for c in view.columns)]
    for index, row in enumerate(view.cells):
        cells = []
        for column, occupant in zip(view.columns, row, strict=True):
            node, pe = column.rsplit(":", 1)
            name = klass.get((node, int(pe), occupant), "") if occupant else ""
            text = (f"{occupant} {name}".strip() if occupant else ".").ljust(width)
            cells.append(f"{COLOURS[name]}{text[:-1]}{RESET} " if colour and name in COLOURS else text)
        marker = "*" if index == view.active_row else " "
        lines.append(f"{marker} {index:<3} " + "".join(cells))
    if colour:
        lines.append("       " + "  ".join(f"{COLOURS[k]} {k} {RESET}" for k in p.CLASSES))
    lines += ["", f"{'JOBID':<6} {'NAME':<16} {'USER':<10} {'STATE':<10} {'RANKS':>5}  NODES / REASON"]
    for job in jobs:
        where = ",".join(job.nodes) if p.JobState(job.state).active else job.reason or "-"
        if job.suspended_by is not None:
            where = f"{where} ({job.reason})"
        state, ranks = state_text(job), ranks_text(job)
        lines.append(f"{job.id:<6} {job.name[:16]:<16} {job.user[:10]:<10} {state:<10} {ranks:>5}  {where}")
    if not jobs:
        lines.append("(no pending or running jobs)")
    return "\n".join(lines)


def watch(endpoint: str | None, interval: float, once: bool, colour: bool | None = None) -> int:
    """Print one frame (``once``) or redraw until interrupted; on a terminal, in its alternate screen so
    that quitting gives the operator's screen back as it was (like top and watch)."""
    terminal = sys.stdout.isatty()
    use_colour = terminal if colour is None else colour
    with Client(endpoint, timeout=10) as client:
        if once:
            print(frame(*fetch(client), use_colour))
            return 0
        if terminal:
            sys.stdout.write(ALT_SCREEN_ON)
        try:
            while True:
                text = frame(*fetch(client), use_colour)
                sys.stdout.write(CLEAR + text + "\n  (Ctrl-C to quit)\n")
                sys.stdout.flush()
                time.sleep(interval)  # the refresh period of a live view
        finally:
            if terminal:
                sys.stdout.write(ALT_SCREEN_OFF)
                sys.stdout.flush()


def fetch(client: Client) -> tuple[p.MatrixView, tuple[p.RankStats, ...], list[p.JobInfo]]:
    view = client.call(p.GetMatrix(), p.MatrixView)
    processes = client.call(p.GetClasses(), p.ClassesView).processes
    return view, processes, client.jobs()
