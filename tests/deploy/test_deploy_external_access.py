"""The chart's ``externalAccess`` (Bitnami's shape): one Service per broker and per
coordinator, an EXTERNAL listener on each, advertised at the address given in the values
or discovered from the pod's Service; each service type rendered and validated strictly,
the start scripts' listener flags checked by the real commands' parsers, the discovery
script's reading of a Service, and bad values refused naming the key."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any

import pytest
from conftest import CHART, by_kind, render
from test_deploy_chart_config import documents, pod, validate_all
from test_deploy_scripts import bin_dir, flag, run  # noqa: F401 - bin_dir is a fixture

ROLES = ("broker", "coordinator")


def external_services(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        name: service
        for name, service in by_kind(docs, "Service").items()
        if name.endswith("-external")
    }


def env(docs: list[dict[str, Any]], role: str) -> dict[str, str]:
    main = pod(docs, role)["spec"]["containers"][0]
    return {e["name"]: e.get("value", "") for e in main["env"]}


def init_names(docs: list[dict[str, Any]], role: str) -> list[str]:
    return [c["name"] for c in pod(docs, role)["spec"].get("initContainers", [])]


def test_node_ports_left_to_kubernetes_are_discovered() -> None:
    docs = documents({"externalAccess": {"enabled": True}})
    services = external_services(docs)
    assert sorted(services) == [
        "hw-highwater-broker-0-external",
        "hw-highwater-broker-1-external",
        "hw-highwater-broker-2-external",
        "hw-highwater-coordinator-0-external",
        "hw-highwater-coordinator-1-external",
    ]
    broker_1 = services["hw-highwater-broker-1-external"]["spec"]
    assert broker_1["type"] == "NodePort"
    assert broker_1["selector"]["statefulset.kubernetes.io/pod-name"] == "hw-highwater-broker-1"
    assert broker_1["ports"] == [
        {"name": "external", "port": 9095, "targetPort": "external", "protocol": "TCP"}
    ]
    for role in ROLES:
        assert init_names(docs, role) == ["external-address"]
        main = pod(docs, role)["spec"]["containers"][0]
        assert {"name": "external-address", "mountPath": "/var/run/highwater-external",
                "readOnly": True} in main["volumeMounts"]  # fmt: skip
        assert "external" in {p["name"] for p in main["ports"]}
    # The init container may read exactly these Services, and the server gets no token.
    (role,) = by_kind(docs, "Role").values()
    assert role["rules"][0]["resourceNames"] == sorted(services)
    assert "hw-highwater-service-reader" in by_kind(docs, "RoleBinding")
    assert pod(docs, "broker")["spec"]["automountServiceAccountToken"] is False
    policy = by_kind(docs, "NetworkPolicy")["hw-highwater"]["spec"]["ingress"][1]
    assert {9095, 9195} <= {p["port"] for p in policy["ports"]}
    validate_all(docs)


def test_node_ports_and_a_domain_given_need_no_discovery() -> None:
    docs = documents(
        {
            "externalAccess": {
                "enabled": True,
                "service": {"type": "NodePort", "port": 9095, "nodePorts": [31001, 31002, 31003],
                            "domain": "nodes.example.com"},
                "coordinator": {"service": {"type": "NodePort", "port": 9195,
                                            "nodePorts": [31101, 31102]}},
            }
        }
    )  # fmt: skip
    services = external_services(docs)
    assert services["hw-highwater-broker-2-external"]["spec"]["ports"][0]["nodePort"] == 31003
    assert services["hw-highwater-coordinator-0-external"]["spec"]["ports"][0]["nodePort"] == 31101
    assert not by_kind(docs, "Role")
    for role in ROLES:
        assert init_names(docs, role) == []
    assert env(docs, "broker")["EXTERNAL_NODE_PORTS"] == "31001 31002 31003"
    assert env(docs, "broker")["EXTERNAL_DOMAIN"] == "nodes.example.com"
    validate_all(docs)


def test_load_balancers_with_given_addresses_or_discovered_ones() -> None:
    service = {
        "type": "LoadBalancer",
        "port": 9095,
        "loadBalancerIPs": ["203.0.113.7", "203.0.113.8", "203.0.113.9"],
        "loadBalancerSourceRanges": ["198.51.100.0/24"],
        "annotations": {"service.beta.kubernetes.io/aws-load-balancer-type": "nlb"},
        "externalTrafficPolicy": "Local",
    }
    coordinators = {**service, "port": 9195, "loadBalancerIPs": []}
    docs = documents(
        {
            "externalAccess": {
                "enabled": True,
                "service": service,
                "coordinator": {"service": coordinators},
            }
        }
    )
    services = external_services(docs)
    broker_0 = services["hw-highwater-broker-0-external"]
    assert broker_0["spec"]["loadBalancerIP"] == "203.0.113.7"
    assert broker_0["spec"]["loadBalancerSourceRanges"] == ["198.51.100.0/24"]
    assert broker_0["spec"]["externalTrafficPolicy"] == "Local"
    assert broker_0["metadata"]["annotations"] == service["annotations"]
    assert "loadBalancerIP" not in services["hw-highwater-coordinator-0-external"]["spec"]
    # The brokers' addresses are given; the coordinators' are discovered.
    assert init_names(docs, "broker") == []
    assert init_names(docs, "coordinator") == ["external-address"]
    (role,) = by_kind(docs, "Role").values()
    assert "hw-highwater-coordinator-1-external" in role["rules"][0]["resourceNames"]
    validate_all(docs)


def test_cluster_ip_for_port_forwards_gives_each_pod_the_next_port() -> None:
    docs = documents(render.load_values([CHART / "ci" / "dev-values.yaml"]) | {"broker": {
        "replicaCount": 2}})  # fmt: skip
    services = external_services(docs)
    ports = {name: s["spec"]["ports"][0]["port"] for name, s in services.items()}
    assert ports == {
        "hw-highwater-broker-0-external": 9095,
        "hw-highwater-broker-1-external": 9096,
        "hw-highwater-coordinator-0-external": 9195,
    }
    assert all(s["spec"]["type"] == "ClusterIP" for s in services.values())
    assert not by_kind(docs, "Role")
    validate_all(docs)


EXTERNAL = {
    "EXTERNAL_PORT": "9095",
    "EXTERNAL_SERVICE_TYPE": "NodePort",
    "EXTERNAL_DOMAIN": "",
    "EXTERNAL_NODE_PORTS": "31001 31002 31003",
    "EXTERNAL_LOAD_BALANCER_IPS": "",
    "HOST_IP": "192.0.2.10",
}
INTERNAL_2 = "hw-highwater-broker-2.hw-highwater-broker-headless.streams.svc.cluster.local:9092"


@pytest.mark.parametrize(
    ("settings", "advertised"),
    [
        ({}, "192.0.2.10:31003"),
        ({"EXTERNAL_DOMAIN": "nodes.example.com"}, "nodes.example.com:31003"),
        (
            {"EXTERNAL_SERVICE_TYPE": "LoadBalancer",
             "EXTERNAL_LOAD_BALANCER_IPS": "203.0.113.7 203.0.113.8 203.0.113.9"},
            "203.0.113.9:9095",
        ),
        ({"EXTERNAL_SERVICE_TYPE": "ClusterIP", "EXTERNAL_DOMAIN": "localhost"}, "localhost:9097"),
    ],
)  # fmt: skip
def test_a_broker_with_external_access_has_two_named_listeners(
    bin_dir: Path,  # noqa: F811 - the fixture
    settings: dict[str, str],
    advertised: str,
) -> None:
    argv = run(bin_dir, "broker.sh", "hw-highwater-broker-2", **{**EXTERNAL, **settings})
    assert "--listen" not in argv and "--advertised-listener" not in argv
    assert flag(argv, "--listeners") == "INTERNAL://0.0.0.0:9092,EXTERNAL://0.0.0.0:9095"
    assert flag(argv, "--advertised-listeners") == (
        f"INTERNAL://{INTERNAL_2},EXTERNAL://{advertised}"
    )
    assert flag(argv, "--inter-broker-listener-name") == "INTERNAL"


def test_a_coordinator_with_external_access_keeps_its_pod_ip_inside(
    bin_dir: Path,  # noqa: F811 - the fixture
) -> None:
    argv = run(
        bin_dir, "coordinator.sh", "hw-highwater-coordinator-1",
        **{**EXTERNAL, "EXTERNAL_PORT": "9195", "EXTERNAL_NODE_PORTS": "31101 31102"},
    )  # fmt: skip
    assert flag(argv, "--listeners") == "INTERNAL://10.1.2.3:9094,EXTERNAL://0.0.0.0:9195"
    assert flag(argv, "--advertised-listeners") == (
        "INTERNAL://10.1.2.3:9094,EXTERNAL://192.0.2.10:31102"
    )
    assert flag(argv, "--inter-broker-listener-name") == "INTERNAL"


def _discovery() -> Any:
    spec = importlib.util.spec_from_file_location(
        "external_address", CHART / "files" / "external_address.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_discovery_reads_the_node_port_or_the_load_balancer_address() -> None:
    discovery = _discovery()
    node_port = {"spec": {"type": "NodePort", "ports": [{"port": 9095, "nodePort": 30555}]}}
    assert discovery.external_address(node_port, {"HOST_IP": "192.0.2.10"}) == "192.0.2.10:30555"
    on_domain = {"HOST_IP": "192.0.2.10", "EXTERNAL_DOMAIN": "n.example"}
    assert discovery.external_address(node_port, on_domain) == "n.example:30555"
    pending = {"spec": {"type": "LoadBalancer", "ports": [{"port": 9095}]}, "status": {}}
    assert discovery.external_address(pending, {}) is None
    named = {**pending, "status": {"loadBalancer": {"ingress": [{"hostname": "lb.example"}]}}}
    assert discovery.external_address(named, {}) == "lb.example:9095"
    addressed = {**pending, "status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.7"}]}}}
    assert discovery.external_address(addressed, {}) == "203.0.113.7:9095"


BAD_VALUES = [
    ({"externalAccess": {"enabled": True, "service": {"type": "NodePort", "port": 9095,
                                                      "nodePort": [1]}}}, "nodePort"),
    ({"externalAccess": {"enabled": True, "service": {"type": "Ingress", "port": 9095}}},
     "/externalAccess/service/type"),
    ({"externalAccess": {"enabled": True, "service": {"type": "NodePort", "port": 9095,
                                                      "nodePorts": [70000]}}},
     "/externalAccess/service/nodePorts/0"),
    ({"externalAccess": {"enabled": True, "service": {"type": "ClusterIP", "port": 9095}}},
     "externalAccess.service.domain"),
    ({"externalAccess": {"enabled": True, "coordinator": {"service": {"type": "NodePort",
                                                                      "port": 9094}}}},
     "externalAccess.coordinator.service.port"),
    ({"externalAccess": {"enabled": True, "autoDiscovery": {}}}, "autoDiscovery"),
]  # fmt: skip


@pytest.mark.parametrize(("values", "key"), BAD_VALUES, ids=[key for _, key in BAD_VALUES])
def test_bad_external_access_values_fail_naming_the_key(values: dict[str, Any], key: str) -> None:
    with pytest.raises(render.RenderError, match=re.escape(key)):
        render.render(values)


def test_notes_say_how_to_reach_the_cluster_from_outside() -> None:
    import helm_python as helm

    notes = helm.Chart.load(CHART).render(
        {"externalAccess": {"enabled": True}, "tls": {"enabled": True}},
        name="hw",
        namespace="streams",
    )["highwater/templates/NOTES.txt"]
    assert "get services -l highwater.io/external-access=true" in notes
    assert "Clients speak TLS (SSL); the CA is ca.crt of the Secret hw-highwater-tls." in notes
