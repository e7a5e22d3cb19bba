"""``RaftServer``: the asyncio driver of one metadata-quorum replica.

It owns a pure :class:`~highwater.raft.node.RaftNode` and does all of its I/O:

* the metadata log (:class:`~highwater.raft.partition_raft_log.PartitionRaftLog`), the
  snapshots (:class:`~highwater.raft.snapshot_files.FileSnapshotStore`) and the
  ``quorum-state`` file (:class:`~highwater.raft.quorum_state_file.QuorumStateFile`), in a
  data directory it holds the lock of
  (:class:`~highwater.storage.data_dir_lock.DataDirLock`);
* the network, through :mod:`highwater.raft.transport`: the process's gRPC host
  (:class:`~highwater.rpc.server.GrpcHost`, with health and reflection) serves
  ``highwater.internal.v1.Raft`` beside any other :class:`~highwater.rpc.server.GrpcService` of the
  process (the quorum controller's, a broker's, a coordinator's) on the same port; each
  Raft request is converted to the core's message, stepped into the node, and answered
  with the response the node emits for it (:meth:`RaftServer.serve`); the node's own
  requests go out over the :class:`~highwater.raft.transport.Transport` and their replies
  are stepped back in;
* the loop: the node is ticked when its next timer is due (between ``tick_interval_ms``
  and ``max_tick_interval_ms`` after the last event or tick) and after every event its
  :class:`~highwater.raft.node.Ready` is applied in order — persist the election state
  (fsync, in a worker thread), send the messages, flush the log if asked (on the loop
  while fsyncs are fast, else in the :class:`~highwater.raft.log_flusher.LogFlusher`'s
  thread; a voter that follows always on the loop, from the fetch answer's callback,
  ``RaftServerSettings.follower_flushes_on_loop``; then ``on_flushed``; appends made
  meanwhile go in the next flush: group commit), load a
  snapshot into the state machine, hand it the newly committed batches, tell the role
  listeners.

The controller on top talks to it through :meth:`RaftServer.append` (appends at once and
returns the entry's offset and epoch with a future that resolves once it is committed and
applied, or raises :class:`NotLeaderError`) or :meth:`RaftServer.propose` (the same,
awaited), :meth:`describe`, and a :class:`~highwater.raft.state_machine.StateMachine` it
passes in, which also writes snapshots every
``metadata.log.max.record.bytes.between.snapshots`` bytes of applied batches.

Time is the wall clock in milliseconds, as Kafka's raft client uses: DescribeQuorum
reports fetch times as timestamps; but the time this replica's loop could not run
(blocked applying a large batch, starved of CPU) counts at most half a second per stall
(:class:`~highwater.raft.loop_clock.LoopClock`), so that a slow apply does not trip the
fetch and election timeouts.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import heapq
import itertools
import logging
import random
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import grpc
import grpc.aio

from highwater.config.topic import LogConfig
from highwater.errors import (
    HighwaterError,
    InvalidRecordError,
    InvalidRequestError,
    KafkaStorageError,
    UnexpectedAppendOffsetError,
)
from highwater.internal.v1 import raft_pb2, raft_pb2_grpc
from highwater.raft.codec import (
    ProtoRequest,
    ProtoResponse,
    RaftResponse,
    describe_quorum_to_proto,
    request_from_proto,
    response_to_proto,
)
from highwater.raft.log_flusher import LogFlusher
from highwater.raft.loop_clock import LoopClock
from highwater.raft.membership_service import (
    MembershipRaftServicer,
    VoterChange,
    discover_quorum,
    send_voter_change,
)
from highwater.raft.messages import (
    FetchRequest,
    FetchResponse,
    OffsetAndEpoch,
    QuorumDescription,
    RaftMessage,
    is_request,
)
from highwater.raft.meta_properties import check_node_id
from highwater.raft.node import (
    JoinRequest,
    NotLeaderError,
    RaftConfig,
    RaftNode,
    Ready,
    RoleChange,
)
from highwater.raft.partition_raft_log import (
    PartitionRaftLog,
    metadata_log_config,
    metadata_log_dir,
)
from highwater.raft.quorum_state_file import (
    NO_ID,
    QUORUM_STATE_FILE,
    QuorumStateData,
    QuorumStateFile,
)
from highwater.raft.snapshot_files import CorruptSnapshotError, FileSnapshotStore
from highwater.raft.state import ElectionState
from highwater.raft.state_machine import RoleListener, SnapshotReader, StateMachine
from highwater.raft.telemetry import RaftTelemetry
from highwater.raft.transport import (
    RAFT_HEALTH_ALIASES,
    RAFT_SERVICE_NAME,
    InboundCalls,
    Superseded,
    Transport,
    abort,
    expire,
)
from highwater.raft.voter_files import (
    COMMITTED_VOTERS_FILE,
    CommittedVotersFile,
    VotersEntry,
    read_snapshot_voters,
    unwrap_snapshot,
    wrap_snapshot,
)
from highwater.raft.voter_set import (
    DIRECTORY_ID_FILE,
    MembershipChangeError,
    Voter,
    VoterSet,
    load_or_create_directory_id,
)
from highwater.records import RecordBatch, iter_batches
from highwater.rpc.channels import MAX_MESSAGE_BYTES
from highwater.rpc.endpoints import parse_endpoint
from highwater.rpc.server import GrpcHost, GrpcService
from highwater.storage.checkpoint import write_atomically
from highwater.storage.data_dir_lock import LOCK_FILE, DataDirLock
from highwater.v1.common_pb2 import ErrorCode

__all__ = [
    "MetadataLogLayout",
    "NotLeaderError",
    "RaftServer",
    "RaftServerSettings",
    "RoleChange",
    "default_cluster_id",
]

log = logging.getLogger(__name__)

_APPLY_READ_BYTES: Final = 1 << 20
_ENDPOINT_CHECK_S: Final = 0.1
"""How often a dynamic quorum's replica checks that the voter set names it at its endpoint."""
_INLINE_FSYNC_MAX_S: Final = 0.0005
"""An fsync that took longer than this sends the next ones to a worker thread (see
``_handle_ready``); one at most this long runs on the loop, where it costs less than the
hand-off to a thread and back. Timed around the flush alone, in the thread too: the
hand-off's own delay is not the disk's."""


