"""The cluster under test: controller, broker and coordinator processes the harness starts,
signals by PID (kill -9, SIGSTOP/SIGCONT, restart) and always stops.

Two network modes (:mod:`highwater.chaos.network`): on loopback every process listens on
127.0.0.1 with its own port; in network namespaces every process runs in a namespace of
its own, reachable at an address inside it, so links between processes can be cut.

Two quorum modes: ``static`` (``--voters``, a fixed set) and ``dynamic`` (KIP-853), set up
as the Helm chart's ``controller.quorum: dynamic`` does it: the first controller forms the
quorum alone (``--initial-controllers`` with its own key), every other one starts with
``--bootstrap-controllers`` and auto-join and becomes a voter by itself, and every restart
of any controller, the first one's too, is such a start. A controller whose data directory
was deleted (the ``wipe`` fault) therefore comes back as a new incarnation that removes its
former key and adds itself, with no command run. A broker whose data directory was deleted
comes back with empty replicas, registers as after an unclean shutdown, and fetches them
again from the leaders before it rejoins their ISRs.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import grpc

from highwater.chaos.network import Network
from highwater.internal.v1 import raft_pb2, raft_pb2_grpc
from highwater.raft.voter_set import DIRECTORY_ID_FILE
from highwater.records import iter_batches
from highwater.rpc import tls
from highwater.rpc.channels import open_blocking_channel
from highwater.rpc.tls import ClientTls
from highwater.security.certificate_authority import secure_server_args, write_cluster_pki
from highwater.v1 import broker_pb2, broker_pb2_grpc
from highwater.v1.common_pb2 import ErrorCode

FIRST_BROKER_ID = 100
FIRST_COORDINATOR_ID = 200
STOP_TIMEOUT_S = 15.0
#: Followers that lag this long leave the ISR (Kafka's default is 30 s; a chaos run is short).
REPLICA_LAG_TIME_MAX_MS = 10_000
QUORUM_MODES = ("static", "dynamic")
#: A dynamic quorum's joining controller looks for its quorum this long before it gives up
#: (the chart's setting: a controller that cannot reach the others keeps waiting).
BOOTSTRAP_TIMEOUT_MS = 3_600_000


class ClusterStartError(RuntimeError):
    """The cluster did not come up (a process exited while starting, or the brokers and
    coordinators did not register in time: a machine too loaded): the run has nothing
    to check, and a campaign goes on with its next seed."""


@dataclass
class ChaosProcess:
    """One process of the cluster, by name (``controller-1``, ``broker-100``, ...)."""

    name: str
    role: str
    node_id: int
    address: str
    args: list[str]
    data_dir: Path
    log_path: Path
    network: Network
    restart_args: list[str] | None = None
    """The arguments of every start after the first, when they differ from ``args`` (the
    dynamic quorum's first controller forms it once, then restarts as the others start)."""
    process: subprocess.Popen[bytes] | None = None
    paused: bool = False
    starts: int = 0
    _log: IO[bytes] | None = field(default=None, repr=False)

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def pid(self) -> int:
        if self.process is None:
            raise RuntimeError(f"{self.name} was never started")
        return self.process.pid

    def start(self) -> None:
        if self.alive:
            raise RuntimeError(f"{self.name} is already running")
        self.reap()
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in reap()
        args = self.args if self.starts == 0 or self.restart_args is None else self.restart_args
        command = [sys.executable, "-m", "highwater", "--log-level", "INFO", *args]
        self.process = subprocess.Popen(
            self.network.wrap(self.name, command),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
            start_new_session=True,
        )
        self.paused = False
        self.starts += 1

    def signal(self, signum: int) -> None:
        """Send ``signum`` to this process (by the PID the harness started it with)."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signum)

    def kill(self) -> None:
        """SIGKILL: no controlled shutdown, no flush."""
        self.signal(signal.SIGKILL)
        self.reap()

    def wipe(self) -> str | None:
        """SIGKILL, then delete the data directory, as a lost volume would: the next start
        begins empty (a controller's as a new incarnation, with a new directory id). The
        directory id it had, if any."""
        self.kill()
        directory_id = self.directory_id()
        shutil.rmtree(self.data_dir, ignore_errors=True)
        return directory_id

    def directory_id(self) -> str | None:
        """The id in the data directory's ``directory-id`` file (a controller of a dynamic
        quorum), or None when there is none yet."""
        try:
            return (self.data_dir / DIRECTORY_ID_FILE).read_text().strip()
        except FileNotFoundError:
            return None

    def pause(self) -> None:
        self.signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        self.signal(signal.SIGCONT)
        self.paused = False

    def stop(self) -> None:
        """SIGCONT (if paused), SIGTERM, then SIGKILL if it does not exit in time."""
        if self.process is not None and self.process.poll() is None:
            self.resume()
            self.signal(signal.SIGTERM)
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
        self.reap()

    def reap(self) -> None:
        process = self.process
        if process is not None:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(10)
        if self._log is not None:
            self._log.close()
            self._log = None


class Cluster:
    """Controllers, brokers and coordinators, each with a data directory and log file under
    ``base_dir``; :meth:`stop` stops every process started, whatever state it is in."""

    def __init__(
        self,
        base_dir: Path,
        network: Network,
        *,
        controllers: int = 1,
        brokers: int = 3,
        coordinators: int = 1,
        secure: bool = False,
        quorum: str = "static",
    ) -> None:
        """``secure``: mutual TLS between every process and with the harness, the ACL checks
        on (the services and the harness's ``User:admin`` are super users), SCRAM logins;
        the certificates of a throwaway CA under ``<base_dir>/pki``. ``quorum``: the
        controllers' quorum mode (the module docstring)."""
        if quorum not in QUORUM_MODES:
            raise ValueError(f"quorum mode {quorum!r}: one of {', '.join(QUORUM_MODES)}")
        self.base_dir = base_dir
        self.network = network
        self.quorum = quorum
        base_dir.mkdir(parents=True, exist_ok=True)
        names = (
            [f"controller-{i + 1}" for i in range(controllers)]
            + [f"broker-{FIRST_BROKER_ID + i}" for i in range(brokers)]
            + [f"coordinator-{FIRST_COORDINATOR_ID + i}" for i in range(coordinators)]
        )
        addresses = network.assign(names)
        voters = ",".join(f"{i + 1}@{addresses[f'controller-{i + 1}']}" for i in range(controllers))
        controller_addresses = ",".join(
            addresses[f"controller-{i + 1}"] for i in range(controllers)
        )
        self.processes: dict[str, ChaosProcess] = {}
        self.admin_tls: ClientTls | None = None
        pki = None
        if secure:
            pki = write_cluster_pki(
                base_dir / "pki",
                {name: [addresses[name].rpartition(":")[0]] for name in names},
            )
            self.admin_tls = ClientTls(pki.ca_file, *pki.files("admin"))
        for name in names:
            role, _, number = name.partition("-")
            node_id = int(number)
            data_dir = base_dir / name
            restart_args = None
            if role == "controller":
                args = [
                    "controller",
                    "--node-id",
                    str(node_id),
                    "--listen",
                    addresses[name],
                    "--data-dir",
                    str(data_dir),
                    "--offsets-topic-replication-factor",
                    str(min(3, brokers)),
                ]
                if quorum == "static":
                    args += ["--voters", voters]
                else:
                    joining = [
                        *args,
                        *("--bootstrap-controllers", controller_addresses),
                        *("--override", "controller.quorum.auto.join.enable=true"),
                        *(
                            "--override",
                            f"controller.quorum.bootstrap.timeout.ms={BOOTSTRAP_TIMEOUT_MS}",
                        ),
                    ]
                    if node_id == 1:
                        own_key = f"1@{addresses[name]}:{uuid.uuid4()}"
                        args += ["--initial-controllers", own_key]
                        restart_args = joining
                    else:
                        args = joining
            elif role == "broker":
                args = [
                    "broker",
                    "--node-id",
                    str(node_id),
                    "--listen",
                    addresses[name],
                    "--controllers",
                    controller_addresses,
                    "--data-dir",
                    str(data_dir),
                    "--replica-lag-time-max-ms",
                    str(REPLICA_LAG_TIME_MAX_MS),
                    # Kafka's wire protocol too, for the fuzzer (docs/kafka-protocol.md).
                    "--kafka-listen",
                    network.second_address(name, addresses[name]),
                ]
            else:
                args = [
                    "coordinator",
                    "--node-id",
                    str(node_id),
                    "--listen",
                    addresses[name],
                    "--controllers",
                    controller_addresses,
                    "--data-dir",
                    str(data_dir),
                    "--group-initial-rebalance-delay-ms",
                    "0",
                ]
            if pki is not None:
                args += secure_server_args(pki, name, names)
                if restart_args is not None:
                    restart_args += secure_server_args(pki, name, names)
            self.processes[name] = ChaosProcess(
                name,
                role,
                node_id,
                addresses[name],
                args,
                data_dir,
                base_dir / f"{name}.log",
                network,
                restart_args,
            )

    def by_role(self, role: str) -> list[ChaosProcess]:
        return [p for p in self.processes.values() if p.role == role]

    @property
    def brokers(self) -> list[ChaosProcess]:
        return self.by_role("broker")

    @property
    def kafka_listeners(self) -> dict[str, str]:
        """Each broker's Kafka listener (process name -> HOST:PORT)."""
        found = {}
        for broker in self.brokers:
            args = broker.args
            found[broker.name] = args[args.index("--kafka-listen") + 1]
        return found

    @property
    def bootstrap(self) -> str:
        return ",".join(b.address for b in self.brokers)

    def start(self, timeout_s: float = 90) -> None:
        """Start every process and wait until every broker and coordinator is registered
        and, in a dynamic quorum, every controller is a voter. A secured cluster's admin
        certificate becomes the harness's (its workload, checks and fuzzer all speak
        mutual TLS as ``User:admin``)."""
        if self.admin_tls is not None:
            tls.configure(server=None, client=self.admin_tls)
        for process in self.processes.values():
            process.start()
        want = (len(self.brokers), len(self.by_role("coordinator")))
        deadline = time.monotonic() + timeout_s
        while True:
            dead = [p.name for p in self.processes.values() if not p.alive]
            if dead:
                raise ClusterStartError(f"{', '.join(dead)} exited while starting; see its log")
            if any(self.registered(b.address) >= want for b in self.brokers) and (
                self.quorum == "static" or self.voter_set_gap() is None
            ):
                return
            if time.monotonic() > deadline:
                raise ClusterStartError("the brokers and coordinators did not register in time")
            time.sleep(0.3)

    @staticmethod
    def registered(address: str) -> tuple[int, int]:
        """How many brokers and coordinators the broker at ``address`` sees registered."""
        try:
            with open_blocking_channel(address) as channel:
                reply = broker_pb2_grpc.BrokerStub(channel).Metadata(
                    broker_pb2.MetadataRequest(topics=["__no_such_topic__"]), timeout=2
                )
        except grpc.RpcError:
            return 0, 0
        return len(reply.brokers), len(reply.coordinators)

    def voter_set_gap(self) -> str | None:
        """In a dynamic quorum, why its voter set is not the controllers' current
        incarnations (each controller's node id with the directory id its data directory
        names now, and no other voter), or None when it is: what must hold before a
        controller's data directory may be deleted, and again once the faults are healed.
        The leader's ``DescribeQuorum`` answer lists the set in use, committed or not."""
        controllers = self.by_role("controller")
        expected = set()
        for controller in controllers:
            directory_id = controller.directory_id()
            if directory_id is None:
                return f"{controller.name} has no directory id yet"
            expected.add((controller.node_id, directory_id))
        answer = self.describe_quorum()
        if answer is None:
            return "no controller answered DescribeQuorum as the quorum's leader"
        voters = {(v.replica_id, v.replica_directory_id) for v in answer.current_voters}
        if voters == expected:
            return None

        def keys(found: set[tuple[int, str]]) -> str:
            return ", ".join(f"{node}:{directory[:8]}" for node, directory in sorted(found))

        return f"the voters are {keys(voters)}; the controllers are {keys(expected)}"

    def replica_set_gap(self, broker_id: int) -> str | None:
        """Why losing broker ``broker_id``'s volume could lose committed records, or None
        when it cannot: every partition with a replica on it (``__consumer_offsets``
        included) has its whole replica set in its ISR, as every running broker's Metadata
        answer shows it. An ISR member holds every committed record, so the others then
        still hold them all; a partition whose only ISR member lost its volume would have
        none left (Kafka's unclean shutdown rules then keep it offline, KIP-966)."""
        asked = 0
        for broker in self.brokers:
            if not broker.alive or broker.paused:
                continue
            try:
                with open_blocking_channel(broker.address) as channel:
                    reply = broker_pb2_grpc.BrokerStub(channel).Metadata(
                        broker_pb2.MetadataRequest(), timeout=2
                    )
            except grpc.RpcError as e:
                return f"{broker.name} did not answer Metadata ({e.code().name})"
            asked += 1
            for topic in reply.topics:
                for partition in topic.partitions:
                    if broker_id in partition.replicas and set(partition.isr) != set(
                        partition.replicas
                    ):
                        return (
                            f"{topic.name}-{partition.partition} has ISR "
                            f"{sorted(partition.isr)} of replicas {sorted(partition.replicas)}, "
                            f"as {broker.name} sees it"
                        )
        return None if asked else "no broker answered Metadata"

    def describe_quorum(self) -> raft_pb2.DescribeQuorumResponse | None:
        """The quorum leader's ``DescribeQuorum`` answer, or None when no controller gives
        one (an election under way, the leader down or cut off)."""
        for controller in self.by_role("controller"):
            try:
                with open_blocking_channel(controller.address) as channel:
                    answer = raft_pb2_grpc.RaftStub(channel).DescribeQuorum(
                        raft_pb2.DescribeQuorumRequest(), timeout=2
                    )
            except grpc.RpcError:
                continue
            if answer.error == ErrorCode.NONE:
                return answer
        return None

    def stop(self) -> None:
        """Stop every process: coordinators, brokers, then controllers."""
        order = self.by_role("coordinator") + self.brokers + self.by_role("controller")
        for process in order:
            process.resume()
        for process in order:
            process.stop()
        if self.admin_tls is not None:
            tls.configure(server=None, client=None)

    def replica_digests(
        self, topic: str, high_watermarks: dict[int, int]
    ) -> list[tuple[int, int, str, int, int]]:
        """``(broker, partition, sha256, bytes, end offset)`` of each replica's batches below
        the high watermark, read from its segment files (call with the brokers stopped); the
        end offset is the next offset after the last of them."""
        found = []
        for broker in self.brokers:
            for partition, high_watermark in sorted(high_watermarks.items()):
                directory = broker.data_dir / "logs" / f"{topic}-{partition}"
                if not directory.is_dir():
                    continue
                data = segment_bytes(directory)
                digest = hashlib.sha256()
                size = 0
                end = 0
                with contextlib.suppress(Exception):  # a torn tail ends the replica's batches
                    for batch in iter_batches(data):
                        if batch.next_offset > high_watermark:
                            break
                        chunk = data[batch.position : batch.position + batch.size]
                        digest.update(chunk)
                        size += len(chunk)
                        end = batch.next_offset
                found.append((broker.node_id, partition, digest.hexdigest(), size, end))
        return found


def segment_bytes(directory: Path) -> bytes:
    """A replica's segment files in offset order, concatenated."""
    segments: Sequence[Path] = sorted(directory.glob("*.log"), key=lambda p: int(p.stem))
    return b"".join(path.read_bytes() for path in segments)
