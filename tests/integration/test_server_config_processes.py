"""Server configuration over real processes: ``--config FILE`` and ``--override KEY=VALUE``
on every role, cluster defaults that topic creation uses, ``highwater configs`` and
``highwater cluster describe`` as an operator types them.

Every server and every command is a ``python -m highwater`` process on loopback.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from broker_processes import BrokerProcess
from click.testing import CliRunner
from highwater.cli.main import main
from highwater.rpc.endpoints import free_loopback_ports
from quorum_processes import Controller

pytestmark = pytest.mark.timeout(180)


def highwater(*args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    """``highwater ARGS...`` as a process; its exit status and output."""
    return subprocess.run(
        [sys.executable, "-m", "highwater", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
        check=False,
    )


def in_process(*args: str) -> subprocess.CompletedProcess[str]:
    """``highwater ARGS...`` run by click's test runner in this process: the exit status
    and the stdout and stderr a process would give, for commands refused before they start."""
    result = CliRunner().invoke(main, list(args))
    return subprocess.CompletedProcess(list(args), result.exit_code, result.stdout, result.stderr)


def until_ok(*args: str, timeout_s: float = 60) -> str:
    """Run ``highwater ARGS...`` until it succeeds (the cluster is still starting); stdout."""
    deadline = time.monotonic() + timeout_s
    while True:
        done = highwater(*args)
        if done.returncode == 0:
            return done.stdout
        if time.monotonic() > deadline:
            raise AssertionError(f"highwater {' '.join(args)}: {done.stderr or done.stdout}")
        time.sleep(0.3)


def partition_count(bootstrap: str, topic: str) -> tuple[int, int]:
    """(PartitionCount, ReplicationFactor) as ``topics describe`` prints them."""
    header = until_ok("topics", "describe", "--topic", topic, "--bootstrap-server", bootstrap)
    fields = dict(f.split(": ", 1) for f in header.splitlines()[0].split("\t"))
    return int(fields["PartitionCount"]), int(fields["ReplicationFactor"])


def one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    """The one ``Error: ...`` line of a command that was refused; asserts exit status 1."""
    assert done.returncode == 1, (done.returncode, done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), done.stderr
    return lines[0]


# --- The embedded server ------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``highwater server --config FILE`` with num.partitions=4; its address."""
    root = tmp_path_factory.mktemp("server-config")
    config = root / "server.properties"
    config.write_text(
        "# cluster defaults\nnum.partitions=4\nlog.retention.hours=2\nbroker.rack=rack-a\n"
    )
    (port,) = free_loopback_ports(1)
    address = f"127.0.0.1:{port}"
    with open(root / "server.log", "wb") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "highwater",
                "server",
                "--listen",
                address,
                "--data-dir",
                str(root / "data"),
                "--config",
                str(config),
                "--override",
                "log.retention.ms=60000",
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
        )
        try:
            yield address
        finally:
            process.terminate()
            process.wait(30)


def test_topics_take_the_file_defaults(server: str) -> None:
    until_ok("topics", "create", "--topic", "defaults", "--bootstrap-server", server)
    assert partition_count(server, "defaults") == (4, 1)
    described = until_ok(
        "configs", "--bootstrap-server", server, "--entity-type", "topics",
        "--entity-name", "defaults", "--describe", "--all",
    )  # fmt: skip
    assert described.splitlines()[0] == "All configs for topic defaults are:"
    # log.retention.ms (an override) wins over log.retention.hours (the file).
    assert (
        "  retention.ms=60000 sensitive=false synonyms={STATIC_BROKER_CONFIG:retention.ms=60000}"
        in described.splitlines()
    )


