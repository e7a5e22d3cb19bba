"""The chart's ``tls`` and ``auth`` values: cert-manager's Issuer and Certificate (or a
Secret of one's own) mounted in every pod and passed as the ``--tls-*`` flags, exec
probes that ask health over TLS with the pod's certificate (run here against a real TLS
server), the tools' client config in the gates, hooks and ``helm test``, the auth flags,
the SCRAM users Job; each rendered and validated strictly; bad values refused naming
the key; the prod values and the prod overlay secure by default."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import grpc.aio
import kubernetes_validate
import pytest
import yaml
from conftest import DEPLOY, KUBERNETES_VERSIONS, by_kind, render, tool
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from highwater.cli.main import main
from highwater.rpc.tls import ServerTls
from highwater.security.certificate_authority import CertificateAuthority
from test_deploy_chart_config import documents, pod
from test_deploy_scripts import ENVIRONMENT, FILES, bin_dir, flag  # noqa: F401 - a fixture

ROLES = ("controller", "broker", "coordinator")
SECURE = {
    "tls": {"enabled": True},
    "auth": {
        "enabled": True,
        "superUsers": ["User:admin"],
        "saslMechanisms": ["SCRAM-SHA-512", "OAUTHBEARER"],
        "scram": {"usersSecret": "hw-users", "mechanism": "SCRAM-SHA-512"},
        "oauthbearer": {"jwksConfigMap": "hw-jwks", "issuer": "https://idp.example.com",
                        "audience": "highwater"},
    },
}  # fmt: skip
AUTH_FLAGS = (
    "--authorizer",
    "--super-users",
    "--allow-everyone-if-no-acl-found",
    "--sasl-enabled-mechanisms",
    "--oauthbearer-jwks-file",
    "--oauthbearer-issuer",
    "--oauthbearer-audience",
)
"""The server flags agreed for authentication and authorization (the auth work adds them)."""


def validate_all(docs: list[dict[str, Any]]) -> None:
    """Every core manifest strictly; cert-manager's resources (CRDs, no schema offline)
    checked by ``cert_manager_resources``."""
    for document in docs:
        if document["apiVersion"].startswith(("monitoring.coreos.com/", "cert-manager.io/")):
            continue
        for version in KUBERNETES_VERSIONS:
            kubernetes_validate.validate(document, version, strict=True)


def cert_manager_resources(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """cert-manager's resources by kind/name, with the fields cert-manager v1 requires."""
    found = {}
    for document in docs:
        if not document["apiVersion"].startswith("cert-manager.io/"):
            continue
        assert document["apiVersion"] == "cert-manager.io/v1"
        spec = document["spec"]
        if document["kind"] == "Certificate":
            assert spec["secretName"] and spec["issuerRef"]["name"]
            assert set(spec) <= {"secretName", "commonName", "duration", "renewBefore",
                                 "privateKey", "usages", "dnsNames", "ipAddresses",
                                 "issuerRef", "isCA"}  # fmt: skip
        else:
            assert document["kind"] == "Issuer"
            assert len(spec) == 1 and set(spec) <= {"selfSigned", "ca"}
        found[f"{document['kind']}/{document['metadata']['name']}"] = document
    return found


