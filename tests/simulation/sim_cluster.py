"""The whole cluster in one process: controllers, brokers and clients over simulated time.

Real code, composed: three controllers are :class:`~highwater.raft.node.RaftNode` voters
whose active member runs the :class:`~highwater.controller.quorum_controller.QuorumController`
(requests in, metadata records out, committed through Raft); each broker is a Raft
observer of the metadata log, replays it into a
:class:`~highwater.metadata.image.MetadataImage`, and hands the image to a real
:class:`~highwater.broker.partitions.PartitionManager` over a real
:class:`~highwater.storage.log_manager.LogManager` (segments, indexes, leader-epoch
cache, checkpoints, recovery) on a :class:`~sim_disk.SimDisk`. Leader and follower
replication is the broker's :class:`~highwater.broker.partitions.Partition` (the pure
:mod:`highwater.broker.replication` state inside). What the simulation writes itself is
the glue the service edge does with gRPC and asyncio: the replica fetcher's loop (one
fetch per followed partition at a time), the produce purgatory, the AlterPartition
sender, the heartbeat and registration loops, and the clients (acks=all producers and
consumers reading up to the high watermark).

Simulated: the clock (one integer of milliseconds), the network (per-message delay,
loss, duplication, reordering, partitions, one-way partitions), processes (crash and
restart, pauses) and disks (:mod:`sim_disk`: unflushed bytes lost on a crash, torn
tails, a full disk that tears a write). Everything random comes from the seed.

The checks run after every event (:meth:`Simulation._check_broker`) and at the end,
where the history of the clients (the chaos harness's format, :mod:`highwater.chaos.history`)
goes through the chaos checker (:func:`highwater.chaos.checker.check`) as the oracle.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import logging
import random
import tempfile
from collections import Counter, deque
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NoReturn, get_args

import group_clients
from group_clients import STALE_LOOKUP_RATE, CoordinatorHandle, GroupClients
from highwater.broker.partitions import Partition, PartitionError, PartitionManager
from highwater.broker.replication import EpochEndOffset
from highwater.chaos.checker import check
from highwater.chaos.history import Op
from highwater.config.topic import LogConfig
from highwater.controller.config import ControllerConfig
from highwater.controller.quorum_controller import QuorumController
from highwater.controller.results import ControllerApiError, ControllerResult
from highwater.controller_api import messages as m
from highwater.coordinator.core import (
    GroupCoordinatorCore,
    GroupCoordinatorSettings,
    RebalanceCompleted,
    Reply,
    Write,
)
from highwater.coordinator.offsets_log import COORDINATOR_PRODUCER_ID_BASE
from highwater.coordinator.ownership import PartitionOwnership
from highwater.coordinator.records import (
    CorruptOffsetsRecordError,
    KeyValue,
    OffsetsRecord,
    encode_epoch_marker,
)
from highwater.coordinator.records import (
    decode_record as decode_offsets_record,
)
from highwater.errors import HighwaterError, KafkaStorageError
from highwater.metadata.consumer_offsets import CONSUMER_OFFSETS_TOPIC, partition_for_group
from highwater.metadata.delta import MetadataDelta
from highwater.metadata.image import MetadataImage, PartitionRegistration
from highwater.metadata.records import (
    CoordinatorAssignmentRecord,
    MetadataRecord,
    PartitionChangeRecord,
    decode_record,
    encode_record,
)
from highwater.raft.log import InMemoryRaftLog
from highwater.raft.messages import RaftMessage, is_request
from highwater.raft.node import NotLeaderError, RaftConfig, RaftNode
from highwater.raft.snapshot import InMemorySnapshotStore
from highwater.raft.state import ElectionState
from highwater.records import SimpleRecord, build_batch, iter_batches
from highwater.storage.log_manager import LogManager
from highwater.storage.topic_partition import TopicPartition
from highwater.v1.common_pb2 import ErrorCode
from sim_disk import DiskFaults, SimDisk, intercept_segment_writes

CLUSTER_ID = "sim-cluster"
TOPIC = "events"
NONE = ErrorCode.NONE
"""Looked up once: a protobuf enum's attribute is a method call (every fetch answer)."""
BASE_TIME_MS = 1_700_000_000_000
"""Simulated time 0 as a wall-clock timestamp (record timestamps must look current)."""
RAFT_MESSAGES = frozenset(get_args(RaftMessage))
"""The Raft messages' classes: a message is one when its type is among them (no message
class derives from another)."""
TICK_MS = 20
NEVER = 1 << 62
OBSERVER_TICK_MS = 40
"""A broker's Raft observer ticks half as often as a voter: its only timers are its fetch
and request timeouts (200 and 80 ms); its next fetch goes out as an answer arrives."""
SIM_CONFIG = RaftConfig(
    election_timeout_ms=100,
    election_backoff_max_ms=100,
    fetch_timeout_ms=200,
    fetch_max_wait_ms=40,
    high_watermark_linger_ms=1,
    request_timeout_ms=80,
    retry_backoff_ms=5,
)
"""The Raft simulation's timings (tests/raft/simulation.py), not one uniform scale of
Kafka's defaults: the election timeout and backoff, the fetch timeout and the high
watermark's linger are scaled down 10x (1,000, 1,000, 2,000 and 10 ms); the fetch's
long poll is 40 ms (500 ms scaled would be 50: a longer poll changes every schedule and
makes none cheaper, 3 % more events in short seeds 1000-1029); the request timeout is
scaled 25x (2,000 ms) so that it stays well above that poll, the retry backoff 4x
(20 ms)."""
FETCH_TIMEOUT_MS = 200
RPC_TIMEOUT_MS = 300
BROKER_TICK_MS = 50
HIGH_WATERMARK_CHECKPOINT_MS = 500
RECOVERY_POINT_CHECKPOINT_ROUNDS = 12
"""The recovery points are checkpointed every 12th high-watermark round (6 s)."""
"""The period of a broker's upkeep (heartbeat, ISR shrink, AlterPartition retries, fetch
timeouts, purgatory expiry). Fetches do not wait for it: the replica fetcher fetches again
as an answer arrives, or when its backoff ends (:meth:`Simulation._fetch_after_backoff`)."""
PRODUCE_TIMEOUT_MS = 1500
FETCH_MAX_BYTES = 16 * 1024

APPLY_BEFORE_REGISTRATION = False
"""Mutation switch: a restarted broker takes the roles of its replayed metadata before its
new registration is in it (see :meth:`Simulation._apply_image`)."""

CONTROLLER_CONFIG = ControllerConfig(
    broker_session_timeout_ms=900,
    broker_heartbeat_interval_ms=100,
    auto_leader_rebalance_enable=False,
    offsets_topic_num_partitions=2,
    coordinator_session_timeout_ms=1_500,
    coordinator_heartbeat_interval_ms=250,
)
"""Kafka's defaults with the sessions shorter, like the Raft timings; two partitions of
``__consumer_offsets`` (one per coordinator while both live)."""
OFFSETS_COMMIT_TIMEOUT_MS = 1_500
"""``offsets.commit.timeout.ms`` of the coordinators, scaled down like the rest."""
FRESH_READER_RATE = 0.5
"""Half the group clients' OffsetFetches are a new reader's, which looks the coordinator up
first (:class:`group_clients.GroupClients`)."""
OFFSETS_RETRY_BACKOFF_MS = 20
OFFSETS_READ_TIMEOUT_MS = 300
_LEADER_ERRORS = frozenset(
    {
        ErrorCode.LEADER_NOT_AVAILABLE,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.FENCED_LEADER_EPOCH,
        ErrorCode.UNKNOWN_LEADER_EPOCH,
    }
)
_IN_DOUBT_ERRORS = frozenset(
    {
        ErrorCode.REQUEST_TIMED_OUT,
        ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        ErrorCode.NETWORK_EXCEPTION,
        ErrorCode.NOT_LEADER_OR_FOLLOWER,  # also after the append (offsets_log)
    }
)
_FENCED_ERRORS = frozenset({ErrorCode.INVALID_PRODUCER_EPOCH, ErrorCode.PRODUCER_FENCED})
"""How the coordinator's appender (:mod:`highwater.coordinator.offsets_log`) sorts a
broker's answers: not appended, perhaps appended (sent again unchanged), fenced."""


class SimulationFailure(AssertionError):
    """An invariant broke (or the cluster did not converge): names the seed, the faults
    and the last events."""

    def __init__(
        self,
        seed: int,
        reason: str,
        trace: Sequence[str],
        faults: Sequence[Fault],
        *,
        chaos_ms: int = 12_000,
        groups: bool = False,
    ) -> None:
        self.seed = seed
        self.reason = reason
        self.faults = tuple(faults)
        tail = "\n".join(trace[-60:])
        plan = "\n".join(f"  {f}" for f in faults) or "  (none)"
        chaos = f" --chaos-ms {chaos_ms}" if chaos_ms != Scenario.chaos_ms else ""
        chaos += " --groups on" if groups else ""
        super().__init__(
            f"seed {seed}: {reason}\n"
            f"reproduce: python -m tests.simulation --seed {seed}{chaos} --trace\n"
            f"faults:\n{plan}\nlast events:\n{tail}"
        )


# --- The schedule ----------------------------------------------------------------------


@dataclass(frozen=True)
class Fault:
    """One fault of the schedule: ``kind`` hits ``target`` at ``at_ms`` for ``duration_ms``."""

    at_ms: int
    kind: str
    """``crash`` (brokers or a controller; ``detail`` says how: ``kill``, the process dies
    and the page cache keeps what it wrote; ``power``, a power loss: what was not flushed
    is lost; ``torn``, a power loss that keeps a random part of it), ``pause``,
    ``partition`` (the targets cut off both ways), ``one-way`` (the targets' outgoing
    messages lost), ``disk-full`` (a broker's), ``dir-failed`` (one of a broker's two log
    directories, or both: ``detail`` names them and what fails there, ``read``, ``write``
    or ``read+write``; when the fault ends the disk is repaired and, if the broker took
    the directory offline, the broker restarted, as an operator would)."""
    target: tuple[str, ...]
    duration_ms: int
    detail: str = ""

    def __str__(self) -> str:
        extra = f" {self.detail}" if self.detail else ""
        targets = ",".join(self.target)
        return f"{self.at_ms:>6} ms {self.kind} {targets} for {self.duration_ms} ms{extra}"


@dataclass(frozen=True)
class Scenario:
    """What one schedule exercises; :meth:`from_seed` picks it from the seed."""

    brokers: int = 3
    partitions: int = 2
    replication_factor: int = 3
    min_insync_replicas: int = 2
    producers: int = 2
    consumers: int = 1
    unclean: bool = False
    chaos_ms: int = 12_000
    converge_ms: int = 30_000
    drop_rate: float = 0.01
    duplicate_rate: float = 0.01
    max_delay_ms: int = 5
    produce_interval_ms: int = 20
    flush_interval_ms: int = 100
    segment_bytes: int = 1 << 30
    replica_lag_time_max_ms: int = 600
    faults: tuple[Fault, ...] | None = None
    """None: planned from the seed; a tuple (a shrunk schedule): exactly these."""
    fault_count: int = 6
    dir_failures: bool = True
    """Whether the schedule may fail a log directory (planned apart from the other faults:
    :func:`plan_faults`)."""
    groups: bool = False
    """Two group coordinators and the group clients of :mod:`group_clients` (with faults of
    their own: :func:`_plan_group_faults`); not with unclean elections, which may lose
    ``__consumer_offsets`` records by design."""

    @classmethod
    def from_seed(cls, seed: int, **overrides: Any) -> Scenario:
        rng = random.Random(f"scenario-{seed}")
        brokers = rng.choice((3, 4, 5))
        scenario = cls(
            brokers=brokers,
            partitions=rng.choice((1, 2, 3)),
            replication_factor=3,
            min_insync_replicas=2,
            producers=rng.choice((1, 2, 3)),
            consumers=rng.choice((0, 1)),
            unclean=rng.random() < 0.1,
            drop_rate=rng.choice((0.0, 0.01, 0.05)),
            duplicate_rate=rng.choice((0.0, 0.01, 0.05)),
            max_delay_ms=rng.choice((2, 5, 20)),
            produce_interval_ms=rng.choice((10, 20, 50)),
            flush_interval_ms=rng.choice((50, 200, 1000)),
            segment_bytes=rng.choice((2048, 16 * 1024, 1 << 30)),
            fault_count=rng.randint(2, 10),
        )
        return replace(scenario, **overrides)


def plan_faults(seed: int, scenario: Scenario) -> tuple[Fault, ...]:
    """The faults of ``seed``'s schedule (a random source of their own, so that dropping
    one while shrinking leaves the others as they were)."""
    if scenario.faults is not None:
        return scenario.faults
    rng = random.Random(f"faults-{seed}")
    brokers = [f"b{i}" for i in range(1, scenario.brokers + 1)]
    controllers = ["c1", "c2", "c3"]
    kinds = ["crash", "crash", "pause", "partition", "one-way", "disk-full", "controller"]
    kinds += ["outage"] if rng.random() < 0.3 else []
    faults = []
    for _ in range(scenario.fault_count):
        kind = rng.choice(kinds)
        at = rng.randrange(1000, scenario.chaos_ms - 500)
        duration = rng.randint(100, 3000)
        if kind == "crash":
            mode = rng.choice(("kill", "power", "torn"))
            faults.append(Fault(at, "crash", (rng.choice(brokers),), duration, mode))
        elif kind == "controller":
            target = rng.choice([*controllers, "active"])
            faults.append(Fault(at, "crash", (target,), duration, "power"))
        elif kind == "pause":
            faults.append(Fault(at, "pause", (rng.choice(brokers + controllers),), duration))
        elif kind in ("partition", "one-way"):
            group = rng.sample(brokers + controllers, rng.randint(1, 2))
            faults.append(Fault(at, kind, tuple(sorted(group)), duration))
        elif kind == "disk-full":
            faults.append(Fault(at, "disk-full", (rng.choice(brokers),), duration))
        elif kind == "outage":
            faults.append(Fault(at, "crash", tuple(brokers), duration, "kill"))
    if scenario.dir_failures:
        faults.extend(_plan_dir_failures(seed, scenario, brokers))
    if scenario.groups and not scenario.unclean:
        faults.extend(_plan_group_faults(seed, scenario))
    return tuple(sorted(faults, key=lambda f: (f.at_ms, f.kind, f.target)))


