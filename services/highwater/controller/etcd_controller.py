"""The etcd metadata mode's controller: a candidate in every broker, one active at a time.

ZooKeeper-era Kafka's ``KafkaController`` with etcd for ZooKeeper (docs/etcd-mode.md).
Every broker process runs an :class:`EtcdController` beside its broker, on the same gRPC
port, serving ``highwater.internal.v1.Controller``:

* **Election.** The candidate holding the ``controller`` key is the controller. A
  candidate claims it with one transaction: if the key is absent and ``controller_epoch``
  is unchanged since it read it, put the key (attached to its process's session lease:
  the key goes when the session does, as the ephemeral ``/controller`` znode) and the
  epoch plus one. The epoch fences: every write the controller makes compares
  ``controller_epoch`` with its own, so a deposed controller's writes fail, and brokers
  refuse pushes of an older epoch; and the ``controller`` key's ``mod_revision`` with its
  claim's, so a controller whose lease is gone writes nothing even before another is
  elected. A session that expires (no lease refresh for its TTL)
  makes the controller step down at once, before etcd can have elected another.
* **Decisions** are the quorum controller's own (:class:`QuorumController`, pure): a
  request or a tick on the current image gives records. **Writes**: the image those
  records make differs from the last in the state keys those records touch
  (:func:`~highwater.etcd_metadata.keys.changed_keys`: only their scopes are encoded, so
  a change costs what it touches, not the image), and those keys are written in one
  transaction (:func:`plan_writes`; or, past etcd's ``--max-txn-ops``, the
  partition-state updates first in several, pipelined: :meth:`_write_pipelined`),
  guarded by the controller epoch and by each written key's ``mod_revision``
  (ZooKeeper's zkVersion: a key changed behind the controller's back, by hand or by
  another writer, fails the write and makes it read the state again), with the
  ``metadata_offset`` counter advanced by the number of records: the image's offset,
  from which broker epochs are taken as in KRaft.
  ISR changes arrive as AlterPartition (Kafka 2.7+'s AlterIsr, KIP-497) and are such a
  compare-and-swap write of the partition's state key.
* **Watching.** An etcd watch on the whole prefix (:meth:`_watch`) wakes the candidate
  on every change: broker registrations, ISR changes written by leaders, topic and
  config changes, the ``controller`` key. Its events carry the changed keys and values,
  applied to the candidate's :class:`~highwater.etcd_metadata.prefix_view.PrefixView` of
  the prefix, so a woken round reads nothing from etcd: it looks at the view. While the
  watch holds, a round reads etcd only for a safety read every
  ``safety_read_interval_ms``: etcd's revision, and when it moved and the watch delivered
  nothing since the last such read, the whole prefix, which reloads the view (a revision
  that moved while events arrive is events in flight: an active controller writing a
  shutdown's batches would otherwise read every key every few seconds). A watch that
  breaks (etcd compacted past it, restarted, stopped answering) makes every round read,
  as polling, until the watch is made again from the revision the next round read and a
  whole read loads the view again. The view (or the whole prefix read) gives: the live
  ``brokers/ids`` keys (a registered broker without one has its session expired at once,
  so the next tick fences it and moves its leaderships, as the controller's
  ``/brokers/ids`` watch did) and the state keys (any not as this controller wrote them
  are loaded again). A candidate without a current view reads the ``controller`` key
  first and campaigns at once when it is free; the candidate that wins reads the whole
  prefix once, after its claim, and takes it as its state. A state that fails validation
  (:class:`~highwater.etcd_metadata.keys.InconsistentMetadataError`) is not served: no
  push, and every request is answered with the error naming the key until it is fixed.
* **Pushes.** After every change, and to any node that missed one, the controller pushes
  to every registered broker and coordinator (``BrokerMetadata.UpdateMetadata``, its
  epoch attached: LeaderAndIsr and UpdateMetadata in one) only the records made since the
  image the node last acknowledged, or the whole image when it has no such base: the
  first push of a controller epoch, a node that (re)registered, a node that answered it
  could not apply a delta, a base older than the kept history, or an image loaded from
  etcd rather than made by records (:class:`~highwater.etcd_metadata.push_delta.DeltaPushes`).

Requests run one at a time. A candidate that is not active answers NOT_CONTROLLER with
the active controller's id and address (from the ``controller`` key), so the brokers'
:class:`~highwater.controller_api.client.ControllerClient` follows it; when etcd cannot
be reached and no controller is known, it answers REQUEST_TIMED_OUT naming the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import random
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc
import grpc.aio
from google.protobuf.message import Message

from highwater.controller.config import ControllerConfig
from highwater.controller.metrics import ControllerMetrics, PushMetrics
from highwater.controller.quorum_controller import CONTROLLER_CALLS, QuorumController
from highwater.controller.service import ControllerServicer
from highwater.controller_api.codec import ControllerRpc, InvalidRequestError
from highwater.controller_api.messages import BrokerHeartbeatRequest
from highwater.errors import HighwaterError
from highwater.etcd_metadata.connection import (
    Compare,
    Delete,
    EtcdConnection,
    EtcdRequestTooLargeError,
    EtcdUnavailableError,
    EtcdWatchBrokenError,
    KeyVersion,
    Put,
    TxnResult,
)
from highwater.etcd_metadata.keys import (
    InconsistentMetadataError,
    KeyChanges,
    KeySpace,
    changed_keys,
    image_from_keys,
    partition_state_value,
)
from highwater.etcd_metadata.prefix_view import KeyChange, PrefixView
from highwater.etcd_metadata.push_delta import DeltaPush, DeltaPushes
from highwater.etcd_metadata.pushed import MetadataPushChannels, push_addresses
from highwater.etcd_metadata.session import EtcdSession
from highwater.internal.v1 import broker_metadata_pb2, controller_pb2
from highwater.metadata.delta import MetadataDelta
from highwater.metadata.image import MetadataImage
from highwater.metadata.records import (
    MetadataRecord,
    RegisterBrokerRecord,
    RegisterCoordinatorRecord,
    encode_record,
)
from highwater.metadata.snapshot import snapshot_values
from highwater.v1.common_pb2 import ErrorCode

__all__ = [
    "EtcdController",
    "EtcdControllerSettings",
    "MetadataWriteTooLargeError",
    "WritePlan",
    "plan_writes",
]

log = logging.getLogger(__name__)


def monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class EtcdControllerSettings:
    controller: ControllerConfig = field(default_factory=ControllerConfig)
    tick_interval_ms: int = 200
    """How often the active controller ticks (and the candidate reads etcd while its watch
    is down)."""
    safety_read_interval_ms: int = 5000
    """While the watch holds: how often a round reads etcd with no change seen (the slow
    safety net under the watch)."""
    push_timeout_s: float = 5.0
    seed: int | None = None
    max_txn_ops: int = 128
    """etcd's ``--max-txn-ops`` (its default: 128): the most compares, and the most
    operations, one transaction may hold. See :meth:`EtcdController._append`."""
    write_pipeline: int = 8
    """How many of a large change's partition-state transactions are in flight at once
    (:meth:`EtcdController._write_pipelined`)."""
    push_history_records: int = 100_000
    """How many records of recent changes are kept for delta pushes: a node further behind
    is pushed the whole image."""


class MetadataWriteTooLargeError(HighwaterError):
    """A change whose keys must be written together exceeds one etcd transaction."""

    code = ErrorCode.INVALID_REQUEST


class _StateChanged(Exception):
    """A write's compare failed: etcd's state is not what this controller last saw."""


@dataclass(frozen=True, slots=True)
class ControllerClaim:
    """The ``controller`` key's value."""

    broker_id: int
    address: str
    epoch: int

    def encode(self) -> bytes:
        return json.dumps(dataclasses.asdict(self), sort_keys=True).encode()

    @classmethod
    def decode(cls, value: bytes) -> ControllerClaim | None:
        try:
            fields = json.loads(value)
            return cls(int(fields["broker_id"]), str(fields["address"]), int(fields["epoch"]))
        except (ValueError, KeyError, TypeError):
            return None


