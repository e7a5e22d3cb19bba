"""The quorum controller as a service: the metadata state machine, a Raft-backed store, gRPC.

Two pieces turn the pure :class:`~highwater.controller.quorum_controller.QuorumController`
into a controller process, on top of the
:class:`~highwater.metadata.state_machine.MetadataStateMachine` every replica of
``__cluster_metadata`` runs (the committed image, the same on every voter):

* :class:`RaftMetadataStore` is the :class:`~highwater.controller.store.MetadataStore`
  over a :class:`~highwater.raft.driver.RaftServer`: the latest image is the committed
  one plus the records this controller appended that are not committed yet (a
  speculative image per batch). An append goes to Raft at once
  (:meth:`RaftServer.append`, guarded by the leader epoch and the expected base offset,
  so the offsets the records were decided with — broker epochs are record offsets —
  are the offsets they get). The one gap it allows is a dynamic quorum's ``voters``
  records, which the Raft layer appends between the store's batches on a membership
  change: a batch staged for the offsets one took goes right after it, and its image is
  rebuilt at its records' offsets (as Kafka's controller replays its records at the
  offsets ``prepareAppend`` returns). What requests decided in that batch from an offset
  (a broker epoch, a controlled shutdown's offset) is then up to that many below the
  record's own offset: still unique, increasing, and reached by no replica before the
  batch itself. When a batch the store appended commits, the committed
  image becomes the speculative image built for it, without decoding it again. Losing
  leadership drops the speculative images.
* :class:`ControllerServer` runs a ``RaftServer`` with the ``highwater.internal.v1.Controller``
  service on the same gRPC server and port (the Raft server takes extra services,
  :class:`~highwater.rpc.server.GrpcService`; health reports the Controller service
  SERVING once the quorum has a leader, and each other service once its role says so). Every RPC,
  every ``tick`` and the activation go through one queue, served one at a time in arrival
  order on the event loop: the request's controller method runs on the latest image and
  its records are staged (the next request already sees them), without waiting for
  anything earlier to commit. The requests that arrive together — those queued, and
  while the group before is still on its way to a majority every request that arrives
  until it commits (and ``append_linger_ms`` since its first while it holds fewer
  requests than the group before it; with an
  ``append_pipeline_depth`` of N, a group waits only while N batches are in flight, for
  the oldest's commit) — form a group whose staged records are sealed into one Raft
  batch (group commit: one append, one fsync per voter and one fetch round trip for the
  group, as Kafka's QuorumController with its batch accumulator); each answer goes out
  once everything appended up to its group is committed. A group decided on an
  image that was then dropped (leadership lost, or Raft refused the batch) is answered
  NOT_CONTROLLER, never acknowledged; so is every group still waiting for its commit when
  the leadership ends (the outcome is not known then). A replica that is not the active
  controller answers NOT_CONTROLLER with the leader's id and address (from the voters).

Activation (Kafka's ``claim``): when Raft reports this replica leader of an epoch, the
controller appends a ``NoOpRecord`` and waits until it is committed and applied, so the
committed image holds every record of earlier epochs; then it activates the controller
(fresh broker and coordinator sessions) and starts ticking every ``tick_interval_ms``
(session expiry, unclean and preferred leader elections, the ``__consumer_offsets`` topic).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Protocol

import grpc
import grpc.aio
from google.protobuf.message import Message

from highwater.controller.config import ControllerConfig
from highwater.controller.etcd_migration import EtcdMigration, etcd_cluster_id
from highwater.controller.metrics import ControllerMetrics
from highwater.controller.quorum_controller import CONTROLLER_CALLS, QuorumController
from highwater.controller.store import NotControllerError
from highwater.controller_api import codec
from highwater.controller_api.authorization import merge_refusals, split_admin_request
from highwater.controller_api.codec import (
    CONTROLLER_HEALTH_ALIASES,
    CONTROLLER_SERVICE_NAME,
    ControllerRpc,
    InvalidRequestError,
)
from highwater.controller_api.messages import (
    ReplicaLogInfo,
    ReplicaLogInfoRequest,
    ReplicaLogInfoResponse,
)
from highwater.errors import UnexpectedAppendOffsetError
from highwater.etcd_metadata.endpoints import EtcdStoreAddress
from highwater.internal.v1 import (
    controller_pb2,
    controller_pb2_grpc,
    replication_pb2,
    replication_pb2_grpc,
)
from highwater.metadata.delta import MetadataDelta
from highwater.metadata.image import MetadataImage
from highwater.metadata.records import MetadataRecord, NoOpRecord, encode_record
from highwater.metadata.state_machine import MetadataStateMachine
from highwater.raft.driver import RaftServer, RaftServerSettings
from highwater.raft.messages import OffsetAndEpoch
from highwater.raft.node import NotLeaderError, RoleChange
from highwater.raft.state import Role
from highwater.raft.voter_set import VoterSet
from highwater.records import RecordBatch
from highwater.rpc.auth import (
    authorizer_enabled,
    follow_image,
    may_speak_for_node,
    node_identities,
    principal_of,
)
from highwater.rpc.channels import open_channel
from highwater.rpc.server import GrpcService
from highwater.v1.common_pb2 import ErrorCode

__all__ = [
    "ControllerServer",
    "ControllerSettings",
    "RaftMetadataStore",
]

log = logging.getLogger(__name__)


RECOVERY_ASK_TIMEOUT_S: Final = 5.0
"""How long the controller waits for a broker's answer to unclean recovery."""


def monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


# --- the store ---------------------------------------------------------------------------


class RaftAppender(Protocol):
    """The part of :class:`RaftServer` the store writes through."""

    def append(
        self,
        values: Sequence[bytes],
        *,
        epoch: int | None = None,
        base_offset: int | None = None,
    ) -> tuple[OffsetAndEpoch, asyncio.Future[int]]: ...

    @property
    def leader_id(self) -> int | None: ...


@dataclass(slots=True)
class _Pending:
    """A batch this store appended that has not committed yet, and the image it makes."""

    base_offset: int
    last: OffsetAndEpoch
    parent: MetadataImage
    image: MetadataImage
    committed: asyncio.Future[int]


