"""``highwater dev-cluster``: a real multi-process cluster on loopback, for development.

With ``--metadata-store etcd`` it starts an etcd (Debian's ``etcd-server``) instead of the
controllers, and brokers and coordinators in the etcd metadata mode (docs/etcd-mode.md):
every broker runs a controller candidate; etcd stops last.

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
from highwater.rpc.endpoints import free_loopback_ports
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
    program: tuple[str, ...] = ()
    """What runs ``args``; empty: ``python -m highwater --log-level INFO``."""

    def start(self) -> None:
        self.log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        program = self.program or (sys.executable, "-m", "highwater", "--log-level", "INFO")
        self.process = subprocess.Popen(
            [*program, *self.args],
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
    "--metadata-store",
    type=click.Choice(["kraft", "etcd"]),
    default="kraft",
    show_default=True,
    help="kraft: a controller quorum holds the metadata; etcd: an etcd started for the "
    "cluster does, and a controller candidate runs in every broker (docs/etcd-mode.md).",
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
    metadata_store: str,
    secure: bool,
) -> None:
    """Run a cluster of controller, broker and coordinator processes on loopback until Ctrl-C."""
    data_dir.mkdir(parents=True, exist_ok=True)
    if metadata_store == "etcd":
        if secure:
            raise click.UsageError("--secure is not offered with --metadata-store etcd yet")
        _etcd_cluster(data_dir, brokers, coordinators, start_timeout)
        return
    ports = free_loopback_ports(controllers + brokers + coordinators)
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


def _wait_listening(port: int, deadline: float, child: _Child) -> None:
    while True:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        if not child.alive():
            raise click.ClickException(f"{child.name} exited; see its log")
        if time.monotonic() > deadline:
            raise click.ClickException(f"{child.name} did not listen on port {port} in time")
        time.sleep(0.1)


def _etcd_cluster(data_dir: Path, brokers: int, coordinators: int, start_timeout: float) -> None:
    """The etcd metadata mode: one etcd (Debian's etcd-server) under ``<data dir>/etcd``,
    brokers each running a controller candidate, and coordinators, all pointed at it."""
    etcd_port, peer_port, *ports = free_loopback_ports(2 + brokers + coordinators)
    broker_ports, coordinator_ports = ports[:brokers], ports[brokers:]
    store = f"etcd://127.0.0.1:{etcd_port}/dev"
    client_url, peer_url = f"http://127.0.0.1:{etcd_port}", f"http://127.0.0.1:{peer_port}"
    etcd = _Child(
        "etcd",
        [
            "--name=dev",
            f"--data-dir={data_dir / 'etcd'}",
            f"--listen-client-urls={client_url}",
            f"--advertise-client-urls={client_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=dev={peer_url}",
        ],
        data_dir / "etcd.log",
        program=("etcd",),
    )
    children = [
        _Child(
            f"broker {FIRST_BROKER_ID + i}",
            [
                "broker",
                "--node-id",
                str(FIRST_BROKER_ID + i),
                "--listen",
                f"127.0.0.1:{port}",
                "--metadata-store",
                store,
                "--data-dir",
                str(data_dir / f"broker-{FIRST_BROKER_ID + i}"),
            ],
            data_dir / f"broker-{FIRST_BROKER_ID + i}.log",
        )
        for i, port in enumerate(broker_ports)
    ] + [
        _Child(
            f"coordinator {FIRST_COORDINATOR_ID + i}",
            [
                "coordinator",
                "--node-id",
                str(FIRST_COORDINATOR_ID + i),
                "--listen",
                f"127.0.0.1:{port}",
                "--metadata-store",
                store,
                "--group-initial-rebalance-delay-ms",
                "0",
            ],
            data_dir / f"coordinator-{FIRST_COORDINATOR_ID + i}.log",
        )
        for i, port in enumerate(coordinator_ports)
    ]
    bootstrap = ",".join(f"127.0.0.1:{port}" for port in broker_ports)
    previous = {s: signal.signal(s, _raise_stop) for s in (signal.SIGINT, signal.SIGTERM)}
    started = [etcd]
    try:
        etcd.start()
        deadline = time.monotonic() + start_timeout
        _wait_listening(etcd_port, deadline, etcd)
        click.echo(f"started etcd at 127.0.0.1:{etcd_port}, log {etcd.log_path}")
        for child in children:
            child.start()
            started.append(child)
            assert child.process is not None
            click.echo(f"started {child.name} (pid {child.process.pid}), log {child.log_path}")
        while _registered(f"127.0.0.1:{broker_ports[0]}") < (brokers, coordinators):
            dead = [child.name for child in started if not child.alive()]
            if dead:
                raise click.ClickException(f"{', '.join(dead)} exited; see its log")
            if time.monotonic() > deadline:
                raise click.ClickException(
                    "the brokers and coordinators did not all register in time"
                )
            time.sleep(0.2)
        click.echo(f"metadata store: {store}")
        click.echo(f"bootstrap: {bootstrap}")
        click.echo("running; Ctrl-C stops every process")
        while all(child.alive() for child in started):
            time.sleep(0.5)
        dead = [child.name for child in started if not child.alive()]
        raise click.ClickException(f"{', '.join(dead)} exited; see its log")
    except _Stop:
        click.echo("stopping")
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        for child in reversed(started):  # coordinators, brokers, then etcd
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