def _plan_dir_failures(seed: int, scenario: Scenario, brokers: list[str]) -> list[Fault]:
    """A failed log directory in about two schedules of five: from a random source of its
    own, so that the other faults of a seed stay what they were before this kind existed.
    Mostly one of the two directories (the broker serves on from the other); now and then
    both (every directory failed: the broker stops)."""
    rng = random.Random(f"dir-faults-{seed}")
    if rng.random() >= 0.4:
        return []
    at = rng.randrange(1000, scenario.chaos_ms - 500)
    duration = rng.randint(300, 4000)
    what = rng.choice(("read", "write", "read+write"))
    dirs = "d0,d1" if rng.random() < 0.15 else rng.choice(("d0", "d1"))
    return [Fault(at, "dir-failed", (rng.choice(brokers),), duration, f"{dirs} {what}")]


def _plan_group_faults(seed: int, scenario: Scenario) -> list[Fault]:
    """Two or three coordinator faults, from a random source of their own: a coordinator
    paused past its session (the stale-coordinator story), crashed, or cut from its
    clients (``cut-clients``)."""
    rng = random.Random(f"group-faults-{seed}")
    session = CONTROLLER_CONFIG.coordinator_session_timeout_ms
    faults = []
    for _ in range(rng.randint(2, 3)):
        kind = rng.choice(("pause", "pause", "crash", "cut-clients"))
        at = rng.randrange(1000, scenario.chaos_ms - 500)
        target = (rng.choice(COORDINATORS),)
        if kind == "pause":
            faults.append(Fault(at, "pause", target, rng.randint(session + 300, session + 2000)))
        elif kind == "crash":
            faults.append(Fault(at, "crash", target, rng.randint(300, 3000), "kill"))
        else:
            faults.append(Fault(at, "cut-clients", target, rng.randint(300, 3000)))
    return faults


COORDINATORS = ("g1", "g2")


# --- Messages between processes ----------------------------------------------------------


@dataclass(frozen=True)
class ControllerCall:
    kind: str  # register, heartbeat, alter_partition, create_topics
    corr: int
    body: Any


@dataclass(frozen=True)
class ControllerReply:
    kind: str
    corr: int
    body: Any


@dataclass(frozen=True)
class Fetch:
    partition: int
    replica_id: int
    fetch_offset: int
    last_fetched_epoch: int
    leader_epoch: int
    topic: str = TOPIC

    def refused(self, error: int) -> FetchReply:
        """The leader's answer that it cannot serve this fetch: ``error``, no records."""
        return FetchReply(
            self.partition, self.leader_epoch, self.fetch_offset, error, topic=self.topic
        )


@dataclass(frozen=True)
class FetchReply:
    partition: int
    leader_epoch: int
    fetch_offset: int
    error: int
    records: bytes = b""
    diverging: EpochEndOffset | None = None
    high_watermark: int = 0
    topic: str = TOPIC


@dataclass(frozen=True)
class Produce:
    partition: int
    corr: int
    value: str
    topic: str = TOPIC
    records: bytes = b""
    """A batch built by the producer (a coordinator's, with its producer id, epoch and
    sequence); empty: one record of ``value``."""


@dataclass(frozen=True)
class ProduceReply:
    partition: int
    corr: int
    error: int
    offset: int = -1
    leader_hint: int = -1
    topic: str = TOPIC


@dataclass(frozen=True)
class ConsumerFetch:
    partition: int
    offset: int
    topic: str = TOPIC

    def refused(self, error: int) -> ConsumerFetchReply:
        """The leader's answer that it cannot serve this read: ``error``, no records."""
        return ConsumerFetchReply(self.partition, self.offset, error, topic=self.topic)


@dataclass(frozen=True)
class ConsumerFetchReply:
    partition: int
    offset: int
    error: int
    records: bytes = b""
    leader_hint: int = -1
    topic: str = TOPIC
    high_watermark: int = -1


# --- Processes ---------------------------------------------------------------------------


@dataclass
class Process:
    name: str
    alive: bool = False
    incarnation: int = 0
    paused_until: int = 0


@dataclass
class RaftMember(Process):
    """The Raft replica of a controller (voter) or broker (observer) of the metadata log."""

    raft_id: int = 0
    raft_log: InMemoryRaftLog = field(default_factory=InMemoryRaftLog)
    snapshots: InMemorySnapshotStore = field(default_factory=InMemorySnapshotStore)
    persisted: ElectionState | None = None
    node: RaftNode | None = None
    flush_pending: bool = False
    tick_due_ms: int = 0
    """Before this, a tick of ``node`` has nothing to do (its
    :meth:`~highwater.raft.node.RaftNode.next_deadline_ms` after its last tick); 0 once
    any other event reached the node, which may bring a deadline forward."""


@dataclass
class ControllerProcess(RaftMember):
    controller: QuorumController | None = None
    image: MetadataImage = field(default_factory=MetadataImage.empty)
    epoch_start: int = -1
    replies: list[tuple[int, str, ControllerReply]] = field(default_factory=list)


class SimLogManager(LogManager):
    """The real log manager, but truncation checkpoints on the caller's thread (the
    simulation has no worker threads) and tells the disk that truncated bytes are gone."""

    disk: SimDisk

    async def truncate_to(self, tp: TopicPartition, offset: int) -> bool:
        partition_log = self.logs[tp]
        truncated = partition_log.truncate_to(offset)
        if truncated:
            self._checkpoint_after_truncation(tp, partition_log.log_end_offset)
            self.disk.truncated(partition_log.directory)
        return truncated


@dataclass
class Waiting:
    """An acks=all produce in the purgatory."""

    partition: int
    required_offset: int
    first_offset: int
    producer: str
    corr: int
    deadline_ms: int
    topic: str = TOPIC


@dataclass
class BrokerProcess(RaftMember):
    broker_id: int = 0
    disk: SimDisk | None = None
    log_manager: SimLogManager | None = None
    manager: PartitionManager | None = None
    image: MetadataImage = field(default_factory=MetadataImage.empty)
    applied: int = 0
    broker_epoch: int = -1
    registering_since: int = -1
    purgatory: list[Waiting] = field(default_factory=list)
    fetching: dict[TopicPartition, int] = field(default_factory=dict)
    """partition -> when its outstanding fetch was sent."""
    next_fetch: dict[TopicPartition, int] = field(default_factory=dict)
    alter_sent: dict[TopicPartition, int] = field(default_factory=dict)
    """partition -> when its pending ISR proposal was last sent."""
    heartbeat_sent: int = -1_000_000


@dataclass
class OffsetsPartition:
    """A coordinator's partition of ``__consumer_offsets`` in one coordinator epoch: taken
    over (``fencing``: the epoch marker appended; ``reading``: replayed up to it), then
    ``serving``: the core's writes appended, one batch at a time."""

    epoch: int
    phase: str = "fencing"
    next_sequence: int = 0
    marker_offset: int = -1
    read_offset: int = 0
    raw: list[KeyValue] = field(default_factory=list)
    writes: list[Write] = field(default_factory=list)
    in_flight: list[Write] | None = None
    records: list[KeyValue] = field(default_factory=list)
    """The batch being appended (the marker while fencing)."""
    corr: int = -1
    """The outstanding produce or fetch (-1: none; ``retry_at`` says when to send)."""
    sent_ms: int = 0
    retry_at: int = 0
    deadline_ms: int | None = None
    in_doubt: bool = False


@dataclass
class CoordinatorProcess(RaftMember):
    """A group coordinator: a Raft observer of the metadata log (the service follows the
    image the same way), the real core, its session lease, and the service's glue."""

    node_id: int = 0
    core: GroupCoordinatorCore | None = None
    ownership: PartitionOwnership = field(
        default_factory=lambda: PartitionOwnership(0, 1, lambda: "")
    )
    """The real decisions: which partitions, in which epochs, the lease, the incarnation."""
    image: MetadataImage = field(default_factory=MetadataImage.empty)
    applied: int = 0
    registration_epoch: int = -1
    registering_since: int = -1
    heartbeat_sent: int = -1_000_000
    calls: dict[int, tuple[int, object]] = field(default_factory=dict)
    """corr -> when the controller call was sent (an answer renews the lease from then)
    and what it was sent for: the incarnation id registered, or the registration epoch
    of a heartbeat."""
    partitions: dict[int, OffsetsPartition] = field(default_factory=dict)
    pending: dict[object, Callable[[object], None]] = field(default_factory=dict)


@dataclass
class Client(Process):
    leaders: dict[int, str] = field(default_factory=dict)
    in_flight: dict[int, tuple[int, str, int]] = field(default_factory=dict)
    """partition -> (corr, value, deadline)."""
    sequence: int = 0
    positions: dict[int, int] = field(default_factory=dict)


@dataclass
class SimulationResult:
    seed: int
    scenario: Scenario
    faults: tuple[Fault, ...]
    events: int
    simulated_ms: int
    acknowledged: int
    attempted: int
    reads: int
    elections: int
    torn_writes: int
    expected_loss: int
    messages: Counter[str]
    dirs_failed: int = 0
    """Log directories taken offline by the brokers (after a ``dir-failed`` fault)."""
    commits: int = 0
    """Offset commits acknowledged to the group clients."""
    offset_fetches: int = 0
    coordinator_moves: int = 0
    """``__consumer_offsets`` partitions the controller gave to another coordinator."""
    coordinator_revocations: int = 0
    """Of those, the partitions revoked from a live coordinator first (handed over once
    its heartbeat showed the revocation applied, or its session ended)."""
    reincarnations: int = 0
    """Times a coordinator registered again as a new incarnation, to take partitions still
    assigned to it in an epoch it had taken them over in (after a lapsed lease or a
    failed take-over) back in new epochs."""

    def summary(self) -> str:
        loss = (
            f", {self.expected_loss} lost as unclean elections allow" if self.expected_loss else ""
        )
        return (
            f"seed {self.seed}: {self.scenario.brokers} brokers, {self.scenario.partitions} "
            f"partitions, {len(self.faults)} faults, {self.events} events, "
            f"{self.simulated_ms} ms simulated, {self.attempted} writes, {self.acknowledged} "
            f"acknowledged, {self.reads} reads, {self.elections} partition leader epochs, "
            f"{self.torn_writes} torn writes, {self.dirs_failed} log directories offline{loss}"
            + (
                f", {self.commits} offset commits, {self.offset_fetches} offset fetches, "
                f"{self.coordinator_moves} coordinator moves "
                f"({self.coordinator_revocations} revoked first), "
                f"{self.reincarnations} coordinator reincarnations"
                if self.scenario.groups
                else ""
            )
        )