@dataclass(slots=True)
class _OpenBatch:
    """Requests' records decided and staged, not yet handed to Raft: they go as one batch.

    The state they make is ``base`` (``parent`` at first, then the image last built for
    them) plus ``since``, the records staged after it replayed on it (``None``: none).
    Each append replays its records into ``since`` (the check that they apply); an image,
    at the offsets the records will get (the batch starts right after ``parent``), is
    built from it only when asked for (:meth:`RaftMetadataStore.latest_image`, and at
    the seal). A request that only reads the state decides on ``since`` itself
    (:meth:`RaftMetadataStore.latest_view`): a group of such requests replays each
    record once and builds one image, and a group whose every request reads an image
    builds one per request from that request's records, as each did before."""

    parent: MetadataImage
    epoch: int
    base: MetadataImage
    since: MetadataDelta | None
    base_offset: int
    """Where the batch is to start: right after ``parent``'s last record, until Raft puts
    it after voter-set records of its own (:meth:`move_to`)."""
    values: list[bytes] = field(default_factory=list)
    records: list[MetadataRecord] = field(default_factory=list)
    base_records: int = 0
    """How many of ``records`` ``base`` holds."""

    @property
    def last_offset(self) -> int:
        return self.base_offset + len(self.values) - 1

    def move_to(self, base_offset: int) -> MetadataImage:
        """Raft appended the batch at ``base_offset``, after ``voters`` records that took
        the offsets it was staged for: its image at the offsets its records have, replayed
        again from ``parent`` (images built for requests while it was staged carry offsets
        up to that many lower, which only ever under-state how far a reader must be)."""
        self.base_offset = base_offset
        self.base = self.parent
        self.base_records = 0
        self.since = MetadataDelta(self.parent).replay_all(self.records)
        return self.built_image()

    def view(self) -> MetadataImage | MetadataDelta:
        return self.base if self.since is None else self.since

    def built_image(self) -> MetadataImage:
        since = self.since
        if since is not None:
            self.base = since.apply(self.last_offset, self.epoch)
            self.base_records = len(self.records)
            self.since = None
        return self.base

    def stage(self, records: Sequence[MetadataRecord], values: list[bytes]) -> None:
        """Replay ``records`` on the staged state and stage them; a record that does not
        replay raises, and leaves the state as the records staged before made it."""
        since = self.since
        if since is None:
            self.since = MetadataDelta(self.base).replay_all(records)
        else:
            try:
                since.replay_all(records)
            except BaseException:
                # Part of them may be in the delta: rebuilt from the ones staged before.
                rebuilt = MetadataDelta(self.base).replay_all(self.records[self.base_records :])
                self.since = rebuilt
                raise
        self.records.extend(records)
        self.values.extend(values)


DEFAULT_APPEND_LINGER_MS: Final = 10
"""``ControllerSettings.append_linger_ms`` by default (docs/raft.md, "Eighth pass")."""

DEFAULT_APPEND_PIPELINE_DEPTH: Final = 1
"""``ControllerSettings.append_pipeline_depth`` by default."""

MAX_RECORDS_PER_BATCH: Final = 10_000
"""Records staged together in one Raft batch before it is sealed (Kafka's
``QuorumController`` bounds its batches the same way); one request's records are never
split, however many."""


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _observe(future: asyncio.Future[Any]) -> None:
    """Mark a future's failure as seen (its waiters, if any, handle it)."""
    if not future.cancelled():
        future.exception()


class RaftMetadataStore:
    """The :class:`~highwater.controller.store.MetadataStore` of the active controller,
    over the Raft quorum (see the module docstring).

    Writable only while activated for a leader epoch (:meth:`activate`); outside one,
    ``append`` raises :class:`NotControllerError` and the latest image is the committed
    one.

    Group commit: between :meth:`begin_batch` and :meth:`seal`, appends are staged — each
    is validated and replayed on the latest image at once, so the next request sees it —
    and the staged records of all of them go to Raft as one batch at :meth:`seal`: one
    log append, one fsync, one fetch round trip for every request that arrived together.
    Outside such a stretch every append goes to Raft at once.
    """

    def __init__(self, raft: RaftAppender, machine: MetadataStateMachine) -> None:
        self._raft = raft
        self._machine = machine
        self._epoch: int | None = None
        self._pending: deque[_Pending] = deque()
        self._open: _OpenBatch | None = None
        self._batching = False
        self._incarnation = 0
        self.sealed_batches = 0
        """Raft batches appended so far (each holds the records of one group)."""
        machine.speculation = self

    # --- leadership ------------------------------------------------------------------

    @property
    def active_epoch(self) -> int | None:
        """The leader epoch this store appends in; ``None`` while not active."""
        return self._epoch

    @property
    def is_active(self) -> bool:
        return self._epoch is not None

    def activate(self, epoch: int) -> None:
        """Start appending in ``epoch``, on top of the committed image (which must hold
        every entry of the log: the caller waited for an entry of ``epoch`` to commit)."""
        self._open = None
        self._pending.clear()
        self._epoch = epoch
        self._incarnation += 1

    def deactivate(self) -> None:
        """Leadership ended: drop the speculative images, back to the committed one; the
        requests staged and not sent to Raft fail as those sent would (NotLeaderError)."""
        if self._pending:
            log.info(
                "dropping %d uncommitted metadata batches (offsets %d..%d)",
                len(self._pending),
                self._pending[0].base_offset,
                self._pending[-1].last.offset,
            )
        self._open = None
        self._epoch = None
        self._pending.clear()
        self._incarnation += 1

    # --- MetadataStore -----------------------------------------------------------------

    def latest_image(self) -> MetadataImage:
        """The committed image plus every record appended since (while active)."""
        if self._open is not None:
            return self._open.built_image()
        return self._pending[-1].image if self._pending else self._machine.image

    def latest_view(self) -> MetadataImage | MetadataDelta:
        """What :meth:`latest_image` holds, without building it: while records are
        staged since the image last built, their delta over it (read it, never replay into
        it); otherwise that image."""
        if self._open is not None:
            return self._open.view()
        return self._pending[-1].image if self._pending else self._machine.image

    def committed_image(self) -> MetadataImage:
        return self._machine.image

    def committed_offset(self) -> int:
        return self._machine.image.offset

    @property
    def pending_batches(self) -> int:
        """Batches appended (or staged) and not committed yet."""
        return len(self._pending) + (self._open is not None)

    @property
    def incarnation(self) -> int:
        """Changes whenever speculative images are dropped (activation, deactivation, a
        staged batch Raft refused): requests decided on an image of an older incarnation
        must not be acknowledged."""
        return self._incarnation

    @property
    def staged_records(self) -> int:
        """Records staged for the next :meth:`seal`."""
        return 0 if self._open is None else len(self._open.values)

    def append(self, records: Sequence[MetadataRecord]) -> int:
        """Append ``records`` atomically right after the latest image; the offset of the
        last one. Their image is the latest from now on.

        Between :meth:`begin_batch` and :meth:`seal` they are staged (see the class
        docstring); otherwise they go to Raft at once as one batch.

        Raises :class:`NotControllerError` when not active (or Raft refuses: not the
        leader of the active epoch), ``UnexpectedAppendOffsetError`` if the log does not
        end where the latest image does, and ``MetadataReplayError`` for records that do
        not replay on the latest image — in each case nothing is appended (a failure of
        the Raft append while staging shows at :meth:`seal` instead).
        """
        epoch = self._epoch
        if epoch is None:
            raise NotControllerError(_or_unknown(self._raft.leader_id))
        if not records:
            return self.latest_image().offset
        if self._open is not None and len(self._open.values) + len(records) > MAX_RECORDS_PER_BATCH:
            self._seal_open()
        values = [encode_record(record) for record in records]
        staged = self._open
        if staged is None:
            parent = self._pending[-1].image if self._pending else self._machine.image
            staged = _OpenBatch(parent, epoch, parent, None, parent.offset + 1)
            staged.stage(records, values)  # raises before anything is staged
            self._open = staged
        else:
            staged.stage(records, values)
        last_offset = staged.last_offset
        if not self._batching:
            self._seal_open()
        return last_offset

    def begin_batch(self) -> None:
        """Stage appends from now until :meth:`seal` (group commit)."""
        self._batching = True

    def seal(self) -> None:
        """Hand the staged records to Raft as one batch and stop staging.

        Raises :class:`NotControllerError` or ``UnexpectedAppendOffsetError`` when Raft
        refuses the batch: the staged images are dropped, and the requests staged must be
        answered NOT_CONTROLLER, never acknowledged.
        """
        self._batching = False
        self._seal_open()

    def _seal_open(self) -> None:
        staged = self._open
        if staged is None:
            return
        image = staged.built_image()
        try:
            last, committed = self._raft.append(
                staged.values, epoch=staged.epoch, base_offset=staged.base_offset
            )
        except NotLeaderError as e:
            self._open = None
            self._incarnation += 1
            raise NotControllerError(_or_unknown(e.leader_id)) from None
        except BaseException:
            self._open = None
            self._incarnation += 1
            raise
        self._open = None
        self.sealed_batches += 1
        committed.add_done_callback(_observe)
        expected = staged.last_offset
        if last.offset > expected and last.epoch == staged.epoch:
            # After voters records Raft appended since the records before it (a membership
            # change): Raft checked that only those lie between (RaftServer.append).
            image = staged.move_to(last.offset - len(staged.values) + 1)
            expected = last.offset
        if last.offset != expected or last.epoch != staged.epoch:
            # Raft put the batch elsewhere than the images say: the caller starts over.
            self._incarnation += 1
            raise UnexpectedAppendOffsetError(
                f"the batch staged for offsets {staged.base_offset}..{expected} of epoch "
                f"{staged.epoch} was appended ending at {last.offset} in epoch {last.epoch}"
            )
        self._pending.append(_Pending(staged.base_offset, last, staged.parent, image, committed))

    def in_flight(self, depth: int = 1) -> asyncio.Future[int] | None:
        """While ``depth`` or more batches handed to Raft are not committed yet, the commit
        of the ``depth``-th last of them (the one whose commit leaves fewer than ``depth``
        in flight); else ``None``. Batches commit in log order, so one done means every
        batch before it is done too."""
        pending = self._pending
        if len(pending) < depth:
            return None
        committed = pending[-depth].committed
        return None if committed.done() else committed

    def commit_waiter(self) -> asyncio.Future[int] | None:
        """A future that resolves once everything appended so far is committed (raises
        ``NotLeaderError`` if it never will be); ``None`` if it is already. Staged
        records have no waiter until :meth:`seal`."""
        if self._open is not None:
            raise RuntimeError("records are staged: seal them before waiting for a commit")
        return self._pending[-1].committed if self._pending else None

    # --- Speculation (called by the state machine) --------------------------------------

    def image_for_batch(self, batch: RecordBatch, parent: MetadataImage) -> MetadataImage | None:
        """The image built at append time for ``batch``, if ``batch`` is the oldest
        pending one (same offsets and epoch: by Raft's log matching, the same entry) and
        ``parent`` is the very image it was built on."""
        pending = self._pending
        while pending and pending[0].last.offset < batch.base_offset:
            pending.popleft()  # committed: it came before this batch
        if not pending:
            return None
        head = pending[0]
        if (
            head.base_offset == batch.base_offset
            and head.last.offset == batch.next_offset - 1
            and head.last.epoch == batch.partition_leader_epoch
            and head.parent is parent
        ):
            return head.image
        return None

    def on_committed(self, image: MetadataImage) -> None:
        pending = self._pending
        while pending and pending[0].last.offset <= image.offset:
            pending.popleft()