# --- configuration -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MetadataLogLayout:
    """Where a controller keeps the metadata log, its snapshots and ``quorum-state``:
    all three in ``__cluster_metadata-0/``, as Kafka does."""

    data_dir: Path

    @property
    def lock_path(self) -> Path:
        """Held (flock) while a process owns the data directory, as the log manager does."""
        return self.data_dir / LOCK_FILE

    @property
    def log_dir(self) -> Path:
        return metadata_log_dir(self.data_dir)

    @property
    def raft_dir(self) -> Path:
        return self.log_dir

    @property
    def quorum_state_path(self) -> Path:
        return self.raft_dir / QUORUM_STATE_FILE

    @property
    def snapshot_dir(self) -> Path:
        return self.raft_dir

    @property
    def committed_voters_path(self) -> Path:
        """A dynamic quorum's committed voter set, kept beside ``quorum-state``."""
        return self.raft_dir / COMMITTED_VOTERS_FILE


@dataclass(frozen=True, slots=True)
class RaftServerSettings:
    """The driver's settings; the protocol's own are in :class:`RaftConfig`."""

    raft: RaftConfig = field(default_factory=RaftConfig)
    log_config: LogConfig = field(default_factory=metadata_log_config)
    tick_interval_ms: int = 10
    """The shortest wait between two ticks without an event: the timers' resolution."""
    max_tick_interval_ms: int = 100
    """The longest: with no timer due sooner (:meth:`RaftNode.next_deadline_ms`) the
    driver still ticks, and reads its clock, this often."""
    metadata_log_max_record_bytes_between_snapshots: int = 20 * 1024 * 1024
    """Kafka's setting: applied batch bytes after which the state machine writes a snapshot."""
    max_message_bytes: int = MAX_MESSAGE_BYTES
    """gRPC's cap on one message, both ways (a fetch carries up to ``fetch_max_bytes``)."""
    shutdown_grace_ms: int = 1000
    """How long :meth:`RaftServer.stop` lets a resignation and in-flight calls finish."""
    discovery_timeout_ms: int = 30_000
    """How long a replica started with ``bootstrap_controllers`` looks for the quorum."""
    follower_flushes_on_loop: bool = True
    """A voter that follows fsyncs a fetch answer's entries on its loop, from the answer's
    callback, and sends its next fetch right after, whatever the disk's speed: its loop
    has nothing of the commit's to do meanwhile, and a hand-off to the flusher thread
    cost a thread wake-up and a loop wake-up on every commit's path (docs/raft.md,
    "Fifth pass"). False: a follower's flushes go to the thread once the disk is slow,
    as a leader's and an observer's do (a broker's loop must not block on them)."""


# --- the server ----------------------------------------------------------------------------


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(order=True, slots=True)
class _Proposal:
    offset: int
    sequence: int
    epoch: int = field(compare=False)
    future: asyncio.Future[int] = field(compare=False)


