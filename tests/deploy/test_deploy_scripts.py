"""The pods' start scripts (deploy/helm/highwater/files/*.sh), run by dash as in the image:
node ids from the pod ordinal, the quorum's addresses, the advertised listener and rack.

``highwater`` on the scripts' PATH is a stand-in that prints the arguments it was exec'd
with; the real commands' click parsers then check those arguments (voters, addresses,
ranges), so a script that passes a malformed flag fails here. Asked ``quorum formed`` (the
first controller of a dynamic quorum, before it forms one), it logs the question to
``$FORMED_ASKED`` and answers with the next exit status of ``$FORMED_ANSWERS`` (0: formed);
``highwater quorum formed`` itself is tested against real controllers in
tests/raft/test_raft_io_membership.py.
"""

from __future__ import annotations

import shutil
import subprocess
import uuid
from pathlib import Path

import click
import pytest
from conftest import CHART, tool
from highwater.cli.main import main

FILES = CHART / "files"
ENVIRONMENT = {
    "POD_NAMESPACE": "streams",
    "POD_IP": "10.1.2.3",
    "CLUSTER_DOMAIN": "cluster.local",
    "CLUSTER_ID": "",
    "CONTROLLER_STATEFULSET": "hw-highwater-controller",
    "CONTROLLER_HEADLESS": "hw-highwater-controller-headless",
    "CONTROLLER_REPLICAS": "3",
    "CONTROLLER_NODE_ID_OFFSET": "0",
    "CONTROLLER_PORT": "9093",
    "CONTROLLER_QUORUM": "dynamic",
    "BROKER_HEADLESS": "hw-highwater-broker-headless",
    "BROKER_NODE_ID_OFFSET": "100",
    "BROKER_PORT": "9092",
    "PRESTOP_TIMEOUT_SECONDS": "240",
    "COORDINATOR_NODE_ID_OFFSET": "200",
    "COORDINATOR_PORT": "9094",
    "METRICS_PORT": "9464",
}
CONTROLLERS = ",".join(
    f"hw-highwater-controller-{i}.hw-highwater-controller-headless.streams.svc.cluster.local:9093"
    for i in range(3)
)


@pytest.fixture(scope="module")
def bin_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("bin")
    stand_in = directory / "highwater"
    stand_in.write_text(
        "#!/bin/sh\n"
        'if [ "$1 $2" = "quorum formed" ]; then\n'
        '    echo "$@" >> "$FORMED_ASKED"\n'
        '    answer=$(head -n 1 "$FORMED_ANSWERS")\n'
        '    sed -i 1d "$FORMED_ANSWERS"\n'
        '    exit "${answer:-0}"\n'
        "fi\n"
        'printf "%s\\n" "$@"\n'
    )
    stand_in.chmod(0o755)
    return directory


def start(
    script: str, bin_dir: Path, pod: str, *args: str, **env: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [tool("dash"), str(FILES / script), *args],
        env={"PATH": f"{bin_dir}:/usr/bin:/bin", "POD_NAME": pod, **ENVIRONMENT, **env},
        capture_output=True,
        text=True,
        check=False,
    )


def run(bin_dir: Path, script: str, pod: str, *args: str, **env: str) -> list[str]:
    """The arguments ``script`` execs ``highwater`` with, in pod ``pod``; checked by the
    real command's parser."""
    result = start(script, bin_dir, pod, *args, **env)
    assert result.returncode == 0, result.stderr
    argv = result.stdout.splitlines()
    command: click.Command = main
    names = []
    while isinstance(command, click.Group):
        names.append(argv[len(names)])
        found = command.get_command(click.Context(command), names[-1])
        assert found is not None, names
        command = found
    command.make_context(" ".join(names), argv[len(names) :])
    return argv


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_a_static_controller_is_voter_ordinal_plus_offset_of_every_controller(
    bin_dir: Path,
) -> None:
    argv = run(bin_dir, "controller.sh", "hw-highwater-controller-2", CONTROLLER_QUORUM="static")
    assert argv[0] == "controller"
    assert flag(argv, "--node-id") == "2"
    assert flag(argv, "--listen") == "0.0.0.0:9093"
    assert flag(argv, "--voters") == ",".join(
        f"{i}@{address}" for i, address in enumerate(CONTROLLERS.split(","))
    )
    assert flag(argv, "--data-dir") == "/var/lib/highwater/data"
    assert flag(argv, "--metrics-listen") == "0.0.0.0:9464"
    # Its settings and the cluster defaults: the chart's properties file.
    assert flag(argv, "--config") == "/etc/highwater/controller.properties"
    assert "--cluster-id" not in argv
    argv = run(
        bin_dir, "controller.sh", "hw-highwater-controller-0", CLUSTER_ID="prod-1",
        CONTROLLER_QUORUM="static",
    )  # fmt: skip
    assert flag(argv, "--cluster-id") == "prod-1"


