"""Every manifest the chart renders and every Kustomize overlay builds, validated against
the Kubernetes OpenAPI schemas in strict mode (unknown fields fail), and the overlays'
shapes: dev small, prod spread and guarded by PodDisruptionBudgets."""

from __future__ import annotations

import copy
from typing import Any

import kubernetes_validate
import pytest
from conftest import KUBERNETES_VERSIONS, by_kind, render


def validate(document: dict[str, Any], version: str) -> None:
    """Strictly; cert-manager's Issuers and Certificates are custom resources without an
    offline schema: test_deploy_security.py checks their fields."""
    if document["apiVersion"].startswith("cert-manager.io/"):
        return
    kubernetes_validate.validate(document, version, strict=True)


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_chart_manifest_is_valid_kubernetes(
    chart_renders: dict[str, dict[str, str]], version: str
) -> None:
    count = 0
    for rendered in chart_renders.values():
        for document in render.documents(rendered):
            validate(document, version)
            count += 1
    assert count >= 3 * 13


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_overlay_manifest_is_valid_kubernetes(
    overlay_documents: dict[str, list[dict[str, Any]]], version: str
) -> None:
    for documents in overlay_documents.values():
        assert documents
        for document in documents:
            validate(document, version)


def test_strict_validation_rejects_an_unknown_field(
    chart_renders: dict[str, dict[str, str]],
) -> None:
    statefulsets = by_kind(render.documents(chart_renders["default"]), "StatefulSet")
    broken = copy.deepcopy(statefulsets["hw-highwater-broker"])
    broken["spec"]["template"]["spec"]["containers"][0]["livenessProbes"] = {}
    with pytest.raises(kubernetes_validate.ValidationError, match="livenessProbes"):
        validate(broken, KUBERNETES_VERSIONS[-1])


def replicas(documents: list[dict[str, Any]]) -> dict[str, int]:
    return {n: s["spec"]["replicas"] for n, s in by_kind(documents, "StatefulSet").items()}


def claim_size(statefulset: dict[str, Any]) -> str:
    (claim,) = statefulset["spec"]["volumeClaimTemplates"]
    return str(claim["spec"]["resources"]["requests"]["storage"])


def test_the_dev_overlay_is_one_of_each_with_small_volumes(
    overlay_documents: dict[str, list[dict[str, Any]]],
) -> None:
    documents = overlay_documents["dev"]
    assert replicas(documents) == {
        "highwater-controller": 1,
        "highwater-broker": 1,
        "highwater-coordinator": 1,
    }
    assert {d["metadata"]["namespace"] for d in documents} == {"highwater-dev"}
    config = by_kind(documents, "ConfigMap")["highwater-config"]["data"]
    assert config["CONTROLLER_REPLICAS"] == "1"
    # One broker: one replica and a min ISR of 1, for topics and __consumer_offsets.
    server = by_kind(documents, "ConfigMap")["highwater-server-config"]["data"]
    for role in ("controller", "broker", "coordinator"):
        properties = server[f"{role}.properties"].splitlines()
        for line in (
            "default.replication.factor=1",
            "min.insync.replicas=1",
            "offsets.topic.replication.factor=1",
        ):
            assert line in properties, (role, properties)
    statefulsets = by_kind(documents, "StatefulSet")
    assert claim_size(statefulsets["highwater-controller"]) == "256Mi"
    assert claim_size(statefulsets["highwater-broker"]) == "1Gi"
    assert not by_kind(documents, "PodDisruptionBudget")
    for document in documents:
        assert document["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "kustomize"


def test_the_prod_overlay_spreads_pods_and_guards_them_with_budgets(
    overlay_documents: dict[str, list[dict[str, Any]]],
) -> None:
    documents = overlay_documents["prod"]
    counts = replicas(documents)
    assert counts["highwater-controller"] == 3
    assert counts["highwater-broker"] >= 3
    config = by_kind(documents, "ConfigMap")["highwater-config"]["data"]
    assert config["CONTROLLER_REPLICAS"] == "3"
    budgets = by_kind(documents, "PodDisruptionBudget")
    statefulsets = by_kind(documents, "StatefulSet")
    assert set(budgets) == set(statefulsets)
    for name, budget in budgets.items():
        assert budget["spec"]["maxUnavailable"] == 1
        assert (
            budget["spec"]["selector"]["matchLabels"]
            == statefulsets[name]["spec"]["selector"]["matchLabels"]
        )
    for name in ("highwater-controller", "highwater-broker"):
        pod = statefulsets[name]["spec"]["template"]["spec"]
        (term,) = pod["affinity"]["podAntiAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]
        assert term["topologyKey"] == "kubernetes.io/hostname"
        assert (
            term["labelSelector"]["matchLabels"]
            == statefulsets[name]["spec"]["selector"]["matchLabels"]
        )
        assert pod["topologySpreadConstraints"][0]["topologyKey"] == "topology.kubernetes.io/zone"
    assert claim_size(statefulsets["highwater-broker"]) == "100Gi"
