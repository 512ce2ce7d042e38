"""``storm sim bluegene``'s report: saturation beside the paper's, its claims checked one by one, the capacity
split (its Fig. 8), every point, and plots (wait and bounded slowdown against utilization per scheduler,
migrations, the capacity split)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from storm.tools.sim.bluegene import BSLD_THRESHOLD, LABELS, PAPER_LOADS, Setup, curve, saturation

Json = dict[str, Any]

# The paper's section 3.4, by log. HPC2N stands in for its SDSC log (sizes of all kinds; sim-targets.md 2.6).
PAPER = {
    "NASA": {
        "FCFS": "~77%",
        "Migration": "~80%",
        "Backfill": "~90%",
        "B+M": "~90%",
        "flat Backfill": "= torus",
    },
    "SDSC": {"FCFS": "63%", "Migration": "73%", "Backfill": ">85%", "B+M": ">85%", "flat FCFS": "~80%"},
}
TIE = 0.001  # utilizations closer than a tenth of a point are a tie, not an order
FIG8_C = 1.0  # the paper's Fig. 8
PAPER_TOP_C = 1.4  # the top of the paper's range of c, where the schedulers differ more


def paper_log(trace: str) -> str:
    """Which of the paper's logs a trace is compared with: NASA by name, any other with SDSC's."""
    return "NASA" if "nasa" in trace.lower() else "SDSC"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def saturations(points: list[Json], traces: list[str]) -> dict[str, dict[str, Json]]:
    """Per trace, the saturation of each scheduler that was run on it (--schedulers may leave some out)."""
    return {
        trace: {label: saturation(line) for label in LABELS if (line := curve(points, trace, label))}
        for trace in traces
    }


def _at(points: list[Json], trace: str, label: str, c: float) -> Json | None:
    return next((p for p in curve(points, trace, label) if abs(p["c"] - c) < 1e-9), None)


def claims(points: list[Json], traces: list[str]) -> list[Json]:
    """The paper's findings as the issue states them, each PASS or DIFFERS with the figures."""
    sat = saturations(points, traces)
    found = []

    def claim(text: str, ok: bool, figures: str) -> None:
        found.append({"claim": text, "verdict": "PASS" if ok else "DIFFERS", "figures": figures})

    nasa = next((t for t in traces if paper_log(t) == "NASA"), None)
    other = next((t for t in traces if paper_log(t) != "NASA"), None)
    order = ("FCFS", "Migration", "Backfill", "B+M")
    for rule, name in (
        ("plateau", "highest utilization reached"),
        ("onset", "utilization at mean BSLD > 100"),
    ):
        if nasa is None or any(sat[nasa].get(label, {}).get(rule) is None for label in order):
            continue
        s = {label: sat[nasa][label][rule] for label in order}
        pairs = list(itertools.pairwise(order))
        gaps = [s[b] - s[a] for a, b in pairs]
        ties = [
            f"{a} and {b} within {100 * TIE:g} point"
            for (a, b), gap in zip(pairs, gaps, strict=True)
            if abs(gap) < TIE
        ]
        claim(
            f"{nasa}: saturation order FCFS < Migration < Backfill <= B+M ({name}; gaps under {100 * TIE:g} "
            "point are ties)",
            gaps[0] >= TIE and gaps[1] >= TIE and gaps[2] > -TIE,
            ", ".join(f"{label} {_pct(s[label])}" for label in order)
            + (f" ({'; '.join(ties)})" if ties else ""),
        )
    for trace in traces:
        for better, worse in (("Migration", "FCFS"), ("B+M", "Backfill")):
            pairs = [
                (a["summary"]["mean_wait"], b["summary"]["mean_wait"])
                for a in curve(points, trace, better)
                if a["c"] in PAPER_LOADS and (b := _at(points, trace, worse, a["c"])) is not None
            ]
            if pairs:
                wins = sum(1 for a, b in pairs if a < b)
                claim(
                    f"{trace}: {better} waits less than {worse} (mean wait, at most of the paper's c, "
                    "0.7 to 1.4)",
                    wins > len(pairs) / 2,
                    f"less at {wins} of {len(pairs)}",
                )
    if (
        nasa is not None
        and other is not None
        and all(label in sat[t] for t in (nasa, other) for label in ("FCFS", "Migration"))
    ):
        gains = {t: sat[t]["Migration"]["plateau"] - sat[t]["FCFS"]["plateau"] for t in (nasa, other)}
        claim(
            f"migration matters more on {other} than on {nasa} (saturation gain over FCFS)",
            gains[other] > gains[nasa],
            f"{other} {100 * gains[other]:+.1f} points, {nasa} {100 * gains[nasa]:+.1f} points",
        )
    if other is not None and "flat FCFS" in sat[other] and "FCFS" in sat[other]:
        flat, torus = sat[other]["flat FCFS"]["plateau"], sat[other]["FCFS"]["plateau"]
        claim(
            f"{other}: the flat machine saturates well above the torus under FCFS (5 points or more)",
            flat - torus >= 0.05,
            f"flat {_pct(flat)}, torus {_pct(torus)}",
        )
    for trace in traces:
        fcfs, both = _at(points, trace, "FCFS", FIG8_C), _at(points, trace, "B+M", FIG8_C)
        if fcfs is None or both is None:
            continue
        lost = (fcfs["capacity"]["lost"], both["capacity"]["lost"])
        claim(
            f"{trace}: B+M loses less capacity than FCFS at c = {FIG8_C:g} (Fig. 8)",
            lost[1] < lost[0],
            f"lost {lost[0]:.3f} -> {lost[1]:.3f} ({100 * (lost[1] / lost[0] - 1) if lost[0] else 0:+.0f}%)",
        )
    return found