def test_a_dynamic_cluster_default_beats_the_file(server: str) -> None:
    base = ["configs", "--bootstrap-server", server, "--entity-type", "brokers"]
    altered = until_ok(
        *base,
        "--entity-default",
        "--alter",
        "--add-config",
        "num.partitions=2,log.cleanup.policy=[compact,delete]",
    )
    assert altered.startswith("Completed updating config")
    until_ok("topics", "create", "--topic", "dynamic", "--bootstrap-server", server)
    assert partition_count(server, "dynamic") == (2, 1)
    default = until_ok(*base, "--entity-default", "--describe").splitlines()
    assert (
        "  num.partitions=2 sensitive=false "
        "synonyms={DYNAMIC_DEFAULT_BROKER_CONFIG:num.partitions=2}" in default
    )
    everything = until_ok(*base, "--entity-name", "1", "--describe", "--all").splitlines()
    assert any(
        line.startswith("  log.retention.hours=2 ") and "STATIC_BROKER_CONFIG" in line
        for line in everything
    )
    assert any(
        line.startswith("  default.replication.factor=1 ") and "DEFAULT_CONFIG" in line
        for line in everything
    )
    until_ok(
        *base, "--entity-default", "--alter", "--delete-config", "num.partitions,log.cleanup.policy"
    )
    until_ok("topics", "create", "--topic", "back", "--bootstrap-server", server)
    assert partition_count(server, "back") == (4, 1)
    # Per broker, a cluster-wide key is refused naming the way to set it.
    refused = one_error_line(
        highwater(*base, "--entity-name", "1", "--alter", "--add-config", "num.partitions=3")
    )
    assert "num.partitions" in refused and "--entity-default" in refused
    bad = one_error_line(
        highwater(*base, "--entity-default", "--alter", "--add-config", "num.partition=3")
    )
    assert "num.partition" in bad
    # Quota entities: a bad value is refused naming the key (tests/cli/test_cli_quotas.py
    # covers the rest).
    quota = one_error_line(
        highwater(
            "configs",
            "--bootstrap-server",
            server,
            "--entity-type",
            "users",
            "--entity-name",
            "u",
            "--alter",
            "--add-config",
            "producer_byte_rate=-1",
        )
    )
    assert "producer_byte_rate" in quota


def test_min_insync_replicas_above_the_replication_factor_is_refused(server: str) -> None:
    refused = one_error_line(
        highwater(
            "topics", "create", "--topic", "too-safe", "--config", "min.insync.replicas=2",
            "--bootstrap-server", server,
        )
    )  # fmt: skip
    assert "min.insync.replicas" in refused and "replication factor 1" in refused
    until_ok("topics", "create", "--topic", "safe", "--bootstrap-server", server)
    altered = one_error_line(
        highwater(
            "configs", "--bootstrap-server", server, "--entity-type", "topics",
            "--entity-name", "safe", "--alter", "--add-config", "min.insync.replicas=3",
        )
    )  # fmt: skip
    assert "min.insync.replicas" in altered


def test_cluster_describe(server: str) -> None:
    lines = until_ok("cluster", "describe", "--bootstrap-server", server).splitlines()
    assert lines[0].startswith("ClusterId: ") and len(lines[0]) > len("ClusterId: ")
    assert lines[1] == "ControllerId: 1"
    assert lines[2] == "MetadataMode: kraft"
    assert lines[3] == f"Broker: 1\tHost: 127.0.0.1\tPort: {server.rsplit(':', 1)[1]}\tRack: rack-a"


# --- Bad configurations stop every role before it starts -------------------------------