def run_sync(coroutine: Coroutine[Any, Any, Any]) -> Any:
    """Run a coroutine that never suspends (the simulation's log manager awaits nothing)."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        return done.value
    coroutine.close()
    raise RuntimeError("a coroutine the simulation runs suspended")


# --- The simulation ----------------------------------------------------------------------


class Simulation:
    """One seeded schedule; :meth:`run` returns a result or raises :class:`SimulationFailure`."""

    def __init__(self, seed: int, scenario: Scenario | None = None, *, trace: bool = False) -> None:
        self.seed = seed
        self.scenario = scenario or Scenario.from_seed(seed)
        self.faults = plan_faults(seed, self.scenario)
        self.rng = random.Random(seed)
        self.print_trace = trace
        self.now_ms = 0
        self._queue: list[tuple[int, int, Callable[..., None], tuple[Any, ...]]] = []
        self._seq = 0
        self.events = 0
        self.trace: deque[str] = deque(maxlen=300)
        self.messages: Counter[str] = Counter()
        self.blocked: Counter[tuple[str, str]] = Counter()
        """(source, destination) -> how many partitions in force cut that link."""
        self.chaos = True
        self.history: list[Op] = []
        self.corr = 0
        self.voters = frozenset({1, 2, 3})
        self.controllers = {f"c{i}": ControllerProcess(f"c{i}", raft_id=i) for i in (1, 2, 3)}
        self._tmp = tempfile.TemporaryDirectory(
            prefix=f"highwater-sim-{seed}-", dir="/dev/shm" if Path("/dev/shm").is_dir() else None
        )
        root = Path(self._tmp.name)
        self.brokers = {
            f"b{i}": BrokerProcess(
                f"b{i}",
                raft_id=100 + i,
                broker_id=i,
                disk=SimDisk(root / f"broker-{i}", random.Random(f"disk-{seed}-{i}")),
            )
            for i in range(1, self.scenario.brokers + 1)
        }
        self.producers = {
            f"producer-{i}": Client(f"producer-{i}") for i in range(self.scenario.producers)
        }
        self.consumers = {
            f"consumer-{i}": Client(f"consumer-{i}") for i in range(self.scenario.consumers)
        }
        groups = self.scenario.groups and not self.scenario.unclean
        self.coordinators = {
            name: CoordinatorProcess(name, raft_id=200 + i, node_id=i)
            for i, name in enumerate(COORDINATORS if groups else (), start=1)
        }
        self.processes: dict[str, Process] = {
            **self.controllers,
            **self.brokers,
            **self.producers,
            **self.consumers,
            **self.coordinators,
        }
        self.raft_names = {
            p.raft_id: p.name
            for p in (
                *self.controllers.values(),
                *self.brokers.values(),
                *self.coordinators.values(),
            )
        }
        self.group_host = ClusterGroupHost(self)
        self.group_clients = GroupClients(
            self.group_host,
            CONTROLLER_CONFIG.offsets_topic_num_partitions,
            fresh_reader_rate=FRESH_READER_RATE,
        )
        self.connection_free: dict[tuple[str, str], int] = {}
        self.previous_owner: dict[int, int] = {}
        """``__consumer_offsets`` partition -> its owner before the controller last moved it
        (what FindCoordinator answers from metadata that lags)."""
        self.epoch_actor: dict[tuple[int, int], str] = {}
        """(partition, coordinator epoch) -> the coordinator that acted in it."""
        self.markers: dict[int, list[tuple[int, int]]] = {}
        """partition -> (offset, coordinator epoch) of every epoch marker acknowledged."""
        self.coordinator_moves = 0
        self.coordinator_revocations = 0
        self.reincarnations = 0
        self.log_config = LogConfig(
            segment_bytes=self.scenario.segment_bytes,
            index_interval_bytes=512,
            min_insync_replicas=self.scenario.min_insync_replicas,
            unclean_leader_election_enable=self.scenario.unclean,
        )
        # What the checks remember.
        self.epoch_leaders: dict[tuple[TopicPartition, int], str] = {}
        self.leader_hw: dict[tuple[str, int, TopicPartition, int], int] = {}
        """(broker, incarnation, partition, leader epoch) -> the HW last seen there."""
        self.committed: dict[TopicPartition, dict[int, tuple[int, int, int]]] = {}
        """partition -> base offset -> (last offset, leader epoch, crc) of every batch seen
        below a high watermark."""
        self.verified: dict[tuple[str, TopicPartition], int] = {}
        """(broker, partition) -> the end of the committed batches the replica holds."""
        self._checked: dict[tuple[str, TopicPartition], tuple[int, int, int, int]] = {}
        """(broker, partition) -> (log end, HW, committed batches, held) at its last check."""
        self._leading: dict[tuple[str, TopicPartition], tuple[object, int, int]] = {}
        """(broker, partition) -> (its leader state, leader epoch, HW) at its last check."""
        self.unclean_elections = 0
        self.unclean_recoveries = 0
        self.power_lost: set[str] = set()
        self.halted_at_startup: set[str] = set()
        self.refused_starts = 0
        """Brokers whose start found no usable log directory, restarted once it is repaired."""
        self.disk_faults: DiskFaults | None = None
        self.dirs_failed = 0
        """Log directories a broker took offline."""
        self._decoded: dict[bytes, MetadataRecord] = {}
        """A committed metadata entry's value -> its record (see :meth:`_decode`)."""

    # --- Running ---------------------------------------------------------------------

    def run(self) -> SimulationResult:
        logger = logging.getLogger("highwater")
        handler = _TraceHandler(self)
        propagate = logger.propagate
        logger.addHandler(handler)
        logger.propagate = False
        try:
            with intercept_segment_writes(
                [b.disk for b in self.brokers.values() if b.disk]
            ) as self.disk_faults:
                return self._run()
        finally:
            logger.removeHandler(handler)
            logger.propagate = propagate
            for broker in self.brokers.values():
                self._stop_broker(broker)
            self._tmp.cleanup()

    def _run(self) -> SimulationResult:
        scenario = self.scenario
        for name in (*self.controllers, *self.brokers):
            self._at(self.rng.randint(0, 50), self._start, self.processes[name])
        for client in (*self.producers.values(), *self.consumers.values()):
            client.alive = True
            self._at(500, self._client_tick, client)
        for coordinator in self.coordinators.values():
            self._at(self.rng.randint(0, 50), self._start, coordinator)
        if self.coordinators:
            self._at(500, self.group_clients.start)
        for fault in self.faults:
            self._at(fault.at_ms, self._inject, fault)
        self._at(scenario.chaos_ms, self._heal)
        self.done = False
        deadline = scenario.chaos_ms + scenario.converge_ms
        queue = self._queue
        pop = heapq.heappop
        try:
            while queue and not self.done:
                at, _, action, args = pop(queue)
                if at > deadline:
                    self._fail(self._not_converged())
                self.now_ms = at
                self.events += 1
                action(*args)
        except SimulationFailure:
            raise
        except Exception as e:  # a core's own check, or a crash in one
            self._fail(f"{type(e).__name__}: {e}")
        if not self.done:
            self._fail("the schedule ran out of events")
        return self._final_check()

    def _at(self, at_ms: int, action: Callable[..., None], *args: Any) -> None:
        self._seq += 1
        heapq.heappush(self._queue, (at_ms, self._seq, action, args))

    def _on(self, process: Process, delay_ms: int, action: Callable[..., None], *args: Any) -> None:
        """Run ``action`` on ``process`` after ``delay_ms``, unless it crashed meanwhile;
        while it is paused, when the pause ends."""
        self._seq += 1
        heapq.heappush(
            self._queue,
            (
                self.now_ms + delay_ms,
                self._seq,
                self._run_on,
                (process, process.incarnation, action, args),
            ),
        )

    def _run_on(
        self, process: Process, incarnation: int, action: Callable[..., None], args: tuple[Any, ...]
    ) -> None:
        if not process.alive or process.incarnation != incarnation:
            return
        if process.paused_until > self.now_ms:
            self._put_off(process, self._run_on, process, incarnation, action, args)
            return
        action(*args)

    def _put_off(self, process: Process, action: Callable[..., None], *args: Any) -> None:
        """Run ``action`` when ``process``'s pause ends (it checks the pause again: a
        later pause may have lengthened it). :meth:`_heal` brings these forward when it
        cuts a pause short."""
        self._at(process.paused_until, self._resume, process, action, args)

    @staticmethod
    def _resume(process: Process, action: Callable[..., None], args: tuple[Any, ...]) -> None:
        action(*args)

    def _bring_forward_put_off(self, processes: set[str]) -> None:
        """Run now what ``processes`` put off to the end of a pause that was cut short
        (each keeps its place among the events of this millisecond by its sequence
        number)."""
        queue = self._queue
        now = self.now_ms
        resume = Simulation._resume
        moved = False
        for index, (at, seq, action, args) in enumerate(queue):
            if action is resume and at > now and args[0].name in processes:
                queue[index] = (now, seq, action, args)
                moved = True
        if moved:
            heapq.heapify(queue)

    # --- The network -----------------------------------------------------------------

    def _send(self, source: str, destination: str, message: Any, *, reliable: bool = False) -> None:
        """Deliver after a random delay (so messages reorder), maybe lost or duplicated
        during the chaos. ``reliable``: a client's request on one connection (TCP neither
        loses nor duplicates; the client's timeout covers a partition)."""
        self.messages[type(message).__name__] += 1
        rng = self.rng
        scenario = self.scenario
        copies = 1
        if self.chaos and not reliable:
            if rng.random() < scenario.drop_rate:
                return
            if rng.random() < scenario.duplicate_rate:
                copies = 2
        target = self.processes[destination]
        args = (source, target, target.incarnation, message)
        for _ in range(copies):
            self._seq += 1
            heapq.heappush(
                self._queue,
                (
                    # ``rng.randint(1, n)``'s own draw (CPython's randint is
                    # ``1 + _randbelow(n)``), without its two calls on every message.
                    self.now_ms + 1 + rng._randbelow(scenario.max_delay_ms),  # type: ignore[attr-defined]
                    self._seq,
                    self._deliver,
                    args,
                ),
            )

    def _deliver(self, source: str, target: Process, incarnation: int, message: Any) -> None:
        blocked = self.blocked
        if blocked and blocked.get((source, target.name), 0) > 0:
            return
        if not target.alive or target.incarnation != incarnation:
            if type(message) in RAFT_MESSAGES and is_request(message) and not target.alive:
                sender = self.processes[source]
                self._on(sender, 1, self._unreachable, sender, message.destination)
            return
        if target.paused_until > self.now_ms:
            self._put_off(target, self._deliver, source, target, incarnation, message)
            return
        if type(message) in RAFT_MESSAGES:
            assert isinstance(target, RaftMember) and target.node is not None
            target.node.step(message, self.now_ms)
            self._after_raft(target)
        elif isinstance(target, ControllerProcess):
            self._controller_call(target, source, message)
        elif isinstance(target, BrokerProcess):
            self._broker_message(target, source, message)
        elif isinstance(target, CoordinatorProcess):
            self._coordinator_message(target, message)
        elif isinstance(target, Client):
            self._client_reply(target, source, message)

    def _unreachable(self, member: RaftMember, peer: int) -> None:
        if member.node is not None:
            member.node.peer_unreachable(peer, self.now_ms)
            self._after_raft(member)

    # --- Faults ----------------------------------------------------------------------

    def _inject(self, fault: Fault) -> None:
        self._note(f"fault: {fault}")
        self.history.append(
            self._op("fault", "nemesis", fault=fault.kind, target=list(fault.target))
        )
        targets = [self._resolve(t) for t in fault.target]
        if fault.kind == "crash":
            for process in targets:
                if process is not None and process.alive:
                    mode = fault.detail
                    if (
                        mode != "kill"
                        and isinstance(process, BrokerProcess)
                        and self._recovering(process)
                    ):
                        # Acks do not wait for fsync (Kafka's design): a power loss while
                        # another replica is still recovering from one may lose
                        # acknowledged writes by design. Make it a kill.
                        self._note(
                            f"{process.name}: power loss made a kill, a replica is still recovering"
                        )
                        mode = "kill"
                    self._crash(process, mode=mode)
                    self._at(self.now_ms + fault.duration_ms, self._restart, process)
        elif fault.kind == "pause":
            for process in targets:
                if process is not None:
                    process.paused_until = max(
                        process.paused_until, self.now_ms + fault.duration_ms
                    )
        elif fault.kind == "cut-clients":
            names = {p.name for p in targets if p is not None}
            clients = self.group_clients.names()
            cut = {(c, n) for c in clients for n in names} | {
                (n, c) for c in clients for n in names
            }
            self.blocked.update(cut)
            self._at(self.now_ms + fault.duration_ms, self._unblock, cut)
        elif fault.kind in ("partition", "one-way"):
            names = {p.name for p in targets if p is not None}
            others = set(self.controllers) | set(self.brokers) | set(self.coordinators)
            cut = {
                (a, b)
                for a in names
                for b in others | set(self.producers) | set(self.consumers)
                if b not in names
            }
            if fault.kind == "partition":
                cut |= {(b, a) for a, b in cut}
            # Counted per partition: a link two overlapping partitions cut stays cut
            # until both have healed.
            self.blocked.update(cut)
            self._at(self.now_ms + fault.duration_ms, self._unblock, cut)
        elif fault.kind == "disk-full":
            for process in targets:
                if isinstance(process, BrokerProcess) and process.disk is not None:
                    process.disk.full = True
                    self._at(self.now_ms + fault.duration_ms, self._disk_freed, process)
        elif fault.kind == "dir-failed":
            names, what = fault.detail.split()
            assert self.disk_faults is not None
            self.disk_faults.arm_failed_dirs()
            for process in targets:
                if isinstance(process, BrokerProcess) and process.disk is not None:
                    for name in names.split(","):
                        process.disk.fail_dir(process.disk.path / name, what)
                    self._at(self.now_ms + fault.duration_ms, self._dirs_repaired, process)

    def _resolve(self, name: str) -> Process | None:
        if name == "active":
            for controller in self.controllers.values():
                if controller.controller is not None:
                    return controller
            return None
        return self.processes[name]

    def _unblock(self, cut: set[tuple[str, str]]) -> None:
        self.blocked.subtract(cut)
        self.blocked = +self.blocked
        self._note(f"partition healed ({len(cut)} links)")

    def _disk_freed(self, broker: BrokerProcess) -> None:
        if broker.disk is not None:
            broker.disk.full = False
            self._note(f"{broker.name}: disk space freed")

    def _dirs_repaired(self, broker: BrokerProcess) -> None:
        """The failed directories of ``broker`` work again. A directory the broker took
        offline stays offline in this process (Kafka's rule: a failed directory comes
        back with a restart), so the operator restarts the broker; and starts it again if it
        could not start for want of a usable directory."""
        disk = broker.disk
        assert disk is not None
        repaired = [d for d in disk.log_dirs if disk.repair_dir(d)]
        if not repaired:
            return
        self._note(
            f"{broker.name}: log directories repaired ({', '.join(d.name for d in repaired)})"
        )
        if broker.name in self.halted_at_startup:
            self.halted_at_startup.discard(broker.name)
            self._at(self.now_ms + 100, self._restart, broker)
            return
        manager = broker.log_manager
        if broker.alive and manager is not None and manager.offline_dirs:
            self._crash(broker, mode="kill")
            self._at(self.now_ms + 100, self._restart, broker)

    def _heal(self) -> None:
        """The faults stop: everything comes back; from now on the cluster must converge."""
        self._note("heal: every process running, no partition, no loss")
        self.chaos = False
        self.blocked.clear()
        paused = {p.name for p in self.processes.values() if p.paused_until > self.now_ms}
        self._bring_forward_put_off(paused)
        for process in self.processes.values():
            process.paused_until = min(process.paused_until, self.now_ms)
            if isinstance(process, BrokerProcess) and process.disk is not None:
                process.disk.full = False
                self._dirs_repaired(process)
            if not process.alive:
                self._restart(process)
        self._at(self.now_ms + 100, self._converged)

    def _recovering(self, broker: BrokerProcess) -> bool:
        """Whether another broker lost unflushed writes and has not yet caught up since:
        it is not back in the ISR of each of its partitions, at the leader's log end; or
        whether ``broker`` leads a partition whose ISR is itself alone (the last replica
        in sync: its unflushed writes are the only copy, and Kafka does not promise them)."""
        if broker.manager is not None:
            for partition in broker.manager:
                state = partition.leader_state
                if state is not None and len(state.isr) < 2:
                    return True
        for other in self.brokers.values():
            if other is broker or other.name not in self.power_lost:
                continue
            if not other.alive or other.manager is None:
                return True
            for tp in self._topic_partitions(other.image):
                mine = self._partition(other, tp.partition, tp.topic)
                if mine is None:
                    # Not serving it: not assigned there, or not yet (a restarted broker
                    # applies its roles once registered: still recovering).
                    topic = other.image.topic(tp.topic)
                    registration = topic.partition(tp.partition) if topic is not None else None
                    if registration is not None and other.broker_id in registration.replicas:
                        return True
                    continue
                leader = self._partition(
                    self.brokers.get(f"b{mine.registration.leader}", other),
                    tp.partition,
                    tp.topic,
                )
                if (
                    leader is None
                    or leader.leader_state is None
                    or other.broker_id not in leader.leader_state.isr
                    or mine.log_end_offset < leader.high_watermark
                ):
                    return True
            self.power_lost.discard(other.name)
        return False

    def _crash(self, process: Process, *, mode: str) -> None:
        process.alive = False
        process.incarnation += 1
        if isinstance(process, RaftMember):
            process.node = None
            process.raft_log.crash(True)
            process.snapshots.crash()
        if isinstance(process, ControllerProcess):
            process.controller = None
            process.replies.clear()
        if isinstance(process, CoordinatorProcess):
            process.core = None
            process.partitions.clear()
            process.pending.clear()
        if isinstance(process, BrokerProcess):
            self._stop_broker(process)
            assert process.disk is not None
            if mode != "kill":
                self.power_lost.add(process.name)
            for note in process.disk.crash(mode):
                self._note(f"{process.name} disk: {note}")
            for key in [k for k in self.verified if k[0] == process.name]:
                del self.verified[key]
            for key in [k for k in self._checked if k[0] == process.name]:
                del self._checked[key]
            for key in [k for k in self._leading if k[0] == process.name]:
                del self._leading[key]
        self._note(f"crash {process.name} ({mode})")

    def _restart(self, process: Process) -> None:
        if not process.alive:
            self._start(process)

    def _stop_broker(self, broker: BrokerProcess) -> None:
        """Drop a broker's open files and lock, as the kernel does when a process dies."""
        if broker.log_manager is not None:
            for partition_log in list(broker.log_manager.logs.values()):
                for segment in partition_log.segments:
                    segment.close()
            for directory in broker.log_manager.log_dirs:
                directory.lock.release()
        broker.log_manager = None
        broker.manager = None

    # --- Starting processes ----------------------------------------------------------

    def _start(self, process: Process) -> None:
        process.alive = True
        process.incarnation += 1
        process.paused_until = 0
        if isinstance(process, BrokerProcess):
            self._start_broker(process)
            if not process.alive:
                return
        if isinstance(process, CoordinatorProcess):
            self._start_coordinator(process)
        if isinstance(process, RaftMember):
            process.flush_pending = False
            process.node = RaftNode(
                process.raft_id,
                self.voters,
                process.raft_log,
                process.snapshots,
                cluster_id=CLUSTER_ID,
                election_state=process.persisted,
                random=random.Random(f"{self.seed}-{process.name}-{process.incarnation}"),
                config=SIM_CONFIG,
                now_ms=self.now_ms,
            )
            self._after_raft(process)
            self._on(process, self._raft_period(process), self._raft_tick, process)
        self._note(f"start {process.name}")

    def _raft_tick(self, member: RaftMember) -> None:
        """The member's timers. A tick before the node's next deadline, with no other
        event on the node since the last tick, would fire nothing and send nothing
        (``next_deadline_ms`` is never later than the earliest timer): the node is not
        called, and the tick stays on its period (the same ticks at the same times)."""
        node = member.node
        assert node is not None
        if self.now_ms >= member.tick_due_ms:
            node.tick(self.now_ms)
            self._after_raft(member)
            deadline = node.next_deadline_ms()
            member.tick_due_ms = NEVER if deadline is None else deadline
        if isinstance(member, ControllerProcess):
            if member.controller is not None:
                self._controller_tick(member)
            self._on(member, TICK_MS, self._raft_tick, member)
        else:
            self._on(member, OBSERVER_TICK_MS, self._raft_tick, member)

    @staticmethod
    def _raft_period(member: RaftMember) -> int:
        return TICK_MS if isinstance(member, ControllerProcess) else OBSERVER_TICK_MS

    def _after_raft(self, member: RaftMember) -> None:
        node = member.node
        if node is None:
            return
        member.tick_due_ms = 0
        ready = node.ready()
        if ready.election_state is not None:
            member.persisted = ready.election_state
        if ready.must_flush and not member.flush_pending:
            member.flush_pending = True
            self._on(member, self.rng.randint(1, 5), self._raft_flush, member)
        for message in ready.messages:
            self._send(member.name, self.raft_names[message.destination], message)
        if isinstance(member, ControllerProcess):
            if ready.role is not None:
                self._note(f"{member.name}: raft {ready.role.role.value} epoch {ready.role.epoch}")
                if node.is_leader:
                    member.epoch_start = member.raft_log.end_offset
                elif member.controller is not None:
                    self._note(f"{member.name}: no longer the active controller")
                    member.controller = None
                    member.replies.clear()
            self._controller_progress(member)
        elif isinstance(member, BrokerProcess) and ready.high_watermark is not None:
            self._broker_metadata(member, ready.high_watermark)
        elif isinstance(member, CoordinatorProcess) and ready.high_watermark is not None:
            self._coordinator_metadata(member, ready.high_watermark)

    def _raft_flush(self, member: RaftMember) -> None:
        assert member.node is not None
        member.flush_pending = False
        member.raft_log.mark_flushed(member.raft_log.end_offset)
        member.node.on_flushed(member.raft_log.end_offset, self.now_ms)
        self._after_raft(member)

    # --- Controllers -----------------------------------------------------------------

    def _controller_progress(self, ctrl: ControllerProcess) -> None:
        node = ctrl.node
        assert node is not None
        hw = node.high_watermark
        if (
            ctrl.controller is None
            and node.is_leader
            and hw is not None
            and hw >= ctrl.epoch_start >= 0
        ):
            # Everything before this epoch is committed: the log is the metadata.
            image = MetadataImage.empty()
            entries = [
                e for e in ctrl.raft_log.entries(0, ctrl.raft_log.end_offset) if not e.is_control
            ]
            if entries:
                records = [self._decode(e.value) for e in entries if e.value is not None]
                image = (
                    MetadataDelta(image).replay_all(records).apply(entries[-1].offset, node.epoch)
                )
            ctrl.image = image
            ctrl.controller = QuorumController(
                lambda: ctrl.image, CONTROLLER_CONFIG, seed=self.seed
            )
            ctrl.controller.activate(self.now_ms)
            self._note(f"{ctrl.name}: active controller in epoch {node.epoch}")
        if hw is not None and ctrl.replies:
            ready = [r for r in ctrl.replies if r[0] < hw]
            ctrl.replies = [r for r in ctrl.replies if r[0] >= hw]
            for _, destination, reply in ready:
                self._send(ctrl.name, destination, reply)

    def _propose(self, ctrl: ControllerProcess, records: list[MetadataRecord]) -> int:
        """Append records to the metadata log; the offset of the last, -1 if none."""
        assert ctrl.node is not None
        if not records:
            return -1
        appended = ctrl.node.propose([encode_record(r) for r in records], self.now_ms)
        self._count_unclean_elections(ctrl.image, records)
        for record in records:
            if isinstance(record, CoordinatorAssignmentRecord):
                before = ctrl.image.coordinator_assignment(record.partition_id)
                if before is not None and before.coordinator_id not in (
                    -1,
                    record.coordinator_id,
                ):
                    self.coordinator_moves += 1
                    self.previous_owner[record.partition_id] = before.coordinator_id
                    if record.revoked_from is not None:
                        self.coordinator_revocations += 1
        ctrl.image = (
            MetadataDelta(ctrl.image).replay_all(records).apply(appended.offset, appended.epoch)
        )
        self._after_raft(ctrl)
        return appended.offset

    def _count_unclean_elections(self, image: MetadataImage, records: list[MetadataRecord]) -> None:
        """Count the leaders ``records`` elect from outside the ISR and the ELR (KIP-966):
        unclean elections, wherever the controller made them (its periodic election of
        leaderless partitions, or fencing a broker that was the last ISR member). With
        some, the loss of acknowledged writes is expected and reported as such."""
        partitions: dict[tuple[str, int], PartitionRegistration] = {}
        for record in records:
            if not isinstance(record, PartitionChangeRecord):
                continue
            key = (record.topic_id, record.partition_id)
            before = partitions.get(key)
            if before is None:
                topic = image.topic_by_id(record.topic_id)
                before = topic.partition(record.partition_id) if topic is not None else None
                if before is None:
                    continue
            after = before.merge(record)
            partitions[key] = after
            if (
                record.leader is not None
                and record.leader >= 0
                and not before.isr
                and not before.elr
                and before.last_known_elr
                and not self.scenario.unclean
            ):
                # KIP-966's unclean recovery: the longest log among the replicas that
                # answered (the last known ELR and any other replica, seed 9700852).
                # Not excused: a loss after it is a violation like any other.
                self.unclean_recoveries += 1
                self._note(
                    f"unclean recovery: p{record.partition_id} leader b{record.leader}, "
                    f"the longest log of the replicas (last known ELR "
                    f"{list(before.last_known_elr)})"
                )
            elif (
                record.leader is not None
                and record.leader >= 0
                and record.leader not in before.isr
                and record.leader not in before.elr
            ):
                self.unclean_elections += 1
                self._note(
                    f"unclean election: p{record.partition_id} leader b{record.leader}, "
                    f"not in the ISR {list(before.isr)} or the ELR {list(before.elr)}"
                )

    def _controller_call(self, ctrl: ControllerProcess, source: str, call: Any) -> None:
        if isinstance(call, m.ReplicaLogInfoResponse):
            if ctrl.controller is not None:
                ctrl.controller.replica_log_info(call)
            return
        if not isinstance(call, ControllerCall):
            return
        controller = ctrl.controller
        if controller is None:
            leader = ctrl.node.leader_id if ctrl.node is not None else None
            self._send(ctrl.name, source, ControllerReply("not-controller", call.corr, leader))
            return
        try:
            result: ControllerResult[Any]
            if call.kind == "register":
                result = controller.register_broker(call.body, self.now_ms)
            elif call.kind == "heartbeat":
                result = controller.broker_heartbeat(call.body, self.now_ms)
            elif call.kind == "alter_partition":
                result = controller.alter_partition(call.body)
            elif call.kind == "register_coordinator":
                result = controller.register_coordinator(call.body, self.now_ms)
            elif call.kind == "coordinator_heartbeat":
                result = controller.coordinator_heartbeat(call.body, self.now_ms)
            else:
                raise ValueError(call.kind)
        except ControllerApiError as e:
            self._send(ctrl.name, source, ControllerReply(call.kind, call.corr, e.code))
            return
        try:
            offset = self._propose(ctrl, result.records)
        except NotLeaderError:
            return
        reply = ControllerReply(call.kind, call.corr, result.response)
        if offset < 0:
            self._send(ctrl.name, source, reply)
        else:
            ctrl.replies.append((offset, source, reply))

    def _controller_tick(self, ctrl: ControllerProcess) -> None:
        controller = ctrl.controller
        assert controller is not None
        try:
            result = controller.tick(self.now_ms)
            records = list(result.records)
            if ctrl.image.topic(TOPIC) is None:
                active = [b for b in ctrl.image.brokers if ctrl.image.is_active_broker(b)]
                if len(active) >= self.scenario.replication_factor:
                    created = controller.create_topics(
                        m.CreateTopicsRequest(
                            (
                                m.CreatableTopic(
                                    TOPIC,
                                    self.scenario.partitions,
                                    self.scenario.replication_factor,
                                    configs={
                                        "min.insync.replicas": str(
                                            self.scenario.min_insync_replicas
                                        ),
                                        "unclean.leader.election.enable": str(
                                            self.scenario.unclean
                                        ).lower(),
                                        "segment.bytes": str(self.scenario.segment_bytes),
                                    },
                                ),
                            )
                        )
                    )
                    if not records:
                        records = list(created.records)
            if records:
                self._propose(ctrl, records)
        except NotLeaderError:
            return
        # Unclean recovery's questions go to the brokers over the network (KIP-966).
        for request in controller.replica_log_info_requests(self.now_ms):
            self._send(ctrl.name, f"b{request.broker_id}", request)

    # --- Brokers: life cycle and metadata ------------------------------------------------

    def _start_broker(self, broker: BrokerProcess) -> None:
        assert broker.disk is not None
        manager = SimLogManager(
            broker.disk.log_dirs, default_config=self.log_config, clock=self._wall_ms
        )
        manager.disk = broker.disk
        incarnation = broker.incarnation
        manager.add_failure_listener(
            lambda directory: self._log_dir_failed(broker, incarnation, directory.path)
        )
        try:
            manager.startup(cluster_id=CLUSTER_ID, node_id=broker.broker_id)
        except KafkaStorageError as e:
            # No log directory loads (every one failed): the broker process exits, as
            # Kafka's halts, and its operator starts it again once the disk is repaired.
            broker.alive = False
            self.halted_at_startup.add(broker.name)
            self.refused_starts += 1
            self._note(f"{broker.name} does not start: {e}")
            return
        broker.log_manager = manager
        broker.manager = PartitionManager(
            broker.broker_id,
            manager,
            clock=self._wall_ms,
            replica_lag_time_max_ms=self.scenario.replica_lag_time_max_ms,
        )
        broker.image = MetadataImage.empty()
        broker.applied = 0
        broker.broker_epoch = -1
        broker.registering_since = -1
        broker.purgatory.clear()
        broker.fetching.clear()
        broker.next_fetch.clear()
        broker.alter_sent.clear()
        self._on(broker, 1, self._broker_tick, broker)
        self._on(
            broker, self.rng.randint(1, self.scenario.flush_interval_ms), self._broker_flush, broker
        )
        self._on(
            broker,
            self.rng.randint(1, HIGH_WATERMARK_CHECKPOINT_MS),
            self._broker_checkpoints,
            broker,
            1,
        )

    def _topic_partitions(self, image: MetadataImage) -> list[TopicPartition]:
        """The clients' topic's partitions, then those of ``__consumer_offsets`` in ``image``."""
        tps = [TopicPartition(TOPIC, i) for i in range(self.scenario.partitions)]
        offsets = image.topic(CONSUMER_OFFSETS_TOPIC)
        if offsets is not None:
            tps += [TopicPartition(CONSUMER_OFFSETS_TOPIC, p) for p in sorted(offsets.partitions)]
        return tps

    def _wall_ms(self) -> int:
        return BASE_TIME_MS + self.now_ms

    def _controller_for(self, member: RaftMember) -> str:
        leader = member.node.leader_id if member.node is not None else None
        if leader is None or leader not in self.voters:
            leader = self.rng.choice(sorted(self.voters))
        return self.raft_names[leader]

    def _call_controller(self, broker: BrokerProcess, kind: str, body: Any) -> None:
        self.corr += 1
        self._send(broker.name, self._controller_for(broker), ControllerCall(kind, self.corr, body))

    def _decode(self, value: bytes) -> MetadataRecord:
        """The metadata record stored as ``value``, decoded once per schedule: every broker,
        coordinator and new active controller replays the same committed entries, and a
        record is immutable (a frozen dataclass), so they share it."""
        record = self._decoded.get(value)
        if record is None:
            record = self._decoded[value] = decode_record(value)
        return record

    def _broker_metadata(self, broker: BrokerProcess, high_watermark: int) -> None:
        if high_watermark <= broker.applied:
            return
        entries = broker.raft_log.entries(broker.applied, high_watermark)
        decode = self._decode
        records = [decode(e.value) for e in entries if not e.is_control and e.value is not None]
        broker.applied = high_watermark
        if not records:
            return
        broker.image = (
            MetadataDelta(broker.image)
            .replay_all(records)
            .apply(high_watermark - 1, entries[-1].epoch)
        )
        self._apply_image(broker)

    def _apply_image(self, broker: BrokerProcess) -> None:
        """Take the roles the image gives, once it holds this incarnation's registration.

        Before that, the image replayed after a restart is the previous incarnation's
        view: acting on it, a broker that lost its log's tail in a power loss leads again
        in its old epoch, and the followers truncate to its shorter log (``diverging
        epoch``) — acknowledged writes lost. Kafka's broker waits for its registration
        to be in the metadata it applies (the controller moves its leaderships first).
        :data:`APPLY_BEFORE_REGISTRATION` puts the early application back (a mutation test).
        """
        registration = broker.image.brokers.get(broker.broker_id)
        registered = registration is not None and registration.broker_epoch == broker.broker_epoch
        if not registered and not APPLY_BEFORE_REGISTRATION:
            return
        assert broker.manager is not None
        before = {
            p.topic_partition: (p.registration.leader, p.leader_epoch) for p in broker.manager
        }
        broker.manager.apply_image(broker.image)
        for partition in broker.manager:
            tp = partition.topic_partition
            now = (partition.registration.leader, partition.leader_epoch)
            if before.get(tp) != now:
                self._note(
                    f"{broker.name} {_label(tp)}: leader b{now[0]} epoch {now[1]} isr "
                    f"{list(partition.registration.isr)}, log end {partition.log_end_offset} "
                    f"hw {partition.high_watermark}"
                )
                if partition.follower_state is not None and now[0] >= 0:
                    self._maybe_fetch(broker, partition)
        self._after_broker(broker)

    def _broker_tick(self, broker: BrokerProcess) -> None:
        """Registration, heartbeat, ISR upkeep, fetches: the broker's periodic work."""
        now = self.now_ms
        if broker.broker_epoch < 0:
            if broker.registering_since < 0 or now - broker.registering_since > RPC_TIMEOUT_MS:
                broker.registering_since = now
                self._call_controller(
                    broker,
                    "register",
                    m.RegisterBrokerRequest(
                        broker.broker_id,
                        f"{broker.name}-{broker.incarnation}",
                        cluster_id=CLUSTER_ID,
                    ),
                )
        elif now - broker.heartbeat_sent >= CONTROLLER_CONFIG.broker_heartbeat_interval_ms:
            self._send_heartbeat(broker)
        assert broker.manager is not None
        for partition in list(broker.manager):
            proposal = partition.maybe_shrink_isr()
            state = partition.leader_state
            if state is not None and state.pending_proposal is not None:
                sent = broker.alter_sent.get(partition.topic_partition)
                if proposal is not None or sent is None or now - sent > RPC_TIMEOUT_MS:
                    self._send_alter_partition(broker, partition)
            if partition.follower_state is not None and partition.registration.leader >= 0:
                self._maybe_fetch(broker, partition)
        self._expire_purgatory(broker)
        self._after_broker(broker)
        self._on(broker, BROKER_TICK_MS, self._broker_tick, broker)

    def _send_heartbeat(self, broker: BrokerProcess) -> None:
        """A heartbeat, with the failed log directories and the replicas this broker
        cannot serve or may not lead (the service's report: ``offline_report``)."""
        assert broker.manager is not None
        broker.heartbeat_sent = self.now_ms
        offline_dirs, offline_replicas = broker.manager.offline_report()
        self._call_controller(
            broker,
            "heartbeat",
            m.BrokerHeartbeatRequest(
                broker.broker_id,
                broker.broker_epoch,
                broker.applied - 1,
                offline_log_dirs=tuple(offline_dirs),
                offline_replicas=tuple(offline_replicas),
            ),
        )

    def _log_dir_failed(self, broker: BrokerProcess, incarnation: int, path: Path) -> None:
        """The log manager took a directory offline (an I/O error in the middle of a
        request, a flush, a checkpoint): as the service does, its replicas stop
        replicating at once and the controller hears of it at once; with no directory
        left the broker stops (restarted once its disk is repaired)."""
        if not broker.alive or broker.incarnation != incarnation or broker.manager is None:
            return
        self.dirs_failed += 1
        stopped = broker.manager.stop_offline()
        self._note(
            f"{broker.name}: log directory {path.name} offline, "
            f"{', '.join(str(tp) for tp in stopped) or 'no replica'} stopped"
        )
        assert broker.log_manager is not None
        if not broker.log_manager.online_dirs:
            self._on(broker, 0, self._every_dir_failed, broker)
        elif broker.broker_epoch >= 0:
            self._on(broker, 0, self._send_heartbeat, broker)

    def _every_dir_failed(self, broker: BrokerProcess) -> None:
        self._note(f"{broker.name}: every log directory failed, the broker stops")
        self._crash(broker, mode="kill")

    def _send_alter_partition(self, broker: BrokerProcess, partition: Partition) -> None:
        state = partition.leader_state
        if state is None or state.pending_proposal is None or broker.broker_epoch < 0:
            return
        proposal = state.pending_proposal
        broker.alter_sent[partition.topic_partition] = self.now_ms
        item = m.AlterPartitionItem(
            partition.topic_id,
            partition.topic_partition.partition,
            proposal.leader_epoch,
            proposal.partition_epoch,
            proposal.new_isr,
        )
        self._call_controller(
            broker,
            "alter_partition",
            m.AlterPartitionRequest(broker.broker_id, broker.broker_epoch, (item,)),
        )

    def _broker_flush(self, broker: BrokerProcess) -> None:
        """The log manager's background flush (``log.flush.interval.ms``, the scenario's)."""
        manager = broker.log_manager
        assert manager is not None and broker.disk is not None
        for partition_log in list(manager.logs.values()):
            if partition_log.unflushed_messages == 0:
                continue
            try:
                partition_log.flush()
            except HighwaterError as e:
                self._note(f"{broker.name}: flush failed: {e}")
                continue
            broker.disk.flushed((s.log_path, s.size) for s in partition_log.segments)
        self._on(broker, self.scenario.flush_interval_ms, self._broker_flush, broker)

    def _broker_checkpoints(self, broker: BrokerProcess, round_: int) -> None:
        """The log manager's checkpoint tasks at the service's intervals scaled down ten
        times like every other timing: the high watermarks every 500 ms
        (``replica.high.watermark.checkpoint.interval.ms``), the recovery points every
        6 s (``log.flush.offset.checkpoint.interval.ms``). A high watermark may thus be
        checkpointed past what a power loss keeps of the log (recovery then knows the
        replica lost committed records), or lag it."""
        manager = broker.log_manager
        assert manager is not None
        manager.checkpoint_high_watermarks()
        if round_ % RECOVERY_POINT_CHECKPOINT_ROUNDS == 0:
            manager.checkpoint_recovery_points()
        self._on(broker, HIGH_WATERMARK_CHECKPOINT_MS, self._broker_checkpoints, broker, round_ + 1)

    # --- Brokers: requests ------------------------------------------------------------------

    def _broker_message(self, broker: BrokerProcess, source: str, message: Any) -> None:
        if isinstance(message, ControllerReply):
            self._broker_controller_reply(broker, message)
        elif isinstance(message, Fetch):
            self._leader_fetch(broker, source, message)
        elif isinstance(message, FetchReply):
            self._follower_fetch_reply(broker, message)
        elif isinstance(message, Produce):
            self._produce(broker, source, message)
        elif isinstance(message, ConsumerFetch):
            self._consumer_fetch(broker, source, message)
        elif isinstance(message, m.ReplicaLogInfoRequest):
            self._replica_log_info(broker, source, message)
        self._after_broker(broker)

    def _replica_log_info(
        self, broker: BrokerProcess, source: str, request: m.ReplicaLogInfoRequest
    ) -> None:
        """The broker's answer to unclean recovery's question, from its logs."""
        if broker.manager is None or broker.broker_epoch < 0:
            return
        infos = tuple(broker.manager.replica_log_info(t, p) for t, p in request.partitions)
        self._note(
            f"{broker.name}: log info for the controller "
            + ", ".join(
                f"p{i.partition_id} {i.last_leader_epoch}/{i.log_end_offset}" for i in infos
            )
        )
        self._send(
            broker.name,
            source,
            m.ReplicaLogInfoResponse(broker.broker_id, broker.broker_epoch, infos),
        )

    def _broker_controller_reply(self, broker: BrokerProcess, reply: ControllerReply) -> None:
        if reply.kind == "not-controller":
            return
        body = reply.body
        if reply.kind == "register" and isinstance(body, m.RegisterBrokerResponse):
            if body.error == NONE and broker.broker_epoch < 0:
                broker.broker_epoch = body.broker_epoch
                self._note(f"{broker.name}: registered, broker epoch {body.broker_epoch}")
                self._apply_image(broker)
        elif reply.kind == "heartbeat" and isinstance(body, m.BrokerHeartbeatResponse):
            if body.error == ErrorCode.STALE_BROKER_EPOCH:
                broker.broker_epoch = -1
        elif reply.kind == "alter_partition" and isinstance(body, m.AlterPartitionResponse):
            assert broker.manager is not None
            for result in body.partitions:
                if result.error == NONE:
                    continue
                topic = broker.image.topic_by_id(result.topic_id)
                if topic is None:
                    continue
                partition = self._partition(broker, result.partition_id, topic.name)
                state = partition.leader_state if partition is not None else None
                if state is None or state.pending_proposal is None:
                    continue
                again = state.on_alter_partition_error(state.pending_proposal, result.error)
                if again is not None and partition is not None:
                    self._send_alter_partition(broker, partition)

    def _partition(self, broker: BrokerProcess, index: int, topic: str = TOPIC) -> Partition | None:
        if broker.manager is None:
            return None
        try:
            return broker.manager.get(topic, index)
        except PartitionError:
            return None

    def _maybe_fetch(self, broker: BrokerProcess, partition: Partition) -> None:
        tp = partition.topic_partition
        sent = broker.fetching.get(tp)
        if sent is not None and self.now_ms - sent < FETCH_TIMEOUT_MS:
            return
        if self.now_ms < broker.next_fetch.get(tp, 0):
            return
        broker.fetching[tp] = self.now_ms
        self._send(
            broker.name,
            f"b{partition.registration.leader}",
            Fetch(
                tp.partition,
                broker.broker_id,
                partition.log_end_offset,
                partition.last_fetched_epoch,
                partition.leader_epoch,
                tp.topic,
            ),
        )

    def _leader_fetch(self, broker: BrokerProcess, source: str, fetch: Fetch) -> None:
        partition = self._partition(broker, fetch.partition, fetch.topic)
        if partition is None:
            self._send(broker.name, source, fetch.refused(ErrorCode.NOT_LEADER_OR_FOLLOWER))
            return
        try:
            read = partition.read_for_follower(
                fetch.replica_id,
                fetch.fetch_offset,
                fetch.last_fetched_epoch,
                FETCH_MAX_BYTES,
                fetch.leader_epoch,
            )
        except HighwaterError as e:  # PartitionError among them: the edge answers its code
            self._send(broker.name, source, fetch.refused(e.code))
            return
        reply = FetchReply(
            fetch.partition,
            fetch.leader_epoch,
            fetch.fetch_offset,
            NONE,
            read.data.records if read.data is not None else b"",
            read.diverging,
            partition.high_watermark,
            fetch.topic,
        )
        if read.proposal is not None:
            self._send_alter_partition(broker, partition)
        self._send(broker.name, source, reply)

    def _follower_fetch_reply(self, broker: BrokerProcess, reply: FetchReply) -> None:
        partition = self._partition(broker, reply.partition, reply.topic)
        if (
            partition is None
            or partition.follower_state is None
            or partition.leader_epoch != reply.leader_epoch
            or partition.log_end_offset != reply.fetch_offset
        ):
            return  # stale: a duplicate, or for an older role or position
        tp = partition.topic_partition
        broker.fetching.pop(tp, None)
        delay = 0
        try:
            if reply.error != NONE:
                delay = 20
                self._note(
                    f"{broker.name} {_label(tp)}: fetch at {reply.fetch_offset} refused: "
                    f"{ErrorCode.Name(reply.error)}"
                )
            elif reply.diverging is not None:
                before = partition.log_end_offset
                run_sync(partition.truncate_to_diverging_epoch(reply.diverging))
                self._note(
                    f"{broker.name} {_label(tp)}: diverging epoch {tuple(reply.diverging)}, "
                    f"truncated {before} -> {partition.log_end_offset}"
                )
            else:
                partition.append_as_follower(reply.records, reply.high_watermark)
                if not reply.records:
                    delay = 15
        except HighwaterError as e:
            self._note(
                f"{broker.name} {_label(tp)}: follower fetch failed: {type(e).__name__}: {e}"
            )
            delay = 50
        broker.next_fetch[tp] = self.now_ms + delay
        if delay == 0:
            self._maybe_fetch(broker, partition)
        else:
            self._on(broker, delay, self._fetch_after_backoff, broker, tp)

    def _fetch_after_backoff(self, broker: BrokerProcess, tp: TopicPartition) -> None:
        """A follower's backoff after an empty or failed fetch ended: fetch again."""
        partition = self._partition(broker, tp.partition, tp.topic)
        if (
            partition is not None
            and partition.follower_state is not None
            and partition.registration.leader >= 0
        ):
            self._maybe_fetch(broker, partition)

    def _produce(self, broker: BrokerProcess, source: str, produce: Produce) -> None:
        partition = self._partition(broker, produce.partition, produce.topic)
        hint = broker.image.topic(produce.topic)
        leader_hint = -1
        if hint is not None and hint.partition(produce.partition) is not None:
            leader_hint = hint.partition(produce.partition).leader  # type: ignore[union-attr]
        if partition is None:
            self._send(
                broker.name,
                source,
                ProduceReply(
                    produce.partition,
                    produce.corr,
                    ErrorCode.NOT_LEADER_OR_FOLLOWER,
                    leader_hint=leader_hint,
                    topic=produce.topic,
                ),
                reliable=True,
            )
            return
        batch = produce.records or build_batch(
            [SimpleRecord(value=produce.value.encode(), timestamp=self._wall_ms())]
        )
        try:
            info = partition.append(batch, -1)
        except PartitionError as e:
            self._send(
                broker.name,
                source,
                ProduceReply(
                    produce.partition,
                    produce.corr,
                    e.code,
                    leader_hint=leader_hint,
                    topic=produce.topic,
                ),
                reliable=True,
            )
            return
        except HighwaterError as e:
            self._note(f"{broker.name} {_label(partition.topic_partition)}: append failed: {e}")
            self._send(
                broker.name,
                source,
                ProduceReply(produce.partition, produce.corr, e.code, topic=produce.topic),
                reliable=True,
            )
            return
        broker.purgatory.append(
            Waiting(
                produce.partition,
                partition.log_end_offset,
                info.first_offset,
                source,
                produce.corr,
                self.now_ms + PRODUCE_TIMEOUT_MS,
                produce.topic,
            )
        )

    def _complete_produces(self, broker: BrokerProcess) -> None:
        if not broker.purgatory:
            return
        still = []
        for waiting in broker.purgatory:
            partition = self._partition(broker, waiting.partition, waiting.topic)
            if partition is None:
                completion_error, completed = ErrorCode.NOT_LEADER_OR_FOLLOWER, True
            else:
                completed, completion_error = partition.produce_completion(waiting.required_offset)
            if not completed:
                still.append(waiting)
                continue
            self._send(
                broker.name,
                waiting.producer,
                ProduceReply(
                    waiting.partition,
                    waiting.corr,
                    completion_error,
                    waiting.first_offset,
                    topic=waiting.topic,
                ),
                reliable=True,
            )
        broker.purgatory = still

    def _expire_purgatory(self, broker: BrokerProcess) -> None:
        expired = [w for w in broker.purgatory if w.deadline_ms <= self.now_ms]
        if not expired:
            return
        broker.purgatory = [w for w in broker.purgatory if w.deadline_ms > self.now_ms]
        for waiting in expired:
            self._send(
                broker.name,
                waiting.producer,
                ProduceReply(
                    waiting.partition,
                    waiting.corr,
                    ErrorCode.REQUEST_TIMED_OUT,
                    topic=waiting.topic,
                ),
                reliable=True,
            )

    def _consumer_fetch(self, broker: BrokerProcess, source: str, fetch: ConsumerFetch) -> None:
        partition = self._partition(broker, fetch.partition, fetch.topic)
        if partition is None:
            reply = fetch.refused(ErrorCode.NOT_LEADER_OR_FOLLOWER)
        else:
            try:
                data = partition.read(fetch.offset, FETCH_MAX_BYTES, -1)
            except HighwaterError as e:  # PartitionError among them: the edge answers its code
                reply = fetch.refused(e.code)
            else:
                reply = ConsumerFetchReply(
                    fetch.partition,
                    fetch.offset,
                    NONE,
                    data.records,
                    topic=fetch.topic,
                    high_watermark=partition.high_watermark,
                )
        self._send(broker.name, source, reply, reliable=True)

    # --- Clients -------------------------------------------------------------------------

    def _client_tick(self, client: Client) -> None:
        for index in range(self.scenario.partitions):
            in_flight = client.in_flight.get(index)
            if in_flight is not None:
                _corr, value, deadline = in_flight
                if self.now_ms < deadline:
                    continue
                del client.in_flight[index]
                if client.name in self.producers:
                    self.history.append(
                        self._op(
                            "write",
                            client.name,
                            status="fail",
                            partition=index,
                            value=value,
                            error="timeout",
                        )
                    )
            if client.name in self.producers:
                if self.chaos and self.rng.random() < 0.5:
                    self._produce_one(client, index)
            else:
                self._consume_one(client, index)
        interval = self.scenario.produce_interval_ms if client.name in self.producers else 100
        self._on(client, interval, self._client_tick, client)

    def _leader_guess(self, client: Client, index: int) -> str:
        leader = client.leaders.get(index)
        return leader if leader is not None else self.rng.choice(sorted(self.brokers))

    def _produce_one(self, client: Client, index: int) -> None:
        client.sequence += 1
        value = f"{client.name}-{client.sequence}"
        self.corr += 1
        client.in_flight[index] = (self.corr, value, self.now_ms + PRODUCE_TIMEOUT_MS + 200)
        self.history.append(
            self._op("write", client.name, status="invoke", partition=index, value=value)
        )
        self._send(
            client.name,
            self._leader_guess(client, index),
            Produce(index, self.corr, value),
            reliable=True,
        )

    def _consume_one(self, client: Client, index: int) -> None:
        self.corr += 1
        client.in_flight[index] = (self.corr, "", self.now_ms + 500)
        offset = client.positions.get(index, 0)
        self._send(
            client.name,
            self._leader_guess(client, index),
            ConsumerFetch(index, offset),
            reliable=True,
        )

    def _client_reply(self, client: Client, source: str, reply: Any) -> None:
        if isinstance(reply, ProduceReply):
            in_flight = client.in_flight.get(reply.partition)
            if in_flight is None or in_flight[0] != reply.corr:
                return
            del client.in_flight[reply.partition]
            value = in_flight[1]
            if reply.error == NONE:
                self.history.append(
                    self._op(
                        "write",
                        client.name,
                        status="ok",
                        partition=reply.partition,
                        value=value,
                        offset=reply.offset,
                    )
                )
                return
            self.history.append(
                self._op(
                    "write",
                    client.name,
                    status="fail",
                    partition=reply.partition,
                    value=value,
                    error=ErrorCode.Name(reply.error),
                )
            )
            self._learn_leader(client, reply.partition, reply.leader_hint)
        elif isinstance(reply, ConsumerFetchReply):
            in_flight = client.in_flight.pop(reply.partition, None)
            if in_flight is None or reply.offset != client.positions.get(reply.partition, 0):
                return
            if reply.error != NONE:
                self._learn_leader(client, reply.partition, reply.leader_hint)
                return
            client.leaders[reply.partition] = source
            position = reply.offset
            for batch in iter_batches(reply.records):
                for record in batch.records():
                    if record.offset < position or record.value is None:
                        continue
                    self.history.append(
                        self._op(
                            "read",
                            client.name,
                            partition=reply.partition,
                            offset=record.offset,
                            value=record.value.decode(),
                        )
                    )
                    position = record.offset + 1
            client.positions[reply.partition] = position

    def _learn_leader(self, client: Client, index: int, hint: int) -> None:
        if hint >= 0:
            client.leaders[index] = f"b{hint}"
        else:
            client.leaders.pop(index, None)

    def _op(self, kind: str, process: str, **fields: Any) -> Op:
        return {"t": self.now_ms / 1000, "kind": kind, "process": process, **fields}

    # --- Group coordinators ------------------------------------------------------------
    #
    # The glue of CoordinatorServer (highwater.coordinator.service) and of its appender
    # (highwater.coordinator.offsets_log), as events: the registration and heartbeats
    # with the controller and the session lease; following the metadata image for the
    # assignments; per partition, fencing with the epoch marker, replaying the partition
    # from the brokers, then appending the core's writes with acks=all as the partition's
    # idempotent producer (producer epoch = coordinator epoch).

    def _start_coordinator(self, c: CoordinatorProcess) -> None:
        c.core = GroupCoordinatorCore(
            GroupCoordinatorSettings(group_initial_rebalance_delay_ms=0),
            lambda group: partition_for_group(
                group, CONTROLLER_CONFIG.offsets_topic_num_partitions
            ),
            new_member_id=lambda prefix: f"{prefix}-{self.rng.getrandbits(32):08x}",
        )
        names = (f"{c.name}-{c.incarnation}-{n}" for n in itertools.count())
        c.ownership = PartitionOwnership(
            c.node_id, CONTROLLER_CONFIG.coordinator_session_timeout_ms, lambda: next(names)
        )
        c.image = MetadataImage.empty()
        c.applied = 0
        c.registration_epoch = -1
        c.registering_since = -1
        c.heartbeat_sent = -1_000_000
        c.calls.clear()
        c.partitions.clear()
        c.pending.clear()
        self._on(c, 1, self._coordinator_tick, c)

    def _coordinator_tick(self, c: CoordinatorProcess) -> None:
        now = self.now_ms
        self._check_lease(c)
        if c.registration_epoch < 0:
            if c.registering_since < 0 or now - c.registering_since > RPC_TIMEOUT_MS:
                self._register_coordinator(c)
        elif now - c.heartbeat_sent >= CONTROLLER_CONFIG.coordinator_heartbeat_interval_ms:
            c.heartbeat_sent = now
            self._coordinator_call(
                c,
                "coordinator_heartbeat",
                m.CoordinatorHeartbeatRequest(
                    c.node_id, c.registration_epoch, metadata_offset=c.ownership.applied_offset
                ),
                c.registration_epoch,
            )
        assert c.core is not None
        if not self._lapsed(c):
            self._coordinator_effects(c, c.core.tick(now))
        for partition, state in list(c.partitions.items()):
            if state.corr >= 0 and now - state.sent_ms > (
                OFFSETS_READ_TIMEOUT_MS if state.phase == "reading" else PRODUCE_TIMEOUT_MS + 200
            ):
                # No answer: the connection is gone; a produce's outcome is unknown.
                state.corr = -1
                if state.phase != "reading":
                    self._offsets_produce_answered(
                        c, partition, state, ErrorCode.NETWORK_EXCEPTION, -1
                    )
                    continue
            if state.corr < 0 and now >= state.retry_at:
                self._offsets_send(c, partition, state)
        self._on(c, BROKER_TICK_MS, self._coordinator_tick, c)

    def _register_coordinator(self, c: CoordinatorProcess) -> None:
        """CoordinatorServer._register: the incarnation the ownership names."""
        c.registering_since = self.now_ms
        incarnation_id = c.ownership.incarnation_id
        self._coordinator_call(
            c,
            "register_coordinator",
            m.RegisterCoordinatorRequest(c.node_id, incarnation_id, cluster_id=CLUSTER_ID),
            incarnation_id,
        )

    def _coordinator_call(
        self, c: CoordinatorProcess, kind: str, body: Any, sent_for: object
    ) -> None:
        self.corr += 1
        c.calls[self.corr] = (self.now_ms, sent_for)
        self._send(c.name, self._controller_for(c), ControllerCall(kind, self.corr, body))

    def _lapsed(self, c: CoordinatorProcess) -> bool:
        return c.ownership.lapsed  # never, with LEASE_CHECKED off: lapse() is not called

    def _check_lease(self, c: CoordinatorProcess) -> None:
        """CoordinatorServer.check_lease: once no heartbeat was acknowledged for the
        session timeout, the controller may have given the partitions away; serve none."""
        if not group_clients.LEASE_CHECKED:
            return
        stop = c.ownership.lapse(self.now_ms)
        if stop:
            self._note(f"{c.name}: session lease lapsed, serving nothing")
        for partition in stop or ():
            self._stop_offsets_partition(c, partition)

    def _renew_lease(self, c: CoordinatorProcess, sent: int) -> None:
        if c.ownership.renew(sent):
            self._note(f"{c.name}: session lease renewed")
            self._coordinator_assignments(c)

    def _coordinator_metadata(self, c: CoordinatorProcess, high_watermark: int) -> None:
        if high_watermark <= c.applied:
            return
        entries = c.raft_log.entries(c.applied, high_watermark)
        decode = self._decode
        records = [decode(e.value) for e in entries if not e.is_control and e.value is not None]
        c.applied = high_watermark
        if not records:
            return
        c.image = (
            MetadataDelta(c.image).replay_all(records).apply(high_watermark - 1, entries[-1].epoch)
        )
        self._coordinator_assignments(c)

    def _coordinator_assignments(self, c: CoordinatorProcess) -> None:
        """CoordinatorServer._on_image: carry out what the ownership decides."""
        if c.core is None:
            return
        incarnations = c.ownership.incarnations
        change = c.ownership.follow(c.image)
        for partition in change.stop:
            self._stop_offsets_partition(c, partition)
        if c.ownership.incarnations != incarnations:
            self.reincarnations += 1
            self._note(
                f"{c.name}: a partition is still assigned in an epoch taken over before; "
                f"registering again as {c.ownership.incarnation_id}"
            )
        for partition, epoch in change.take_over:
            state = OffsetsPartition(epoch)
            state.records = [encode_epoch_marker(c.node_id, epoch)]
            c.partitions[partition] = state
            c.core.begin_loading(partition)
            self._note(f"{c.name}: taking over offsets partition {partition} in epoch {epoch}")
            self._offsets_send(c, partition, state)

    def _stop_offsets_partition(self, c: CoordinatorProcess, partition: int) -> None:
        c.partitions.pop(partition, None)
        self._note(f"{c.name}: no longer serves offsets partition {partition}")
        assert c.core is not None
        self._coordinator_effects(c, c.core.unload(partition))

    def _lose_offsets_partition(
        self, c: CoordinatorProcess, partition: int, state: OffsetsPartition, *, failed: bool
    ) -> None:
        """The end of CoordinatorServer._serve_partition: fenced by a newer owner (the
        image will show the move), or failed (most likely still assigned here in this
        epoch); the ownership decides what next."""
        c.ownership.lost(partition, state.epoch, fenced=not failed)
        self._stop_offsets_partition(c, partition)
        self._coordinator_assignments(c)

    def _coordinator_message(self, c: CoordinatorProcess, message: Any) -> None:
        if c.core is None:
            return
        if isinstance(message, ControllerReply):
            call = c.calls.pop(message.corr, None)
            body = message.body
            if call is None:
                return
            sent, sent_for = call
            if isinstance(body, m.RegisterCoordinatorResponse):
                if (
                    body.error == NONE
                    and sent_for == c.ownership.incarnation_id
                    and (c.registration_epoch < 0 or c.ownership.register_again)
                ):
                    c.registration_epoch = body.registration_epoch
                    c.registering_since = -1
                    c.ownership.registered(sent_for)
                    self._note(f"{c.name}: registered {sent_for}, epoch {body.registration_epoch}")
                    c.ownership.renew(sent)
                    self._coordinator_assignments(c)
            elif (
                isinstance(body, m.CoordinatorHeartbeatResponse)
                and sent_for == c.registration_epoch
            ):
                if body.error == NONE:
                    self._renew_lease(c, sent)
                elif body.error in (
                    ErrorCode.BROKER_ID_NOT_REGISTERED,
                    ErrorCode.STALE_BROKER_EPOCH,
                ):
                    self._note(f"{c.name}: registration lost; registering again")
                    self._check_lease(c)
                    c.registration_epoch = -1
                    c.registering_since = -1
                if (
                    c.ownership.register_again
                    and c.registration_epoch >= 0
                    and (
                        c.registering_since < 0
                        or self.now_ms - c.registering_since > RPC_TIMEOUT_MS
                    )
                ):
                    # CoordinatorServer._heartbeat_forever: register after the heartbeat.
                    self._register_coordinator(c)
        elif isinstance(message, ProduceReply) and message.topic == CONSUMER_OFFSETS_TOPIC:
            state = c.partitions.get(message.partition)
            if state is not None and state.corr == message.corr and state.phase != "reading":
                state.corr = -1
                self._offsets_produce_answered(
                    c, message.partition, state, message.error, message.offset
                )
        elif isinstance(message, ConsumerFetchReply) and message.topic == CONSUMER_OFFSETS_TOPIC:
            state = c.partitions.get(message.partition)
            if (
                state is not None
                and state.phase == "reading"
                and state.corr >= 0
                and message.offset == state.read_offset
            ):
                state.corr = -1
                self._offsets_read_answered(c, message.partition, state, message)
        self._coordinator_after(c)

    def _coordinator_after(self, c: CoordinatorProcess) -> None:
        """Send what became ready: the next batch of a partition with none in flight."""
        for partition, state in list(c.partitions.items()):
            if (
                state.phase == "serving"
                and state.in_flight is None
                and state.writes
                and state.corr < 0
            ):
                state.in_flight, state.writes = state.writes, []
                state.records = [r for w in state.in_flight for r in w.records]
                state.in_doubt = False
                state.deadline_ms = self.now_ms + OFFSETS_COMMIT_TIMEOUT_MS
                self._offsets_send(c, partition, state)

    def _offsets_leader(self, c: CoordinatorProcess, partition: int) -> str | None:
        topic = c.image.topic(CONSUMER_OFFSETS_TOPIC)
        registration = topic.partition(partition) if topic is not None else None
        if registration is None or registration.leader < 0:
            return None
        return f"b{registration.leader}"

    def _offsets_send(self, c: CoordinatorProcess, partition: int, state: OffsetsPartition) -> None:
        """Send the partition's outstanding request (the marker or the batch in flight, or
        the next read) to the partition's leader in the coordinator's image."""
        if state.phase == "serving" and state.in_flight is None:
            return
        leader = self._offsets_leader(c, partition)
        if leader is None:
            state.retry_at = self.now_ms + OFFSETS_RETRY_BACKOFF_MS
            if state.phase == "serving" and not state.in_doubt:
                self._offsets_give_up(c, partition, state, ErrorCode.LEADER_NOT_AVAILABLE)
            return
        self.corr += 1
        state.corr = self.corr
        state.sent_ms = self.now_ms
        if state.phase == "reading":
            self._send(
                c.name,
                leader,
                ConsumerFetch(partition, state.read_offset, CONSUMER_OFFSETS_TOPIC),
                reliable=True,
            )
            return
        batch = build_batch(
            [SimpleRecord(key=k, value=v, timestamp=self._wall_ms()) for k, v in state.records],
            producer_id=COORDINATOR_PRODUCER_ID_BASE + partition,
            producer_epoch=state.epoch,
            base_sequence=state.next_sequence,
        )
        self._send(
            c.name,
            leader,
            Produce(partition, self.corr, "", CONSUMER_OFFSETS_TOPIC, batch),
            reliable=True,
        )

    def _offsets_give_up(
        self, c: CoordinatorProcess, partition: int, state: OffsetsPartition, error: int
    ) -> None:
        """A batch refused outright, or not appended within offsets.commit.timeout.ms."""
        if (
            state.deadline_ms is not None
            and self.now_ms < state.deadline_ms
            and error in (_LEADER_ERRORS | {ErrorCode.NOT_ENOUGH_REPLICAS})
        ):
            return
        writes, state.in_flight = state.in_flight or [], None
        assert c.core is not None
        for write in writes:
            self._coordinator_effects(c, c.core.write_completed(write.write_id, error, self.now_ms))

    def _offsets_produce_answered(
        self,
        c: CoordinatorProcess,
        partition: int,
        state: OffsetsPartition,
        error: int,
        offset: int,
    ) -> None:
        """PartitionAppender._append_until_known, one answer at a time."""
        assert c.core is not None
        if error == NONE:
            state.next_sequence += len(state.records)
            if state.phase == "fencing":
                state.marker_offset = offset
                self.markers.setdefault(partition, []).append((offset, state.epoch))
                self._act(c, partition, state.epoch)
                state.phase = "reading"
                state.read_offset = 0
                state.raw = []
                if offset == 0:
                    self._offsets_loaded(c, partition, state)
                else:
                    self._offsets_send(c, partition, state)
                return
            for marker_offset, epoch in self.markers.get(partition, []):
                if epoch > state.epoch and marker_offset < offset:
                    self._fail(
                        f"{c.name}: a write of coordinator epoch {state.epoch} to offsets "
                        f"partition {partition} acknowledged at {offset}, after the marker of "
                        f"epoch {epoch} at {marker_offset}: a deposed coordinator's commit"
                    )
            self._act(c, partition, state.epoch)
            writes, state.in_flight = state.in_flight or [], None
            for write in writes:
                self._coordinator_effects(
                    c, c.core.write_completed(write.write_id, NONE, self.now_ms)
                )
            return
        if error in _FENCED_ERRORS:
            self._note(f"{c.name}: offsets partition {partition} epoch {state.epoch} fenced")
            self._lose_offsets_partition(c, partition, state, failed=False)
            return
        if error == ErrorCode.UNKNOWN_PRODUCER_ID and not state.in_doubt:
            state.next_sequence = 0
            self._offsets_send(c, partition, state)
            return
        state.retry_at = self.now_ms + OFFSETS_RETRY_BACKOFF_MS
        if error in _IN_DOUBT_ERRORS:
            state.in_doubt = True
        elif error not in _LEADER_ERRORS and error != ErrorCode.NOT_ENOUGH_REPLICAS:
            if state.in_doubt or state.phase == "fencing":
                self._note(
                    f"{c.name}: offsets partition {partition} failed: {ErrorCode.Name(error)}"  # type: ignore[arg-type]
                )
                self._lose_offsets_partition(c, partition, state, failed=True)
            else:
                self._offsets_give_up(c, partition, state, error)
        elif state.phase == "serving" and not state.in_doubt:
            self._offsets_give_up(c, partition, state, error)

    def _offsets_read_answered(
        self,
        c: CoordinatorProcess,
        partition: int,
        state: OffsetsPartition,
        reply: ConsumerFetchReply,
    ) -> None:
        """OffsetsTopicClient.read, one answer at a time: every record below the marker."""
        if reply.error != NONE:
            if reply.error in _LEADER_ERRORS or reply.error in (
                ErrorCode.NOT_LEADER_OR_FOLLOWER,
                ErrorCode.OFFSET_OUT_OF_RANGE,
            ):
                state.retry_at = self.now_ms + OFFSETS_RETRY_BACKOFF_MS
                return
            self._note(f"{c.name}: reading offsets partition {partition} failed")
            self._lose_offsets_partition(c, partition, state, failed=True)
            return
        for batch in iter_batches(reply.records):
            if batch.next_offset <= state.read_offset:
                continue
            for record in batch.records():
                if state.read_offset <= record.offset < state.marker_offset:
                    state.raw.append((record.key, record.value))  # type: ignore[arg-type]
            state.read_offset = batch.next_offset
        if state.read_offset >= state.marker_offset:
            self._offsets_loaded(c, partition, state)
        elif not reply.records:
            state.retry_at = self.now_ms + OFFSETS_RETRY_BACKOFF_MS
        else:
            self._offsets_send(c, partition, state)

    def _offsets_loaded(
        self, c: CoordinatorProcess, partition: int, state: OffsetsPartition
    ) -> None:
        assert c.core is not None
        records: list[OffsetsRecord] = []
        for key, value in state.raw:
            try:
                records.append(decode_offsets_record(key, value))
            except CorruptOffsetsRecordError as e:
                self._note(f"{c.name}: offsets partition {partition}: skipping a record: {e}")
        c.core.load(partition, state.epoch, records, self.now_ms)
        state.phase = "serving"
        state.raw = []
        state.records = []
        self._act(c, partition, state.epoch)
        self._note(
            f"{c.name}: serving offsets partition {partition} in epoch {state.epoch} "
            f"({len(records)} records replayed)"
        )

    def _coordinator_effects(self, c: CoordinatorProcess, effects: list[Any]) -> None:
        for effect in effects:
            if isinstance(effect, Reply):
                reply = c.pending.pop(effect.token, None)
                if reply is not None:
                    reply(effect.result)
            elif isinstance(effect, RebalanceCompleted):
                continue
            elif isinstance(effect, Write):
                state = c.partitions.get(effect.partition)
                if state is None:
                    assert c.core is not None
                    self._coordinator_effects(
                        c,
                        c.core.write_completed(
                            effect.write_id, ErrorCode.NOT_COORDINATOR, self.now_ms
                        ),
                    )
                    continue
                state.writes.append(effect)
        self._coordinator_after(c)

    def _act(self, c: CoordinatorProcess, partition: int, epoch: int) -> None:
        """One coordinator acts in each coordinator epoch of a partition."""
        actor = self.epoch_actor.setdefault((partition, epoch), c.name)
        if actor != c.name:
            self._fail(
                f"{actor} and {c.name} both act in coordinator epoch {epoch} of offsets "
                f"partition {partition}"
            )

    def _group_request(
        self,
        client: str,
        c: CoordinatorProcess,
        serve: Callable[[Callable[[object], None]], None],
        answer: Callable[[object], None],
    ) -> None:
        """A group client's request on its in-order connection to ``c`` (lost while a
        ``cut-clients`` fault or a partition cuts them; queued while ``c`` is paused)."""
        self.messages["GroupRequest"] += 1
        key = (client, c.name)
        delay = self.rng.randint(1, self.scenario.max_delay_ms)
        when = max(self.connection_free.get(key, 0), self.now_ms + delay)
        self.connection_free[key] = when
        incarnation = c.incarnation

        def reply(result: object) -> None:
            if self.blocked[(c.name, client)] > 0:
                return
            back = self.rng.randint(1, self.scenario.max_delay_ms)
            self._at(self.now_ms + back, answer, result)

        def arrive() -> None:
            if self.blocked[(client, c.name)] > 0:
                return
            self._run_on(c, incarnation, serve, (reply,))

        self._at(when, arrive)

    def _find_coordinator(self, group: str) -> CoordinatorProcess | None:
        """FindCoordinator, answered by a broker from its metadata image; now and then from
        metadata that lags (the partition's previous owner)."""
        partition = partition_for_group(group, CONTROLLER_CONFIG.offsets_topic_num_partitions)
        brokers = [b for b in self.brokers.values() if b.alive and b.broker_epoch >= 0]
        if not brokers:
            return None
        image = self.rng.choice(brokers).image
        assignment = image.coordinator_assignment(partition)
        if assignment is None or assignment.coordinator_id < 0:
            return None
        node = assignment.coordinator_id
        previous = self.previous_owner.get(partition)
        if previous is not None and self.rng.random() < STALE_LOOKUP_RATE:
            node = previous
        return self.coordinators.get(COORDINATORS[node - 1])

    def _serving(self, c: CoordinatorProcess) -> bool:
        """The edge's check before every request."""
        if c.core is None:
            return False
        self._check_lease(c)
        return not self._lapsed(c)

    # --- Checks at every step ------------------------------------------------------------

    def _after_broker(self, broker: BrokerProcess) -> None:
        if broker.manager is None:
            return
        self._complete_produces(broker)
        self._check_broker(broker)

    def _check_broker(self, broker: BrokerProcess) -> None:
        faults = self.disk_faults
        if faults is None:
            self._check_broker_now(broker)
            return
        faults.suspended = True
        try:
            self._check_broker_now(broker)
        finally:
            faults.suspended = False

    def _check_broker_now(self, broker: BrokerProcess) -> None:
        """The invariants a broker's partitions must keep after every event."""
        assert broker.manager is not None
        log_manager = broker.log_manager
        if log_manager is not None and not all(d.online for d in log_manager.log_dirs):
            for tp in log_manager.offline_partitions:
                replica = broker.manager.replica(tp)
                if replica is not None and (
                    replica.leader_state is not None or replica.follower_state is not None
                ):
                    role = "leads" if replica.leader_state is not None else "follows"
                    self._fail(
                        f"{broker.name} {_label(tp)}: its log directory is offline, "
                        f"yet it still {role} in leader epoch {replica.leader_epoch}"
                    )
        name = broker.name
        checked = self._checked
        verified = self.verified
        leading = self._leading
        for partition in broker.manager:
            tp = partition.topic_partition
            key = (name, tp)
            state = partition.leader_state
            last = leading.get(key) if state is not None else None
            if state is not None and (
                last is None
                or last[0] is not state
                or last[1] != state.leader_epoch
                or last[2] != state.high_watermark
            ):
                # The same leader state (this incarnation's, in this epoch) checked already
                # at this high watermark has nothing new to check.
                leading[key] = (state, state.leader_epoch, state.high_watermark)
                leader = self.epoch_leaders.setdefault((tp, state.leader_epoch), broker.name)
                if leader != broker.name:
                    self._fail(
                        f"{_label(tp)}: two leaders in leader epoch {state.leader_epoch}: "
                        f"{leader} and {broker.name}"
                    )
                hw_key = (broker.name, broker.incarnation, tp, state.leader_epoch)
                previous = self.leader_hw.get(hw_key)
                if previous is None:
                    self._check_leader_complete(broker, partition)
                elif state.high_watermark < previous:
                    self._fail(
                        f"{broker.name} {_label(tp)}: the leader's high watermark went back "
                        f"from {previous} to {state.high_watermark}"
                    )
                self.leader_hw[hw_key] = state.high_watermark
            # What the check below reads, unchanged since the last check of this replica:
            # nothing new to check (see _check_below_high_watermark).
            committed = self.committed.get(tp)
            log = partition.log
            if committed is not None and checked.get(key) == (
                log.log_end_offset,
                log.high_watermark,
                len(committed),
                verified.get(key, 0),
            ):
                continue
            self._check_below_high_watermark(broker, partition)

    def _check_below_high_watermark(self, broker: BrokerProcess, partition: Partition) -> None:
        """Every replica holds the same batches below its high watermark, and a replica
        never truncates a batch it holds that is committed (below some replica's high
        watermark): truncation by leader epoch only cuts what diverges from the leader,
        and the leader holds everything committed."""
        tp = partition.topic_partition
        key = (broker.name, tp)
        held = self.verified.get(key, 0)
        log_end = partition.log_end_offset
        high_watermark = partition.high_watermark
        committed = self.committed.setdefault(tp, {})
        # What the check reads: the log past ``held`` (it changes only with the log end:
        # every append and truncation is an event checked after it), the high watermark
        # and the committed batches (which only grow). Unchanged since the last check of
        # this replica: nothing new to check.
        seen = (log_end, high_watermark, len(committed), held)
        if self._checked.get(key) == seen:
            return
        if log_end < held and not self.scenario.unclean:
            self._fail(
                f"{broker.name} {_label(tp)}: its log was cut to {log_end}, below committed "
                f"batches it held (up to {held})"
            )
        for _, _, header in partition.log.iter_batches(min(held, log_end)):
            if header.last_offset < held:
                continue
            mine = (header.last_offset, header.partition_leader_epoch, header.crc)
            if header.base_offset < high_watermark:
                known = committed.setdefault(header.base_offset, mine)
                if known != mine and not self.scenario.unclean:
                    self._fail(
                        f"{broker.name} {_label(tp)}: batch at {header.base_offset} is {mine} "
                        f"below the high watermark {high_watermark}; another replica had "
                        f"{known} there"
                    )
            elif committed.get(header.base_offset) != mine:
                break
            held = header.last_offset + 1
        self.verified[key] = held
        self._checked[key] = (log_end, high_watermark, len(committed), held)

    def _check_leader_complete(self, broker: BrokerProcess, partition: Partition) -> None:
        """A new leader (clean election) holds every batch ever below a high watermark:
        every acknowledged acks=all write included; a fenced or demoted broker's log is
        never the one that serves."""
        tp = partition.topic_partition
        committed = self.committed.get(tp, {})
        if not committed or self.scenario.unclean:
            return
        held = {
            h.base_offset: (h.last_offset, h.partition_leader_epoch, h.crc)
            for _, _, h in partition.log.iter_batches()
        }
        for base, batch in sorted(committed.items()):
            if held.get(base) != batch:
                self._fail(
                    f"{broker.name} {_label(tp)}: leader in epoch {partition.leader_epoch} "
                    f"lacks the committed batch at {base} {batch} (it has {held.get(base)}, "
                    f"log end {partition.log_end_offset})"
                )

    # --- The end: convergence and the final read ----------------------------------------

    def _converged(self) -> None:
        if self._not_converged() is None:
            self.done = True
            return
        self._at(self.now_ms + 100, self._converged)

    def _not_converged(self) -> str | None:
        """Why the healed cluster has not settled yet, None once it has."""
        active = [c for c in self.controllers.values() if c.controller is not None]
        if not active:
            return "no active controller after healing"
        image = active[0].image
        topic = image.topic(TOPIC)
        if topic is None:
            return "the topic was never created"
        for index in range(self.scenario.partitions):
            registration = topic.partition(index)
            if registration is None or registration.leader < 0:
                return f"p{index} has no leader after healing"
            leader = self.brokers[f"b{registration.leader}"]
            partition = self._partition(leader, index)
            if partition is None or partition.leader_state is None:
                return f"p{index}: b{registration.leader} does not lead it after healing"
            if set(partition.leader_state.isr) != set(registration.replicas):
                isr = list(partition.leader_state.isr)
                return f"p{index}: ISR {isr} of {list(registration.replicas)} after healing"
            if partition.high_watermark != partition.log_end_offset or leader.purgatory:
                return f"p{index}: the high watermark has not caught up after healing"
            for replica in registration.replicas:
                follower = self._partition(self.brokers[f"b{replica}"], index)
                if follower is None or follower.log_end_offset != partition.log_end_offset:
                    return f"p{index}: replica b{replica} has not caught up after healing"
        if any(c.in_flight for c in self.producers.values()):
            return "writes still in flight after healing"
        if self.coordinators:
            return self._offsets_not_converged(image)
        return None

    def _offsets_not_converged(self, image: MetadataImage) -> str | None:
        """Why ``__consumer_offsets`` has not settled: its replicas, like the clients'
        topic's, and each partition served by its assigned coordinator."""
        topic = image.topic(CONSUMER_OFFSETS_TOPIC)
        if topic is None:
            return "__consumer_offsets was never created"
        for index in sorted(topic.partitions):
            tp = TopicPartition(CONSUMER_OFFSETS_TOPIC, index)
            registration = topic.partition(index)
            if registration is None or registration.leader < 0:
                return f"{tp} has no leader after healing"
            leader = self.brokers[f"b{registration.leader}"]
            partition = self._partition(leader, index, tp.topic)
            if partition is None or partition.leader_state is None:
                return f"{tp}: b{registration.leader} does not lead it after healing"
            if set(partition.leader_state.isr) != set(registration.replicas):
                return f"{tp}: ISR {list(partition.leader_state.isr)} after healing"
            if partition.high_watermark != partition.log_end_offset or leader.purgatory:
                return f"{tp}: the high watermark has not caught up after healing"
            for replica in registration.replicas:
                follower = self._partition(self.brokers[f"b{replica}"], index, tp.topic)
                if follower is None or follower.log_end_offset != partition.log_end_offset:
                    return f"{tp}: replica b{replica} has not caught up after healing"
            assignment = image.coordinator_assignment(index)
            if assignment is None or assignment.coordinator_id < 0:
                return f"{tp} has no coordinator after healing"
            owner = self.coordinators[COORDINATORS[assignment.coordinator_id - 1]]
            state = owner.partitions.get(index)
            if state is None or state.epoch != assignment.coordinator_epoch:
                return f"{tp}: {owner.name} has not taken it over after healing"
            if state.phase != "serving" or state.in_flight or state.writes:
                return f"{tp}: {owner.name} has not loaded it, or is still writing"
        return None

    def _final_check(self) -> SimulationResult:
        """The final read of every partition, the replicas' digests, then the checker."""
        controller = next(c for c in self.controllers.values() if c.controller is not None)
        topic = controller.image.topic(TOPIC)
        assert topic is not None
        for index in range(self.scenario.partitions):
            registration = topic.partition(index)
            assert registration is not None
            leader = self._partition(self.brokers[f"b{registration.leader}"], index)
            assert leader is not None
            high_watermark = leader.high_watermark
            records = 0
            for _, _, data in self._read_all(leader, high_watermark):
                self.history.append(
                    self._op("read", "final", partition=index, offset=data[0], value=data[1])
                )
                records += 1
            self.history.append(
                self._op(
                    "final",
                    "final",
                    partition=index,
                    high_watermark=high_watermark,
                    records=records,
                )
            )
            for replica in registration.replicas:
                partition = self._partition(self.brokers[f"b{replica}"], index)
                assert partition is not None
                digest = hashlib.sha256()
                size = 0
                end = 0
                for _, _, header in partition.log.iter_batches():
                    if header.base_offset >= high_watermark:
                        break
                    data = partition.log.read(
                        header.base_offset, header.size, min_one_batch=True
                    ).records
                    digest.update(data[: header.size])
                    size += header.size
                    end = header.last_offset + 1
                self.history.append(
                    self._op(
                        "replica",
                        "replicas",
                        broker=replica,
                        partition=index,
                        digest=digest.hexdigest(),
                        bytes=size,
                        end_offset=end,
                        high_watermark=high_watermark,
                    )
                )
        if self.coordinators:
            self._check_offsets_fencing(controller.image)
        result = check(self.history)
        expected_loss = 0
        anomalies = list(result.anomalies)
        if self.scenario.unclean and self.unclean_elections:
            # The loss unclean elections allow: reported, not a failure.
            expected = {"lost-write", "offset-mismatch", "read-then-vanished", "replica-divergence"}
            expected_loss = sum(1 for a in anomalies if a.kind == "lost-write")
            anomalies = [a for a in anomalies if a.kind not in expected]
        if anomalies:
            lines = "\n".join(f"{a.kind}: {a.detail}" for a in anomalies[:10])
            self._fail(f"the checker found {len(anomalies)} anomalies:\n{lines}")
        return SimulationResult(
            seed=self.seed,
            scenario=self.scenario,
            faults=self.faults,
            events=self.events,
            simulated_ms=self.now_ms,
            acknowledged=result.writes_acknowledged,
            attempted=result.writes_attempted,
            reads=result.reads,
            elections=len(self.epoch_leaders),
            torn_writes=sum(b.disk.torn_writes for b in self.brokers.values() if b.disk),
            expected_loss=expected_loss,
            messages=self.messages,
            dirs_failed=self.dirs_failed,
            commits=self.group_clients.counts["commits"],
            offset_fetches=self.group_clients.counts["fetches"],
            coordinator_moves=self.coordinator_moves,
            coordinator_revocations=self.coordinator_revocations,
            reincarnations=self.reincarnations,
        )

    def _check_offsets_fencing(self, image: MetadataImage) -> None:
        """In the committed log of each ``__consumer_offsets`` partition the producer
        epochs (coordinator epochs) never go back: after a new owner's marker, no write of
        an earlier owner."""
        topic = image.topic(CONSUMER_OFFSETS_TOPIC)
        assert topic is not None
        for index in sorted(topic.partitions):
            registration = topic.partition(index)
            assert registration is not None
            leader = self._partition(
                self.brokers[f"b{registration.leader}"], index, CONSUMER_OFFSETS_TOPIC
            )
            assert leader is not None
            epoch = -1
            for _, _, header in leader.log.iter_batches():
                if header.base_offset >= leader.high_watermark:
                    break
                if header.producer_epoch < epoch:
                    self._fail(
                        f"{CONSUMER_OFFSETS_TOPIC}-{index}: a batch of coordinator epoch "
                        f"{header.producer_epoch} at {header.base_offset}, after epoch {epoch}"
                    )
                epoch = header.producer_epoch

    def _read_all(
        self, partition: Partition, high_watermark: int
    ) -> list[tuple[int, int, tuple[int, str]]]:
        out: list[tuple[int, int, tuple[int, str]]] = []
        position = 0
        while position < high_watermark:
            data = partition.log.read(position, FETCH_MAX_BYTES, max_offset=high_watermark)
            if not data.records:
                break
            for batch in iter_batches(data.records):
                for record in batch.records():
                    if position <= record.offset < high_watermark and record.value is not None:
                        out.append(
                            (
                                batch.base_offset,
                                record.offset,
                                (record.offset, record.value.decode()),
                            )
                        )
            position = max(position + 1, data.next_offset)
        return out

    # --- Diagnostics -------------------------------------------------------------------

    def _note(self, text: str) -> None:
        line = f"{self.now_ms:>7} {text}"
        self.trace.append(line)
        if self.print_trace:
            print(line)

    def _fail(self, reason: str) -> NoReturn:
        raise SimulationFailure(
            self.seed,
            reason,
            list(self.trace),
            self.faults,
            chaos_ms=self.scenario.chaos_ms,
            groups=self.scenario.groups,
        )