def _or_unknown(node_id: int | None) -> int:
    return -1 if node_id is None else node_id


# --- the controller server -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ControllerSettings:
    """The controller process's settings: the Raft driver's, the controller's, and its own."""

    raft: RaftServerSettings = field(default_factory=RaftServerSettings)
    controller: ControllerConfig = field(default_factory=ControllerConfig)
    tick_interval_ms: int = 100
    """How often the active controller runs :meth:`QuorumController.tick`."""
    append_linger_ms: int = DEFAULT_APPEND_LINGER_MS
    """How long a group of requests started while the batch before it is on its way to a
    majority may keep taking requests in (from its first), besides waiting for that batch
    to commit (Kafka's ``controller.quorum.append.linger.ms``), while it holds fewer
    requests than the group sealed before it. A group started with nothing in flight (a
    lone writer) is sealed at once whatever this says, and so is one as large as the
    group before it (a few writers, all in it already)."""
    append_pipeline_depth: int = DEFAULT_APPEND_PIPELINE_DEPTH
    """How many sealed batches may be on their way to a majority at once. A group started
    while that many are in flight keeps taking requests in until the oldest of them
    commits; with fewer in flight it is sealed as soon as the requests queued are run.
    With 1 (the default) a group is sealed when the batch before it commits."""
    seed: int | None = None
    """Seeds replica placement and topic ids; ``None``: a random seed."""
    migration_from: EtcdStoreAddress | None = None
    """The etcd-mode cluster to migrate to this quorum (``--migration-from``;
    :mod:`highwater.controller.etcd_migration`); None: no migration."""


@dataclass(frozen=True, slots=True)
class _NotController:
    controller_id: int | None


@dataclass(slots=True)
class _Request:
    rpc: ControllerRpc[Any, Any]
    request: Any
    reply: asyncio.Future[Any]
    """The response once its records are committed, or :class:`_NotController`."""
    principal: str = ""
    """The caller's principal, recorded with a RegisterBroker (with the ACL checks on)."""


@dataclass(frozen=True, slots=True)
class _Activate:
    epoch: int


@dataclass(frozen=True, slots=True)
class _Tick:
    pass


@dataclass(frozen=True, slots=True)
class _BrokerDisconnected:
    """A broker's liveness stream ended without its saying it was leaving."""

    broker_id: int
    broker_epoch: int
    leader_epoch: int


@dataclass(slots=True)
class _Propose:
    """Records the controller appends on its own (the etcd migration's copy and end)."""

    records: tuple[MetadataRecord, ...]
    reply: asyncio.Future[Any]
    """``None`` once the records are committed, or :class:`_NotController`."""


_Job = _Request | _Activate | _Tick | _BrokerDisconnected | _Propose


class _JobQueue:
    """The worker's jobs, in arrival order, for one consumer (the worker).

    Waiting costs one future, woken by the next job or by another future's end
    (:meth:`get_before`): not a task per wait, as ``asyncio.wait`` on a queue's ``get``
    would cost for every request that joins a group."""

    def __init__(self) -> None:
        self._jobs: deque[_Job] = deque()
        self._waiter: asyncio.Future[None] | None = None

    def put_nowait(self, job: _Job) -> None:
        self._jobs.append(job)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def empty(self) -> bool:
        return not self._jobs

    def get_nowait(self) -> _Job:
        """The oldest job; ``IndexError`` if there is none."""
        return self._jobs.popleft()

    async def get(self) -> _Job:
        while not self._jobs:
            await self._wait(())
        return self._jobs.popleft()

    async def get_before(self, *done: asyncio.Future[Any]) -> _Job | None:
        """The next job, if one arrives before any of ``done`` is done; else ``None``."""
        while not self._jobs:
            if any(future.done() for future in done):
                return None
            await self._wait(done)
        return self._jobs.popleft()

    async def _wait(self, also: Sequence[asyncio.Future[Any]]) -> None:
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def wake(_: asyncio.Future[Any]) -> None:
            if not waiter.done():
                waiter.set_result(None)

        self._waiter = waiter
        for future in also:
            future.add_done_callback(wake)
        try:
            await waiter
        finally:
            self._waiter = None
            for future in also:
                future.remove_done_callback(wake)


