"""Checkov, offline (``--skip-download``), over the chart's renders, the Kustomize overlays
and the Dockerfile: nothing fails but the checks deploy/checkov-skips.yaml lists with a
reason, and every listed check still fails somewhere (no stale skips).

Checkov runs once per session from its own virtual environment (.venv/tools/checkov,
made by ``make deploy-tools``): its dependency pins conflict with the project's.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import CHECKOV, DEPLOY, REPO, render, tool

SKIPS: dict[str, str] = yaml.safe_load((DEPLOY / "checkov-skips.yaml").read_text())


@pytest.fixture(scope="session")
def checkov_results(
    chart_renders: dict[str, dict[str, str]],
    overlay_builds: dict[str, str],
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, dict[str, Any]]:
    """One checkov run over every manifest and the Dockerfile: results by framework."""
    checkov = tool("checkov", CHECKOV)
    scanned = tmp_path_factory.mktemp("checkov")
    for name, rendered in chart_renders.items():
        (scanned / f"chart-{name}.yaml").write_text(render.as_stream(rendered))
    for overlay, text in overlay_builds.items():
        (scanned / f"kustomize-{overlay}.yaml").write_text(text)
    shutil.copy(REPO / "Dockerfile", scanned / "Dockerfile")
    result = subprocess.run(
        [
            checkov,
            "--directory",
            str(scanned),
            "--framework",
            "kubernetes",
            "dockerfile",
            "--skip-download",
            "--output",
            "json",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert result.returncode in (0, 1), result.stderr
    reports = json.loads(result.stdout)
    reports = reports if isinstance(reports, list) else [reports]
    return {report["check_type"]: report for report in reports}


def failed(report: dict[str, Any]) -> list[dict[str, Any]]:
    return list(report["results"]["failed_checks"])


def test_checkov_scanned_the_manifests_and_the_dockerfile(
    checkov_results: dict[str, dict[str, Any]],
) -> None:
    assert set(checkov_results) == {"kubernetes", "dockerfile"}
    kubernetes = checkov_results["kubernetes"]["summary"]
    assert kubernetes["parsing_errors"] == 0
    assert kubernetes["resource_count"] >= 60
    assert kubernetes["passed"] > 1000
    assert checkov_results["dockerfile"]["summary"]["resource_count"] == 1


def test_the_dockerfile_passes_every_check(checkov_results: dict[str, dict[str, Any]]) -> None:
    report = checkov_results["dockerfile"]
    assert [f["check_id"] for f in failed(report)] == []
    assert report["summary"]["passed"] > 50


def test_nothing_fails_but_the_listed_skips(checkov_results: dict[str, dict[str, Any]]) -> None:
    unexpected = sorted(
        {
            f"{f['check_id']} {f['check_name']} ({f['file_path']}: {f['resource']})"
            for f in failed(checkov_results["kubernetes"])
            if f["check_id"] not in SKIPS
        }
    )
    assert unexpected == []


def test_every_listed_skip_has_a_reason_and_still_applies(
    checkov_results: dict[str, dict[str, Any]],
) -> None:
    for check, reason in SKIPS.items():
        assert isinstance(reason, str) and len(reason.split()) >= 8, check
    firing = {f["check_id"] for f in failed(checkov_results["kubernetes"])}
    assert set(SKIPS) <= firing, f"no longer failing, drop from the list: {set(SKIPS) - firing}"


def test_checks_skipped_in_the_chart_say_why(checkov_results: dict[str, dict[str, Any]]) -> None:
    skipped = checkov_results["kubernetes"]["results"].get("skipped_checks", [])
    assert skipped, "the helm test pod skips the probe checks by annotation"
    for check in skipped:
        assert check["check_id"] in ("CKV_K8S_8", "CKV_K8S_9"), check["check_id"]
        assert "test pod" in check["check_result"]["suppress_comment"]
        assert Path(check["file_path"]).name.startswith("chart-")