@pytest.mark.parametrize(
    "role",
    [
        ["server", "--listen", "127.0.0.1:{port}", "--data-dir", "{dir}"],
        ["controller", "--node-id", "1", "--listen", "127.0.0.1:{port}",
         "--voters", "1@127.0.0.1:{port}", "--data-dir", "{dir}"],
        ["broker", "--node-id", "1", "--listen", "127.0.0.1:{port}",
         "--controllers", "127.0.0.1:{port}", "--data-dir", "{dir}"],
        ["coordinator", "--node-id", "1", "--listen", "127.0.0.1:{port}",
         "--controllers", "127.0.0.1:{port}"],
    ],
    ids=lambda role: role[0],
)  # fmt: skip
def test_unknown_keys_and_bad_values_stop_every_role(tmp_path: Path, role: list[str]) -> None:
    """The typo as a real process (its exit status and stderr); the other refusals, which
    take the same path, through click's test runner in this process (no start-up to pay)."""
    (port,) = free_loopback_ports(1)
    command = [arg.format(port=port, dir=tmp_path / "data") for arg in role]
    config = tmp_path / "server.properties"
    config.write_text("num.partitions=3\ndefault.replicaton.factor=3\n")
    typo = one_error_line(highwater(*command, "--config", str(config), timeout_s=30))
    assert "'default.replicaton.factor'" in typo and "default.replication.factor" in typo
    config.write_text("num.partitions=3\n")
    bad = one_error_line(
        in_process(*command, "--config", str(config), "--override", "min.insync.replicas=none")
    )
    assert "min.insync.replicas" in bad and "'none'" in bad
    missing = one_error_line(in_process(*command, "--config", str(tmp_path / "absent.properties")))
    assert "absent.properties" in missing
    assert not (tmp_path / "data").exists()  # refused before anything was written


# --- A cluster of processes: controller defaults, broker settings, flags ---------------


def test_a_cluster_takes_the_controllers_defaults(tmp_path: Path) -> None:
    controller_port, *broker_ports = free_loopback_ports(4)
    controller_config = tmp_path / "controller.properties"
    controller_config.write_text(
        "default.replication.factor=3\nmin.insync.replicas=2\nnum.partitions=4\n"
        "offsets.topic.replication.factor=3\n"
    )
    broker_config = tmp_path / "broker.properties"
    broker_config.write_text("broker.rack=from-file\nreplica.lag.time.max.ms=10000\n")
    controller = Controller(
        1,
        controller_port,
        f"1@127.0.0.1:{controller_port}",
        tmp_path / "controller",
        tmp_path / "controller.log",
        extra_args=("--config", str(controller_config), "--override", "num.partitions=2"),
    )
    brokers = [
        BrokerProcess(
            node_id,
            port,
            controller.address,
            tmp_path / f"broker-{node_id}",
            tmp_path / f"broker-{node_id}.log",
            extra_args=("--config", str(broker_config))
            + (("--rack", "from-flag") if node_id == 13 else ()),
        )
        for node_id, port in zip((11, 12, 13), broker_ports, strict=True)
    ]
    controller.start()
    try:
        for broker in brokers:
            broker.start()
        bootstrap = brokers[0].address
        described = until_ok("cluster", "describe", "--bootstrap-server", bootstrap)
        deadline = time.monotonic() + 60
        while described.count("Broker: ") < 3 and time.monotonic() < deadline:
            time.sleep(0.3)
            described = until_ok("cluster", "describe", "--bootstrap-server", bootstrap)
        lines = described.splitlines()
        assert lines[1:3] == ["ControllerId: 1", "MetadataMode: kraft"]
        racks = {line.split("\t")[0]: line.rsplit("Rack: ", 1)[1] for line in lines[3:]}
        assert racks == {
            "Broker: 11": "from-file",
            "Broker: 12": "from-file",
            "Broker: 13": "from-flag",
        }
        until_ok("topics", "create", "--topic", "replicated", "--bootstrap-server", bootstrap)
        # The override (2) beats the file (4); the file's replication factor is used.
        assert partition_count(bootstrap, "replicated") == (2, 3)
        refused = one_error_line(
            highwater(
                "topics", "create", "--topic", "thin", "--replication-factor", "1",
                "--bootstrap-server", bootstrap,
            )
        )  # fmt: skip
        assert "min.insync.replicas (the cluster default)" in refused
    finally:
        for broker in brokers:
            broker.reap()
        controller.reap()