def test_a_single_static_controller_quorum(bin_dir: Path) -> None:
    argv = run(
        bin_dir, "controller.sh", "hw-highwater-controller-0", CONTROLLER_REPLICAS="1",
        CONTROLLER_QUORUM="static",
    )  # fmt: skip
    assert flag(argv, "--voters") == "0@" + CONTROLLERS.split(",")[0]


@pytest.fixture
def dynamic(tmp_path: Path) -> dict[str, str]:
    """A dynamic quorum's environment: an empty data directory, and the answers the first
    controller's ``quorum formed`` gets (none yet: formed)."""
    (tmp_path / "answers").write_text("")
    return {
        "HIGHWATER_DATA_DIR": str(tmp_path / "data"),
        "FORMED_ANSWERS": str(tmp_path / "answers"),
        "FORMED_ASKED": str(tmp_path / "asked"),
    }


def asked(env: dict[str, str]) -> list[str]:
    path = Path(env["FORMED_ASKED"])
    return path.read_text().splitlines() if path.exists() else []


def own_address(ordinal: int) -> str:
    return CONTROLLERS.split(",")[ordinal]


def test_a_dynamic_controller_joins_with_auto_join_announcing_its_pod_address(
    bin_dir: Path, dynamic: dict[str, str]
) -> None:
    argv = run(bin_dir, "controller.sh", "hw-highwater-controller-2", **dynamic)
    assert flag(argv, "--node-id") == "2"
    assert flag(argv, "--listen") == "0.0.0.0:9093"
    assert flag(argv, "--advertised-listener") == own_address(2)
    assert flag(argv, "--bootstrap-controllers") == CONTROLLERS
    overrides = [argv[i + 1] for i, arg in enumerate(argv) if arg == "--override"]
    assert "controller.quorum.auto.join.enable=true" in overrides
    assert "--voters" not in argv and "--initial-controllers" not in argv
    assert flag(argv, "--data-dir") == dynamic["HIGHWATER_DATA_DIR"]
    assert asked(dynamic) == [], "only the first controller asks"


def test_the_first_dynamic_controller_forms_the_quorum_once_every_other_knows_none(
    bin_dir: Path, dynamic: dict[str, str]
) -> None:
    # Not known twice (a controller did not answer), then not formed.
    Path(dynamic["FORMED_ANSWERS"]).write_text("1\n1\n3\n")
    argv = run(bin_dir, "controller.sh", "hw-highwater-controller-0", **dynamic)
    others = ",".join(CONTROLLERS.split(",")[1:])
    assert asked(dynamic) == [f"quorum formed --controllers {others}"] * 3
    initial = flag(argv, "--initial-controllers")
    assert initial.startswith(f"0@{own_address(0)}:")
    uuid.UUID(initial.rsplit(":", 1)[1])  # a new directory id
    assert flag(argv, "--advertised-listener") == own_address(0)
    assert "--bootstrap-controllers" not in argv
    # Formed (its volume was lost): it joins, as every other controller does.
    Path(dynamic["FORMED_ANSWERS"]).write_text("0\n")
    argv = run(bin_dir, "controller.sh", "hw-highwater-controller-0", **dynamic)
    assert flag(argv, "--bootstrap-controllers") == CONTROLLERS
    assert "--initial-controllers" not in argv


