"""``highwater dev-cluster``: a real multi-process cluster on loopback, for development.

It starts ``--controllers`` controller processes (a Raft quorum), ``--brokers`` broker
processes and ``--coordinators`` group coordinator processes, each with its own data
directory and log file under ``--data-dir``, waits until every broker and coordinator is
registered, prints the bootstrap address (any broker: it answers Metadata and
FindCoordinator and forwards admin calls), and runs until SIGINT or SIGTERM; then it stops
every process it started — coordinators first, then brokers (controlled shutdowns), then
the controllers — and kills any that do not stop in time. The coordinators start a
group's first rebalance at once (``group.initial.rebalance.delay.ms`` 0, as Kafka's
development configuration does).

With ``--secure`` the cluster is secured as production would be: a throwaway CA
(``highwater.security.certificate_authority``, under ``<data dir>/pki``) gives every
process its own certificate (``CN=controller-1``, ``CN=broker-100``, ...), every port and
every call between services uses mutual TLS, the ACL checks are on with the services and
``User:admin`` as super users (deny by default), and SCRAM-SHA-256/512 logins are offered.
The command writes ``<data dir>/admin.properties``, the client settings of the admin (a
certificate ``CN=admin``) for ``--command-config`` and the client library, and prints its
path.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import IO

import click
import grpc

from highwater.rpc.channels import open_blocking_channel
from highwater.rpc.tls import ClientTls
from highwater.security.certificate_authority import secure_server_args, write_cluster_pki
from highwater.v1 import broker_pb2, broker_pb2_grpc

FIRST_BROKER_ID = 100
FIRST_COORDINATOR_ID = 200
STOP_TIMEOUT_S = 20


@dataclass
class _Child:
    name: str
    args: list[str]
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    log: IO[bytes] | None = None

    def start(self) -> None:
        self.log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "highwater", "--log-level", "INFO", *self.args],
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C reaches this command only: it stops them in order
        )

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        process = self.process
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self.log is not None:
            self.log.close()
            self.log = None


def _free_ports(count: int) -> list[int]:
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _registered(address: str, tls: ClientTls | None = None) -> tuple[int, int]:
    """How many brokers and coordinators the broker at ``address`` knows are registered."""
    try:
        with open_blocking_channel(address, tls=tls) as channel:
            reply = broker_pb2_grpc.BrokerStub(channel).Metadata(
                broker_pb2.MetadataRequest(topics=["__no_such_topic__"]), timeout=2
            )
    except grpc.RpcError:
        return 0, 0
    return len(reply.brokers), len(reply.coordinators)


class _Stop(Exception):
    """SIGINT or SIGTERM arrived."""


def _raise_stop(_signum: int, _frame: FrameType | None) -> None:
    raise _Stop()


@click.command("dev-cluster")
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="Where every process keeps its data directory and log file.",
)
@click.option("--controllers", type=click.IntRange(1, 9), default=3, show_default=True)
@click.option("--brokers", type=click.IntRange(1, 20), default=3, show_default=True)
@click.option("--coordinators", type=click.IntRange(0, 9), default=2, show_default=True)
@click.option(
    "--start-timeout", type=click.FloatRange(min=1), default=60, show_default=True, help="s"
)
@click.option(
    "--secure",
    is_flag=True,
    help="Mutual TLS everywhere from a throwaway CA, ACLs on (deny by default), SCRAM "
    "logins; writes the admin's client properties file.",
)
def dev_cluster(
    data_dir: Path,
    controllers: int,
    brokers: int,
    coordinators: int,
    start_timeout: float,
    secure: bool,
) -> None:
    """Run a cluster of controller, broker and coordinator processes on loopback until Ctrl-C."""
    data_dir.mkdir(parents=True, exist_ok=True)
    ports = _free_ports(controllers + brokers + coordinators)
    controller_ports = ports[:controllers]
    broker_ports = ports[controllers : controllers + brokers]
    coordinator_ports = ports[controllers + brokers :]
    voters = ",".join(f"{i + 1}@127.0.0.1:{port}" for i, port in enumerate(controller_ports))
    controller_addresses = ",".join(f"127.0.0.1:{port}" for port in controller_ports)
    children = (
        [
            _Child(
                f"controller {i + 1}",
                [
                    "controller",
                    "--node-id",
                    str(i + 1),
                    "--listen",
                    f"127.0.0.1:{port}",
                    "--voters",
                    voters,
                    "--data-dir",
                    str(data_dir / f"controller-{i + 1}"),
                    "--offsets-topic-replication-factor",
                    str(min(3, brokers)),
                ],
                data_dir / f"controller-{i + 1}.log",
            )
            for i, port in enumerate(controller_ports)
        ]
        + [
            _Child(
                f"broker {FIRST_BROKER_ID + i}",
                [
                    "broker",
                    "--node-id",
                    str(FIRST_BROKER_ID + i),
                    "--listen",
                    f"127.0.0.1:{port}",
                    "--controllers",
                    controller_addresses,
                    "--data-dir",
                    str(data_dir / f"broker-{FIRST_BROKER_ID + i}"),
                ],
                data_dir / f"broker-{FIRST_BROKER_ID + i}.log",
            )
            for i, port in enumerate(broker_ports)
        ]
        + [
            _Child(
                f"coordinator {FIRST_COORDINATOR_ID + i}",
                [
                    "coordinator",
                    "--node-id",
                    str(FIRST_COORDINATOR_ID + i),
                    "--listen",
                    f"127.0.0.1:{port}",
                    "--controllers",
                    controller_addresses,
                    "--data-dir",
                    str(data_dir / f"coordinator-{FIRST_COORDINATOR_ID + i}"),
                    "--group-initial-rebalance-delay-ms",
                    "0",
                ],
                data_dir / f"coordinator-{FIRST_COORDINATOR_ID + i}.log",
            )
            for i, port in enumerate(coordinator_ports)
        ]
    )
    bootstrap = ",".join(f"127.0.0.1:{port}" for port in broker_ports)
    admin_tls: ClientTls | None = None
    properties: Path | None = None
    if secure:
        admin_tls, properties = _secure(data_dir, children)
    previous = {s: signal.signal(s, _raise_stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        for child in children:
            child.start()
            assert child.process is not None
            click.echo(f"started {child.name} (pid {child.process.pid}), log {child.log_path}")
        deadline = time.monotonic() + start_timeout
        while _registered(f"127.0.0.1:{broker_ports[0]}", admin_tls) < (brokers, coordinators):
            dead = [child.name for child in children if not child.alive()]
            if dead:
                raise click.ClickException(f"{', '.join(dead)} exited; see its log")
            if time.monotonic() > deadline:
                raise click.ClickException(
                    "the brokers and coordinators did not all register in time"
                )
            time.sleep(0.2)
        click.echo(f"controllers: {controller_addresses}")
        click.echo(f"bootstrap: {bootstrap}")
        if properties is not None:
            click.echo(f"client properties: {properties} (User:admin, a super user)")
            click.echo(
                f"  e.g. highwater users create --bootstrap-server {bootstrap.split(',')[0]} "
                f"--command-config {properties} --user alice"
            )
        click.echo("running; Ctrl-C stops every process")
        while all(child.alive() for child in children):
            time.sleep(0.5)
        dead = [child.name for child in children if not child.alive()]
        raise click.ClickException(f"{', '.join(dead)} exited; see its log")
    except _Stop:
        click.echo("stopping")
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        for child in reversed(children):  # coordinators, brokers, then the controllers
            child.stop()


def _secure(data_dir: Path, children: list[_Child]) -> tuple[ClientTls, Path]:
    """Give every child a certificate of a new CA and the security flags; the admin's
    client TLS and its properties file."""
    names = [child.name.replace(" ", "-") for child in children]
    pki = write_cluster_pki(data_dir / "pki", dict.fromkeys(names, ()))
    for child, name in zip(children, names, strict=True):
        child.args += secure_server_args(pki, name, names)
    cert, key = pki.files("admin")
    properties = data_dir / "admin.properties"
    properties.write_text(
        "security.protocol=SSL\n"
        f"ssl.ca.location={pki.ca_file}\n"
        f"ssl.certificate.location={cert}\n"
        f"ssl.key.location={key}\n"
    )
    return ClientTls(pki.ca_file, cert, key), properties