_LATE_TICK_WARNING_S: Final = 1.0
"""A tick timer this late means the controller's loop was blocked: logged."""
_MAX_REQUESTS_PER_GROUP: Final = 1024


class ControllerServer:
    """A voter of the metadata quorum serving ``highwater.internal.v1.Controller`` (see the module
    docstring): ``await start()``, ``await stop()``."""

    def __init__(
        self,
        *,
        node_id: int,
        listen: str,
        voters: Mapping[int, str] | None = None,
        initial_voters: VoterSet | None = None,
        bootstrap_controllers: Sequence[str] = (),
        data_dir: Path,
        cluster_id: str | None = None,
        settings: ControllerSettings | None = None,
        clock: Callable[[], int] = monotonic_ms,
        services: Sequence[GrpcService] = (),
        listener_name: str | None = None,
        more_listeners: Sequence[tuple[str, str]] = (),
        advertised: str | None = None,
    ) -> None:
        """``services``: more gRPC services to serve on the same port (a co-located
        broker's, in ``highwater server``); ``listener_name`` names ``listen``,
        ``more_listeners`` (name, ``HOST:PORT``) serve the same (its named listeners);
        ``advertised``: the endpoint the other controllers reach this one at, if not
        ``listen`` (:class:`~highwater.raft.driver.RaftServer`)."""
        self.node_id = node_id
        self.settings = settings or ControllerSettings()
        self._clock = clock
        self.machine = MetadataStateMachine()
        follow_image(lambda: self.machine.image)
        self.raft = RaftServer(
            node_id=node_id,
            listen=listen,
            voters=voters,
            initial_voters=initial_voters,
            bootstrap_controllers=bootstrap_controllers,
            data_dir=data_dir,
            state_machine=self.machine,
            cluster_id=cluster_id,
            settings=self.settings.raft,
            role_listeners=[self._on_role_change],
            services=[
                GrpcService(
                    CONTROLLER_SERVICE_NAME,
                    self._add_servicer,
                    health_aliases=CONTROLLER_HEALTH_ALIASES,
                ),
                *services,
            ],
            listener_name=listener_name,
            more_listeners=more_listeners,
            advertised=advertised,
        )
        self.store = RaftMetadataStore(self.raft, self.machine)
        self.metrics = ControllerMetrics(self)
        self._controller: QuorumController | None = None
        self._jobs = _JobQueue()
        self._last_group_size = 0
        """How many requests the group sealed last held: a group lingers
        (``append_linger_ms``) only while it holds fewer."""
        self._worker: asyncio.Task[None] | None = None
        self._ticker: asyncio.Task[None] | None = None
        self._tick_queued = False
        self._leader_epoch: int | None = None
        self._leadership_over: asyncio.Future[None] | None = None
        self._broken_streams: dict[int, int] = {}
        """Broker id -> broker epoch: the liveness streams of this leadership that ended
        without the broker leaving, and after which nothing of that epoch arrived. Each is
        fenced by its job at once, and again by every later activation of this leadership
        (a no-op once fenced): a fence whose batch the store dropped (its activation
        restarted) is not lost until the session timeout."""
        self._latest_streams: dict[int, object] = {}
        """Broker id -> a token of the liveness stream it opened last here. A broker holds
        one stream and opens another only when it lost the one before: its channel's
        keepalive closed a connection a partition had cut (``rpc/channels.py``), and that
        stream ends here when the link is back, or never (nothing is written to it). So
        only the end of a broker's latest stream is the end of its process; the older one
        may end when it will."""
        self._stopping = False
        self._cluster_id = cluster_id
        self.migration: EtcdMigration | None = None
        if self.settings.migration_from is not None:
            self.migration = EtcdMigration(
                store=self.settings.migration_from,
                node_id=node_id,
                address=self.raft.voters.get(node_id, listen),
                committed_image=lambda: self.machine.image,
                is_active=lambda: self.store.is_active,
                propose=self.propose,
            )
        self._recovery_asks: set[asyncio.Task[None]] = set()
        """Unclean recovery's questions to brokers in flight (KIP-966's GetReplicaLogInfo)."""

    # --- public API --------------------------------------------------------------------

    @property
    def port(self) -> int:
        return self.raft.port

    @property
    def is_active(self) -> bool:
        """Whether this replica is the active controller (leader, and activated)."""
        return self.store.is_active

    def committed_image(self) -> MetadataImage:
        """The metadata image of the committed records."""
        return self.store.committed_image()

    @property
    def controller(self) -> QuorumController:
        if self._controller is None:
            raise RuntimeError("the controller server has not started")
        return self._controller

    @property
    def failure(self) -> BaseException | None:
        return self.raft.failure

    async def wait_stopped(self) -> None:
        await self.raft.wait_stopped()

    async def start(self) -> None:
        """Start the Raft server (which serves the Controller service too) and the worker.
        With a migration, etcd is checked first (it answers, and holds the cluster this
        quorum's cluster id names): if not, the typed error is raised and nothing is written."""
        migration = self.migration
        if migration is not None:
            await etcd_cluster_id(migration.store_address, self._cluster_id)
        await self.raft.start()
        config = self.settings.controller
        if not config.cluster_id:
            config = dataclasses.replace(config, cluster_id=self.raft.cluster_id)
        seed = self.settings.seed
        if seed is None:
            seed = random.SystemRandom().getrandbits(64)
        self._controller = QuorumController(
            self.store.latest_image,
            config,
            seed=seed,
            credit_stalls=True,
            view_supplier=self.store.latest_view,
        )
        # The image replayed at start: its indexes built now, each later image derives
        # them, and this controller's activation, whenever it comes, finds them built.
        self._controller.prepare_standby()
        self._worker = asyncio.create_task(self._work(), name=f"controller-{self.node_id}")
        if migration is not None:
            await migration.start()

    async def stop(self) -> None:
        """Stop serving: pending requests answer NOT_CONTROLLER; the Raft server stops
        (a leader resigns first)."""
        if self._stopping:
            await self.raft.wait_stopped()
            return
        self._stopping = True
        self._lose_leadership()
        if self.migration is not None:
            await self.migration.stop()
        for task in (self._worker, self._ticker, *self._recovery_asks):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        while not self._jobs.empty():
            job = self._jobs.get_nowait()
            if isinstance(job, _Request) and not job.reply.done():
                job.reply.set_result(_NotController(None))
        await self.raft.stop()

    async def wait_active(self, timeout_s: float = 30) -> None:
        """Wait until this replica is the active controller (for tests and tools)."""
        async with asyncio.timeout(timeout_s):
            while not self.is_active:
                await asyncio.sleep(0.01)

    async def call(
        self, rpc: ControllerRpc[Any, Any], request: Any, *, principal: str = ""
    ) -> Message:
        """Serve one request as the gRPC servicer does; the proto response. ``principal``:
        the caller's, which a RegisterBroker records as its node's."""
        reply: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if self._stopping or self._worker is None:
            # Stopping, or not started: a controller that still looks for its quorum
            # (--bootstrap-controllers) serves already, and knows no active controller.
            return self._not_controller(rpc, None)
        self._note_contact(rpc, request)
        self._jobs.put_nowait(_Request(rpc, request, reply, principal))
        outcome = await reply
        if isinstance(outcome, _NotController):
            return self._not_controller(rpc, outcome.controller_id)
        return rpc.response_to_proto(outcome)

    def _note_contact(self, rpc: ControllerRpc[Any, Any], request: Any) -> None:
        """A heartbeat's contact time is when it arrived, not when the worker reaches it
        behind earlier work (``controller/heartbeats.py``, as Kafka's heartbeat tracker)."""
        if rpc.name == "BrokerHeartbeat":
            # Also while the store restarts its activation: the broker is alive.
            self._heard_from(request.broker_id, request.broker_epoch)
        controller = self._controller
        if controller is None or not self.store.is_active:
            return
        if rpc.name == "BrokerHeartbeat":
            controller.heartbeats.note_contact(
                request.broker_id, request.broker_epoch, self._clock()
            )
        elif rpc.name == "CoordinatorHeartbeat":
            controller.coordinator_sessions.note_contact(
                request.coordinator_id, request.registration_epoch, self._clock()
            )

    def _note_liveness(self, broker_id: int, broker_epoch: int) -> None:
        """A message on broker ``broker_id``'s liveness stream: contact for that epoch's
        session (a heartbeat's answer may be held behind commits; the stream's messages
        never are)."""
        self._heard_from(broker_id, broker_epoch)
        controller = self._controller
        if controller is not None and self.store.is_active:
            controller.heartbeats.note_contact(broker_id, broker_epoch, self._clock())

    def _heard_from(self, broker_id: int, broker_epoch: int) -> None:
        """Something of this broker epoch arrived: a stream of it that broke earlier did
        not break with its process, so activations no longer fence it."""
        if self._broken_streams.get(broker_id) == broker_epoch:
            del self._broken_streams[broker_id]

    async def propose(self, records: Sequence[MetadataRecord]) -> bool:
        """Append ``records`` as the active controller, in the worker's order; whether
        they were committed (False: not the active controller, or no longer)."""
        if self._stopping:
            return False
        reply: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._jobs.put_nowait(_Propose(tuple(records), reply))
        outcome = await reply
        return not isinstance(outcome, _NotController)

    # --- leadership --------------------------------------------------------------------

    def _on_role_change(self, change: RoleChange) -> None:
        """Raft's role listener (runs in the Raft driver: it only queues work). Health
        reports the Controller service SERVING while the quorum has a leader: this replica
        answers, or redirects to the active controller with NOT_CONTROLLER."""
        self.raft.report_serving(CONTROLLER_SERVICE_NAME, change.leader_id is not None)
        if change.role is Role.LEADER and change.leader_id == self.node_id:
            if self._leader_epoch == change.epoch or self._stopping:
                return
            self._lose_leadership()
            self._leader_epoch = change.epoch
            self._leadership_over = asyncio.get_running_loop().create_future()
            self._jobs.put_nowait(_Activate(change.epoch))
        else:
            self._lose_leadership()

    def _lose_leadership(self) -> None:
        if self._leader_epoch is not None:
            log.info("node %d: no longer the active controller", self.node_id)
        self._leader_epoch = None
        self._broken_streams.clear()
        self.store.deactivate()
        over = self._leadership_over
        if over is not None and not over.done():
            over.set_result(None)
        self._leadership_over = None
        if self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None

    async def _activate(self, epoch: int) -> None:
        """Claim ``epoch``: a NoOpRecord committed means the committed image holds every
        earlier record; then the controller starts on it."""
        over = self._leadership_over
        if self._leader_epoch != epoch or over is None:
            return
        try:
            _, committed = self.raft.append([encode_record(NoOpRecord())], epoch=epoch)
        except NotLeaderError:
            return
        committed.add_done_callback(_observe)
        waiting: set[asyncio.Future[Any]] = {committed, over}
        await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        if (
            not committed.done()
            or committed.cancelled()
            or committed.exception() is not None
            or self._leader_epoch != epoch
        ):
            return
        self.store.activate(epoch)
        self.controller.activate(self._clock())
        self._ticker = asyncio.create_task(self._tick_timer(epoch))
        for broker_id, broker_epoch in self._broken_streams.items():
            # Fenced already unless its batch was dropped (the activation restarted).
            self._jobs.put_nowait(_BrokerDisconnected(broker_id, broker_epoch, epoch))
        log.info(
            "node %d: the active controller of epoch %d, from offset %d",
            self.node_id,
            epoch,
            self.store.committed_offset(),
        )

    def _restart_activation(self, reason: BaseException) -> None:
        """The store's view and the log disagree (a bug, or a race with Raft): drop the
        speculation and claim the epoch again."""
        epoch = self._leader_epoch
        log.error("node %d: the metadata store lost track of the log: %s", self.node_id, reason)
        self.store.deactivate()
        if epoch is not None:
            self._jobs.put_nowait(_Activate(epoch))

    # --- the worker: one job at a time, sealed in groups --------------------------------

    async def _work(self) -> None:
        while True:
            job = await self._jobs.get()
            try:
                if isinstance(job, _Activate):
                    await self._activate(job.epoch)
                    continue
                activation = await self._run_group(job)
                if activation is not None:
                    await self._activate(activation.epoch)
            except Exception:
                log.exception("node %d: controller job %r failed", self.node_id, job)

    async def _run_group(
        self, first: _Request | _Tick | _BrokerDisconnected | _Propose
    ) -> _Activate | None:
        """Run ``first`` and the requests that arrive with it in order, each on the image
        the ones before it made, staging their records; then seal them as one Raft batch
        and answer each once it commits (group commit). Returns an activation that
        arrived meanwhile, to run after the group."""
        store = self.store
        incarnation = store.incarnation
        # Resolved when this leadership ends (_lose_leadership): the group stops waiting,
        # and once sealed its requests fail if their batch has not committed by then
        # (Raft fails a deposed leader's batch only when another leader's entry commits
        # over it, which a leader cut off from the quorum never hears of).
        over = self._leadership_over
        answered: list[tuple[_Request | _Propose, Any]] = []
        activation: _Activate | None = None
        loop = asyncio.get_running_loop()
        linger_until: float | None = None
        linger: asyncio.Future[None] | None = None
        linger_timer: asyncio.TimerHandle | None = None
        store.begin_batch()
        try:
            self._run(first, answered)
            in_flight = store.in_flight(self.settings.append_pipeline_depth)
            if in_flight is not None and self.settings.append_linger_ms > 0:
                linger_until = loop.time() + self.settings.append_linger_ms / 1000
            while (
                len(answered) < _MAX_REQUESTS_PER_GROUP
                and store.staged_records < MAX_RECORDS_PER_BATCH
                and over is not None
                and not over.done()
            ):
                if self._jobs.empty():
                    # Nothing on its way to a majority when the group started: sealed at
                    # once, no idle loop turns first (they were on a lone write's path).
                    # Requests that arrive next gather while this batch is in flight.
                    #
                    # The batch before still on its way to a majority: this group could
                    # not commit before it anyway, so it takes in the requests arriving
                    # meanwhile, and is sealed when that batch commits (one Raft append,
                    # fsync and fetch round trip for all of them) and its linger
                    # (``append_linger_ms`` since the group started) has passed.
                    #
                    # The linger holds the group only while it is smaller than the
                    # group sealed before it: under steady concurrency a batch is as
                    # large as the one before unless the linger runs out (fewer Raft
                    # rounds, fsyncs and stream messages per write, and fewer of the
                    # leader's loop turns between two calls gRPC takes in), while a few
                    # writers, all of whom are in the group already, are not kept
                    # waiting for nobody.
                    wait_for: asyncio.Future[Any] | None = None
                    if in_flight is not None and not in_flight.done():
                        wait_for = in_flight
                    elif (
                        linger_until is not None
                        and len(answered) < self._last_group_size
                        and loop.time() < linger_until
                    ):
                        if linger is None:
                            linger = loop.create_future()
                            linger_timer = loop.call_at(linger_until, _resolve, linger)
                        wait_for = linger
                    if wait_for is None:
                        break
                    job = await self._jobs.get_before(wait_for, over)
                    if job is None:
                        continue
                else:
                    job = self._jobs.get_nowait()
                if isinstance(job, _Activate):
                    activation = job
                    break
                self._run(job, answered)
        except BaseException:
            # The worker cancelled (the server stops) or failed while the group gathered:
            # its requests are answered all the same, never left waiting.
            self._renounce(answered)
            raise
        finally:
            if linger_timer is not None:
                linger_timer.cancel()
            sealed = self._seal()
            if answered:  # a tick's group (no request) says nothing of the writers
                self._last_group_size = len(answered)
        if not sealed or store.incarnation != incarnation:
            # Decided on an image that is gone: never acknowledged.
            for request, _ in answered:
                if not request.reply.done():
                    request.reply.set_result(_NotController(self.raft.leader_id))
            return activation
        waiter = store.commit_waiter()
        if waiter is None or waiter.done():
            self._answer(answered, waiter)
        elif answered:
            assert over is not None  # the store is active only while a leadership lasts
            self._answer_at_commit(answered, waiter, over)
        return activation

    def _answer_at_commit(
        self,
        answered: list[tuple[_Request | _Propose, Any]],
        committed: asyncio.Future[int],
        over: asyncio.Future[None],
    ) -> None:
        """Answer a sealed group when its batch commits (:meth:`_answer`), or NOT_CONTROLLER
        if this leadership ends first: a leader that resigns renounces what it has not
        committed, as Kafka's controller fails its deferred events (the batch may still
        commit under the next leader: NOT_CONTROLLER says the outcome is not known). One
        callback for the whole group: each caller wakes once, with its answer."""

        def done(_: asyncio.Future[Any]) -> None:
            committed.remove_done_callback(done)
            over.remove_done_callback(done)
            if committed.done():
                self._answer(answered, committed)
            else:
                self._renounce(answered)

        committed.add_done_callback(done)
        over.add_done_callback(done)

    def _renounce(self, answered: list[tuple[_Request | _Propose, Any]]) -> None:
        """Answer NOT_CONTROLLER to a group's requests not answered yet: their batch's
        outcome is not known (it may still commit under the next leader)."""
        leader = _NotController(self.raft.leader_id)
        for request, _response in answered:
            if not request.reply.done():
                request.reply.set_result(leader)

    def _answer(
        self,
        answered: list[tuple[_Request | _Propose, Any]],
        committed: asyncio.Future[int] | None,
    ) -> None:
        """Answer a group's requests once ``committed`` (their batch's commit, ``None``:
        nothing to wait for) is done: their responses, or NOT_CONTROLLER if the batch
        will never commit (another leader's entry replaced it)."""
        outcome: Any = None
        if committed is not None:
            if committed.cancelled():
                for request, _ in answered:
                    request.reply.cancel()
                return
            error = committed.exception()
            if isinstance(error, NotLeaderError):
                outcome = _NotController(error.leader_id)
            elif error is not None:
                for request, _ in answered:
                    if not request.reply.done():
                        request.reply.set_exception(error)
                return
        for request, response in answered:
            if not request.reply.done():
                request.reply.set_result(response if outcome is None else outcome)

    def _run(
        self,
        job: _Request | _Tick | _BrokerDisconnected | _Propose,
        answered: list[tuple[_Request | _Propose, Any]],
    ) -> None:
        if isinstance(job, _Tick):
            self._tick_queued = False
            self._tick()
            return
        if isinstance(job, _BrokerDisconnected):
            self._fence_disconnected(job)
            return
        if job.reply.done():
            return  # the caller gave up
        if not self.store.is_active:
            job.reply.set_result(_NotController(self.raft.leader_id))
            return
        if isinstance(job, _Propose):
            self._run_propose(job, answered)
            return
        if self.migration is not None and self.migration.holds_requests():
            # Migrating, and etcd's state is not copied yet: nothing to answer with.
            job.reply.set_result(_NotController(self.node_id))
            return
        try:
            if job.rpc.name == "RegisterBroker":
                result = self.controller.register_broker(
                    job.request, self._clock(), principal=job.principal
                )
            else:
                result = CONTROLLER_CALLS[job.rpc.name](self.controller, job.request, self._clock())
            if result.records:
                self.store.append(result.records)
            answered.append((job, result.response))
        except NotControllerError as e:
            job.reply.set_result(_NotController(e.controller_id))
        except UnexpectedAppendOffsetError as e:
            self._restart_activation(e)
            job.reply.set_result(_NotController(self.node_id))
        except Exception as e:
            job.reply.set_exception(e)

    def _run_propose(self, job: _Propose, answered: list[tuple[_Request | _Propose, Any]]) -> None:
        try:
            self.store.append(job.records)
        except NotControllerError as e:
            job.reply.set_result(_NotController(e.controller_id))
            return
        except UnexpectedAppendOffsetError as e:
            self._restart_activation(e)
            job.reply.set_result(_NotController(self.node_id))
            return
        answered.append((job, None))

    def _seal(self) -> bool:
        """Seal the staged records into one Raft batch; False if Raft refused it."""
        try:
            self.store.seal()
        except NotControllerError:
            return False
        except UnexpectedAppendOffsetError as e:
            self._restart_activation(e)
            return False
        return True

    def _fence_disconnected(self, job: _BrokerDisconnected) -> None:
        if not self.store.is_active or self._leader_epoch != job.leader_epoch:
            return
        result = self.controller.broker_disconnected(job.broker_id, job.broker_epoch)
        if not result.records:
            return
        try:
            self.store.append(result.records)
        except NotControllerError:
            return
        except UnexpectedAppendOffsetError as e:
            self._restart_activation(e)
            return
        log.info(
            "node %d: broker %d (epoch %d) disconnected: fenced, %d records",
            self.node_id,
            job.broker_id,
            job.broker_epoch,
            len(result.records),
        )

    def _tick(self) -> None:
        if not self.store.is_active:
            return
        result = self.controller.tick(self._clock())
        self._ask_replica_logs()
        if not result.records:
            return
        try:
            self.store.append(result.records)
        except NotControllerError:
            return
        except UnexpectedAppendOffsetError as e:
            self._restart_activation(e)
            return
        outcome = result.response
        log.info(
            "node %d: tick wrote %d records (fenced brokers %s, expired coordinators %s, "
            "%d preferred and %d unclean elections, %d leader moves%s)",
            self.node_id,
            len(result.records),
            list(outcome.fenced_brokers),
            list(outcome.expired_coordinators),
            outcome.preferred_elections,
            outcome.unclean_elections,
            outcome.leader_moves,
            ", created __consumer_offsets" if outcome.created_offsets_topic else "",
        )

    def _ask_replica_logs(self) -> None:
        """Send unclean recovery's questions (``QuorumController.replica_log_info_requests``)
        to the brokers, at the first listener of each one's registration; the answers go
        back to the controller while this leadership lasts, and :meth:`_tick` elects."""
        epoch = self._leader_epoch
        if epoch is None:
            return
        image = self.store.latest_image()
        for request in self.controller.replica_log_info_requests(self._clock()):
            broker = image.broker(request.broker_id)
            if broker is None or not broker.listeners:
                continue
            address = f"{broker.listeners[0].host}:{broker.listeners[0].port}"
            task = asyncio.create_task(self._ask_replica_log(address, request, epoch))
            self._recovery_asks.add(task)
            task.add_done_callback(self._recovery_asks.discard)

    async def _ask_replica_log(
        self, address: str, request: ReplicaLogInfoRequest, epoch: int
    ) -> None:
        channel = open_channel(address)
        try:
            stub = replication_pb2_grpc.ReplicaFetchServiceStub(channel)
            answer = await stub.GetReplicaLogInfo(
                replication_pb2.GetReplicaLogInfoRequest(
                    broker_id=request.broker_id,
                    broker_epoch=request.broker_epoch,
                    partitions=[
                        replication_pb2.ReplicaLogInfoPartition(topic_id=t, partition=p)
                        for t, p in request.partitions
                    ],
                ),
                timeout=RECOVERY_ASK_TIMEOUT_S,
            )
        except grpc.RpcError as e:
            log.info(
                "node %d: broker %d did not answer unclean recovery: %s",
                self.node_id,
                request.broker_id,
                e.code() if isinstance(e, grpc.aio.AioRpcError) else e,
            )
            return
        finally:
            await channel.close()
        if self._leader_epoch != epoch:
            return
        self.controller.replica_log_info(
            ReplicaLogInfoResponse(
                answer.broker_id,
                answer.broker_epoch,
                tuple(
                    ReplicaLogInfo(
                        p.topic_id, p.partition, p.last_leader_epoch, p.log_end_offset, p.error
                    )
                    for p in answer.partitions
                ),
            )
        )

    async def _tick_timer(self, epoch: int) -> None:
        interval_s = self.settings.tick_interval_ms / 1000
        loop = asyncio.get_running_loop()
        while self._leader_epoch == epoch:
            slept = loop.time()
            await asyncio.sleep(interval_s)
            late_s = loop.time() - slept - interval_s
            if late_s >= _LATE_TICK_WARNING_S:
                # The loop could not run (blocked, or the process starved of CPU): the
                # sessions do not count this (controller/heartbeats.py); say so.
                log.warning(
                    "node %d: the controller's loop could not run for %.1f s", self.node_id, late_s
                )
            if not self._tick_queued:
                self._tick_queued = True
                self._jobs.put_nowait(_Tick())

    # --- gRPC --------------------------------------------------------------------------

    def _not_controller(self, rpc: ControllerRpc[Any, Any], controller_id: int | None) -> Message:
        if controller_id is None or controller_id < 0:
            controller_id = self.raft.leader_id
        address = self.raft.voters.get(controller_id) if controller_id is not None else None
        return rpc.not_controller(controller_id, address)

    def _add_servicer(self, server: grpc.aio.Server) -> None:
        controller_pb2_grpc.add_ControllerServicer_to_server(ControllerServicer(self), server)

    async def serve(
        self, rpc: ControllerRpc[Any, Any], message: Message, context: grpc.aio.ServicerContext
    ) -> Message:
        """One gRPC call: decode, run, answer (INVALID_ARGUMENT for a malformed request).
        With the authorizer on, the items the caller may not act on are answered refused
        (``controller_api/authorization.py``) and a broker may speak only for its own node
        id (``security/node_identities.py``)."""
        to_run, refused = split_admin_request(rpc.name, message, context, self._topic_name_of)
        if to_run is None:
            return merge_refusals(rpc.name, rpc.proto_response(), refused)
        message = to_run
        node_id = _NODE_OF.get(rpc.name)
        if node_id is not None and not may_speak_for_node(context, node_id(message)):
            return rpc.proto_response(
                error=ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                error_message=f"{principal_of(context).principal} may not act as node "
                f"{node_id(message)}",
            )
        try:
            request = rpc.request_from_proto(message)
        except InvalidRequestError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
            raise AssertionError("unreachable: abort raises") from e
        owner = principal_of(context).principal if authorizer_enabled() else ""
        try:
            answer = await self.call(rpc, request, principal=owner)
        except Exception as e:
            log.exception("node %d: %s failed", self.node_id, rpc.name)
            await context.abort(grpc.StatusCode.INTERNAL, f"{type(e).__name__}: {e}")
            raise AssertionError("unreachable: abort raises") from e
        if rpc.name == "UnregisterBroker" and getattr(answer, "error", 1) == ErrorCode.NONE:
            node_identities().release(message.broker_id, "")  # type: ignore[attr-defined]
        return merge_refusals(rpc.name, answer, refused)

    async def broker_liveness(
        self,
        requests: AsyncIterator[controller_pb2.BrokerLivenessRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[controller_pb2.BrokerLivenessResponse]:
        """A broker's liveness stream (controller.proto's ``BrokerLiveness``): answered
        once, then held open while this replica is the active controller. Each message
        the broker writes on it meanwhile (one per heartbeat interval) is contact for its
        session, noted on arrival. If it ends without the broker saying it is leaving,
        and the broker opened no other stream here since, the broker's process is
        gone (the kernel closed its connection: a paused broker keeps it open), and that
        broker epoch is fenced at once rather than after the session timeout.

        Unless the broker had gone silent on it first, missing two heartbeat intervals'
        pings: then the link was cut before the stream ended (a partition dropping its
        packets; the broker's keepalive closed its side, and it opens another stream when
        it can), and the end arrives when the link is back, racing the broker's new
        stream. That end says nothing of the process: the session timeout, running since
        the silence began, judges it, as it judges a paused broker."""
        first = await anext(requests, None)
        if first is None:
            return
        if not may_speak_for_node(context, first.broker_id):
            yield controller_pb2.BrokerLivenessResponse(
                error=ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                error_message=f"{principal_of(context).principal} may not act as node "
                f"{first.broker_id}",
            )
            return
        over, leader_epoch = self._leadership_over, self._leader_epoch
        if not self.store.is_active or over is None or over.done() or leader_epoch is None:
            controller_id = self.raft.leader_id
            address = self.raft.voters.get(controller_id) if controller_id is not None else None
            yield controller_pb2.BrokerLivenessResponse(
                error=ErrorCode.NOT_CONTROLLER,
                controller_id=-1 if controller_id is None else controller_id,
                controller_address=address or "",
            )
            return
        registration = self.store.latest_image().broker(first.broker_id)
        if registration is None or registration.broker_epoch != first.broker_epoch:
            yield controller_pb2.BrokerLivenessResponse(
                error=ErrorCode.STALE_BROKER_EPOCH,
                error_message=f"broker {first.broker_id} of epoch {first.broker_epoch} "
                "is not registered",
            )
            return
        yield controller_pb2.BrokerLivenessResponse()
        self._heard_from(first.broker_id, first.broker_epoch)
        leaving = first.leaving
        token = self._latest_streams[first.broker_id] = object()
        last_heard_ms = self._clock()
        try:
            while True:
                reader: asyncio.Future[Any] = asyncio.ensure_future(anext(requests, None))
                waiting: set[asyncio.Future[Any]] = {reader, over}
                try:
                    await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    if not reader.done():
                        reader.cancel()
                if not reader.done():
                    return  # no longer the active controller: the broker finds the next one
                message = None if reader.cancelled() or reader.exception() else reader.result()
                if message is None:
                    break
                leaving = leaving or message.leaving
                if not leaving:
                    # A ping: contact on arrival, as a heartbeat's, queued behind nothing.
                    self._note_liveness(first.broker_id, first.broker_epoch)
                    last_heard_ms = self._clock()
        finally:
            # The call ended: the broker half-closed it, or gRPC cancelled it because the
            # connection closed. Either way, unless the broker said it leaves, opened
            # another stream since (it lost this one's connection), went silent on it
            # before it ended, or this replica is no longer the active controller of that
            # epoch, it is gone.
            latest = self._latest_streams.get(first.broker_id) is token
            if latest:
                del self._latest_streams[first.broker_id]
            ended = (
                not leaving and latest and not self._stopping and self._leader_epoch == leader_epoch
            )
            silent_ms = self._clock() - last_heard_ms
            silent = silent_ms > 2 * self.settings.controller.broker_heartbeat_interval_ms
            if ended and silent:
                log.info(
                    "node %d: broker %d (epoch %d): its liveness stream ended %.1f s after "
                    "its last message on it: left to its session",
                    self.node_id,
                    first.broker_id,
                    first.broker_epoch,
                    silent_ms / 1000,
                )
            elif ended:
                self._broken_streams[first.broker_id] = first.broker_epoch
                self._jobs.put_nowait(
                    _BrokerDisconnected(first.broker_id, first.broker_epoch, leader_epoch)
                )

    def _topic_name_of(self, topic_id: str) -> str | None:
        topic = self.machine.image.topics.by_id.get(topic_id)
        return topic.name if topic is not None else None


_NODE_OF: dict[str, Callable[[Any], int]] = {
    "RegisterBroker": lambda message: message.broker_id,
    "BrokerHeartbeat": lambda message: message.broker_id,
    "AlterPartition": lambda message: message.broker_id,
    "AllocateProducerIds": lambda message: message.broker_id,
}
"""The calls a broker makes as its node, and where they name it."""


class ControllerServicer(controller_pb2_grpc.ControllerServicer):
    """``highwater.internal.v1.Controller``: every method goes through
    :meth:`ControllerServer.serve`."""

    def __init__(self, server: ControllerServer) -> None:
        self._server = server

    async def RegisterBroker(self, request: Any, context: Any) -> Any:
        return await self._server.serve(codec.REGISTER_BROKER, request, context)

    async def BrokerHeartbeat(self, request: Any, context: Any) -> Any:
        return await self._server.serve(codec.BROKER_HEARTBEAT, request, context)

    async def UnregisterBroker(self, request: Any, context: Any) -> Any:
        return await self._server.serve(codec.UNREGISTER_BROKER, request, context)

    async def AlterPartition(self, request: Any, context: Any) -> Any:
        return await self._server.serve(codec.ALTER_PARTITION, request, context)

    async def CreateTopics(self, request: Any, context: Any) -> Any:
        return await self._server.serve(codec.CREATE_TOPICS, request, context)

    async def DeleteTopics(self, request: Any, context: Any) -> Any:
        return await self._server.serve(codec.DELETE_TOPICS, request, context)

    async def CreatePartitions(self, request: Any, context: Any) -> Any:
        return await self._server.serve(codec.CREATE_PARTITIONS, request, context)

    async def ElectLeaders(self, request: Any, context: Any) -> Any:
        return await self._server.serve(codec.ELECT_LEADERS, request, context)

    async def AlterPartitionReassignments(self, request: Any, context: Any) -> Any:
        return await self._server.serve(codec.ALTER_PARTITION_REASSIGNMENTS, request, context)

    async def ListPartitionReassignments(self, request: Any, context: Any) -> Any:
        return await self._server.serve(codec.LIST_PARTITION_REASSIGNMENTS, request, context)

    async def AlterConfigs(self, request: Any, context: Any) -> Any:
        return await self._server.serve(codec.ALTER_CONFIGS, request, context)

    async def DescribeConfigs(self, request: Any, context: Any) -> Any:
        return await self._server.serve(codec.DESCRIBE_CONFIGS, request, context)

    async def CreateAcls(self, request: Any, context: Any) -> Any:
        return await self._server.serve(codec.CREATE_ACLS, request, context)

    async def DescribeAcls(self, request: Any, context: Any) -> Any:
        return await self._server.serve(codec.DESCRIBE_ACLS, request, context)

    async def DeleteAcls(self, request: Any, context: Any) -> Any:
        return await self._server.serve(codec.DELETE_ACLS, request, context)

    async def AlterUserScramCredentials(self, request: Any, context: Any) -> Any:
        return await self._server.serve(codec.ALTER_USER_SCRAM_CREDENTIALS, request, context)

    async def DescribeUserScramCredentials(self, request: Any, context: Any) -> Any:
        return await self._server.serve(codec.DESCRIBE_USER_SCRAM_CREDENTIALS, request, context)

    async def AlterClientQuotas(self, request: Any, context: Any) -> Any:
        return await self._server.serve(codec.ALTER_CLIENT_QUOTAS, request, context)

    async def DescribeClientQuotas(self, request: Any, context: Any) -> Any:
        return await self._server.serve(codec.DESCRIBE_CLIENT_QUOTAS, request, context)

    async def AllocateProducerIds(self, request: Any, context: Any) -> Any:
        return await self._server.serve(codec.ALLOCATE_PRODUCER_IDS, request, context)

    async def BrokerLiveness(self, request_iterator: Any, context: Any) -> Any:
        async for response in self._server.broker_liveness(request_iterator, context):
            yield response

    async def RegisterCoordinator(self, request: Any, context: Any) -> Any:
        return await self._server.serve(codec.REGISTER_COORDINATOR, request, context)

    async def CoordinatorHeartbeat(self, request: Any, context: Any) -> Any:
        return await self._server.serve(codec.COORDINATOR_HEARTBEAT, request, context)

    async def UnregisterCoordinator(self, request: Any, context: Any) -> Any:
        return await self._server.serve(codec.UNREGISTER_COORDINATOR, request, context)
