"""skaffold.yaml and the Dockerfile, read as data (there is no skaffold binary or Docker
engine here): the image skaffold builds is the one the chart and the overlays run, and the
paths it deploys exist and render."""

from __future__ import annotations

from typing import Any

import yaml
from conftest import CHART, DEPLOY, REPO, by_kind, render

SKAFFOLD: dict[str, Any] = yaml.safe_load((REPO / "skaffold.yaml").read_text())


def test_skaffold_builds_the_image_from_the_dockerfile() -> None:
    (artifact,) = SKAFFOLD["build"]["artifacts"]
    assert artifact["image"] == "highwater"
    assert artifact["docker"]["dockerfile"] == "Dockerfile"
    chart_values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert chart_values["image"]["repository"] == artifact["image"]
    statefulsets = by_kind(
        render.documents({"base": (DEPLOY / "kustomize" / "base" / "highwater.yaml").read_text()}),
        "StatefulSet",
    )
    for statefulset in statefulsets.values():
        image = statefulset["spec"]["template"]["spec"]["containers"][0]["image"]
        assert image.split(":")[0] == artifact["image"]


def test_skaffold_deploys_the_chart_with_values_that_render() -> None:
    (release,) = SKAFFOLD["deploy"]["helm"]["releases"]
    assert (REPO / release["chartPath"]).resolve() == CHART
    values = render.load_values([REPO / path for path in release["valuesFiles"]])
    overrides = {"image": {"repository": "highwater", "tag": "abc1234"}}
    rendered = render.render(render.merge_values(values, overrides), namespace=release["namespace"])
    statefulsets = by_kind(render.documents(rendered), "StatefulSet")
    assert {
        s["spec"]["template"]["spec"]["containers"][0]["image"] for s in statefulsets.values()
    } == {"highwater:abc1234"}
    assert set(release["setValueTemplates"]) == {
        "image.repository",
        "image.tag",
        "image.pullPolicy",
    }
    forwarded = SKAFFOLD["portForward"][0]
    assert forwarded["resourceName"] in by_kind(render.documents(rendered), "Service")


def test_each_overlay_has_a_profile() -> None:
    profiles = {p["name"]: p for p in SKAFFOLD["profiles"]}
    assert set(profiles) == {"kustomize-dev", "kustomize-prod"}
    for overlay in ("dev", "prod"):
        profile = profiles[f"kustomize-{overlay}"]
        (path,) = profile["manifests"]["kustomize"]["paths"]
        assert (REPO / path).resolve() == DEPLOY / "kustomize" / "overlays" / overlay
        assert {"op": "remove", "path": "/deploy/helm"} in profile["patches"]
        assert "kubectl" in profile["deploy"]


def test_the_dockerfile_builds_in_stages_and_runs_highwater_unprivileged() -> None:
    lines = [
        line.strip()
        for line in (REPO / "Dockerfile").read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    stages = [line for line in lines if line.startswith("FROM ")]
    assert len(stages) == 2
    assert all("-slim" in stage for stage in stages)
    assert any(line.startswith("COPY --from=build ") for line in lines)
    (user,) = [line for line in lines if line.startswith("USER ")]
    assert user.split()[1].split(":")[0] not in ("root", "0")
    assert lines[-2:] == ['ENTRYPOINT ["highwater"]', 'CMD ["--help"]']
    ignored = (REPO / ".dockerignore").read_text().splitlines()
    assert "*" in ignored and "!services/" in ignored