@dataclass(frozen=True, slots=True)
class WritePlan:
    """The transactions of one change (see :meth:`EtcdController._write`): ``chunks`` of
    partition-state updates, each valid alone, then ``final``, what is valid only together
    (written with the ``metadata_offset`` counter)."""

    chunks: list[list[Put | Delete]]
    final: list[Put | Delete]


FENCE_COMPARES = 2
"""The compares every write of the controller holds besides its keys' own: the
``controller_epoch`` it was elected in, and the ``controller`` key it claimed (its
``mod_revision``: gone with the lease, or overwritten by a newer claim)."""


def plan_writes(changes: KeyChanges, epoch: int, max_txn_ops: int) -> WritePlan:
    """How ``changes`` are written by the controller of ``epoch`` (pure): partition states
    stamped with the epoch; in one transaction when it fits etcd's ``--max-txn-ops`` with
    the two fencing compares (the epoch, the claimed ``controller`` key) and the offset
    counter, else the existing partitions' states in transactions of ``max_txn_ops - 2``
    first. :class:`MetadataWriteTooLargeError` when
    what must be written together does not fit one transaction."""
    updates: list[Put | Delete] = []  # existing partition states: each valid alone
    structure: list[Put | Delete] = []  # everything else: valid only together
    for key, value in changes.updated.items():
        if "/partitions/" in key:
            updates.append(Put(key, partition_state_value(value, epoch)))
        else:
            structure.append(Put(key, value))
    for key, value in changes.created.items():
        if "/partitions/" in key:
            value = partition_state_value(value, epoch)
        structure.append(Put(key, value))
    structure.extend(Delete(key) for key in sorted(changes.deleted))
    # Compares: the epoch, the claimed key, one per key written, the offset counter.
    if len(updates) + len(structure) + FENCE_COMPARES + 1 <= max_txn_ops:
        return WritePlan([], updates + structure)
    if len(structure) + FENCE_COMPARES + 1 > max_txn_ops:
        raise MetadataWriteTooLargeError(
            f"this change writes {len(structure)} keys that etcd must take in one "
            f"transaction, and etcd takes at most {max_txn_ops} operations in one "
            "(--max-txn-ops): start etcd with a larger --max-txn-ops (and "
            "--max-request-bytes), and the brokers with --etcd-max-txn-ops to match"
        )
    size = max_txn_ops - FENCE_COMPARES
    return WritePlan([updates[i : i + size] for i in range(0, len(updates), size)], structure)