def test_tls_issues_a_certificate_every_pod_mounts_and_presents() -> None:
    docs = documents({"tls": {"enabled": True}})
    issued = cert_manager_resources(docs)
    assert sorted(issued) == [
        "Certificate/hw-highwater-ca",
        "Certificate/hw-highwater-tls",
        "Issuer/hw-highwater-ca",
        "Issuer/hw-highwater-selfsigned",
    ]
    certificate = issued["Certificate/hw-highwater-tls"]["spec"]
    assert certificate["issuerRef"] == {"name": "hw-highwater-ca", "kind": "Issuer",
                                        "group": "cert-manager.io"}  # fmt: skip
    assert certificate["usages"][:2] == ["server auth", "client auth"]
    names = set(certificate["dnsNames"])
    assert {"hw-highwater", "localhost",
            "*.hw-highwater-broker-headless.streams.svc.cluster.local",
            "*.hw-highwater-coordinator-headless.streams.svc.cluster.local",
            "hw-highwater-controller-headless"} <= names  # fmt: skip
    assert certificate["ipAddresses"] == ["127.0.0.1"]
    config = by_kind(docs, "ConfigMap")["hw-highwater-config"]["data"]
    assert config["TLS_CERT_FILE"] == "/etc/highwater-tls/tls.crt"
    assert config["TLS_CLIENT_AUTH"] == "required"
    assert "AUTHORIZER" not in config
    client = by_kind(docs, "ConfigMap")["hw-highwater-server-config"]["data"]["client.properties"]
    assert "security.protocol=SSL" in client.splitlines()
    for role in ROLES:
        spec = pod(docs, role)["spec"]
        main_container = spec["containers"][0]
        assert {"name": "tls", "mountPath": "/etc/highwater-tls", "readOnly": True} in (
            main_container["volumeMounts"]
        )
        (tls,) = [v for v in spec["volumes"] if v["name"] == "tls"]
        assert tls["secret"]["secretName"] == "hw-highwater-tls"
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            command = main_container[probe]["exec"]["command"]
            assert command[:2] == ["python3", "/opt/highwater/scripts/health_check.py"]
            assert "grpc" not in main_container[probe]
    broker_ready = pod(docs, "broker")["spec"]["containers"][0]["readinessProbe"]["exec"]
    assert broker_ready["command"][2:] == ["9092", "highwater.broker.ready"]
    test_pod = by_kind(docs, "Pod")["hw-highwater-test-produce-consume"]["spec"]
    assert {"name": "CLIENT_CONFIG", "value": "/etc/highwater/client.properties"} in (
        test_pod["containers"][0]["env"]
    )
    for role in ("broker", "controller"):
        check = by_kind(docs, "Job")[f"hw-highwater-{role}-scale-down-check"]
        assert "--command-config" in check["spec"]["template"]["spec"]["containers"][0]["command"]
    validate_all(docs)


def test_an_issuer_or_a_secret_of_ones_own() -> None:
    cert_manager = {
        "issuerRef": {"name": "corporate-ca", "kind": "ClusterIssuer"},
        "extraDnsNames": ["highwater.example.com"],
        "extraIpAddresses": ["192.0.2.1"],
    }
    docs = documents({"tls": {"enabled": True, "clientAuth": "none", "certManager": cert_manager}})
    issued = cert_manager_resources(docs)
    assert sorted(issued) == ["Certificate/hw-highwater-tls"]
    spec = issued["Certificate/hw-highwater-tls"]["spec"]
    assert spec["issuerRef"] == {"name": "corporate-ca", "kind": "ClusterIssuer",
                                 "group": "cert-manager.io"}  # fmt: skip
    assert "highwater.example.com" in spec["dnsNames"] and "192.0.2.1" in spec["ipAddresses"]
    config = by_kind(docs, "ConfigMap")["hw-highwater-config"]["data"]
    assert config["TLS_CLIENT_AUTH"] == "none"
    own = documents({"tls": {"enabled": True, "existingSecret": "my-tls"}})
    assert not cert_manager_resources(own)
    (volume,) = [v for v in pod(own, "broker")["spec"]["volumes"] if v["name"] == "tls"]
    assert volume["secret"]["secretName"] == "my-tls"
    validate_all(docs + own)


def test_auth_passes_the_agreed_flags_and_creates_the_scram_users() -> None:
    docs = documents(SECURE)
    config = by_kind(docs, "ConfigMap")["hw-highwater-config"]["data"]
    assert config["AUTHORIZER"] == "acl"
    # The pods' own certificate principal is a super user: they call each other.
    assert config["SUPER_USERS"] == "User:hw-highwater;User:admin"
    assert config["ALLOW_EVERYONE_IF_NO_ACL_FOUND"] == ""
    assert config["SASL_ENABLED_MECHANISMS"] == "SCRAM-SHA-512,OAUTHBEARER"
    assert config["OAUTHBEARER_JWKS_FILE"] == "/etc/highwater-jwks/jwks.json"
    for role in ("broker", "coordinator"):
        spec = pod(docs, role)["spec"]
        assert {"name": "jwks", "configMap": {"name": "hw-jwks"}} in spec["volumes"]
    assert "jwks" not in {v["name"] for v in pod(docs, "controller")["spec"]["volumes"]}
    job = by_kind(docs, "Job")["hw-highwater-create-users"]
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "post-install,post-upgrade"
    volumes = {v["name"]: v for v in job["spec"]["template"]["spec"]["volumes"]}
    assert volumes["users"]["secret"]["secretName"] == "hw-users"
    assert volumes["tls"]["secret"]["secretName"] == "hw-highwater-tls"
    validate_all(docs)


