"""Fixtures of the offline deployment checks: the chart rendered with each values file, the
Kustomize overlays built by ``kubectl kustomize``, and the tools they need.

There is no cluster: these render, validate and scan what ``helm install`` and
``kubectl apply -k`` would apply. A missing tool fails the tests, naming how to install it
(``make deploy-tools``), rather than skipping them.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
CHART = DEPLOY / "helm" / "highwater"
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
OVERLAYS = ("dev", "prod")
#: The oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and the newest schema.
KUBERNETES_VERSIONS = ("1.27.0", "1.37.0")
CHECKOV = REPO / ".venv" / "tools" / "checkov" / "bin" / "checkov"


def _load_render() -> ModuleType:
    spec = importlib.util.spec_from_file_location("deploy_render", DEPLOY / "render.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["deploy_render"] = module
    spec.loader.exec_module(module)
    return module


render = _load_render()


def tool(name: str, path: Path | None = None) -> str:
    """The path of a command-line tool the checks need: ``path`` if given and there, else
    the one on PATH, else the project environment's; a failure naming the fix if absent."""
    if path is not None and path.exists():
        return str(path)
    found = shutil.which(name) or shutil.which(name, path=str(REPO / ".venv" / "bin"))
    if found is None:
        pytest.fail(f"{name} is not installed: run `make deploy-tools`", pytrace=False)
    return found


def by_kind(documents: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    """The documents of one kind, by name."""
    return {d["metadata"]["name"]: d for d in documents if d["kind"] == kind}


@pytest.fixture(scope="session")
def chart_renders() -> dict[str, dict[str, str]]:
    """Each ci/*-values.yaml (by file stem) rendered as release ``hw`` in ``streams``."""
    return {
        path.name.removesuffix("-values.yaml"): render.render(
            render.load_values([path]), name="hw", namespace="streams"
        )
        for path in CI_VALUES
    }


@pytest.fixture(scope="session")
def overlay_builds() -> dict[str, str]:
    """``kubectl kustomize`` of each overlay."""
    kubectl = tool("kubectl")
    builds = {}
    for overlay in OVERLAYS:
        result = subprocess.run(
            [kubectl, "kustomize", str(DEPLOY / "kustomize" / "overlays" / overlay)],
            capture_output=True,
            text=True,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        builds[overlay] = result.stdout
    return builds


@pytest.fixture(scope="session")
def overlay_documents(overlay_builds: dict[str, str]) -> dict[str, list[dict[str, Any]]]:
    return {
        overlay: [d for d in yaml.safe_load_all(text) if d]
        for overlay, text in overlay_builds.items()
    }
