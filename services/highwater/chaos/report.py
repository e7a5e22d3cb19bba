"""The timeline of a run as an SVG: acknowledged writes per second, with the fault windows
shaded and labelled; and the Markdown report of a set of runs.

The SVG is written by hand (a few rectangles and a polyline) so the harness needs no
plotting library.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from html import escape
from typing import Any

from highwater.chaos.checker import fault_windows
from highwater.chaos.history import Op

WIDTH, HEIGHT = 960, 320
LEFT, RIGHT, TOP, BOTTOM = 60, 20, 30, 60
COLOURS = {"kill": "#e45756", "pause": "#f2b134", "partition": "#4c78a8", "disk": "#72b7b2"}


def throughput(ops: Sequence[Op], bucket_s: float = 1.0) -> list[tuple[float, int]]:
    """(bucket start, writes acknowledged in it), from the first write to the last ack."""
    times = [float(op["t"]) for op in ops if op.get("kind") == "write" and op.get("status") == "ok"]
    starts = [float(op["t"]) for op in ops if op.get("kind") == "write"]
    if not starts:
        return []
    first, last = min(starts), max([*starts, *times])
    buckets = [0] * (int((last - first) / bucket_s) + 1)
    for t in times:
        buckets[int((t - first) / bucket_s)] += 1
    return [(first + i * bucket_s, n) for i, n in enumerate(buckets)]


def timeline_svg(ops: Sequence[Op], title: str) -> str:
    series = throughput(ops)
    windows = fault_windows(ops)
    t_end = max([t for t, _ in series] + [w[1] for w in windows] + [1.0])
    peak = max([n for _, n in series] + [1])
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(t: float) -> float:
        return LEFT + plot_w * t / t_end

    def y(n: float) -> float:
        return TOP + plot_h * (1 - n / peak)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'font-family="sans-serif" font-size="11">',
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
        f'<text x="{LEFT}" y="18" font-size="13">{escape(title)}</text>',
    ]
    for number, (start, end, kind, targets) in enumerate(windows):
        colour = COLOURS.get(kind, "#999")
        parts.append(
            f'<rect x="{x(start):.1f}" y="{TOP}" width="{max(x(end) - x(start), 1):.1f}" '
            f'height="{plot_h}" fill="{colour}" fill-opacity="0.25">'
            f"<title>{escape(kind)} {escape(targets)} {start:.1f}-{end:.1f}s</title></rect>"
        )
        parts.append(
            f'<text x="{x(start) + 2:.1f}" y="{TOP + 12 + 12 * (number % 3)}" fill="{colour}">'
            f"{escape(kind)} {escape(targets)}</text>"
        )
    if series:
        points = " ".join(f"{x(t):.1f},{y(n):.1f}" for t, n in series)
        parts.append(f'<polyline points="{points}" fill="none" stroke="#222" stroke-width="1.2"/>')
    parts.append(
        f'<line x1="{LEFT}" y1="{TOP + plot_h}" x2="{LEFT + plot_w}" y2="{TOP + plot_h}" '
        'stroke="#444"/>'
    )
    parts.append(f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{TOP + plot_h}" stroke="#444"/>')
    step = max(1, int(t_end / 10))
    for tick in range(0, int(t_end) + 1, step):
        parts.append(
            f'<text x="{x(tick):.1f}" y="{TOP + plot_h + 14}" text-anchor="middle">{tick}</text>'
        )
    parts.append(
        f'<text x="{LEFT + plot_w / 2}" y="{HEIGHT - 28}" text-anchor="middle">'
        "seconds since the run started</text>"
    )
    parts.append(f'<text x="{LEFT - 6}" y="{TOP + 4}" text-anchor="end">{peak}</text>')
    parts.append(f'<text x="{LEFT - 6}" y="{TOP + plot_h}" text-anchor="end">0</text>')
    parts.append(
        f'<text x="14" y="{TOP + plot_h / 2}" transform="rotate(-90 14 {TOP + plot_h / 2})" '
        'text-anchor="middle">acknowledged writes / s</text>'
    )
    legend_x = LEFT
    for kind, colour in COLOURS.items():
        parts.append(
            f'<rect x="{legend_x}" y="{HEIGHT - 16}" width="10" height="10" fill="{colour}" '
            'fill-opacity="0.5"/>'
        )
        parts.append(f'<text x="{legend_x + 14}" y="{HEIGHT - 7}">{kind}</text>')
        legend_x += 90
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def campaign_totals(summaries: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The totals of several runs' summaries: schedules run, faults injected, writes
    acknowledged, lost and duplicated, anomalies (and the seeds that had any), and per
    fault kind the longest unavailability of any run (summaries without the per-kind
    figures, from an older harness, count in the rest)."""
    by_fault: dict[str, float] = {}
    for summary in summaries:
        for fault, seconds in summary.get("unavailability_by_fault_s", {}).items():
            by_fault[fault] = max(by_fault.get(fault, 0.0), float(seconds))
    return {
        "schedules": len(summaries),
        "faults_injected": sum(int(s["faults_injected"]) for s in summaries),
        "writes_acknowledged": sum(int(s["writes_acknowledged"]) for s in summaries),
        "writes_lost": sum(int(s["writes_lost"]) for s in summaries),
        "duplicates": sum(int(s["duplicates"]) for s in summaries),
        "anomalies": sum(len(s["anomalies"]) for s in summaries),
        "seeds_with_anomalies": [s["seed"] for s in summaries if s["anomalies"]],
        "longest_unavailability_s": max(
            (float(s["longest_unavailability_s"]) for s in summaries), default=0.0
        ),
        "unavailability_by_fault_s": dict(sorted(by_fault.items())),
    }