def test_a_dynamic_controller_that_holds_the_voters_restarts_without_asking(
    bin_dir: Path, dynamic: dict[str, str]
) -> None:
    metadata = Path(dynamic["HIGHWATER_DATA_DIR"]) / "__cluster_metadata-0"
    metadata.mkdir(parents=True)
    (metadata / "quorum-state").write_text("{}")
    (metadata / "quorum-voters").write_text("{}")
    argv = run(bin_dir, "controller.sh", "hw-highwater-controller-0", **dynamic)
    assert flag(argv, "--bootstrap-controllers") == CONTROLLERS
    assert asked(dynamic) == []


def test_a_single_dynamic_controller_forms_its_quorum_alone(
    bin_dir: Path, dynamic: dict[str, str]
) -> None:
    argv = run(
        bin_dir, "controller.sh", "hw-highwater-controller-0", CONTROLLER_REPLICAS="1", **dynamic
    )
    assert flag(argv, "--initial-controllers").startswith(f"0@{own_address(0)}:")
    assert asked(dynamic) == []


def test_a_static_data_directory_stays_static_under_a_dynamic_controller(
    bin_dir: Path, dynamic: dict[str, str]
) -> None:
    """A release installed before ``controller.quorum`` existed, upgraded: its voters'
    data directories hold a static quorum's state, which cannot become dynamic."""
    metadata = Path(dynamic["HIGHWATER_DATA_DIR"]) / "__cluster_metadata-0"
    metadata.mkdir(parents=True)
    (metadata / "quorum-state").write_text("{}")
    result = start("controller.sh", bin_dir, "hw-highwater-controller-1", **dynamic)
    assert result.returncode == 0, result.stderr
    assert "holds a static quorum's state (--voters), which stays static" in result.stderr
    argv = result.stdout.splitlines()
    assert flag(argv, "--voters") == ",".join(
        f"{i}@{address}" for i, address in enumerate(CONTROLLERS.split(","))
    )
    assert "--bootstrap-controllers" not in argv and asked(dynamic) == []


def test_a_broker_advertises_its_pod_name_and_takes_its_rack(bin_dir: Path, tmp_path: Path) -> None:
    argv = run(bin_dir, "broker.sh", "hw-highwater-broker-11")
    assert argv[0] == "broker"
    assert flag(argv, "--node-id") == "111"
    assert flag(argv, "--advertised-listener") == (
        "hw-highwater-broker-11.hw-highwater-broker-headless.streams.svc.cluster.local:9092"
    )
    assert flag(argv, "--controllers") == CONTROLLERS
    assert flag(argv, "--metrics-listen") == "0.0.0.0:9464"
    assert flag(argv, "--config") == "/etc/highwater/broker.properties"
    assert "--rack" not in argv
    # metrics.enabled false: the ConfigMap's METRICS_PORT is empty, no endpoint.
    assert "--metrics-listen" not in run(
        bin_dir, "broker.sh", "hw-highwater-broker-0", METRICS_PORT=""
    )


def test_a_broker_serves_kafkas_protocol_only_when_the_chart_enables_it(bin_dir: Path) -> None:
    argv = run(bin_dir, "broker.sh", "hw-highwater-broker-2", BROKER_KAFKA_PORT="9095")
    assert flag(argv, "--kafka-listen") == "PLAINTEXT://0.0.0.0:9095"
    secured = run(
        bin_dir,
        "broker.sh",
        "hw-highwater-broker-2",
        BROKER_KAFKA_PORT="9095",
        BROKER_KAFKA_SECURITY_PROTOCOL="SASL_SSL",
    )
    assert flag(secured, "--kafka-listen") == "SASL_SSL://0.0.0.0:9095"
    assert flag(argv, "--kafka-advertised-listener") == (
        "hw-highwater-broker-2.hw-highwater-broker-headless.streams.svc.cluster.local:9095"
    )
    assert flag(argv, "--listen") == "0.0.0.0:9092"
    assert "--kafka-listen" not in run(bin_dir, "broker.sh", "hw-highwater-broker-2")
    assert "--kafka-listen" not in run(
        bin_dir, "broker.sh", "hw-highwater-broker-2", BROKER_KAFKA_PORT=""
    )


