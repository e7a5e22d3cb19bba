"""The timeline plot and the campaign report from hand-made histories."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest
from highwater.chaos.history import Op
from highwater.chaos.report import (
    campaign_totals,
    fault_windows,
    markdown_report,
    throughput,
    timeline_svg,
)
from highwater.chaos.schedule import parse_seeds


def history() -> list[Op]:
    ops: list[Op] = []
    for i in range(10):
        ops.append(
            {
                "t": i * 0.5,
                "kind": "write",
                "process": "producer-0",
                "status": "invoke",
                "value": f"p0-{i}",
                "partition": 0,
            }
        )
        ops.append(
            {
                "t": i * 0.5 + 0.1,
                "kind": "write",
                "process": "producer-0",
                "status": "ok",
                "value": f"p0-{i}",
                "partition": 0,
                "offset": i,
            }
        )
    ops.append(
        {
            "t": 1.0,
            "kind": "fault",
            "process": "nemesis",
            "fault": "kill",
            "target": ["broker-100"],
            "detail": "pid 1",
        }
    )
    ops.append(
        {"t": 3.0, "kind": "heal", "process": "nemesis", "fault": "kill", "target": ["broker-100"]}
    )
    ops.append(
        {
            "t": 4.0,
            "kind": "fault",
            "process": "nemesis",
            "fault": "pause",
            "target": ["broker-101"],
            "detail": "pid 2",
        }
    )
    return ops


def test_throughput_counts_acknowledged_writes_per_second() -> None:
    assert throughput(history()) == [(0.0, 2), (1.0, 2), (2.0, 2), (3.0, 2), (4.0, 2)]


def test_fault_windows_pair_faults_with_heals_and_leave_unhealed_ones_open_to_the_end() -> None:
    assert fault_windows(history()) == [
        (1.0, 3.0, "kill", "broker-100"),
        (4.0, 4.6, "pause", "broker-101"),
    ]


def test_the_timeline_is_an_svg_with_a_window_per_fault_and_the_throughput_line() -> None:
    root = ET.fromstring(timeline_svg(history(), "seed 1 <test>"))
    ns = "{http://www.w3.org/2000/svg}"
    titles = [t.text for t in root.iter(f"{ns}title")]
    assert titles == ["kill broker-100 1.0-3.0s", "pause broker-101 4.0-4.6s"]
    assert len(list(root.iter(f"{ns}polyline"))) == 1


def test_the_report_has_a_row_and_a_plot_per_run() -> None:
    summary = {
        "seed": 4,
        "duration_s": 60,
        "faults_injected": 2,
        "writes_acknowledged": 10,
        "writes_lost": 0,
        "duplicates": 0,
        "anomalies": [],
        "longest_unavailability_s": 1.5,
    }
    text = markdown_report([(summary, "seed-4/timeline.svg")])
    assert "| 4 | 60 | 2 | 10 | 0 | 0 | 0 | 1.5 |" in text
    assert "![timeline](seed-4/timeline.svg)" in text


def test_the_report_totals_its_runs_and_the_longest_unavailability_per_fault_kind() -> None:
    def summary(seed: int, lost: int, by_fault: dict[str, float]) -> dict[str, object]:
        return {
            "seed": seed,
            "duration_s": 120,
            "faults_injected": 3,
            "writes_acknowledged": 100,
            "writes_lost": lost,
            "duplicates": 0,
            "anomalies": [{"kind": "lost-write"}] * lost,
            "longest_unavailability_s": max(by_fault.values()),
            "unavailability_by_fault_s": by_fault,
        }

    runs = [summary(1, 0, {"kill": 2.5, "pause": 9.0}), summary(2, 2, {"kill": 4.0, "disk": 1.0})]
    totals = campaign_totals(runs)
    assert totals == {
        "schedules": 2,
        "faults_injected": 6,
        "writes_acknowledged": 200,
        "writes_lost": 2,
        "duplicates": 0,
        "anomalies": 2,
        "seeds_with_anomalies": [2],
        "longest_unavailability_s": 9.0,
        "unavailability_by_fault_s": {"disk": 1.0, "kill": 4.0, "pause": 9.0},
    }
    named = [(run, f"seed-{run['seed']}/timeline.svg") for run in runs]
    text = markdown_report(named)
    assert "| 2 | 6 | 200 | 2 | 0 | 2 | 9.0 | disk 1.0, kill 4.0, pause 9.0 |" in text
    assert "| 2 | 120 | 3 | 100 | 2 | 0 | 2 | 4.0 | kill 4.0, disk 1.0 |" in text
    assert "Not run" not in text
    assert "did not finish): seeds 3, 5." in markdown_report(named, not_started=[3, 5])


def test_campaign_seeds_are_numbers_and_inclusive_ranges() -> None:
    assert parse_seeds("1-3,7, 10-10") == [1, 2, 3, 7, 10]
    assert parse_seeds("1-200") == list(range(1, 201))
    for bad in ("", "a", "5-2", "1-b"):
        with pytest.raises(ValueError):
            parse_seeds(bad)