def script_argv(
    bin_dir: Path,  # noqa: F811 - the fixture
    script: str,
    pod_name: str,
    *args: str,
    **env: str,
) -> list[str]:
    """The arguments ``script`` execs ``highwater`` with; parsed by the real command,
    less the agreed auth flags that this command does not define yet."""
    result = subprocess.run(
        [tool("dash"), str(FILES / script), *args],
        env={"PATH": f"{bin_dir}:/usr/bin:/bin", "POD_NAME": pod_name, **ENVIRONMENT, **env},
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    argv = result.stdout.splitlines()
    command: click.Command = main
    names: list[str] = []
    while isinstance(command, click.Group):
        names.append(argv[len(names)])
        found = command.get_command(click.Context(command), names[-1])
        assert found is not None, names
        command = found
    known = {opt for param in command.params for opt in param.opts}
    parsed, skip = [], False
    for i, arg in enumerate(argv[len(names) :], len(names)):
        if skip:
            skip = False
            continue
        if arg in AUTH_FLAGS and arg not in known:
            takes_value = arg != "--allow-everyone-if-no-acl-found"
            skip = takes_value and i + 1 < len(argv)
            continue
        parsed.append(arg)
    command.make_context(" ".join(names), parsed)
    return argv


def test_the_start_scripts_pass_tls_to_every_role_and_sasl_to_the_client_facing(
    bin_dir: Path,  # noqa: F811 - the fixture
    tmp_path: Path,
) -> None:
    pem = tmp_path / "pem"
    pem.write_text("-----BEGIN CERTIFICATE-----\n")
    docs = documents(SECURE)
    settings = dict(by_kind(docs, "ConfigMap")["hw-highwater-config"]["data"])
    # The files exist in the pods; here, stand-ins (the parsers check they exist).
    settings |= {"TLS_CERT_FILE": str(pem), "TLS_KEY_FILE": str(pem), "TLS_CA_FILE": str(pem)}
    # The tools' rendered client config, which the real --command-config reads.
    client = tmp_path / "client.properties"
    client.write_text(
        by_kind(docs, "ConfigMap")["hw-highwater-server-config"]["data"]["client.properties"]
    )
    assert settings["CLIENT_CONFIG"] == "/etc/highwater/client.properties"
    settings["CLIENT_CONFIG"] = str(client)
    jwks = tmp_path / "jwks.json"
    jwks.write_text('{"keys": []}')
    assert settings["OAUTHBEARER_JWKS_FILE"] == "/etc/highwater-jwks/jwks.json"
    settings["OAUTHBEARER_JWKS_FILE"] = str(jwks)
    for script, pod_name, sasl in (
        ("controller.sh", "hw-highwater-controller-0", False),
        ("broker.sh", "hw-highwater-broker-0", True),
        ("coordinator.sh", "hw-highwater-coordinator-0", True),
    ):
        argv = script_argv(bin_dir, script, pod_name, **{**ENVIRONMENT, **settings})
        assert flag(argv, "--tls-cert-file") == str(pem)
        assert flag(argv, "--tls-client-auth") == "required"
        assert flag(argv, "--authorizer") == "acl"
        assert flag(argv, "--super-users") == "User:hw-highwater;User:admin"
        assert "--allow-everyone-if-no-acl-found" not in argv
        assert ("--sasl-enabled-mechanisms" in argv) == sasl
        if sasl:
            assert flag(argv, "--sasl-enabled-mechanisms") == "SCRAM-SHA-512,OAUTHBEARER"
            assert flag(argv, "--oauthbearer-jwks-file") == str(jwks)
            assert flag(argv, "--oauthbearer-audience") == "highwater"
    # With TLS a coordinator advertises its pod DNS name, which the certificate names.
    argv = script_argv(bin_dir, "coordinator.sh", "hw-highwater-coordinator-1",
                       **{**ENVIRONMENT, **settings})  # fmt: skip
    assert flag(argv, "--advertised-listeners") == (
        "PLAINTEXT://hw-highwater-coordinator-1.hw-highwater-coordinator-headless.streams.svc"
        ".cluster.local:9094"
    )
    gate = script_argv(bin_dir, "broker-gate.sh", "hw-highwater-broker-1", "ready", **settings)
    assert flag(gate, "--command-config") == str(client)


def test_the_tls_probe_asks_health_with_the_pods_certificate(tmp_path: Path) -> None:
    """files/health_check.py against a real gRPC server with mutual TLS."""
    ca = CertificateAuthority()
    (tmp_path / "ca.crt").write_bytes(ca.certificate_pem)
    ca.issue("hw-highwater", hosts=["localhost", "127.0.0.1"]).write(
        tmp_path / "tls.crt", tmp_path / "tls.key"
    )
    stranger = tmp_path / "stranger"
    stranger.mkdir()
    (stranger / "ca.crt").write_bytes(ca.certificate_pem)
    CertificateAuthority("another CA").issue("x", hosts=["localhost"]).write(
        stranger / "tls.crt", stranger / "tls.key"
    )

    def probe(port: int, *service: str, pki: Path = tmp_path) -> int:
        files = {"TLS_CERT_FILE": "tls.crt", "TLS_KEY_FILE": "tls.key", "TLS_CA_FILE": "ca.crt"}
        env = {**os.environ, **{name: str(pki / file) for name, file in files.items()}}
        return subprocess.run(
            [sys.executable, str(FILES / "health_check.py"), str(port), *service],
            env=env, capture_output=True, timeout=30, check=False,
        ).returncode  # fmt: skip

    async def serve() -> None:
        server = grpc.aio.server()
        servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
        tls = ServerTls(tmp_path / "tls.crt", tmp_path / "tls.key", tmp_path / "ca.crt")
        port = server.add_secure_port("127.0.0.1:0", tls.credentials())
        await server.start()
        try:
            await servicer.set("", health_pb2.HealthCheckResponse.SERVING)
            await servicer.set("highwater.broker.ready", health_pb2.HealthCheckResponse.NOT_SERVING)
            results = await asyncio.gather(
                asyncio.to_thread(probe, port),
                asyncio.to_thread(probe, port, "highwater.broker.ready"),
                asyncio.to_thread(probe, port, pki=stranger),
            )
            assert list(results) == [0, 1, 1]
        finally:
            await server.stop(None)

    asyncio.run(serve())


BAD_VALUES = [
    ({"auth": {"enabled": True}}, "auth.enabled"),
    ({"tls": {"enabled": True}, "auth": {"enabled": True, "saslMechanisms": ["OAUTHBEARER"]}},
     "auth.oauthbearer.jwksConfigMap"),
    ({"tls": {"enabled": True}, "auth": {"enabled": True, "saslMechanisms": ["SCRAM-SHA-256"],
                                         "scram": {"usersSecret": "u"}}}, "auth.scram.mechanism"),
    ({"tls": {"enabled": True, "existingSecret": "mine"}, "auth": {"enabled": True}},
     "auth.superUsers"),
    ({"tls": {"enabled": True, "clientAuth": "requested"}}, "/tls/clientAuth"),
    ({"auth": {"saslMechanisms": ["PLAIN"]}}, "/auth/saslMechanisms/0"),
    ({"auth": {"superUsers": ["admin"]}}, "/auth/superUsers/0"),
    ({"tls": {"certManager": {"duration": "90 days"}}}, "/tls/certManager/duration"),
    ({"tls": {"certificate": "x"}}, "certificate"),
    ({"broker": {"kafka": {"enabled": True, "securityProtocol": "SSL"}}},
     "broker.kafka.securityProtocol: SSL needs tls.enabled"),
    ({"tls": {"enabled": True},
      "broker": {"kafka": {"enabled": True, "securityProtocol": "SASL_SSL"}}},
     "broker.kafka.securityProtocol: SASL_SSL needs auth.enabled"),
    ({"broker": {"kafka": {"securityProtocol": "TLS"}}}, "/broker/kafka/securityProtocol"),
]  # fmt: skip


@pytest.mark.parametrize(("values", "key"), BAD_VALUES, ids=[key for _, key in BAD_VALUES])
def test_bad_security_values_fail_naming_the_key(values: dict[str, Any], key: str) -> None:
    with pytest.raises(render.RenderError, match=re.escape(key)):
        render.render(values)


def test_the_kafka_listener_takes_the_releases_security() -> None:
    """With auth on, the Kafka listener is SASL_SSL unless the values say otherwise; with
    TLS alone it is SSL (without either, PLAINTEXT: the Kustomize base's)."""

    def protocol(values: dict[str, Any]) -> str:
        kafka = {"broker": {"kafka": {"enabled": True, **values.pop("kafka", {})}}}
        config = by_kind(documents({**values, **kafka}), "ConfigMap")["hw-highwater-config"]
        return str(config["data"]["BROKER_KAFKA_SECURITY_PROTOCOL"])

    assert protocol(dict(SECURE)) == "SASL_SSL"
    assert protocol({"tls": {"enabled": True}}) == "SSL"
    assert protocol({**SECURE, "kafka": {"securityProtocol": "SSL"}}) == "SSL"


def test_the_prod_values_are_secure_by_default(chart_renders: dict[str, dict[str, str]]) -> None:
    docs = render.documents(chart_renders["prod"])
    config = by_kind(docs, "ConfigMap")["hw-highwater-config"]["data"]
    assert config["TLS_CLIENT_AUTH"] == "required"  # mutual TLS between the pods
    assert config["AUTHORIZER"] == "acl" and config["ALLOW_EVERYONE_IF_NO_ACL_FOUND"] == ""
    assert config["SASL_ENABLED_MECHANISMS"]  # SASL_SSL for clients
    assert "Certificate/hw-highwater-tls" in cert_manager_resources(docs)


def test_the_prod_overlay_is_secure_by_default(
    overlay_documents: dict[str, list[dict[str, Any]]],
) -> None:
    docs = overlay_documents["prod"]
    config = by_kind(docs, "ConfigMap")["highwater-config"]["data"]
    assert config["TLS_CLIENT_AUTH"] == "required"
    assert config["AUTHORIZER"] == "acl" and config["ALLOW_EVERYONE_IF_NO_ACL_FOUND"] == ""
    assert config["SASL_ENABLED_MECHANISMS"]
    assert "Certificate/highwater-tls" in cert_manager_resources(docs)
    for name, statefulset in by_kind(docs, "StatefulSet").items():
        probe = statefulset["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]
        assert "exec" in probe, name
    dev = overlay_documents["dev"]
    assert "AUTHORIZER" not in by_kind(dev, "ConfigMap")["highwater-config"]["data"]


def test_the_secure_kustomize_base_is_the_chart_rendered_with_its_values() -> None:
    secure_base = DEPLOY / "kustomize" / "secure-base"
    assert (secure_base / "highwater.yaml").read_text() == render.render_base(secure_base)
    assert yaml.safe_load((secure_base / "values.yaml").read_text())["auth"]["enabled"]


def test_the_users_job_creates_each_user_of_the_secret(
    bin_dir: Path,  # noqa: F811 - the fixture
    tmp_path: Path,
) -> None:
    # The Job mounts the Secret at /etc/highwater-users; run a copy that reads the test's.
    users = tmp_path / "users"
    users.mkdir()
    (users / "alice").write_text("alice-secret\n")
    (users / "bob").write_text("bob-secret\n")
    client = tmp_path / "client.properties"
    client.write_text("security.protocol=SSL\n")
    script = tmp_path / "create_users.sh"
    script.write_text(
        (FILES / "create_users.sh").read_text().replace("/etc/highwater-users", str(users))
    )
    result = subprocess.run(
        [tool("dash"), str(script)],
        env={"PATH": f"{bin_dir}:/usr/bin:/bin", "BOOTSTRAP": "hw-highwater:9092",
             "SCRAM_MECHANISM": "SCRAM-SHA-512", "CLIENT_CONFIG": str(client)},
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    calls = result.stdout.split("users\n")[1:]
    assert len(calls) == 2
    for user, call in zip(("alice", "bob"), calls, strict=True):
        argv = ["users", *call.splitlines()]
        users_command = main.command_named("users")
        assert isinstance(users_command, click.Group)
        users_command.commands["create"].make_context("users create", argv[2:])
        assert flag(argv, "--user") == user
        assert flag(argv, "--password-file") == str(users / user)
        assert flag(argv, "--mechanism") == "SCRAM-SHA-512"
        assert flag(argv, "--command-config") == str(client)