def _label(tp: TopicPartition) -> str:
    """How the trace names a partition: ``p0`` for the clients' topic, else ``topic-0``."""
    return f"p{tp.partition}" if tp.topic == TOPIC else str(tp)


class ClusterGroupHost:
    """The whole-cluster simulation as :class:`group_clients.GroupHost`."""

    def __init__(self, simulation: Simulation) -> None:
        self.simulation = simulation
        self.rng = simulation.rng

    @property
    def now(self) -> int:
        return self.simulation.now_ms

    def at(self, delay: int, action: Callable[[], None]) -> None:
        self.simulation._at(self.simulation.now_ms + delay, action)

    def find(self, group: str) -> CoordinatorHandle | None:
        return self.simulation._find_coordinator(group)

    def request(
        self,
        client: str,
        c: CoordinatorHandle,
        serve: Callable[[Callable[[object], None]], None],
        answer: Callable[[object], None],
    ) -> None:
        assert isinstance(c, CoordinatorProcess)
        self.simulation._group_request(client, c, serve, answer)

    def serving(self, c: CoordinatorHandle) -> bool:
        assert isinstance(c, CoordinatorProcess)
        return self.simulation._serving(c)

    def effects(self, c: CoordinatorHandle, effects: list[object]) -> None:
        assert isinstance(c, CoordinatorProcess)
        self.simulation._coordinator_effects(c, effects)

    def act(self, c: CoordinatorHandle, partition: int, epoch: int) -> None:
        assert isinstance(c, CoordinatorProcess)
        self.simulation._act(c, partition, epoch)

    def committing(self) -> bool:
        return self.simulation.chaos

    def note(self, text: str) -> None:
        self.simulation._note(text)

    def violation(self, text: str) -> AssertionError:
        simulation = self.simulation
        return SimulationFailure(
            simulation.seed,
            text,
            list(simulation.trace),
            simulation.faults,
            chaos_ms=simulation.scenario.chaos_ms,
            groups=simulation.scenario.groups,
        )


class _TraceHandler(logging.Handler):
    """The cores' log lines (warnings and up), into the simulation's trace."""

    def __init__(self, simulation: Simulation) -> None:
        super().__init__(logging.WARNING)
        self.simulation = simulation

    def emit(self, record: logging.LogRecord) -> None:
        self.simulation._note(f"log {record.levelname.lower()}: {record.getMessage()}")


def run_schedule(seed: int, *, trace: bool = False, **overrides: Any) -> SimulationResult:
    """Run the schedule of ``seed`` (its scenario adjusted by ``overrides``)."""
    return Simulation(seed, Scenario.from_seed(seed, **overrides), trace=trace).run()