def migration_rates(points: list[Json], trace: str) -> str:
    """Attempts and successes of the Migration scheduler over the sweep, and the mean time between them."""
    line = curve(points, trace, "Migration")
    attempts = sum(p["migrations"]["attempts"] for p in line if p["migrations"])
    successes = sum(p["migrations"]["successes"] for p in line if p["migrations"])
    if not attempts:
        return f"{trace}: no migration attempted"
    at_one = _at(points, trace, "Migration", 1.0)
    every = ""
    if at_one and at_one["migrations"] and at_one["migrations"]["successes"]:
        hours = at_one["summary"]["makespan"] / at_one["migrations"]["successes"] / 3600
        every = f"; at c = 1 one successful migration every {hours:.1f} h of simulated time"
    return f"{trace}: {attempts:,} attempted over the sweep, {successes / attempts:.0%} successful{every}"


def _table_saturation(points: list[Json], traces: list[str]) -> list[str]:
    sat = saturations(points, traces)
    lines = [
        "| trace | scheduler | highest utilization reached | flattened | utilization at mean BSLD > 100 | "
        "paper |",
        "|---|---|---:|---|---:|---:|",
    ]
    for trace in traces:
        log = paper_log(trace)
        for label, s in sat[trace].items():
            paper = PAPER[log].get(label, "-")
            paper = paper if paper == "-" or log == "NASA" else f"{paper} (SDSC)"
            flat = "yes" if s["flat"] else "no: a lower bound"
            lines.append(
                f"| {trace} | {label} | {_pct(s['plateau'])} | {flat} | {_pct(s['onset'])} | {paper} |"
            )
    return lines