class EtcdController:
    """A controller candidate over etcd (see the module docstring): ``await start()``,
    ``await stop()``; serve :meth:`add_servicer` on the process's gRPC server."""

    def __init__(
        self,
        *,
        node_id: int,
        address: str,
        connection: EtcdConnection,
        space: KeySpace,
        session: EtcdSession,
        cluster_id: str,
        settings: EtcdControllerSettings | None = None,
        clock: Callable[[], int] = monotonic_ms,
    ) -> None:
        self.node_id = node_id
        self.address = address
        self.connection = connection
        self.space = space
        self.session = session
        self.settings = settings = settings or EtcdControllerSettings()
        self._clock = clock
        config = dataclasses.replace(settings.controller, cluster_id=cluster_id)
        seed = settings.seed if settings.seed is not None else random.SystemRandom().getrandbits(64)
        self._image = MetadataImage.empty()
        self.controller = QuorumController(lambda: self._image, config, seed=seed)
        self.epoch: int | None = None
        """The controller epoch this candidate is active in; None while not active."""
        self.active_claim: ControllerClaim | None = None
        """Who holds the ``controller`` key, as last read."""
        self._claim_revision = 0
        """The ``mod_revision`` of this controller's ``controller`` key (while active)."""
        self.inconsistency: InconsistentMetadataError | None = None
        self.unreachable: EtcdUnavailableError | None = None
        """The last failure to reach etcd, until it answers again."""
        self._revisions: dict[str, int] = {}
        self._offset_revision = 0
        self._known_revision = -1
        self._live_brokers: set[int] = set()
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._pushes = DeltaPushes(max_records=settings.push_history_records)
        self._full_push: tuple[MetadataImage, list[bytes]] | None = None
        self.pushes_full = 0
        self.pushes_delta = 0
        """Pushes sent (and answered) of the whole image, and of deltas."""
        self._push_channels = MetadataPushChannels(node_id)
        self._push_tasks: dict[str, asyncio.Task[None]] = {}
        self.failing_pushes: dict[str, str] = {}
        """The nodes (by push address) whose latest push failed, and how: a failure streak
        is logged once, when it starts, and once when it ends."""
        self.push_metrics = PushMetrics(self)
        self.metrics = ControllerMetrics(self)
        self._wake = asyncio.Event()
        self._watch_task: asyncio.Task[None] | None = None
        self.watching = False
        """Whether the etcd watch holds (rounds with no change then skip the read)."""
        self._watch_saw_change = True
        self._last_read_ms: int | None = None
        self._read_revision: int | None = None
        self._read_done = asyncio.Event()
        self.reads = 0
        """How many times a round read etcd's revision (a measure of the polling left)."""
        self._watch_responses = 0
        self._responses_seen = 0
        self._safety_revision = -1
        """Watch responses received, and their count and etcd's revision at the last read
        of the revision: a watch that delivered since is alive, and a revision that moved
        is its events in flight, not a reason to read the whole prefix."""
        self.view = PrefixView()
        self.prefix_reads = 0
        """How many times the whole prefix was read."""
        session.add_listener(self._on_session)

    # --- lifecycle ---------------------------------------------------------------------

    @property
    def is_active(self) -> bool:
        return self.epoch is not None

    @property
    def image(self) -> MetadataImage:
        return self._image

    def committed_image(self) -> MetadataImage:
        """The image of what etcd holds (every change written there is committed)."""
        return self._image

    def records_since(self, offset: int) -> tuple[bytes, ...] | None:
        """The encoded records that took this controller's image from ``offset`` to the
        current one (what a delta push from there carries); None when its history of
        changes does not reach back there (``push_history_records``)."""
        return self._pushes.history.since(offset)

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"etcd-controller-{self.node_id}")
        self._watch_task = asyncio.create_task(
            self._watch(), name=f"etcd-controller-watch-{self.node_id}"
        )

    async def stop(self) -> None:
        """Stop campaigning; an active controller gives up its key (best effort)."""
        if self._watch_task is not None:
            self._watch_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch_task
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for task in self._push_tasks.values():
            task.cancel()
        if self.epoch is not None:
            with contextlib.suppress(EtcdUnavailableError):
                await self.connection.txn(
                    [Compare(self.space.controller_epoch, "value", str(self.epoch).encode())],
                    [Delete(self.space.controller)],
                )
        self._step_down("stopping")
        await self._push_channels.close()

    async def wait_active(self, timeout_s: float = 30) -> None:
        async with asyncio.timeout(timeout_s):
            while not self.is_active:
                await asyncio.sleep(0.02)

    def _on_session(self, lease_id: int | None) -> None:
        if lease_id is None:
            self._step_down("the etcd session expired")
        self._wake.set()

    def _step_down(self, why: str) -> None:
        if self.epoch is not None:
            log.warning(
                "node %d: no longer the controller (epoch %d): %s", self.node_id, self.epoch, why
            )
        self.epoch = None
        self._known_revision = -1

    # --- the candidate's loop -------------------------------------------------------------

    async def _run(self) -> None:
        interval_s = self.settings.tick_interval_ms / 1000
        while True:
            # Cleared before the round, not after: a change seen during it (the watch's
            # events of the round's own writes, among others) starts the next round at
            # once. So a controlled shutdown's batches follow one another as fast as etcd
            # takes them; clearing after the round made each batch wait a whole
            # ``tick_interval_ms`` (at 1,000,000 partitions, 1,000 batches: 200 s idle).
            self._wake.clear()
            try:
                await self._round()
                self.unreachable = None
            except EtcdUnavailableError as e:
                if self.unreachable is None:
                    log.warning("node %d: %s", self.node_id, e)
                self.unreachable = e
            except Exception:
                log.exception("node %d: the etcd controller's round failed", self.node_id)
            # asyncio.timeout, not wait_for: Python 3.11's wait_for returns the inner
            # result when a cancellation arrives as the event is set, swallowing it, and
            # stop() then waits for this loop forever.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval_s):
                    await self._wake.wait()

    async def _round(self) -> None:
        if self.session.lease_id is None:
            self._step_down("no etcd session")
            _, claim = await self.connection.get(self.space.controller)
            self.active_claim = ControllerClaim.decode(claim.value) if claim else None
            return
        now = self._clock()
        safety_due = (
            self._last_read_ms is None
            or now - self._last_read_ms >= self.settings.safety_read_interval_ms
        )
        if self.watching and not safety_due and (not self._watch_saw_change or self._view_usable()):
            if self._watch_saw_change:  # what changed is in the view: no read
                self._watch_saw_change = False
                await self._observe(self.view.revision, self.view.keys)
            if self.is_active:
                await self._serialized(self._tick)
                self._push_all()
            return
        self._watch_saw_change = False
        self._last_read_ms = now
        self.reads += 1
        revision, epoch_kv = await self.connection.get(self.space.controller_epoch)
        self._read_revision = revision
        self._read_done.set()
        if not self.is_active and not (self.watching and self.view.current):
            # Without a view: the key alone says whether to campaign, and an election
            # reads the whole prefix once, after its claim.
            _, claim_kv = await self.connection.get(self.space.controller)
            if claim_kv is None:
                await self._campaign(epoch_kv)
                if self.is_active:
                    await self._serialized(self._tick)
                    self._push_all()
                return
        moved = revision != self._safety_revision
        silent = self._watch_responses == self._responses_seen
        self._safety_revision, self._responses_seen = revision, self._watch_responses
        if (
            not (self.watching and self.view.current)
            or (self.is_active and self._known_revision == -1)
            or (moved and silent)
        ):
            revision, keys = await self._read_prefix()
            await self._observe(revision, keys, read=True)
        elif not self.is_active:  # a campaign that failed is tried again from the view
            await self._observe(self.view.revision, self.view.keys)
        if self.is_active:
            await self._serialized(self._tick)
            self._push_all()

    def _view_usable(self) -> bool:
        """Whether a woken round may take the view for a read: the view is current and no
        failed write asked for a read of etcd itself."""
        return self.view.current and not (self.is_active and self._known_revision == -1)

    async def _read_prefix(self) -> tuple[int, dict[str, KeyVersion]]:
        revision, keys = await self.connection.get_prefix(self.space.prefix)
        self.prefix_reads += 1
        self.view.load(revision, keys)
        return revision, keys

    async def _watch(self) -> None:
        """Wake the candidate on every change under the prefix (the module docstring's
        Watching): watch from the revision a round read, so nothing between is missed."""
        while True:
            self._read_done.clear()
            self._read_revision = None
            self._watch_saw_change = True
            self._wake.set()
            await self._read_done.wait()
            start = (self._read_revision or 0) + 1
            try:
                self.watching = True
                self.view.watching_from(start)
                async for response in self.connection.watch_prefix_changes(
                    self.space.prefix, start
                ):
                    self.view.apply(KeyChange(*change) for change in response.changes)
                    self._watch_responses += 1
                    self._watch_saw_change = True
                    self._wake.set()
            except EtcdWatchBrokenError as e:
                log.info("node %d: %s; reading in full and watching again", self.node_id, e)
            finally:
                self.watching = False
                self.view.watch_broken()
            await asyncio.sleep(self.settings.tick_interval_ms / 1000)

    async def _observe(
        self, revision: int, keys: dict[str, KeyVersion], *, read: bool = False
    ) -> None:
        """What the whole prefix says: who is controller, which brokers live, the state.
        ``read``: ``keys`` come from a whole read of etcd (else from the view)."""
        claim_kv = keys.get(self.space.controller)
        claim = ControllerClaim.decode(claim_kv.value) if claim_kv is not None else None
        self.active_claim = claim
        epoch_kv = keys.get(self.space.controller_epoch)
        # From the view: only the keys changed since the last look (all after a load).
        changed = None if read else self.view.take_changes()
        if changed is None:
            self._live_brokers = {
                b for key in keys if (b := self.space.broker_id_of(key)) is not None
            }
        else:
            for key in changed:
                if (broker_id := self.space.broker_id_of(key)) is not None:
                    if key in keys:
                        self._live_brokers.add(broker_id)
                    else:
                        self._live_brokers.discard(broker_id)
        if self.is_active:
            if claim is None or claim.epoch != self.epoch or claim.broker_id != self.node_id:
                self._step_down(f"the controller key now names {claim}")
            else:
                async with self._lock:
                    # A view from before this controller's last write is stale, not a
                    # change: the keys it changed are looked at again once it caught up
                    # (else an edit behind the controller's back whose event came before
                    # the controller's own write's events went unseen).
                    if revision < self._offset_revision:
                        if changed is not None:
                            self.view.keep_changes(changed)
                    elif self._state_changed(keys, changed):
                        self._load(keys)
                self._expire_dead_brokers()
                self._known_revision = revision
                return
        if claim is None:
            await self._campaign(epoch_kv)
        elif (
            claim.broker_id == self.node_id
            and claim_kv is not None
            and claim_kv.lease == self.session.lease_id
            and epoch_kv is not None
            and epoch_kv.value == str(claim.epoch).encode()
        ):
            # Our own claim, under our own lease, whose answer was lost (the call timed
            # out after etcd applied it): take it up as if the answer had come.
            await self._take_claim(claim, claim_kv.mod_revision)

    def _state_changed(self, keys: Mapping[str, KeyVersion], changed: set[str] | None) -> bool:
        """Whether a state key (of ``changed`` only, when given) is not as this controller
        last wrote or read it."""
        offset_kv = keys.get(self.space.metadata_offset)
        offset_revision = offset_kv.mod_revision if offset_kv is not None else 0
        if offset_revision != self._offset_revision:
            return True
        if changed is not None:
            for key in changed:
                if self.space.is_state(key):
                    held = keys.get(key)
                    if (held.mod_revision if held else None) != self._revisions.get(key):
                        return True
            return False
        state = {k: v.mod_revision for k, v in keys.items() if self.space.is_state(k)}
        return state != self._revisions

    async def _campaign(self, epoch_kv: KeyVersion | None) -> None:
        """Claim the ``controller`` key, then read the whole prefix and take it as the
        state: the new controller reads every key, as a ZooKeeper-era one did."""
        lease = self.session.lease_id
        if lease is None:
            return
        current = int(epoch_kv.value) if epoch_kv is not None else 0
        new_epoch = current + 1
        claim = ControllerClaim(self.node_id, self.address, new_epoch)
        result = await self.connection.txn(
            [
                Compare(self.space.controller, "create", 0),
                Compare(
                    self.space.controller_epoch,
                    "mod",
                    epoch_kv.mod_revision if epoch_kv is not None else 0,
                ),
            ],
            [
                Put(self.space.controller, claim.encode(), lease),
                Put(self.space.controller_epoch, str(new_epoch).encode()),
            ],
        )
        if not result.succeeded:
            return
        await self._take_claim(claim, result.revision)

    async def _take_claim(self, claim: ControllerClaim, claim_revision: int) -> None:
        """Become the controller of ``claim.epoch`` (its key put at ``claim_revision``):
        read the whole prefix once and take it as the state."""
        revision, keys = await self._read_prefix()
        async with self._lock:
            self._load(keys)
            self.epoch = claim.epoch
            self._claim_revision = claim_revision
            self.active_claim = claim
            self._live_brokers = {
                b for key in keys if (b := self.space.broker_id_of(key)) is not None
            }
            self.controller.activate(self._clock())
            self._pushes.clear(self._image.offset)
        self._expire_dead_brokers()
        self._known_revision = revision
        log.info(
            "node %d: the controller of epoch %d, from metadata offset %d",
            self.node_id,
            claim.epoch,
            self._image.offset,
        )

    def _load(self, keys: Mapping[str, KeyVersion]) -> None:
        """Take etcd's state as the image (or, if it is impossible, serve nothing)."""
        offset_kv = keys.get(self.space.metadata_offset)
        offset = int(offset_kv.value) if offset_kv is not None else -1
        state = {k: v.value for k, v in keys.items() if self.space.is_state(k)}
        self._revisions = {k: v.mod_revision for k, v in keys.items() if self.space.is_state(k)}
        self._offset_revision = offset_kv.mod_revision if offset_kv is not None else 0
        try:
            image = image_from_keys(state, self.space, offset)
        except InconsistentMetadataError as e:
            if self.inconsistency is None or str(self.inconsistency) != str(e):
                log.error("node %d: the metadata in etcd is inconsistent: %s", self.node_id, e)
            self.inconsistency = e
            return
        if self.inconsistency is not None:
            log.info("node %d: the metadata in etcd is consistent again", self.node_id)
        self.inconsistency = None
        self._image = image
        self._pushes.reset(image.offset)

    def _expire_dead_brokers(self) -> None:
        """A registered, unfenced broker without its leased key is gone: its session is
        over now, and the next tick fences it."""
        for broker_id, broker in self._image.brokers.items():
            if not broker.fenced and broker_id not in self._live_brokers:
                session = self.controller.heartbeats.session(broker_id)
                if session is not None:
                    session.last_contact_ms = -(2**62)

    # --- writing -----------------------------------------------------------------------

    async def _serialized(self, work: Callable[[], Any]) -> Any:
        async with self._lock:
            return await work()

    async def _tick(self) -> None:
        if not self.is_active or self.inconsistency is not None:
            return
        result = self.controller.tick(self._clock())
        if result.records:
            with contextlib.suppress(_StateChanged):
                await self._append(result.records)

    async def _append(self, records: list[MetadataRecord]) -> None:
        """Write the image ``records`` make (see the module docstring); raises
        :class:`_StateChanged` (and reads etcd again) if a compare failed, or
        :class:`EtcdUnavailableError`."""
        epoch, claim_revision = self.epoch, self._claim_revision
        if epoch is None:
            raise _StateChanged("not the controller")
        fence = (epoch, claim_revision)
        parent = self._image
        offset = parent.offset + len(records)
        image = MetadataDelta(parent).replay_all(records).apply(offset, epoch)
        plan = plan_writes(
            changed_keys(parent, image, records, self.space), epoch, self.settings.max_txn_ops
        )
        chunks, structure = plan.chunks, plan.final
        results = await self._write_pipelined(chunks, fence, offset)
        written = list(zip(chunks, results, strict=True))
        result = await self._write(structure, fence, offset, final=True)
        written.append((structure, result))
        for ops, at in written:  # only once all are in: see _write
            for op in ops:
                if isinstance(op, Put):
                    self._revisions[op.key] = at.revision
                else:
                    self._revisions.pop(op.key, None)
        self._offset_revision = result.revision
        self._image = image
        self._pushes.changed(parent.offset, offset, [encode_record(r) for r in records])
        for record in records:  # a node that (re)registered is pushed the whole image
            if isinstance(record, RegisterBrokerRecord | RegisterCoordinatorRecord):
                for address in self._addresses_of(record):
                    self._pushes.forget(address)
        self._push_all()

    async def _write_pipelined(
        self, chunks: list[list[Put | Delete]], fence: tuple[int, int], offset: int
    ) -> list[TxnResult]:
        """The transactions of ``chunks`` (a plan's partition-state updates: disjoint keys,
        each valid alone), up to ``write_pipeline`` of them in flight, as ZooKeeper-era
        controllers sent their znode writes asynchronously and waited for the answers:
        each is still guarded by the controller epoch and its keys' revisions (see
        :meth:`_write`). The first failure stops sending more; those in flight are
        answered before it is raised (the caller then reads etcd again, as after a failure
        between sequential chunks: some partitions are changed, others not)."""
        results: list[TxnResult | None] = [None] * len(chunks)
        pending = iter(range(len(chunks)))
        failures: list[BaseException] = []

        async def send() -> None:
            for index in pending:
                if failures:
                    return
                try:
                    results[index] = await self._write(chunks[index], fence, offset)
                except (_StateChanged, EtcdUnavailableError, EtcdRequestTooLargeError) as e:
                    failures.append(e)
                    return

        senders = min(self.settings.write_pipeline, len(chunks))
        await asyncio.gather(*(send() for _ in range(senders)))
        if failures:
            raise failures[0]
        return [r for r in results if r is not None]

    async def _write(
        self, ops: list[Put | Delete], fence: tuple[int, int], offset: int, *, final: bool = False
    ) -> TxnResult:
        """One transaction of ``ops``, guarded by ``fence`` (the controller epoch, and the
        ``mod_revision`` of the ``controller`` key this controller claimed: a controller
        whose lease is gone, paused past it, writes nothing even before another is
        elected) and each key's ``mod_revision``; ``final``: the one that also advances
        ``metadata_offset``.

        A change too large for one transaction (etcd's ``--max-txn-ops``) is written as
        several: first the updates of existing partition states (each key valid alone, as
        each partition's znode was written alone by ZooKeeper-era controllers), in
        transactions of ``max_txn_ops - 2``, several in flight
        (:meth:`_write_pipelined`), then, once all are in, the rest with the offset. A failure
        between them leaves some partitions changed: the next read finds keys not as this
        controller holds them and loads etcd's state again, and the controller decides
        anew on it."""
        epoch, claim_revision = fence
        compares = [
            Compare(self.space.controller_epoch, "value", str(epoch).encode()),
            Compare(self.space.controller, "mod", claim_revision),
        ]
        compares += [Compare(op.key, "mod", self._revisions.get(op.key, 0)) for op in ops]
        ops = list(ops)
        if final:
            compares.append(Compare(self.space.metadata_offset, "mod", self._offset_revision))
            ops.append(Put(self.space.metadata_offset, str(offset).encode()))
        try:
            result = await self.connection.txn(compares, ops)
        except EtcdUnavailableError:
            self._known_revision = -1  # the outcome is unknown: read everything again
            raise
        if not result.succeeded:
            self._known_revision = -1
            self._wake.set()
            raise _StateChanged(f"a compare failed writing offset {offset}")
        return result

    # --- requests ----------------------------------------------------------------------

    async def call(self, rpc: ControllerRpc[Any, Any], request: Any) -> Message:
        """Serve one request; the proto response."""
        async with self._lock:
            if not self.is_active:
                return self._not_active(rpc)
            if self.inconsistency is not None:
                return rpc.error(
                    ErrorCode.INVALID_REQUEST,
                    f"the controller serves nothing from an inconsistent metadata store: "
                    f"{self.inconsistency}",
                )
            if (
                isinstance(request, BrokerHeartbeatRequest)
                and request.broker_id not in self._live_brokers
                and not request.want_fence
            ):
                # Liveness is the leased key (the ephemeral znode): a broker without one
                # (its session expired, or it is cut off from etcd) is fenced by its
                # heartbeat too, and none unfences it until its key is back.
                request = dataclasses.replace(request, want_fence=True)
            result = CONTROLLER_CALLS[rpc.name](self.controller, request, self._clock())
            if result.records:
                try:
                    await self._append(list(result.records))
                except _StateChanged:
                    return rpc.not_controller(
                        self.node_id, self.address, "the metadata changed in etcd: retry"
                    )
                except EtcdUnavailableError as e:
                    return rpc.error(
                        ErrorCode.REQUEST_TIMED_OUT,
                        f"the metadata store {self.connection.address} is unreachable: {e}",
                    )
                except (MetadataWriteTooLargeError, EtcdRequestTooLargeError) as e:
                    return rpc.error(ErrorCode.INVALID_REQUEST, str(e))
            return rpc.response_to_proto(result.response)

    def _not_active(self, rpc: ControllerRpc[Any, Any]) -> Message:
        if self.unreachable is not None:
            return rpc.error(
                ErrorCode.REQUEST_TIMED_OUT,
                f"no controller: the metadata store {self.connection.address} is "
                f"unreachable ({self.unreachable})",
            )
        claim = self.active_claim
        if claim is not None and claim.broker_id != self.node_id:
            return rpc.not_controller(claim.broker_id, claim.address)
        return rpc.not_controller(None, None, "no controller elected yet")

    async def serve(
        self, rpc: ControllerRpc[Any, Any], message: Message, context: grpc.aio.ServicerContext
    ) -> Message:
        """One gRPC call: decode, run, answer (INVALID_ARGUMENT for a malformed request)."""
        try:
            request = rpc.request_from_proto(message)
        except InvalidRequestError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
            raise AssertionError("unreachable: abort raises") from e
        return await self.call(rpc, request)

    async def broker_liveness(
        self,
        requests: AsyncIterator[controller_pb2.BrokerLivenessRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[controller_pb2.BrokerLivenessResponse]:
        """A broker's ``BrokerLiveness`` stream. In this mode a broker's liveness is its
        leased ``brokers/ids`` key (ZooKeeper's ephemeral node), so the stream only tells
        the broker which candidate is the controller: NOT_CONTROLLER naming the active one,
        or answered once and held open while this candidate stays controller. Its end
        fences nothing: the lease's expiry does."""
        if await anext(requests, None) is None:
            return
        epoch = self.epoch
        if not self.is_active or epoch is None:
            claim = self.active_claim
            yield controller_pb2.BrokerLivenessResponse(
                error=ErrorCode.NOT_CONTROLLER,
                controller_id=claim.broker_id if claim is not None else -1,
                controller_address=claim.address if claim is not None else "",
            )
            return
        yield controller_pb2.BrokerLivenessResponse(error=ErrorCode.NONE)

        async def drain() -> None:
            async for _ in requests:
                pass

        closed = asyncio.ensure_future(drain())
        try:
            while not closed.done() and self.is_active and self.epoch == epoch:
                await asyncio.wait({closed}, timeout=self.settings.tick_interval_ms / 1000)
        finally:
            closed.cancel()

    def add_servicer(self, server: grpc.aio.Server) -> None:
        from highwater.internal.v1 import controller_pb2_grpc

        controller_pb2_grpc.add_ControllerServicer_to_server(
            ControllerServicer(self),  # type: ignore[arg-type]
            server,
        )

    # --- pushes ------------------------------------------------------------------------

    @staticmethod
    def _addresses_of(record: RegisterBrokerRecord | RegisterCoordinatorRecord) -> list[str]:
        """Where a registering node is pushed to (its first listener, as
        :func:`push_addresses`)."""
        return [f"{e.host}:{e.port}" for e in record.listeners[:1]]

    def _push_all(self) -> None:
        if not self.is_active or self.inconsistency is not None:
            return
        for address in push_addresses(self._image):
            if self._pushes.plan(address) is None:
                continue
            task = self._push_tasks.get(address)
            if task is not None and not task.done():
                continue  # it pushes again when done; else the next round does
            self._push_tasks[address] = asyncio.create_task(self._push(address))

    def _full_values(self, image: MetadataImage) -> list[bytes]:
        """The whole image's records, encoded once per image for every node that needs it."""
        if self._full_push is None or self._full_push[0] is not image:
            self._full_push = (image, snapshot_values(image))
        return self._full_push[1]

    def _node_at(self, address: str) -> int | None:
        """The broker or coordinator pushed to at ``address``, as the image knows it."""
        for broker in self._image.brokers.values():
            if broker.listeners and broker.listeners[0].address == address:
                return broker.broker_id
        for coordinator in self._image.cluster.coordinators.values():
            if coordinator.listeners and coordinator.listeners[0].address == address:
                return coordinator.coordinator_id
        return None

    def _push_failed(self, address: str, error: str) -> None:
        """A push to ``address`` was refused or not answered: counted each time, logged
        when a streak of failures starts (every round pushes again)."""
        node_id = self._node_at(address)
        self.push_metrics.failed(node_id, address)
        if address not in self.failing_pushes:
            log.warning(
                "node %d: node %s at %s did not take the metadata push of offset %d: %s "
                "(pushed again every round; logged again once a push succeeds)",
                self.node_id,
                node_id if node_id is not None else "?",
                address,
                self._image.offset,
                error,
            )
        self.failing_pushes[address] = error

    def _push_succeeded(self, address: str) -> None:
        if self.failing_pushes.pop(address, None) is not None:
            log.info("node %d: %s takes metadata pushes again", self.node_id, address)

    async def _push(self, address: str) -> None:
        """Push to ``address`` until it holds the current image: a delta when it has a base
        (see :class:`DeltaPushes`), else the whole image; a few attempts, then the next
        round's."""
        for _ in range(4):
            epoch, image = self.epoch, self._image
            if epoch is None or self.inconsistency is not None:
                return
            plan = self._pushes.plan(address)
            if plan is None or plan.offset != image.offset:
                return
            request = broker_metadata_pb2.UpdateMetadataRequest(
                controller_id=self.node_id,
                controller_epoch=epoch,
                offset=image.offset,
                controller_address=self.address,
            )
            if isinstance(plan, DeltaPush):
                request.delta = True
                request.base_offset = plan.base_offset
                request.records.extend(plan.records)
            else:
                request.records.extend(self._full_values(image))
            reply = await self._push_channels.update_metadata(
                address, request, self.settings.push_timeout_s
            )
            if reply is None:
                self._push_failed(address, "no answer (unreachable, or past the push timeout)")
                return
            if reply.error == ErrorCode.STALE_CONTROLLER_EPOCH:
                log.warning(
                    "node %d: %s refused our push: %s",
                    self.node_id,
                    address,
                    reply.error_message,
                )
                self._step_down("a broker knows a newer controller epoch")
                return
            if reply.error != ErrorCode.NONE:
                name = ErrorCode.Name(reply.error)
                self._push_failed(address, f"{name}: {reply.error_message}")
                return
            if self.epoch != epoch:
                return
            self._push_succeeded(address)
            if isinstance(plan, DeltaPush):
                self.pushes_delta += 1
            else:
                self.pushes_full += 1
            if reply.full_image_needed:
                log.debug("node %d: %s: %s", self.node_id, address, reply.error_message)
                self._pushes.forget(address)
                continue
            self._pushes.acknowledged(
                address,
                image_offset=reply.image_offset,
                image_epoch=reply.image_controller_epoch,
                controller_epoch=epoch,
            )