def test_the_broker_gates_ask_the_local_broker(bin_dir: Path) -> None:
    argv = run(bin_dir, "broker-gate.sh", "hw-highwater-broker-1", "ready")
    assert argv == ["rolling", "ready", "--node-id", "101", "--bootstrap-server", "127.0.0.1:9092"]
    argv = run(bin_dir, "broker-gate.sh", "hw-highwater-broker-1", "pre-stop")
    assert argv[:2] == ["rolling", "pre-stop"]
    assert flag(argv, "--timeout") == "240"
    assert flag(argv, "--node-id") == "101"


def test_a_coordinator_listens_on_its_pod_ip(bin_dir: Path) -> None:
    argv = run(bin_dir, "coordinator.sh", "hw-highwater-coordinator-1")
    assert argv[0] == "coordinator"
    assert flag(argv, "--node-id") == "201"
    assert flag(argv, "--listen") == "10.1.2.3:9094"
    assert flag(argv, "--controllers") == CONTROLLERS
    assert flag(argv, "--config") == "/etc/highwater/coordinator.properties"
    assert flag(argv, "--metrics-listen") == "0.0.0.0:9464"


def test_a_broker_with_a_rack_file_passes_it(bin_dir: Path, tmp_path: Path) -> None:
    # the script reads /var/run/highwater/rack; run a copy that reads a file of the test's
    scripts = tmp_path / "scripts"
    shutil.copytree(FILES, scripts)
    rack = tmp_path / "rack"
    rack.write_text("europe-west4-b")
    broker = scripts / "broker.sh"
    broker.write_text(broker.read_text().replace("/var/run/highwater/rack", str(rack)))
    dash = tool("dash")
    result = subprocess.run(
        [dash, str(broker)],
        env={
            "PATH": f"{bin_dir}:/usr/bin:/bin",
            "POD_NAME": "hw-highwater-broker-0",
            **ENVIRONMENT,
        },
        capture_output=True,
        text=True,
        check=True,
    )
    argv = result.stdout.splitlines()
    assert flag(argv, "--rack") == "europe-west4-b"


def test_in_the_etcd_metadata_mode_brokers_and_coordinators_use_the_store(bin_dir: Path) -> None:
    store = "etcd://etcd-0.etcd:2379,etcd-1.etcd:2379/hw"
    for script, pod in (
        ("broker.sh", "hw-highwater-broker-0"),
        ("coordinator.sh", "hw-highwater-coordinator-0"),
    ):
        argv = run(bin_dir, script, pod, METADATA_STORE=store)
        assert flag(argv, "--metadata-store") == store
        assert "--controllers" not in argv
        assert "--etcd-ca-file" not in argv


def test_over_tls_to_etcd_brokers_and_coordinators_pass_the_etcd_files(bin_dir: Path) -> None:
    store = "https://etcd-0.etcd:2379/hw"
    files = {
        "ETCD_CA_FILE": "/etc/highwater-etcd-tls/ca.crt",
        "ETCD_CERT_FILE": "/etc/highwater-etcd-tls/tls.crt",
        "ETCD_KEY_FILE": "/etc/highwater-etcd-tls/tls.key",
    }
    for script, pod in (
        ("broker.sh", "hw-highwater-broker-0"),
        ("coordinator.sh", "hw-highwater-coordinator-0"),
    ):
        argv = run(bin_dir, script, pod, METADATA_STORE=store, **files)
        assert flag(argv, "--metadata-store") == store
        assert flag(argv, "--etcd-ca-file") == files["ETCD_CA_FILE"]
        assert flag(argv, "--etcd-cert-file") == files["ETCD_CERT_FILE"]
        assert flag(argv, "--etcd-key-file") == files["ETCD_KEY_FILE"]