class RaftServer:
    """One replica of the metadata quorum, served over gRPC: a voter, or an observer when
    ``node_id`` is not among the voters.

    The quorum is given one of three ways:

    * ``voters`` (id -> ``HOST:PORT``): a static quorum (``--voters``), fixed for good;
    * ``initial_voters``: a dynamic quorum (KIP-853) bootstrapped with this set
      (``--initial-controllers``); this node's directory id is the one the set gives it.
      A node not in the set (a broker's metadata observer, given the set a DescribeQuorum
      named) starts from it and follows the changes it replicates;
    * ``bootstrap_controllers`` (``HOST:PORT`` only): join a running dynamic quorum as an
      observer (``--bootstrap-controllers``), learning its voters and cluster id from
      their DescribeQuorum at the first start.

    In a dynamic quorum the data directory's ``directory-id`` file names this incarnation,
    the committed voter set is kept in ``quorum-voters`` (and restored at start, or taken
    from the latest snapshot when that is newer), every snapshot carries the set, the
    transport follows the voters' endpoints, and :meth:`add_voter`, :meth:`remove_voter`
    and :meth:`update_voter` run KIP-853's changes on the leader. ``advertised`` is the
    endpoint this replica announces (else ``listen``'s); a voter the set names at another
    endpoint sends UpdateRaftVoter itself. ``controller`` False makes an observer only (a
    broker's or a coordinator's metadata replica): as a Kafka broker has no controller
    listener, its fetches announce its directory id but no endpoint, DescribeQuorum lists
    it without one, and a leader refuses to add it as a voter (see :meth:`add_voter`).
    """

    def __init__(
        self,
        *,
        node_id: int,
        listen: str,
        voters: Mapping[int, str] | None = None,
        initial_voters: VoterSet | None = None,
        initial_voters_offset: int = -1,
        bootstrap_controllers: Sequence[str] = (),
        data_dir: Path,
        state_machine: StateMachine,
        cluster_id: str | None = None,
        settings: RaftServerSettings | None = None,
        role_listeners: Sequence[RoleListener] = (),
        clock: Callable[[], int] = wall_clock_ms,
        services: Sequence[GrpcService] = (),
        listener_name: str | None = None,
        more_listeners: Sequence[tuple[str, str]] = (),
        advertised: str | None = None,
        controller: bool = True,
    ) -> None:
        """``listener_name``, ``more_listeners``: named listeners
        (:class:`~highwater.rpc.server.GrpcHost`), ``listen`` being the first.
        ``advertised`` (``HOST:PORT``): where the other replicas reach this one, when not
        at ``listen`` (a controller listening on ``0.0.0.0``, or behind a proxy); it is
        the endpoint a dynamic quorum's replica announces. ``initial_voters_offset``: the
        offset of the ``voters`` record ``initial_voters`` was read from (an observer's
        set, from a DescribeQuorum's ``voters_offset``), -1 for a bootstrap set: a set kept
        from an earlier start that is older gives way to it."""
        given = sum((bool(voters), initial_voters is not None, bool(bootstrap_controllers)))
        if given != 1:
            raise ValueError(
                "give the quorum one way: voters, initial_voters or bootstrap_controllers"
            )
        parse_endpoint(listen)
        if advertised is not None:
            parse_endpoint(advertised)
        for address in bootstrap_controllers:
            parse_endpoint(address)
        self.node_id = node_id
        self.listen = listen
        self.advertised = advertised
        self.is_controller = controller
        self.is_dynamic = not voters
        self._initial_voters = initial_voters
        self._initial_voters_offset = initial_voters_offset
        self._bootstrap_controllers = tuple(bootstrap_controllers)
        self.voters: dict[int, str] = (
            dict(voters)
            if voters
            else {}
            if initial_voters is None
            else {v.node_id: v.endpoint for v in initial_voters}
        )
        self.directory_id: uuid.UUID | None = None
        self.layout = MetadataLogLayout(data_dir)
        self.settings = settings or RaftServerSettings()
        self._requested_cluster_id = cluster_id
        self._state_machine = state_machine
        self._role_listeners = list(role_listeners)
        self._services = tuple(services)
        self._clock = LoopClock(clock)  # stalls of this loop do not count (loop_clock.py)
        self._cluster_id: str | None = None
        self._node: RaftNode | None = None
        self._log: PartitionRaftLog | None = None
        self._snapshots: FileSnapshotStore | None = None
        self._state_file = QuorumStateFile(self.layout.quorum_state_path)
        self._voters_file = CommittedVotersFile(self.layout.committed_voters_path)
        self._voters_entry: VotersEntry | None = None
        raft = GrpcService(
            RAFT_SERVICE_NAME,
            lambda server: raft_pb2_grpc.add_RaftServicer_to_server(
                MembershipRaftServicer(self), server
            ),
            serving_at_start=True,
            health_aliases=RAFT_HEALTH_ALIASES,
        )
        self._host = GrpcHost(
            listen,
            (raft, *self._services),
            max_message_bytes=self.settings.max_message_bytes,
            listener_name=listener_name,
            more_listeners=more_listeners,
        )
        self._transport: Transport | None = None
        self._inbound = InboundCalls()
        self._driver: asyncio.Task[None] | None = None
        self._wakeup = asyncio.Event()
        self._idle = asyncio.Event()
        self._stopping = False
        self._stopped = asyncio.Event()
        self._failure: BaseException | None = None
        self._shutdown_task: asyncio.Task[None] | None = None
        self._bound_port: int | None = None
        self._lock = DataDirLock(data_dir)
        self._proposals: list[_Proposal] = []
        self._sequence = itertools.count()
        self._applied_offset = 0
        self._applied_epoch = 0
        self._high_watermark = 0
        self._last_snapshot_offset = 0
        self._bytes_since_snapshot = 0
        self._role: RoleChange | None = None
        self._flushing: asyncio.Task[None] | None = None
        self._flusher: LogFlusher | None = None
        self._last_fsync_s = 0.0
        self._announcer: asyncio.Task[None] | None = None
        self._joining: asyncio.Task[None] | None = None
        self._join_problem: str | None = None
        self.telemetry = RaftTelemetry(self)

    # --- public API --------------------------------------------------------------------

    @property
    def cluster_id(self) -> str:
        if self._cluster_id is None:
            raise RuntimeError("the server has not started")
        return self._cluster_id

    @property
    def port(self) -> int:
        """The port the gRPC server listens on (the real one when ``listen`` said 0)."""
        if self._bound_port is None:
            raise RuntimeError("the server has not started")
        return self._bound_port

    @property
    def endpoint(self) -> str:
        """``HOST:PORT`` where the other replicas reach this one: ``advertised`` if given,
        else ``listen`` with the bound port."""
        if self.advertised is not None:
            return self.advertised
        host, _ = parse_endpoint(self.listen)
        return f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"

    def report_serving(self, name: str, serving: bool) -> None:
        """Report ``name`` SERVING or NOT_SERVING on this server's ``grpc.health.v1``
        (:meth:`~highwater.rpc.server.GrpcHost.report_serving`): a service served here,
        or a readiness of its own, such as a broker's rolling-restart gate."""
        self._host.report_serving(name, serving)

    def is_serving(self, name: str = "") -> bool:
        """What health says of ``name`` (the empty name: the whole server)."""
        return self._host.is_serving(name)

    @property
    def role(self) -> RoleChange | None:
        """The role, epoch and leader last reported by the node."""
        return self._role

    @property
    def is_leader(self) -> bool:
        return self._node is not None and self._node.is_leader

    @property
    def leader_id(self) -> int | None:
        return None if self._node is None else self._node.leader_id

    @property
    def high_watermark(self) -> int:
        """The commit point this replica knows (everything below it is applied, or being)."""
        return self._high_watermark

    @property
    def applied_offset(self) -> int:
        """The state machine has applied every committed entry below this offset."""
        return self._applied_offset

    @property
    def failure(self) -> BaseException | None:
        """The error that stopped the driver, if one did."""
        return self._failure

    async def wait_stopped(self) -> None:
        """Return once the server stopped (by :meth:`stop` or a fatal storage error)."""
        await self._stopped.wait()

    def describe(self) -> QuorumDescription:
        return self._require_node().describe()

    def append(
        self,
        values: Sequence[bytes],
        *,
        epoch: int | None = None,
        base_offset: int | None = None,
    ) -> tuple[OffsetAndEpoch, asyncio.Future[int]]:
        """Append ``values`` as one batch now (Kafka's ``scheduleAtomicAppend``).

        Returns the offset and epoch of the last value, and a future that resolves to that
        offset once the batch is committed and handed to the state machine, or raises
        :class:`NotLeaderError` if another leader's entry replaced it (or the server
        stopped). Await it through :func:`asyncio.shield` if the waiter may be cancelled.

        Raises :class:`NotLeaderError` at once unless this replica leads — in ``epoch``,
        when one is given — and :class:`~highwater.errors.UnexpectedAppendOffsetError`
        when ``base_offset`` is given and the log does not end there (nothing is
        appended then). The one exception: ``voters`` records this layer appended after
        ``base_offset`` (a dynamic quorum's membership changes take offsets of the log
        between the caller's batches, as Kafka's ``VotersRecord`` does). The batch goes
        after them, and the offset returned tells the caller where its records are, as
        Kafka's ``prepareAppend`` does for its controller.
        """
        node = self._require_node()
        if self._stopping or (epoch is not None and node.epoch != epoch):
            raise NotLeaderError(node.leader_id if not self._stopping else None, node.epoch)
        if base_offset is not None and node.is_leader:
            end_offset = self._require_log().end_offset
            if end_offset != base_offset and (
                end_offset < base_offset
                or node.voter_records_between(base_offset, end_offset) != end_offset - base_offset
            ):
                raise UnexpectedAppendOffsetError(
                    f"the metadata log ends at offset {end_offset}, not at the required "
                    f"base offset {base_offset}"
                    + ("" if end_offset < base_offset else " nor after voter-set records alone")
                )
        appended = node.propose(values, self._clock())
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        heapq.heappush(
            self._proposals,
            _Proposal(appended.offset, next(self._sequence), appended.epoch, future),
        )
        self._wakeup.set()
        self.telemetry.appended(future, appended, len(values))
        return appended, future

    async def propose(self, values: Sequence[bytes]) -> int:
        """Append ``values`` as one batch; the offset of the last once it is committed and
        applied. Raises :class:`NotLeaderError` if this replica does not lead, or if the
        entry was replaced by another leader's before it committed."""
        _, committed = self.append(values)
        return await committed

    async def start(self) -> None:
        """Open the log, the snapshots and ``quorum-state``, start serving and driving."""
        layout = self.layout
        layout.raft_dir.mkdir(parents=True, exist_ok=True)
        self._lock.acquire()
        try:
            if self.is_controller:  # a voter's vote is only its own under its node id
                await asyncio.to_thread(check_node_id, layout.data_dir, self.node_id)
            snapshots = await asyncio.to_thread(FileSnapshotStore, layout.snapshot_dir)
            raft_log = await asyncio.to_thread(
                PartitionRaftLog.open,
                layout.log_dir,
                snapshots=snapshots.snapshots(),
                config=self.settings.log_config,
            )
        except BaseException:
            self._lock.release()
            raise
        try:
            if self.is_dynamic:
                await self._load_voters(snapshots)
            election_state = await self._load_quorum_state()
            self._snapshots, self._log = snapshots, raft_log
            quorum: frozenset[int] | VoterSet = frozenset(self.voters)
            voters_offset = -1
            if self._voters_entry is not None:
                voters_offset, quorum = self._voters_entry
            self._node = RaftNode(
                self.node_id,
                quorum,
                raft_log,
                snapshots,
                voters_offset=voters_offset,
                cluster_id=self.cluster_id,
                election_state=election_state,
                random=random.Random(),
                config=self.settings.raft,
                now_ms=self._clock(),
                snapshot_voters=lambda snapshot_id: read_snapshot_voters(snapshots, snapshot_id),
                directory_id=self.directory_id,
            )
            self._use_voters(self._node.voter_set)
            # A snapshot, if there is one, is loaded by the first Ready (load_snapshot).
            self._applied_offset = self._high_watermark = raft_log.start_offset
            if self._bound_port is None:  # else serving since the discovery
                await self._start_grpc()
            if self.directory_id is not None and self.is_controller:
                # Known once the server is bound (``listen`` may say port 0): the fetches
                # announce it, and only a replica that does may be added as a voter.
                self._node.endpoint = self.endpoint
        except BaseException:
            if self._bound_port is not None:
                await self._host.stop(0)
            await asyncio.to_thread(raft_log.close)
            snapshots.close()
            self._lock.release()
            raise
        self._transport = Transport(
            {voter: address for voter, address in self.voters.items() if voter != self.node_id},
            timeout_ms=self.settings.raft.request_timeout_ms,
            max_message_bytes=self.settings.max_message_bytes,
            on_response=self._on_response,
            on_unreachable=self._on_unreachable,
        )
        self._driver = asyncio.create_task(self._drive(), name=f"raft-driver-{self.node_id}")
        if self.is_dynamic and self.is_controller:
            self._announcer = asyncio.create_task(
                self._announce_endpoint(), name=f"raft-endpoint-{self.node_id}"
            )
        log.info(
            "node %d serving the metadata quorum of cluster %s on port %d (voters %s)",
            self.node_id,
            self.cluster_id,
            self.port,
            self.voters,
        )

    async def stop(self) -> None:
        """Resign if leading (EndQuorumEpoch to the voters), stop serving, close the files."""
        if self._stopping:
            await self._stopped.wait()
            return
        node = self._node
        driver = self._driver
        if node is not None and node.is_leader and driver is not None and not driver.done():
            node.resign(self._clock())
            self._idle.clear()
            self._wakeup.set()
            grace_s = self.settings.shutdown_grace_ms / 1000
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), grace_s)
            if self._transport is not None:
                await self._transport.wait_idle(grace_s)
        await self._shutdown()

    # --- membership changes (KIP-853), on the leader ----------------------------------

    async def add_voter(self, voter: Voter) -> int:
        """AddRaftVoter: make the caught-up observer ``voter`` a voter; the offset of the
        ``voters`` record once committed. Raises :class:`NotLeaderError` or the core's
        :class:`~highwater.raft.voter_set.MembershipChangeError` (among them
        :class:`~highwater.raft.voter_set.NotAControllerError` for a broker's or a
        coordinator's metadata replica, which announces no controller endpoint)."""
        node = self._require_leading()
        return await self._committed(node.add_voter(voter, self._clock()))

    async def remove_voter(self, node_id: int, directory_id: uuid.UUID | None) -> int:
        """RemoveRaftVoter (``directory_id`` None: whatever the voter's directory)."""
        node = self._require_leading()
        return await self._committed(node.remove_voter(node_id, directory_id, self._clock()))

    async def update_voter(self, voter: Voter) -> int:
        """UpdateRaftVoter: the voter ``voter.key`` now listens at ``voter.endpoint``."""
        node = self._require_leading()
        return await self._committed(node.update_voter(voter, self._clock()))

    def voter_set(self) -> VoterSet:
        """The voter set in use (a static quorum's as ids with nil directory ids)."""
        return self._require_node().voter_set

    def _require_leading(self) -> RaftNode:
        node = self._require_node()
        if self._stopping:
            raise NotLeaderError(None, node.epoch)
        return node

    async def _committed(self, appended: OffsetAndEpoch) -> int:
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        heapq.heappush(
            self._proposals,
            _Proposal(appended.offset, next(self._sequence), appended.epoch, future),
        )
        self._wakeup.set()
        return await asyncio.shield(future)

    def _use_voters(self, voters: VoterSet) -> None:
        """The voter set in use changed: where the voters listen (a static quorum's
        addresses stay those it was given)."""
        if not self.is_dynamic:
            return
        self.voters = {voter.node_id: voter.endpoint for voter in voters}
        if self._transport is not None:
            self._transport.set_peers(
                {node_id: a for node_id, a in self.voters.items() if node_id != self.node_id}
            )

    def _stale_endpoint(self) -> Voter | None:
        """This replica as a voter with its endpoint now, if the voter set in use names it
        (this incarnation) at another endpoint."""
        node = self._node
        if node is None or self.directory_id is None:
            return None
        voter = node.voter_set.get(self.node_id)
        if voter is None or voter.directory_id != self.directory_id:
            return None
        if voter.endpoint == self.endpoint:
            return None
        return Voter(self.node_id, self.directory_id, self.endpoint)

    async def _announce_endpoint(self) -> None:
        """UpdateRaftVoter, sent by the voter itself (as Kafka's controllers do) whenever
        the voter set names it at another endpoint than the one it serves on now (it
        restarted on a new address, or with another ``advertised``): to its own node when
        it leads, else to the leader; retried until the new set is in use."""
        settle_s = self.settings.raft.fetch_timeout_ms / 1000
        while not self._stopping:
            await asyncio.sleep(_ENDPOINT_CHECK_S)
            voter = self._stale_endpoint()
            leader_id = self.leader_id
            if voter is None or leader_id is None:
                continue
            try:
                if leader_id == self.node_id:
                    await self.update_voter(voter)
                elif leader_id in self.voters:
                    problem = await send_voter_change(
                        self.voters[leader_id],
                        self.cluster_id,
                        "update",
                        voter,
                        timeout_s=self.settings.raft.request_timeout_ms / 1000,
                    )
                    if problem is not None:
                        log.debug("node %d: UpdateRaftVoter: %s", self.node_id, problem)
                        continue
                log.info("node %d: the voter set now names it at %s", self.node_id, voter.endpoint)
                # Committed: give this replica's fetch the time to bring the record before
                # asking again.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(settle_s):
                        while self._stale_endpoint() == voter:
                            await asyncio.sleep(_ENDPOINT_CHECK_S)
            except (NotLeaderError, MembershipChangeError) as e:
                log.debug("node %d: UpdateRaftVoter: %s", self.node_id, e)

    # --- startup -------------------------------------------------------------------------

    async def _load_voters(self, snapshots: FileSnapshotStore) -> None:
        """A dynamic quorum's directory id and voter set at start: the kept committed set,
        or the latest snapshot's when newer, or the bootstrap (``initial_voters``, or what
        the ``bootstrap_controllers`` describe)."""
        data_dir = self.layout.data_dir
        initial = self._initial_voters
        mine = None if initial is None else initial.get(self.node_id)
        id_path = data_dir / DIRECTORY_ID_FILE
        if mine is not None:
            kept_id = await asyncio.to_thread(
                lambda: id_path.read_text().strip() if id_path.exists() else None
            )
            if kept_id is None:
                await asyncio.to_thread(write_directory_id, id_path, mine.directory_id)
            elif kept_id != str(mine.directory_id):
                raise KafkaStorageError(
                    f"{id_path} holds directory id {kept_id}, but --initial-controllers gives "
                    f"node {self.node_id} directory {mine.directory_id}: a replaced disk "
                    "rejoins with --bootstrap-controllers"
                )
        self.directory_id = await asyncio.to_thread(load_or_create_directory_id, data_dir)
        entry = await asyncio.to_thread(self._voters_file.read)
        latest = snapshots.latest()
        if latest is not None:
            try:
                carried = await asyncio.to_thread(read_snapshot_voters, snapshots, latest)
            except InvalidRecordError as e:
                raise KafkaStorageError(f"snapshot {latest}: {e}") from e
            if carried is not None and (entry is None or carried[0] > entry[0]):
                entry = carried
        if entry is not None and initial is not None:
            if self._initial_voters_offset > entry[0]:
                # A set described at this start that is newer than the one kept: this
                # replica was down while the voters changed (perhaps every one of them,
                # to new addresses), and the kept set may name none that still serves.
                entry = (self._initial_voters_offset, initial)
                await asyncio.to_thread(self._voters_file.write, entry)
        elif entry is None:
            if initial is not None:
                entry = (self._initial_voters_offset, initial)
            else:
                # Serve while looking: DescribeQuorum answers that this replica knows no
                # quorum (BROKER_NOT_AVAILABLE, no voters, no cluster id), the other calls
                # UNAVAILABLE. A start script that forms a quorum only once every other
                # controller says so asks exactly that (docs/kubernetes.md).
                await self._start_grpc()
                cluster_id, learned = await discover_quorum(
                    self._bootstrap_controllers,
                    timeout_s=self.settings.discovery_timeout_ms / 1000,
                    max_message_bytes=self.settings.max_message_bytes,
                )
                requested = self._requested_cluster_id
                if requested is not None and requested != cluster_id:
                    raise KafkaStorageError(
                        f"the quorum at {', '.join(self._bootstrap_controllers)} belongs to "
                        f"cluster {cluster_id!r}, not {requested!r}"
                    )
                self._requested_cluster_id = cluster_id
                entry = (-1, learned)
            await asyncio.to_thread(self._voters_file.write, entry)
        self._voters_entry = entry
        self.voters = {voter.node_id: voter.endpoint for voter in entry[1]}

    async def _load_quorum_state(self) -> ElectionState | None:
        stored = await asyncio.to_thread(self._state_file.read)
        requested = self._requested_cluster_id
        if stored is not None and requested is not None and stored.cluster_id != requested:
            raise KafkaStorageError(
                f"{self._state_file.path}: this data directory belongs to cluster "
                f"{stored.cluster_id!r}, not {requested!r}"
            )
        if stored is not None:
            self._cluster_id = stored.cluster_id
            if stored.voters and set(stored.voters) != set(self.voters):
                log.warning(
                    "the voters changed from %s to %s since %s was written",
                    sorted(stored.voters),
                    sorted(self.voters),
                    self._state_file.path,
                )
            return ElectionState(
                stored.leader_epoch,
                None if stored.voted_id == NO_ID else stored.voted_id,
                None if stored.leader_id == NO_ID else stored.leader_id,
            )
        self._cluster_id = requested or default_cluster_id(self.voters)
        await asyncio.to_thread(
            self._state_file.write,
            QuorumStateData(self._cluster_id, 0, voters=tuple(sorted(self.voters))),
        )
        return None

    async def _start_grpc(self) -> None:
        await self._host.start()
        self._bound_port = self._host.port

    # --- the loop --------------------------------------------------------------------------

    async def _drive(self) -> None:
        node = self._require_node()
        min_wait_ms = self.settings.tick_interval_ms
        max_wait_ms = max(min_wait_ms, self.settings.max_tick_interval_ms)
        loop = asyncio.get_running_loop()
        try:
            while not self._stopping:
                # No linger before taking a Ready: the one appender, the controller's
                # worker, groups concurrent requests into one batch itself, so turns
                # spent here gathered nothing and delayed the fetch answers a new
                # batch makes (docs/raft.md, "Where a commit's time goes").
                self._wakeup.clear()
                node.tick(self._clock())
                ready = node.ready()
                if not ready.is_empty and not self._waits_for_flush(ready):
                    await self._handle_ready(node, ready)
                    continue
                self._idle.set()
                # Tick when the core's next timer is due, not on a fixed period: an idle
                # replica's ticks found nothing to do ~100 times a second (docs/raft.md).
                deadline_ms = node.next_deadline_ms()
                wait_ms = (
                    max_wait_ms
                    if deadline_ms is None
                    else min(max(deadline_ms - self._clock(), min_wait_ms), max_wait_ms)
                )
                timer = loop.call_later(wait_ms / 1000, self._wakeup.set)
                try:
                    await self._wakeup.wait()
                finally:
                    timer.cancel()
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self._fail(e)

    def _fail(self, error: BaseException) -> None:
        """A storage error or a broken invariant: stop serving rather than go on wrong."""
        if self._failure is not None or self._stopping:
            return
        log.error("node %d: stopping the Raft server after %r", self.node_id, error, exc_info=error)
        self._failure = error
        self._shutdown_task = asyncio.get_running_loop().create_task(self._shutdown())

    async def _handle_ready(self, node: RaftNode, ready: Ready) -> None:
        raft_log = self._require_log()
        if ready.election_state is not None:
            await asyncio.to_thread(
                self._state_file.write, self._quorum_state(ready.election_state)
            )
        if ready.voters is not None:
            self._use_voters(ready.voters)
        if ready.committed_voters is not None:
            self._voters_entry = ready.committed_voters
            await asyncio.to_thread(self._voters_file.write, ready.committed_voters)
        for message in ready.messages:
            self._dispatch(message)
        if ready.must_flush and self._flushing is None:
            # Messages go out before the log is durable: a leader ships entries to its
            # followers first (it counts itself toward the high watermark only up to its
            # flushed offset), and a follower's core emits its next fetch only after
            # ``on_flushed``, so nothing sent claims unflushed entries. A fast fsync runs
            # on the loop itself: a few kilobytes of metadata log sync in about 0.1 ms,
            # less than handing the fsync to a worker thread and back costs in CPU and GIL
            # hand-offs (docs/raft.md). Once one took longer (a busy disk), the next run
            # in a worker thread while the loop goes on serving requests and appending
            # them; entries appended meanwhile go in the next flush (group commit).
            if self._last_fsync_s <= _INLINE_FSYNC_MAX_S or self._flushes_on_loop(node):
                if ready.messages:
                    await asyncio.sleep(0)  # let the sends start before the loop blocks
                self._flush_on_loop(node)
            else:
                # Handed to the thread now, not from a task's first step: the thread
                # starts the fsync while the loop sends and serves, a loop turn or two
                # earlier (a follower's fsync is on every commit's path).
                self._hand_flush_to_thread(node)
        if ready.load_snapshot is not None:
            await self._load_snapshot(ready.load_snapshot)
        if ready.high_watermark is not None:
            self._high_watermark = max(self._high_watermark, ready.high_watermark)
        await self._apply_committed(node)
        if self._proposals and not node.is_leader:
            self._fail_truncated_proposals(raft_log.end_offset, node.epoch)
        if ready.role is not None:
            self._on_role_change(ready.role)
        if ready.join is not None and (self._joining is None or self._joining.done()):
            # One at a time: while one is in flight the core's next is dropped, and it
            # asks again after its backoff if it still needs to.
            self._joining = asyncio.create_task(
                self._send_join(ready.join), name=f"raft-join-{self.node_id}"
            )

    async def _send_join(self, join: JoinRequest) -> None:
        """Auto-join (``controller.quorum.auto.join.enable``): send the core's request to
        the leader it follows."""
        leader = self.voters.get(join.leader_id)
        if leader is None:
            return
        change: VoterChange = "add" if join.add else "remove"
        problem = await send_voter_change(
            leader,
            self.cluster_id,
            change,
            join.voter,
            timeout_s=self.settings.raft.request_timeout_ms / 1000,
        )
        if problem is None:
            log.info(
                "node %d: auto-join: the leader %s voter %s",
                self.node_id,
                "added" if join.add else "removed",
                join.voter,
            )
        else:
            # Asked again every backoff until it is a voter: a new refusal is news, the
            # same one again is not (not caught up yet, a change in progress).
            level = logging.DEBUG if problem == self._join_problem else logging.INFO
            log.log(
                level, "node %d: auto-join %s of %s: %s", self.node_id, change, join.voter, problem
            )
        self._join_problem = problem

    def _waits_for_flush(self, ready: Ready) -> bool:
        """Whether all ``ready`` asks is a flush while one runs in a worker thread: its end
        wakes the loop, and the next Ready asks again for what was appended meanwhile."""
        return self._flushing is not None and ready == Ready(must_flush=True)

    async def _flush_in_thread(self, node: RaftNode, flushed: asyncio.Future[float]) -> None:
        """Wait for the flush handed to the flusher thread (``flushed``: the seconds it took
        there), then count it."""
        try:
            # Timed in the thread: the round trip through the thread pool and back to a
            # busy loop took more than the limit on its own, so once in a thread the
            # flushes never came back to the loop even when the disk was fast again.
            self._last_fsync_s = await flushed
            if not self._stopping:
                self._flushed(node)
        except Exception as e:
            self._fail(e)
        finally:
            self._flushing = None
            self._wakeup.set()

    def _require_flusher(self) -> LogFlusher:
        if self._flusher is None:
            self._flusher = LogFlusher(f"raft-{self.node_id}-flusher")
        return self._flusher

    def _flushed(self, node: RaftNode) -> None:
        node.on_flushed(self._require_log().flushed_offset, self._clock())
        # A follower's next fetch goes out before the state machine's work that follows.
        for message in node.ready_messages():
            self._dispatch(message)

    def _quorum_state(self, election: ElectionState) -> QuorumStateData:
        return QuorumStateData(
            cluster_id=self.cluster_id,
            leader_epoch=election.epoch,
            voted_id=NO_ID if election.voted_id is None else election.voted_id,
            leader_id=NO_ID if election.leader_id is None else election.leader_id,
            voters=tuple(sorted(self.voters)),
        )

    def _dispatch(self, message: RaftMessage) -> None:
        if is_request(message):
            assert self._transport is not None
            self._transport.send(message)  # type: ignore[arg-type]
        elif not self._inbound.complete(message):  # type: ignore[arg-type]
            log.debug("node %d: nobody waits for %r any more", self.node_id, message)

    async def _load_snapshot(self, snapshot_id: OffsetAndEpoch) -> None:
        store = self._require_snapshots()
        data = await asyncio.to_thread(store.read, snapshot_id)
        try:
            _, data = unwrap_snapshot(data)
        except InvalidRecordError as e:
            raise KafkaStorageError(f"snapshot {snapshot_id}: {e}") from e
        self._state_machine.load_snapshot(SnapshotReader(snapshot_id, data))
        self._applied_offset = snapshot_id.offset
        self._applied_epoch = snapshot_id.epoch
        self._high_watermark = max(self._high_watermark, snapshot_id.offset)
        self._last_snapshot_offset = snapshot_id.offset
        self._bytes_since_snapshot = 0
        while self._proposals and self._proposals[0].offset < snapshot_id.offset:
            _fail(heapq.heappop(self._proposals), NotLeaderError(self.leader_id, snapshot_id.epoch))

    async def _apply_committed(self, node: RaftNode) -> None:
        raft_log = self._require_log()
        while True:
            high_watermark = min(self._high_watermark, raft_log.end_offset)
            if self._applied_offset >= high_watermark:
                return
            if self._applied_offset < raft_log.start_offset:
                return  # the log was reset to a snapshot: the next Ready loads it first
            data = raft_log.read(self._applied_offset, _APPLY_READ_BYTES)
            committed: list[RecordBatch] = []
            applied_bytes = 0
            for batch in iter_batches(data):
                if batch.next_offset <= self._applied_offset:
                    continue
                if batch.next_offset > high_watermark:
                    break
                self._resolve_proposals(batch)
                if not batch.is_control:
                    committed.append(batch)
                applied_bytes += batch.size
                self._applied_offset = batch.next_offset
                self._applied_epoch = batch.partition_leader_epoch
            if not applied_bytes:
                return
            if committed:
                self._state_machine.apply(committed, high_watermark)
            self._bytes_since_snapshot += applied_bytes
            if (
                self._bytes_since_snapshot
                >= self.settings.metadata_log_max_record_bytes_between_snapshots
            ):
                await self._write_snapshot(node)
            if self._applied_offset < min(self._high_watermark, raft_log.end_offset):
                # More than one read's worth is committed: let the loop serve between.
                # Not after the last read: a commit's apply would cost a loop turn more.
                await asyncio.sleep(0)

    def _resolve_proposals(self, batch: RecordBatch) -> None:
        proposals = self._proposals
        while proposals and proposals[0].offset < batch.next_offset:
            proposal = heapq.heappop(proposals)
            if (
                proposal.offset >= batch.base_offset
                and proposal.epoch == batch.partition_leader_epoch
            ):
                if not proposal.future.done():
                    proposal.future.set_result(proposal.offset)
            else:
                _fail(proposal, NotLeaderError(self.leader_id, batch.partition_leader_epoch))

    def _fail_truncated_proposals(self, end_offset: int, epoch: int) -> None:
        """Fail the proposals whose entries a follower's truncation removed: a deposed
        leader's uncommitted tail can never commit. ``_resolve_proposals`` fails such a
        proposal only once the new leader's committed entries cover its offset, and a
        proposal past the new leader's log end would wait for writes that may never come.
        An entry truncated and written again before this check keeps its proposal until
        the batch at its offset commits (in another epoch, so it fails there)."""
        if all(proposal.offset < end_offset for proposal in self._proposals):
            return
        kept: list[_Proposal] = []
        for proposal in self._proposals:
            if proposal.offset >= end_offset:
                _fail(proposal, NotLeaderError(self.leader_id, epoch))
            else:
                kept.append(proposal)
        heapq.heapify(kept)
        self._proposals = kept

    async def _write_snapshot(self, node: RaftNode) -> None:
        snapshot_id = OffsetAndEpoch(self._applied_offset, self._applied_epoch)
        if snapshot_id.offset <= self._last_snapshot_offset:
            return
        data = self._state_machine.snapshot(snapshot_id)
        if self.is_dynamic:
            data = wrap_snapshot(node.voters_at(snapshot_id.offset), data)
        store = self._require_snapshots()
        path = await asyncio.to_thread(store.write_file, snapshot_id, data)
        store.add(snapshot_id, path)
        node.snapshot_written(snapshot_id)
        self._last_snapshot_offset = snapshot_id.offset
        self._bytes_since_snapshot = 0
        log.info("node %d: wrote snapshot %s", self.node_id, snapshot_id)

    def _on_role_change(self, role: RoleChange) -> None:
        self._role = role
        self.telemetry.role_changed(role)
        log.info(
            "node %d: %s in epoch %d (leader %s)",
            self.node_id,
            role.role.value,
            role.epoch,
            role.leader_id,
        )
        for listener in self._role_listeners:
            try:
                listener(role)
            except Exception:
                log.exception("node %d: a role listener failed", self.node_id)

    # --- serving requests ------------------------------------------------------------------

    async def serve(
        self, wire: ProtoRequest, context: grpc.aio.ServicerContext, *, timed: bool = True
    ) -> ProtoResponse:
        """Step a request into the node and wait for the node's answer to it; ``timed``:
        for at most the request timeout (and a fetch's ``max_wait_ms``), else until the
        caller cancels (a ``FetchStream``'s fetcher times its fetches itself)."""
        node = self._node
        if node is None or self._stopping:
            return await abort(
                context, grpc.StatusCode.UNAVAILABLE, "the Raft server is not running"
            )
        try:
            request = request_from_proto(wire, destination=self.node_id)
        except InvalidRequestError as e:
            return await abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(e))
        future = self._inbound.expect(request)
        timer = None
        if timed:
            timeout_s = self.settings.raft.request_timeout_ms / 1000
            if isinstance(request, FetchRequest):
                timeout_s += request.max_wait_ms / 1000
            timer = asyncio.get_running_loop().call_later(timeout_s, expire, future)
        try:
            self._step(node, request)
            response = await future
        except TimeoutError:
            return await abort(
                context, grpc.StatusCode.DEADLINE_EXCEEDED, "the Raft node did not answer in time"
            )
        except Superseded:
            return await abort(
                context,
                grpc.StatusCode.ABORTED,
                "a newer request from the same replica replaced it",
            )
        finally:
            if timer is not None:
                timer.cancel()
            self._inbound.forget(request, future)
            if not future.done():
                future.cancel()
        return response_to_proto(response)

    def describe_quorum_response(self) -> raft_pb2.DescribeQuorumResponse:
        node = self._node
        if node is None:
            return raft_pb2.DescribeQuorumResponse(error=ErrorCode.BROKER_NOT_AVAILABLE)
        error = ErrorCode.NONE if node.is_leader else ErrorCode.NOT_LEADER_OR_FOLLOWER
        response = describe_quorum_to_proto(
            node.describe(), cluster_id=self.cluster_id, error=error
        )
        directory_ids = (
            {v.node_id: str(v.directory_id) for v in node.voter_set} if self.is_dynamic else {}
        )
        committed_below = node.high_watermark or 0
        if self.is_dynamic and 0 <= node.voters_offset < committed_below:
            # Only a committed set's offset: an observer keeps what it takes as committed.
            response.voters_offset = node.voters_offset
        for node_id, address in sorted(self.voters.items()):
            response.nodes.add(
                node_id=node_id, address=address, directory_id=directory_ids.get(node_id, "")
            )
        for replica in response.current_voters:
            replica.replica_directory_id = directory_ids.get(replica.replica_id, "")
            replica.endpoint = self.voters.get(replica.replica_id, "")
        for replica in response.observers:
            if replica.replica_id == self.node_id and self.directory_id is not None:
                # A leader that removed itself, listed as an observer (its own progress
                # carries no fetch's key).
                replica.replica_directory_id, replica.endpoint = (
                    str(self.directory_id),
                    self.endpoint,
                )
        return response

    def _on_response(self, response: RaftResponse) -> None:
        node = self._node
        if node is None or self._stopping:
            return
        try:
            with contextlib.suppress(Exception):  # _step stopped the server already
                self._step(node, response, wake=False)
                if isinstance(response, FetchResponse) and response.records:
                    self._flush_early(node)
        finally:
            # The driver wakes after the flush: a follower that flushed on its loop has
            # queued its next fetch, whose writer then runs before the driver's Ready (the
            # apply of what the answer committed), not after it.
            self._wakeup.set()

    def _flush_early(self, node: RaftNode) -> None:
        """A fetch answer appended entries to this follower's log: hand their flush to the
        flusher thread now, from the answer's callback, rather than once the driver's loop
        wakes and takes the Ready (a loop turn, a tick and a Ready later, on the path of
        every commit). Only when flushes go to the thread anyway and none runs; the Ready
        that asks for this flush finds it under way (``_waits_for_flush``). Nothing is
        claimed earlier for it: the node learns of it by ``on_flushed`` once it returned
        in the thread, as of any flush, and the next fetch goes out only then."""
        raft_log = self._require_log()
        if (
            self._flushing is not None
            or self._stopping
            or raft_log.flushed_offset >= raft_log.end_offset
        ):
            return
        if self._flushes_on_loop(node):
            try:
                self._flush_on_loop(node)
            except Exception as e:
                self._fail(e)
            return
        if self._last_fsync_s <= _INLINE_FSYNC_MAX_S:
            return
        self._hand_flush_to_thread(node)

    def _flushes_on_loop(self, node: RaftNode) -> bool:
        """Whether this replica's flushes run on its loop whatever the disk's speed: a voter
        that follows (``RaftServerSettings.follower_flushes_on_loop``)."""
        return self.settings.follower_flushes_on_loop and node.is_voter and not node.is_leader

    def _flush_on_loop(self, node: RaftNode) -> None:
        """Fsync the log on the loop (the GIL is released meanwhile: gRPC's threads go on
        taking messages in), then tell the node, whose next fetch goes out at once."""
        started = time.perf_counter()
        self._require_log().flush()
        self._last_fsync_s = time.perf_counter() - started
        self._flushed(node)

    def _hand_flush_to_thread(self, node: RaftNode) -> None:
        """Start a flush in the flusher thread; a voter that follows waits until the thread
        has started it (``LogFlusher``): its fsync is on the path of every commit and its
        loop has nothing of the commit's to do first. A leader does not wait (its own
        fsync runs beside the replication, and its loop serves the requests), nor does an
        observer (a broker's loop serves its clients)."""
        wait_started = node.is_voter and not node.is_leader
        flushed = self._require_flusher().flush(
            self._require_log().flush, wait_started=wait_started
        )
        self._flushing = asyncio.create_task(self._flush_in_thread(node, flushed))

    def _on_unreachable(self, peer_id: int) -> None:
        node = self._node
        if node is None or self._stopping:
            return
        try:
            node.peer_unreachable(peer_id, self._clock())
        except Exception as e:
            self._fail(e)
        self._wakeup.set()

    def _step(self, node: RaftNode, message: RaftMessage, *, wake: bool = True) -> None:
        """Step a message into the node; any failure but a bad snapshot transfer is fatal.
        ``wake``: wake the driver for the Ready (False: the caller does, later)."""
        try:
            node.step(message, self._clock())
        except CorruptSnapshotError as e:
            # The snapshot received from the leader did not check: dropped, fetched again.
            log.error("node %d: %s", self.node_id, e)
        except Exception as e:
            self._fail(e)
            raise
        finally:
            if wake:
                self._wakeup.set()

    # --- shutdown ---------------------------------------------------------------------------

    async def _shutdown(self) -> None:
        if self._stopping:
            await self._stopped.wait()
            return
        self._stopping = True
        self._wakeup.set()
        try:
            await self._host.enter_graceful_shutdown()
            for task in (self._announcer, self._joining):
                if task is not None and not task.done():
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
            driver = self._driver
            if driver is not None and driver is not asyncio.current_task() and not driver.done():
                driver.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await driver
            await self._host.stop(self.settings.shutdown_grace_ms / 1000)
            flushing = self._flushing
            if flushing is not None:
                with contextlib.suppress(Exception):
                    await flushing
            if self._flusher is not None:
                self._flusher.close()
            if self._transport is not None:
                await self._transport.close()
            self._inbound.fail_all()
            epoch = self._node.epoch if self._node is not None else 0
            for proposal in self._proposals:
                _fail(proposal, NotLeaderError(None, epoch))
            self._proposals.clear()
            if self._log is not None:
                await asyncio.to_thread(self._log.close)
            if self._snapshots is not None:
                self._snapshots.close()
            self._lock.release()
        finally:
            self._stopped.set()
            log.info("node %d: stopped", self.node_id)

    # --- helpers ------------------------------------------------------------------------------

    def _require_node(self) -> RaftNode:
        if self._node is None:
            raise RuntimeError("the Raft server has not started")
        return self._node

    def _require_log(self) -> PartitionRaftLog:
        if self._log is None:
            raise RuntimeError("the Raft server has not started")
        return self._log

    def _require_snapshots(self) -> FileSnapshotStore:
        if self._snapshots is None:
            raise RuntimeError("the Raft server has not started")
        return self._snapshots


def _fail(proposal: _Proposal, error: HighwaterError) -> None:
    if not proposal.future.done():
        proposal.future.set_exception(error)


def write_directory_id(path: Path, directory_id: uuid.UUID) -> None:
    """Write a data directory's ``directory-id`` (the one ``--initial-controllers`` gave)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, f"{directory_id}\n".encode())


def default_cluster_id(voters: Mapping[int, str]) -> str:
    """A cluster id every voter derives alike from the voter set, when none was given."""
    text = ",".join(f"{voter}@{address}" for voter, address in sorted(voters.items()))
    digest = hashlib.sha256(text.encode()).digest()[:16]
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")