def _table_points(points: list[Json], trace: str) -> list[str]:
    lines = [
        "| scheduler | c | offered load | utilized | unused | lost | mean wait (s) | mean response (s) | "
        "mean BSLD | migrations (successful) | wall (s) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for label in LABELS:
        for p in curve(points, trace, label):
            cap, s, mig = p["capacity"], p["summary"], p["migrations"]
            moved = "-" if mig is None else f"{mig['attempts']} ({mig['successes']})"
            lines.append(
                f"| {label} | {p['c']:g} | {p['offered_load']:.3f} | {cap['utilized']:.3f} | "
                f"{cap['unused']:.3f} | {cap['lost']:.3f} | {s['mean_wait']:,.0f} | "
                f"{s['mean_response']:,.0f} | {s['mean_bsld']:,.1f} | {moved} | {p['wall_s']:.1f} |"
            )
    return lines


def _table_fig8(points: list[Json], traces: list[str]) -> list[str]:
    lines = ["| trace | scheduler | utilized | unused | lost |", "|---|---|---:|---:|---:|"]
    for trace in traces:
        for label in LABELS:
            p = _at(points, trace, label, FIG8_C)
            if p is not None:
                cap = p["capacity"]
                lines.append(
                    f"| {trace} | {label} | {cap['utilized']:.3f} | {cap['unused']:.3f} | {cap['lost']:.3f} |"
                )
    return lines


def report(points: list[Json], setups: list[Setup], command: str, notes: list[str]) -> Json:
    traces = [s.name for s in setups]
    sat = saturations(points, traces)
    return {
        "command": command,
        "setups": [s.key() for s in setups],
        "notes": notes,
        "saturation": sat,
        "claims": claims(points, traces),
        "migration_rates": [migration_rates(points, t) for t in traces],
        "capacity_checked_runs": len(points),
        "points": points,
    }


def markdown(data: Json, intro: str) -> str:
    points, traces = data["points"], [Path(s["trace"]).name for s in data["setups"]]
    out = [intro, "", "### Saturation, beside the paper's", ""]
    out += _table_saturation(points, traces)
    out += [
        "",
        f"Highest utilization reached: past saturation, more work only lengthens the queue and the "
        f"utilization creeps towards what the scheduler packs with a queue that never empties (the vertical "
        f"part of the paper's curves); 'flattened' says whether the sweep's last two points are within a "
        f"point. The onset is the utilization of the first c whose mean bounded slowdown ({BSLD_THRESHOLD:g} "
        f"s) exceeds 100. The paper read its figures by eye.",
        "",
        "### The paper's findings, checked",
        "",
        "| finding | verdict | figures |",
        "|---|---|---|",
    ]
    out += [f"| {c['claim']} | {c['verdict']} | {c['figures']} |" for c in data["claims"]]
    out += [
        "",
        f"- Utilized + unused + lost capacity = 1 was checked on every one of the "
        f"{data['capacity_checked_runs']} runs (the engine stops a run where it does not hold).",
        *(f"- Migration, {rate}." for rate in data["migration_rates"]),
        "",
        "### Why the figures differ from the paper's",
        "",
        *(f"- {note}" for note in data["notes"]),
        "",
        f"### Capacity at c = {FIG8_C:g} (the paper's Fig. 8)",
        "",
    ]
    out += _table_fig8(points, traces)
    for trace in traces:
        out += ["", f"### Every point: {trace}", ""]
        out += _table_points(points, trace)
    return "\n".join(out) + "\n"


def plot(points: list[Json], traces: list[str], directory: Path) -> list[Path]:
    """Per trace: mean wait, mean bounded slowdown and migrations against utilization; and the capacity split
    of every scheduler on every trace at c = 1 (Fig. 8) and 1.4. The paths written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    styles = {label: ("--" if label.startswith("flat") else "-") for label in LABELS}
    colours = {label: f"C{i}" for i, label in enumerate(LABELS)}  # one colour per scheduler in every panel
    for trace in traces:
        fig, (wait, bsld, moves) = plt.subplots(1, 3, figsize=(16, 4.5))
        for label in LABELS:
            line = curve(points, trace, label)
            utils = [p["capacity"]["utilized"] for p in line]
            colour, dash = colours[label], styles[label]
            waits = [p["summary"]["mean_wait"] / 3600 for p in line]
            wait.plot(utils, waits, dash, color=colour, marker=".", label=label)
            bsld.plot(
                utils, [p["summary"]["mean_bsld"] for p in line], dash, color=colour, marker=".", label=label
            )
            if label in ("Migration", "B+M"):
                for key, mark, kind in (("attempts", "o", ":"), ("successes", "x", "-")):
                    counts = [p["migrations"][key] for p in line]
                    moves.plot(utils, counts, kind, color=colour, marker=mark, label=f"{label}: {key}")
        for axis, name in ((wait, "mean wait (h)"), (bsld, f"mean bounded slowdown ({BSLD_THRESHOLD:g} s)")):
            axis.set_yscale("log")
            axis.set_ylabel(name)
        moves.set_ylabel("migrations over the run")
        for axis in (wait, bsld, moves):
            axis.set_xlabel("utilization (capacity utilized)")
            axis.grid(alpha=0.3)
            axis.legend(fontsize=7)
        fig.suptitle(f"{trace} on a 4x4x8 torus and a flat 128-node machine, runtimes x c")
        fig.tight_layout()
        path = directory / f"{Path(trace).stem.replace('.', '_')}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    loads = (FIG8_C, PAPER_TOP_C)
    size = (6 * len(traces), 4.5 * len(loads))
    fig, axes = plt.subplots(len(loads), len(traces), figsize=size, squeeze=False)
    for row, c in enumerate(loads):
        for axis, trace in zip(axes[row], traces, strict=True):
            found = [(label, p) for label in LABELS if (p := _at(points, trace, label, c)) is not None]
            bottom = [0.0] * len(found)
            for part, colour in (("utilized", "tab:green"), ("unused", "tab:blue"), ("lost", "tab:red")):
                values = [p["capacity"][part] for _, p in found]
                axis.bar([label for label, _ in found], values, bottom=bottom, color=colour, label=part)
                bottom = [b + v for b, v in zip(bottom, values, strict=True)]
            axis.set_title(f"{trace}, c = {c:g}")
            axis.set_ylabel("share of capacity")
            axis.tick_params(axis="x", labelrotation=30)
            axis.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    path = directory / "capacity.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)
    return written
