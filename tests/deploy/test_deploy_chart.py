"""The Helm chart, rendered offline with each ci/ values file: what it deploys, its lint,
and its schema rejecting bad values at render time with the key named."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
import yaml
from conftest import CHART, CI_VALUES, DEPLOY, by_kind, render
from highwater.broker.rolling import READY_SERVICE

STANDARD_LABELS = (
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/managed-by",
    "helm.sh/chart",
)


def documents(rendered: dict[str, str]) -> list[dict[str, Any]]:
    return render.documents(rendered)


def container(statefulset: dict[str, Any]) -> dict[str, Any]:
    containers = statefulset["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def test_the_ci_values_files_are_the_ones_expected() -> None:
    assert [p.name for p in CI_VALUES] == [
        "default-values.yaml",
        "dev-values.yaml",
        "prod-values.yaml",
    ]


@pytest.mark.parametrize("values", CI_VALUES, ids=lambda p: p.stem)
def test_the_chart_lints_clean_in_strict_mode(values: Any) -> None:
    assert render.lint(render.load_values([values])) == []


def test_every_resource_carries_the_standard_labels(
    chart_renders: dict[str, dict[str, str]],
) -> None:
    for name, rendered in chart_renders.items():
        for document in documents(rendered):
            labels = document["metadata"]["labels"]
            missing = [label for label in STANDARD_LABELS if label not in labels]
            assert not missing, (name, document["kind"], document["metadata"]["name"], missing)
            if document["kind"] == "StatefulSet":
                pod_labels = document["spec"]["template"]["metadata"]["labels"]
                assert all(label in pod_labels for label in STANDARD_LABELS)
                assert pod_labels["app.kubernetes.io/component"] in (
                    "controller",
                    "broker",
                    "coordinator",
                )


def test_the_default_release_deploys_three_roles_as_statefulsets(
    chart_renders: dict[str, dict[str, str]],
) -> None:
    docs = documents(chart_renders["default"])
    statefulsets = by_kind(docs, "StatefulSet")
    assert {n: s["spec"]["replicas"] for n, s in statefulsets.items()} == {
        "hw-highwater-controller": 3,
        "hw-highwater-broker": 3,
        "hw-highwater-coordinator": 2,
    }
    for name in ("hw-highwater-controller", "hw-highwater-broker"):
        claims = statefulsets[name]["spec"]["volumeClaimTemplates"]
        assert [c["metadata"]["name"] for c in claims] == ["data"]
        assert container(statefulsets[name])["volumeMounts"][0] == {
            "name": "data",
            "mountPath": "/var/lib/highwater",
        }
    broker_claim = statefulsets["hw-highwater-broker"]["spec"]["volumeClaimTemplates"][0]
    assert broker_claim["spec"]["resources"]["requests"]["storage"] == "20Gi"
    assert "volumeClaimTemplates" not in statefulsets["hw-highwater-coordinator"]["spec"]

    services = by_kind(docs, "Service")
    for role in ("controller", "broker", "coordinator"):
        headless = services[f"hw-highwater-{role}-headless"]["spec"]
        assert headless["clusterIP"] == "None"
        assert headless["publishNotReadyAddresses"] is True
        assert statefulsets[f"hw-highwater-{role}"]["spec"]["serviceName"] == (
            f"hw-highwater-{role}-headless"
        )
    client = services["hw-highwater"]["spec"]
    assert client["selector"]["app.kubernetes.io/component"] == "broker"
    assert client["ports"][0]["port"] == 9092
    assert set(by_kind(docs, "PodDisruptionBudget")) == {
        "hw-highwater-controller",
        "hw-highwater-broker",
        "hw-highwater-coordinator",
    }
    assert by_kind(docs, "PodDisruptionBudget")["hw-highwater-broker"]["spec"] == {
        "maxUnavailable": 1,
        "selector": {
            "matchLabels": statefulsets["hw-highwater-broker"]["spec"]["selector"]["matchLabels"]
        },
    }


def test_the_config_map_carries_the_values(chart_renders: dict[str, dict[str, str]]) -> None:
    config = by_kind(documents(chart_renders["default"]), "ConfigMap")["hw-highwater-config"]
    data = config["data"]
    assert data["CONTROLLER_REPLICAS"] == "3"
    assert data["BROKER_NODE_ID_OFFSET"] == "100"
    assert data["PRESTOP_TIMEOUT_SECONDS"] == "240"
    dev = by_kind(documents(chart_renders["dev"]), "ConfigMap")["hw-highwater-config"]["data"]
    assert dev["CONTROLLER_REPLICAS"] == "1"
    assert dev["HIGHWATER_LOG_LEVEL"] == "DEBUG"


def test_every_container_probes_grpc_health_and_runs_unprivileged(
    chart_renders: dict[str, dict[str, str]],
) -> None:
    for rendered in chart_renders.values():
        docs = documents(rendered)
        for statefulset in by_kind(docs, "StatefulSet").values():
            pod = statefulset["spec"]["template"]["spec"]
            main = container(statefulset)
            port = main["ports"][0]["containerPort"]
            # Alive while the process runs: a quorum without a leader or a fenced broker is
            # NOT_SERVING on the whole server's health, and no reason to restart the pod.
            for probe in ("startupProbe", "livenessProbe"):
                if "grpc" in main[probe]:
                    assert main[probe]["grpc"] == {"port": port, "service": "highwater.v1.Raft"}
                else:  # with TLS (the prod values), the same question over TLS
                    script = "/opt/highwater/scripts/health_check.py"
                    assert main[probe]["exec"]["command"] == [
                        "python3", script, str(port), "highwater.v1.Raft"
                    ]  # fmt: skip
            assert pod["securityContext"]["runAsNonRoot"] is True
            assert pod["automountServiceAccountToken"] is False
            for each in [main, *pod.get("initContainers", [])]:
                security = each["securityContext"]
                assert security["allowPrivilegeEscalation"] is False
                assert security["readOnlyRootFilesystem"] is True
                assert security["capabilities"] == {"drop": ["ALL"]}
                assert each["resources"]["limits"] and each["resources"]["requests"]


def test_brokers_gate_rolling_restarts(chart_renders: dict[str, dict[str, str]]) -> None:
    statefulsets = by_kind(documents(chart_renders["default"]), "StatefulSet")
    broker = statefulsets["hw-highwater-broker"]
    main = container(broker)
    # Ready as the broker itself reports it: registered, unfenced, in every ISR it belongs to.
    assert main["readinessProbe"]["grpc"] == {"port": 9092, "service": READY_SERVICE}
    assert main["lifecycle"]["preStop"]["exec"]["command"] == [
        "/bin/sh",
        "/opt/highwater/scripts/broker-gate.sh",
        "pre-stop",
    ]
    spec = broker["spec"]
    assert spec["updateStrategy"] == {"type": "RollingUpdate"}
    assert spec["template"]["spec"]["terminationGracePeriodSeconds"] == 300
    # without the gate, readiness is the gRPC health check alone
    dev = by_kind(documents(chart_renders["dev"]), "StatefulSet")["hw-highwater-broker"]
    assert container(dev)["readinessProbe"]["grpc"] == {"port": 9092}
    for role in ("controller", "coordinator"):
        assert container(statefulsets[f"hw-highwater-{role}"])["readinessProbe"]["grpc"]


def test_prod_values_pin_the_image_spread_pods_and_take_the_rack_from_the_zone(
    chart_renders: dict[str, dict[str, str]],
) -> None:
    docs = documents(chart_renders["prod"])
    statefulsets = by_kind(docs, "StatefulSet")
    broker = statefulsets["hw-highwater-broker"]
    pod = broker["spec"]["template"]["spec"]
    assert broker["spec"]["replicas"] == 5
    assert container(broker)["image"] == (
        "registry.example.com/streaming/highwater@sha256:"
        "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
    )
    required = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert required[0]["topologyKey"] == "kubernetes.io/hostname"
    assert pod["topologySpreadConstraints"][0]["whenUnsatisfiable"] == "DoNotSchedule"
    (rack,) = pod["initContainers"]
    assert rack["command"][1] == "/opt/highwater/scripts/node_rack.py"
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in rack["env"]}
    assert env["RACK_TOPOLOGY_KEY"] == "topology.kubernetes.io/zone"
    assert env["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    # the token is mounted into the init container alone
    mounts = {m["name"] for m in rack["volumeMounts"]}
    assert "node-reader-token" in mounts
    assert "node-reader-token" not in {m["name"] for m in container(broker)["volumeMounts"]}
    role = by_kind(docs, "ClusterRole")["hw-highwater-streams-node-reader"]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}]
    assert "ClusterRole" not in {d["kind"] for d in documents(chart_renders["default"])}
    assert pod["imagePullSecrets"] == [{"name": "registry-credentials"}]


def test_helm_test_produces_and_consumes(chart_renders: dict[str, dict[str, str]]) -> None:
    rendered = chart_renders["default"]
    (pod,) = [
        d
        for d in documents(rendered)
        if d["kind"] == "Pod" and d["metadata"]["annotations"].get("helm.sh/hook") == "test"
    ]
    script = pod["spec"]["containers"][0]["command"][-1]
    assert "highwater topics create" in script
    assert "highwater produce" in script
    assert "highwater consume" in script
    assert pod["spec"]["restartPolicy"] == "Never"


def test_an_upgrade_that_lowers_the_broker_count_first_checks_the_brokers_to_go(
    chart_renders: dict[str, dict[str, str]],
) -> None:
    docs = documents(render.render({"broker": {"replicaCount": 2}}, name="hw", namespace="s"))
    job = by_kind(docs, "Job")["hw-highwater-broker-scale-down-check"]
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-upgrade"
    assert job["spec"]["backoffLimit"] == 0
    command = job["spec"]["template"]["spec"]["containers"][0]["command"]
    # Brokers are ids 100 + ordinal: with 2 left, ids 102 and up must hold no replicas.
    assert command[:3] == ["highwater", "brokers", "check-removal"]
    assert command[command.index("--ids-from") + 1] == "102"
    assert command[command.index("--bootstrap-server") + 1] == "hw-highwater:9092"
    assert "hw-highwater-broker-scale-down-check" not in by_kind(
        documents(render.render({"broker": {"scaleDownCheck": {"enabled": False,
                                                                "timeoutSeconds": 60}}},
                                name="hw", namespace="s")),
        "Job",
    )  # fmt: skip


def test_an_upgrade_that_lowers_the_controller_count_first_checks_the_voters_to_go(
    chart_renders: dict[str, dict[str, str]],
) -> None:
    docs = documents(render.render({"controller": {"replicaCount": 1}}, name="hw", namespace="s"))
    job = by_kind(docs, "Job")["hw-highwater-controller-scale-down-check"]
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-upgrade"
    assert job["spec"]["backoffLimit"] == 0
    command = job["spec"]["template"]["spec"]["containers"][0]["command"]
    # Controllers are ids 0 + ordinal: with 1 left, ids 1 and up must vote no more.
    assert command[:3] == ["highwater", "quorum", "check-removal"]
    assert command[command.index("--ids-from") + 1] == "1"
    assert command[command.index("--controllers") + 1] == (
        "hw-highwater-controller-0.hw-highwater-controller-headless.s.svc.cluster.local:9093"
    )
    off = {"scaleDownCheck": {"enabled": False, "timeoutSeconds": 60}}
    for values in (
        {"controller": off},
        {"metadata": {"mode": "etcd", "etcd": {"endpoints": ["e:2379"]}}},
    ):
        names = by_kind(documents(render.render(values, name="hw", namespace="s")), "Job")
        assert "hw-highwater-controller-scale-down-check" not in names, values


def test_notes_name_the_bootstrap_address() -> None:
    import helm_python as helm

    notes = helm.Chart.load(CHART).render({}, name="hw", namespace="streams")[
        "highwater/templates/NOTES.txt"
    ]
    assert "hw-highwater.streams.svc.cluster.local:9092" in notes
    assert "node ids 100..102" in notes
    assert "helm test hw -n streams" in notes


def test_the_kustomize_base_is_the_chart_rendered_with_the_base_values() -> None:
    assert (DEPLOY / "kustomize" / "base" / "highwater.yaml").read_text() == render.render_base()


def test_every_pod_serves_metrics_and_is_annotated_for_scraping(
    chart_renders: dict[str, dict[str, str]],
) -> None:
    docs = documents(chart_renders["default"])
    for statefulset in by_kind(docs, "StatefulSet").values():
        ports = {p["name"]: p["containerPort"] for p in container(statefulset)["ports"]}
        assert ports["metrics"] == 9464
        annotations = statefulset["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true"
        assert annotations["prometheus.io/port"] == "9464"
        assert annotations["prometheus.io/path"] == "/metrics"
    config = by_kind(docs, "ConfigMap")["hw-highwater-config"]["data"]
    assert config["METRICS_PORT"] == "9464"
    scripts = by_kind(docs, "ConfigMap")["hw-highwater-scripts"]["data"]
    for script in ("controller.sh", "broker.sh", "coordinator.sh"):
        assert '--metrics-listen "0.0.0.0:$METRICS_PORT"' in scripts[script]
    for role in ("controller", "broker", "coordinator"):
        headless = by_kind(docs, "Service")[f"hw-highwater-{role}-headless"]["spec"]
        assert {"name": "metrics", "port": 9464, "targetPort": "metrics", "protocol": "TCP"} in (
            headless["ports"]
        )
    [policy] = by_kind(docs, "NetworkPolicy").values()
    assert any(
        rule.get("ports") == [{"port": 9464, "protocol": "TCP"}] and "from" not in rule
        for rule in policy["spec"]["ingress"]
    )
    assert not by_kind(docs, "ServiceMonitor")


def test_metrics_off_leaves_no_endpoint_port_or_annotation() -> None:
    docs = documents(render.render({"metrics": {"enabled": False}}))
    for statefulset in by_kind(docs, "StatefulSet").values():
        assert [p["name"] for p in container(statefulset)["ports"]] == ["grpc"]
        annotations = statefulset["spec"]["template"]["metadata"]["annotations"]
        assert not [a for a in annotations if a.startswith("prometheus.io/")]
    assert by_kind(docs, "ConfigMap")["highwater-config"]["data"]["METRICS_PORT"] == ""


def test_the_kafka_listener_is_a_second_broker_port_only_when_enabled() -> None:
    default = documents(render.render({}))
    assert by_kind(default, "ConfigMap")["highwater-config"]["data"]["BROKER_KAFKA_PORT"] == ""
    docs = documents(render.render({"broker": {"kafka": {"enabled": True, "port": 9095}}}))
    assert by_kind(docs, "ConfigMap")["highwater-config"]["data"]["BROKER_KAFKA_PORT"] == "9095"
    for name, statefulset in by_kind(docs, "StatefulSet").items():
        ports = {p["name"]: p["containerPort"] for p in container(statefulset)["ports"]}
        assert ("kafka" in ports) == name.endswith("broker"), name
        if name.endswith("broker"):
            assert ports["kafka"] == 9095
    services = by_kind(docs, "Service")
    for name, service in services.items():
        ports = {p["name"]: p["port"] for p in service["spec"]["ports"]}
        broker_facing = name.endswith("broker-headless") or name == "highwater"
        assert (ports.get("kafka") == 9095) == broker_facing, name
    (policy,) = by_kind(docs, "NetworkPolicy").values()
    client_ports = [p["port"] for rule in policy["spec"]["ingress"] for p in rule.get("ports", [])]
    assert 9095 in client_ports


def test_a_service_monitor_scrapes_the_headless_services_and_otel_settings_reach_the_pods() -> None:
    docs = documents(
        render.render(
            {
                "metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}},
                "otel": {"env": {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"}},
            },
            name="hw",
            namespace="streams",
        )
    )
    [monitor] = by_kind(docs, "ServiceMonitor").values()
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["endpoints"] == [
        {"port": "metrics", "path": "/metrics", "interval": "30s", "scrapeTimeout": "10s"}
    ]
    selector = monitor["spec"]["selector"]["matchLabels"]
    scraped = [
        name
        for name, service in by_kind(docs, "Service").items()
        if selector.items() <= service["metadata"]["labels"].items()
        and any(p["name"] == "metrics" for p in service["spec"]["ports"])
    ]
    assert sorted(scraped) == [
        f"hw-highwater-{role}-headless" for role in ("broker", "controller", "coordinator")
    ]
    config = by_kind(docs, "ConfigMap")["hw-highwater-config"]["data"]
    assert config["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://collector:4317"


def test_the_etcd_metadata_mode_deploys_no_controllers_and_points_the_roles_at_etcd() -> None:
    default = documents(render.render({}))
    assert by_kind(default, "ConfigMap")["highwater-config"]["data"]["METADATA_STORE"] == ""
    docs = documents(
        render.render(
            {
                "metadata": {
                    "mode": "etcd",
                    "etcd": {"endpoints": ["etcd-0.etcd:2379", "etcd-1.etcd:2379"]},
                }
            }
        )
    )
    assert sorted(by_kind(docs, "StatefulSet")) == ["highwater-broker", "highwater-coordinator"]
    config = by_kind(docs, "ConfigMap")["highwater-config"]["data"]
    assert config["METADATA_STORE"] == "etcd://etcd-0.etcd:2379,etcd-1.etcd:2379/highwater"
    named = documents(
        render.render(
            {"metadata": {"mode": "etcd", "etcd": {"endpoints": ["e:2379"], "cluster": "prod"}}}
        )
    )
    assert by_kind(named, "ConfigMap")["highwater-config"]["data"]["METADATA_STORE"] == (
        "etcd://e:2379/prod"
    )


def test_tls_to_etcd_mounts_the_secret_in_brokers_and_coordinators_and_passes_its_files() -> None:
    etcd = {"endpoints": ["e:2379"], "cluster": "prod"}
    docs = documents(
        render.render(
            {
                "metadata": {
                    "mode": "etcd",
                    "etcd": {
                        **etcd,
                        "tls": {
                            "enabled": True,
                            "secret": "etcd-client",
                            "certKey": "tls.crt",
                            "keyKey": "tls.key",
                        },
                    },
                }
            }
        )
    )
    config = by_kind(docs, "ConfigMap")["highwater-config"]["data"]
    assert config["METADATA_STORE"] == "https://e:2379/prod"
    assert config["ETCD_CA_FILE"] == "/etc/highwater-etcd-tls/ca.crt"
    assert config["ETCD_CERT_FILE"] == "/etc/highwater-etcd-tls/tls.crt"
    assert config["ETCD_KEY_FILE"] == "/etc/highwater-etcd-tls/tls.key"
    for statefulset in by_kind(docs, "StatefulSet").values():
        volumes = {v["name"]: v for v in statefulset["spec"]["template"]["spec"]["volumes"]}
        assert volumes["etcd-tls"]["secret"]["secretName"] == "etcd-client"
        mounts = {m["name"]: m for m in container(statefulset)["volumeMounts"]}
        assert mounts["etcd-tls"]["mountPath"] == "/etc/highwater-etcd-tls"
    server_only = documents(
        render.render(
            {
                "metadata": {
                    "mode": "etcd",
                    "etcd": {**etcd, "tls": {"enabled": True, "secret": "etcd-ca"}},
                }
            }
        )
    )
    config = by_kind(server_only, "ConfigMap")["highwater-config"]["data"]
    assert config["ETCD_CA_FILE"] == "/etc/highwater-etcd-tls/ca.crt"
    assert "ETCD_CERT_FILE" not in config and "ETCD_KEY_FILE" not in config
    plain = documents(render.render({"metadata": {"mode": "etcd", "etcd": etcd}}))
    assert "ETCD_CA_FILE" not in by_kind(plain, "ConfigMap")["highwater-config"]["data"]


BAD_VALUES = [
    ({"metadata": {"mode": "zookeeper"}}, "/metadata/mode"),
    (
        {"metadata": {"mode": "etcd", "etcd": {"endpoints": ["e:2379"], "tls": {"enabled": True}}}},
        "metadata.etcd.tls.secret",
    ),
    (
        {
            "metadata": {
                "mode": "etcd",
                "etcd": {
                    "endpoints": ["e:2379"],
                    "tls": {"enabled": True, "secret": "s", "certKey": "tls.crt"},
                },
            }
        },
        "a client certificate needs its key",
    ),
    ({"metadata": {"etcd": {"tls": {"verify": False}}}}, "/metadata/etcd/tls"),
    ({"metadata": {"mode": "etcd"}}, "metadata.etcd.endpoints"),
    (
        {"metadata": {"mode": "etcd", "etcd": {"endpoints": ["no-port"]}}},
        "/metadata/etcd/endpoints",
    ),
    ({"metrics": {"port": 0}}, "/metrics/port"),
    ({"metrics": {"serviceMonitor": {"interval": "often"}}}, "/metrics/serviceMonitor/interval"),
    ({"otel": {"env": {"LOG_LEVEL": "x"}}}, "LOG_LEVEL"),
    ({"broker": {"replicaCount": 0}}, "/broker/replicaCount"),
    ({"broker": {"replicaCount": "three"}}, "/broker/replicaCount"),
    ({"controller": {"replicaCount": 2}}, "/controller/replicaCount"),
    ({"broker": {"persistence": {"size": "lots"}}}, "/broker/persistence/size"),
    ({"broker": {"pdb": {"maxUnavailable": 0}}}, "/broker/pdb/maxUnavailable"),
    ({"broker": {"replicaCont": 3}}, "replicaCont"),
    ({"logLevel": "LOUD"}, "/logLevel"),
    ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
    ({"image": {"digest": "latest"}}, "/image/digest"),
    ({"broker": {"rollingRestart": {"preStopTimeoutSeconds": -1}}}, "preStopTimeoutSeconds"),
    ({"broker": {"nodeIdOffset": 1}}, "broker.nodeIdOffset"),
    ({"broker": {"terminationGracePeriodSeconds": 100}}, "broker.terminationGracePeriodSeconds"),
    ({"controller": {"offsetsTopicReplicationFactor": 5}}, "offsetsTopicReplicationFactor"),
]


@pytest.mark.parametrize(("values", "key"), BAD_VALUES, ids=[key for _, key in BAD_VALUES])
def test_bad_values_fail_at_render_time_naming_the_key(values: dict[str, Any], key: str) -> None:
    with pytest.raises(render.RenderError, match=key.replace(".", r"\.")):
        render.render(values)


def test_a_bad_values_file_fails_the_render_command(tmp_path: Any) -> None:
    bad = tmp_path / "bad-values.yaml"
    bad.write_text(yaml.safe_dump({"broker": {"persistence": {"size": "-5Gi"}}}))
    result = subprocess.run(
        [sys.executable, str(DEPLOY / "render.py"), "template", "-f", str(bad)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 1
    assert "/broker/persistence/size" in result.stderr
    assert result.stdout == ""