def _by_fault(figures: dict[str, float]) -> str:
    return ", ".join(f"{fault} {seconds}" for fault, seconds in figures.items()) or "-"


def markdown_report(
    runs: Sequence[tuple[dict[str, Any], str]], *, not_started: Sequence[int] = ()
) -> str:
    """The report of several runs: (summary, timeline SVG file name) each; the totals
    first (:func:`campaign_totals`), and the seeds whose run did not start or finish."""
    totals = campaign_totals([summary for summary, _ in runs])
    lines = ["# Chaos report", ""]
    if not_started:
        lines += [
            "Not run (the cluster did not start, or the run did not finish): seeds "
            + ", ".join(str(seed) for seed in not_started)
            + ".",
            "",
        ]
    lines += [
        "| schedules | faults | acked writes | lost | duplicates | anomalies | "
        "longest unavailability s | by fault kind s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
        f"| {totals['schedules']} | {totals['faults_injected']} | "
        f"{totals['writes_acknowledged']} | {totals['writes_lost']} | {totals['duplicates']} | "
        f"{totals['anomalies']} | {totals['longest_unavailability_s']} | "
        f"{_by_fault(totals['unavailability_by_fault_s'])} |",
        "",
        "| seed | duration s | faults | acked writes | lost | duplicates | anomalies | "
        "longest unavailability s | by fault kind s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for summary, _ in runs:
        lines.append(
            f"| {summary['seed']} | {summary['duration_s']} | {summary['faults_injected']} | "
            f"{summary['writes_acknowledged']} | {summary['writes_lost']} | "
            f"{summary['duplicates']} | {len(summary['anomalies'])} | "
            f"{summary['longest_unavailability_s']} | "
            f"{_by_fault(summary.get('unavailability_by_fault_s', {}))} |"
        )
    for summary, svg in runs:
        lines += ["", f"## Seed {summary['seed']}", "", f"![timeline]({svg})", ""]
        lines += ["```json", json.dumps(summary, indent=2), "```"]
    return "\n".join(lines) + "\n"
