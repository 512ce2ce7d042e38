"""The bar chart of ``storm bench scenarios``: each policy's turnaround and mean response over gang's.

One panel per metric, one group of bars per scenario, one bar per policy (its best run), and the paper's
ratio for the same policy and scenario as a black tick across the bar, so that a reader sees at once where
we match the paper and where we do not. Drawing needs matplotlib (``pip install 'storm[bench]'``); the
figures it draws come from ``bars``, which needs nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

from storm.tools.scenarios import paper_normalised, parse_policy

METRICS = (("turnaround", "turnaround / gang's"), ("mean_response", "mean response / gang's"))


class Bar(NamedTuple):
    scenario: str
    policy: str
    ours: float
    paper: float | None


class ChartUnavailable(RuntimeError):
    """matplotlib is not installed."""


def bars(summary: dict[str, Any], metric: str) -> list[Bar]:
    """Per scenario with a gang run, each policy's best ``metric`` over gang's, ours and the paper's."""
    out = []
    for scenario, rows in summary.items():
        if "gang" not in rows:
            continue
        gang = rows["gang"]["best"][metric]
        paper_gang = paper_normalised(scenario, "gang")
        for policy, row in rows.items():
            paper = paper_normalised(scenario, parse_policy(policy)[0])
            ratio = None
            if paper is not None and paper_gang is not None:
                # (completion times, turnaround, mean response)
                ours, theirs = (
                    (paper[1], paper_gang[1]) if metric == "turnaround" else (paper[2], paper_gang[2])
                )
                ratio = ours / theirs
            out.append(Bar(scenario, policy, row["best"][metric] / gang, ratio))
    return out


def draw(summary: dict[str, Any], path: Path, title: str) -> None:
    """Write the chart as a PNG; ChartUnavailable if matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display on a cluster's login node or in CI
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ChartUnavailable("the chart needs matplotlib: pip install 'storm[bench]'") from exc
    figure, axes = plt.subplots(1, len(METRICS), figsize=(12, 4.5), squeeze=False)
    for axis, (metric, label) in zip(axes[0], METRICS, strict=True):
        data = bars(summary, metric)
        scenarios = list(dict.fromkeys(b.scenario for b in data))
        policies = list(dict.fromkeys(b.policy for b in data))
        width = 0.8 / max(1, len(policies))
        paper_label: str | None = "paper"
        for i, policy in enumerate(policies):
            mine = [b for b in data if b.policy == policy]
            xs = [scenarios.index(b.scenario) + (i - (len(policies) - 1) / 2) * width for b in mine]
            axis.bar(xs, [b.ours for b in mine], width, label=policy)
            ticks = [(x, b.paper) for x, b in zip(xs, mine, strict=True) if b.paper is not None]
            if ticks:
                axis.scatter(
                    [x for x, _ in ticks], [v for _, v in ticks], marker="_", s=300, color="black", zorder=3,
                    label=paper_label,
                )  # fmt: skip
                paper_label = None
        axis.axhline(1.0, color="grey", linewidth=0.8)
        axis.set_xticks(range(len(scenarios)), scenarios)
        axis.set_ylabel(label)
    axes[0][0].legend(fontsize="small")
    figure.suptitle(title)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
