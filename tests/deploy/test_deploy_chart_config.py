"""The chart's server configuration and passthroughs: the properties file each role starts
with (safe defaults for three brokers, ``config``/``extraConfig``), extra environment,
volumes, containers, labels, update strategy, image registry, PodDisruptionBudget and
existing claims, the dashboard, each rendered and validated strictly; bad values fail at
render time naming the key."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from conftest import CHART, KUBERNETES_VERSIONS, REPO, by_kind, render
from highwater.config.server import load_server_config

ROLES = ("controller", "broker", "coordinator")


def documents(values: dict[str, Any]) -> list[dict[str, Any]]:
    return render.documents(render.render(values, name="hw", namespace="streams"))


def properties(docs: list[dict[str, Any]], role: str) -> str:
    return str(
        by_kind(docs, "ConfigMap")["hw-highwater-server-config"]["data"][f"{role}.properties"]
    )


def pod(docs: list[dict[str, Any]], role: str) -> dict[str, Any]:
    return dict(by_kind(docs, "StatefulSet")[f"hw-highwater-{role}"]["spec"]["template"])


def validate_all(docs: list[dict[str, Any]]) -> None:
    for document in docs:
        if document["apiVersion"].startswith("monitoring.coreos.com/"):
            continue  # a CRD: its rules are checked by promtool (test_deploy_alerts.py)
        for version in KUBERNETES_VERSIONS:
            kubernetes_validate.validate(document, version, strict=True)


def test_the_default_release_is_safe_for_three_brokers(
    chart_renders: dict[str, dict[str, str]], tmp_path: Path
) -> None:
    docs = render.documents(chart_renders["default"])
    for role in ROLES:
        text = properties(docs, role)
        lines = text.splitlines()
        for line in (
            "default.replication.factor=3",
            "min.insync.replicas=2",
            "offsets.topic.replication.factor=3",
        ):
            assert line in lines, (role, text)
        # The file is what the role reads at start: every key is one it knows.
        path = tmp_path / f"{role}.properties"
        path.write_text(text)
        config = load_server_config(path)
        assert config.get("min.insync.replicas") == 2
        spec = pod(docs, role)["spec"]
        (main,) = spec["containers"]
        assert {"name": "server-config", "mountPath": "/etc/highwater", "readOnly": True} in (
            main["volumeMounts"]
        )
        (volume,) = [v for v in spec["volumes"] if v["name"] == "server-config"]
        assert volume["configMap"]["items"] == [
            {"key": f"{role}.properties", "path": f"{role}.properties"}
        ]
    assert "replica.lag.time.max.ms=30000" in properties(docs, "broker").splitlines()
    assert "group.initial.rebalance.delay.ms=3000" in properties(docs, "coordinator").splitlines()


@pytest.mark.parametrize(
    "values", sorted((CHART / "ci").glob("*-values.yaml")), ids=lambda p: p.stem
)
def test_every_ci_release_renders_properties_the_roles_accept(values: Path, tmp_path: Path) -> None:
    docs = render.documents(render.render(render.load_values([values]), name="hw"))
    brokers = by_kind(docs, "StatefulSet")["hw-highwater-broker"]["spec"]["replicas"]
    for role in ROLES:
        path = tmp_path / f"{role}.properties"
        path.write_text(
            str(
                by_kind(docs, "ConfigMap")["hw-highwater-server-config"]["data"][
                    f"{role}.properties"
                ]
            )
        )
        config = load_server_config(path)
        factor = config.get("default.replication.factor")
        assert factor == min(3, brokers)
        assert config.get("min.insync.replicas") == (2 if factor >= 3 else 1)
        assert config.get("offsets.topic.replication.factor") <= brokers


def test_config_and_extra_config_per_role(tmp_path: Path) -> None:
    docs = documents(
        {
            "config": {"num.partitions": 6, "log.retention.hours": 72,
                       "log.cleanup.policy": ["compact", "delete"],
                       "metadata.log.max.record.bytes.between.snapshots": 52428800},
            "controller": {"config": {"num.partitions": 12}},
            "broker": {"config": {"broker.rack": "zone-a"}, "extraConfig": "log.roll.hours=24\n"},
        }
    )  # fmt: skip
    controller = properties(docs, "controller").splitlines()
    assert "num.partitions=12" in controller  # the role's config over the shared one
    assert "log.retention.hours=72" in controller
    assert "log.cleanup.policy=compact,delete" in controller
    # Large numbers keep their digits (YAML numbers are floats to Helm).
    assert "metadata.log.max.record.bytes.between.snapshots=52428800" in controller
    broker = properties(docs, "broker").splitlines()
    assert "num.partitions=6" in broker and "broker.rack=zone-a" in broker
    assert broker[-1] == "log.roll.hours=24"
    for role in ROLES:
        path = tmp_path / f"{role}.properties"
        path.write_text(properties(docs, role))
        load_server_config(path)
    validate_all(docs)


def test_passthroughs_reach_the_pods() -> None:
    extras = {
        "extraEnvVars": [{"name": "JAVA_LIKE", "value": "yes"}],
        "extraEnvVarsCM": "more-env",
        "extraEnvVarsSecret": "secret-env",
        "extraVolumes": [{"name": "certs", "secret": {"secretName": "tls"}}],
        "extraVolumeMounts": [{"name": "certs", "mountPath": "/certs", "readOnly": True}],
        "sidecars": [
            {"name": "shipper", "image": "busybox:1.36", "command": ["sleep", "infinity"],
             "resources": {"limits": {"cpu": "100m", "memory": "64Mi"}}}
        ],
        "initContainers": [{"name": "wait", "image": "busybox:1.36", "command": ["true"]}],
        "podLabels": {"team": "streams"},
        "podAnnotations": {"example.com/owner": "streams"},
        "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": 1}},
        "pdb": {"create": True, "maxUnavailable": 1, "minAvailable": 2},
    }  # fmt: skip
    docs = documents(
        {
            "global": {"imageRegistry": "mirror.example.com:5000/hub"},
            "image": {"registry": "registry.example.com"},
            "broker": {**extras, "rack": {"enabled": True, "topologyKey": "zone"}},
            "controller": extras,
            "coordinator": extras,
        }
    )
    for role in ROLES:
        statefulset = by_kind(docs, "StatefulSet")[f"hw-highwater-{role}"]
        template = statefulset["spec"]["template"]
        spec = template["spec"]
        assert statefulset["spec"]["updateStrategy"] == {
            "type": "RollingUpdate",
            "rollingUpdate": {"partition": 1},
        }
        assert template["metadata"]["labels"]["team"] == "streams"
        assert template["metadata"]["annotations"]["example.com/owner"] == "streams"
        main, sidecar = spec["containers"]
        assert main["name"] == role and sidecar["name"] == "shipper"
        # global.imageRegistry wins over image.registry.
        assert main["image"] == "mirror.example.com:5000/hub/highwater:0.1.0"
        assert {"name": "JAVA_LIKE", "value": "yes"} in main["env"]
        assert main["envFrom"][1:] == [
            {"configMapRef": {"name": "more-env"}},
            {"secretRef": {"name": "secret-env"}},
        ]
        assert {"name": "certs", "mountPath": "/certs", "readOnly": True} in main["volumeMounts"]
        assert {"name": "certs", "secret": {"secretName": "tls"}} in spec["volumes"]
        init = [c["name"] for c in spec["initContainers"]]
        assert init == (["wait", "rack"] if role == "broker" else ["wait"])
        budget = by_kind(docs, "PodDisruptionBudget")[f"hw-highwater-{role}"]["spec"]
        assert budget["minAvailable"] == 2 and "maxUnavailable" not in budget
    plain = documents({"image": {"registry": "registry.example.com/streaming"}})
    main = pod(plain, "broker")["spec"]["containers"][0]
    assert main["image"] == "registry.example.com/streaming/highwater:0.1.0"
    validate_all(docs)


def test_an_existing_claim_replaces_the_claim_template() -> None:
    docs = documents(
        {"broker": {"replicaCount": 1, "persistence": {"enabled": True, "size": "1Gi",
                                                       "existingClaim": "broker-data"}}}
    )  # fmt: skip
    statefulset = by_kind(docs, "StatefulSet")["hw-highwater-broker"]
    assert "volumeClaimTemplates" not in statefulset["spec"]
    volumes = statefulset["spec"]["template"]["spec"]["volumes"]
    assert {"name": "data", "persistentVolumeClaim": {"claimName": "broker-data"}} in volumes
    validate_all(docs)


def test_the_dashboard_is_a_labelled_config_map_on_exported_metrics() -> None:
    docs = documents({"metrics": {"grafanaDashboard": {"enabled": True}}})
    dashboard = by_kind(docs, "ConfigMap")["hw-highwater-dashboard"]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    board = json.loads(dashboard["data"]["highwater.json"])
    expressions = [t["expr"] for panel in board["panels"] for t in panel["targets"]]
    assert len(expressions) >= 10
    assert_exported(" ".join(expressions))
    validate_all(docs)
    assert not by_kind(documents({}), "PrometheusRule")


_SUFFIXES = ("_seconds_bucket", "_seconds_count", "_seconds_sum", "_bytes_total", "_total")


def exported_metrics() -> set[str]:
    """The Prometheus base names of every metric the services create (dots as underscores)."""
    names: set[str] = set()
    for path in (REPO / "services" / "highwater").rglob("*.py"):
        for name in re.findall(r'"(highwater\.[a-z_.]+)"', path.read_text()):
            names.add(name.replace(".", "_"))
    return names


def assert_exported(promql: str) -> None:
    """Every ``highwater_*`` metric named in ``promql`` is one the services export."""
    exported = exported_metrics()
    used = set(re.findall(r"\bhighwater_[a-z_]+", promql))
    assert used
    for name in used:
        base = next((name.removesuffix(s) for s in _SUFFIXES if name.endswith(s)), name)
        assert base in exported, name


BAD_VALUES = [
    ({"config": {"min.insync.replicas": 4}}, "min.insync.replicas"),
    ({"config": {"default.replication.factor": 5}}, "default.replication.factor"),
    ({"controller": {"config": {"offsets.topic.replication.factor": 4}}},
     "offsets.topic.replication.factor"),
    ({"config": {"Num.Partitions": 3}}, "Num.Partitions"),
    ({"config": {"num.partitions": {"nested": 1}}}, "/config/num.partitions"),
    ({"broker": {"extraConfig": 3}}, "/broker/extraConfig"),
    ({"broker": {"extraEnv": []}}, "extraEnv"),
    ({"broker": {"extraVolumeMounts": [{"name": "x"}]}}, "/broker/extraVolumeMounts/0"),
    ({"coordinator": {"sidecars": [{"image": "busybox"}]}}, "/coordinator/sidecars/0"),
    ({"controller": {"updateStrategy": {"type": "Sometimes"}}}, "/controller/updateStrategy/type"),
    ({"broker": {"pdb": {"minAvailable": 0}}}, "/broker/pdb/minAvailable"),
    ({"broker": {"podLabels": {"team": 3}}}, "/broker/podLabels/team"),
    ({"image": {"registry": "Not A Registry"}}, "/image/registry"),
    ({"broker": {"persistence": {"enabled": True, "size": "1Gi", "existingClaim": "one"}}},
     "broker.persistence.existingClaim"),
    ({"metrics": {"prometheusRule": {"enabled": True, "disk": {"usedRatio": 2}}}},
     "/metrics/prometheusRule/disk/usedRatio"),
    ({"metrics": {"grafanaDashboard": {"enabled": True, "label": {}}}}, "label"),
]  # fmt: skip


@pytest.mark.parametrize(("values", "key"), BAD_VALUES, ids=[key for _, key in BAD_VALUES])
def test_bad_values_fail_at_render_time_naming_the_key(values: dict[str, Any], key: str) -> None:
    with pytest.raises(render.RenderError, match=re.escape(key)):
        render.render(values)
