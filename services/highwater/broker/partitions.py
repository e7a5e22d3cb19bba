"""The partitions a broker holds: their logs, their roles from the metadata image, and the
rules a partition leader applies to produce, fetch and offset requests.

:class:`PartitionManager` follows the :class:`~highwater.metadata.image.MetadataImage`:
every partition that names this broker among its replicas gets a log in the data
directory (created empty, with the topic's effective config, which an image that changes
it gives the open logs again) and a role — leader in the
partition's leader epoch, or follower. The leader appends produced batches through the
storage engine (which checks them, stamps offsets and the leader epoch, and detects an
idempotent producer's duplicates) and serves reads up to the high watermark.

Leader and follower are symmetric: a partition holds the pure replication state of its
role (:mod:`highwater.broker.replication`) and every change to its log's offsets goes
through it. A leader keeps a :class:`~highwater.broker.replication.LeaderReplicationState`:
the followers' progress from their fetches, the high watermark over the (maximal) ISR, the
ISR changes to propose to the controller, and when an acks=all produce is complete. A
follower keeps a :class:`~highwater.broker.replication.FollowerReplicationState`: the
broker's replica fetcher (:mod:`highwater.broker.replica_fetcher`) hands it what the
leader sent (:meth:`Partition.append_as_follower`, :meth:`Partition.truncate_to_diverging_epoch`),
and the state decides the follower's high watermark (``min(its LEO, the leader's HW)``,
never backwards but by a truncation) and where to truncate (by leader epoch, never by the
high watermark). The log's high watermark is always the state's.

Everything here runs on the broker's event loop and, but for the truncation's checkpoint
writes, synchronously; waiting (long polls, acks) is the request handler's business
(:mod:`highwater.broker.request_handler`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from highwater.broker.replication import (
    AlterPartitionProposal,
    EpochEndOffset,
    FollowerReplicationState,
    LeaderReplicationState,
    ProduceCompletion,
    TruncationDecision,
    UnknownReplicaError,
    find_diverging_epoch,
)
from highwater.config.topic import LogConfig
from highwater.controller_api import messages as m
from highwater.controller_api.messages import ReplicaLogInfo
from highwater.errors import HighwaterError, KafkaStorageError, OffsetOutOfRangeError
from highwater.metadata.image import (
    ClusterImage,
    ConfigResource,
    ConfigurationsImage,
    MetadataImage,
    PartitionRegistration,
    TopicImage,
)
from highwater.metadata.records import ConfigResourceType
from highwater.storage.log import AppendInfo, FetchData, PartitionLog, wall_clock_ms
from highwater.storage.log_manager import LogManager
from highwater.storage.topic_partition import TopicPartition
from highwater.v1.common_pb2 import ErrorCode

__all__ = [
    "EARLIEST_TIMESTAMP",
    "LATEST_TIMESTAMP",
    "MAX_TIMESTAMP",
    "FollowerRead",
    "LogTruncation",
    "Partition",
    "PartitionError",
    "PartitionManager",
]

log = logging.getLogger(__name__)

LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2
MAX_TIMESTAMP = -3
NO_EPOCH = -1

_STATIC_CLUSTER_DEFAULTS = ConfigResource(ConfigResourceType.STATIC_CLUSTER_DEFAULT, "")
"""The controllers' static cluster defaults, one of the sources of a topic's config."""
_METADATA_TOPIC = "__cluster_metadata"
"""The metadata log's topic: never a stray, whatever directory holds it."""

LogTruncation = Callable[[TopicPartition, int], Awaitable[bool]]
"""Truncates a partition's log and makes the lowered recovery point durable
(:meth:`~highwater.storage.log_manager.LogManager.truncate_to`)."""


class PartitionError(HighwaterError):
    """A request for one partition failed with ``code`` (the rest of the request goes on)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class FollowerRead:
    """A follower's fetch as the leader answers it: records, or where the logs diverge;
    and an ISR change to propose, if the fetch brought the follower back in sync."""

    data: FetchData | None
    diverging: EpochEndOffset | None
    proposal: AlterPartitionProposal | None
    high_watermark_moved: bool = False


@dataclass(slots=True)
class Partition:
    """One partition replica on this broker: its log and the role the image gives it."""

    topic_partition: TopicPartition
    topic_id: str
    log: PartitionLog
    registration: PartitionRegistration
    broker_id: int
    clock: Callable[[], int] = wall_clock_ms
    replica_lag_time_max_ms: int = 30_000
    truncate_log: LogTruncation | None = None
    """How the follower truncates its log; None: the log alone (no data directory's
    checkpoints to lower)."""
    leader_state: LeaderReplicationState | None = None
    follower_state: FollowerReplicationState | None = None

    @property
    def is_leader(self) -> bool:
        return self.registration.leader == self.broker_id

    @property
    def leader_epoch(self) -> int:
        return self.registration.leader_epoch

    @property
    def high_watermark(self) -> int:
        return self.log.high_watermark

    @property
    def log_end_offset(self) -> int:
        return self.log.log_end_offset

    def update(self, registration: PartitionRegistration) -> None:
        """Take the role ``registration`` gives: a new leader epoch starts a new leader
        state; a change within the epoch (an ISR change) is applied to it."""
        self.registration = registration
        if registration.leader != self.broker_id:
            self.leader_state = None
            self._follow(registration)
            return
        self.follower_state = None
        now = self.clock()
        state = self.leader_state
        if state is None or state.leader_epoch != registration.leader_epoch:
            log_end = self.log.log_end_offset
            # The new epoch starts here, before any record of it is appended (Kafka's
            # makeLeader): a follower whose last epoch is newer than every epoch of this
            # log (it followed a leader this replica never heard from) is then answered
            # with where that epoch's predecessor ends here, not OFFSET_OUT_OF_RANGE.
            self.log.assign_epoch_start(registration.leader_epoch, log_end)
            self.leader_state = LeaderReplicationState(
                self.broker_id,
                registration.replicas,
                registration.isr,
                registration.leader_epoch,
                registration.partition_epoch,
                log_end,
                min(self.log.high_watermark, log_end),
                now,
                replica_lag_time_max_ms=self.replica_lag_time_max_ms,
                min_insync_replicas=self.log.config.min_insync_replicas,
            )
        else:
            state.apply_partition_change(
                registration.isr,
                registration.leader_epoch,
                registration.partition_epoch,
                now,
                replicas=registration.replicas,
            )
        self._sync_high_watermark()

    def apply_config(self, config: LogConfig) -> bool:
        """The topic's config changed: the log takes it, and a leader's replication state
        its ``min.insync.replicas`` at once (Kafka's leader reads it from the log config
        at each check), which recomputes the high watermark
        (:meth:`LeaderReplicationState.update_min_insync_replicas`). True if the high
        watermark moved: the caller wakes what waits for it."""
        self.log.config = config
        state = self.leader_state
        if state is None or state.min_insync_replicas == config.min_insync_replicas:
            return False
        moved = state.update_min_insync_replicas(config.min_insync_replicas, self.clock())
        self._sync_high_watermark()
        return moved

    def stop_replicating(self, registration: PartitionRegistration | None = None) -> None:
        """The log went offline (its directory failed): neither lead nor follow any more.
        The leader state goes with its purgatory's hopes and the follower's fetches stop;
        the broker reports the replica offline and the controller moves the leadership
        and the ISR membership away (Kafka's ``handleLogDirFailure``). ``registration``:
        the latest, remembered but not acted on."""
        if registration is not None:
            self.registration = registration
        self.leader_state = None
        self.follower_state = None

    def _follow(self, registration: PartitionRegistration) -> None:
        """Follow ``registration``'s leader: a follower state from the log's offsets when
        this replica was not following, else the state learns the new leader and epoch.

        An epoch this replica led without appending in it starts at the log end and holds
        nothing: it is forgotten, so that the fetches name the epoch of the last batch (a
        leader that never had the empty epoch would answer with a diverging epoch ending
        at this very log end, again and again)."""
        self.log.forget_epochs_from(self.log.log_end_offset)
        state = self.follower_state
        if state is None:
            self.follower_state = FollowerReplicationState(
                self.broker_id,
                registration.leader,
                registration.leader_epoch,
                self.log.log_end_offset,
                self.log.high_watermark,
            )
        else:
            state.on_leader_change(registration.leader, registration.leader_epoch)

    def update_eligibility(self, image: MetadataImage) -> bool:
        """Followers that are fenced or shutting down may not join the ISR (the controller
        would refuse them with INELIGIBLE_REPLICA): tell the leader state which. True if
        that changed (a follower that became eligible may join the ISR at its next fetch,
        the high watermark may have moved)."""
        state = self.leader_state
        if state is None:
            return False
        ineligible = frozenset(
            replica
            for replica in self.registration.replicas
            if replica != self.broker_id and not image.is_active_broker(replica)
        )
        if ineligible == state.ineligible_replicas:
            return False
        state.update_ineligible_replicas(ineligible, self.clock())
        self._sync_high_watermark()
        return True

    def _leader(self, current_leader_epoch: int) -> LeaderReplicationState:
        self.check_leader(current_leader_epoch)
        assert self.leader_state is not None
        return self.leader_state

    def _sync_high_watermark(self) -> None:
        if self.leader_state is not None:
            self.log.update_high_watermark(self.leader_state.high_watermark)

    def check_leader(self, current_leader_epoch: int) -> None:
        """Refuse a request for a leader this replica is not, or for another epoch."""
        if current_leader_epoch != NO_EPOCH:
            if current_leader_epoch < self.leader_epoch:
                raise PartitionError(
                    ErrorCode.FENCED_LEADER_EPOCH,
                    f"{self.topic_partition}: leader epoch {current_leader_epoch} is older "
                    f"than {self.leader_epoch}",
                )
            if current_leader_epoch > self.leader_epoch:
                raise PartitionError(
                    ErrorCode.UNKNOWN_LEADER_EPOCH,
                    f"{self.topic_partition}: leader epoch {current_leader_epoch} is newer "
                    f"than {self.leader_epoch}",
                )
        if not self.is_leader or self.leader_state is None:
            raise PartitionError(
                ErrorCode.NOT_LEADER_OR_FOLLOWER,
                f"{self.topic_partition}: broker {self.broker_id} does not lead it "
                f"(leader {self.registration.leader})",
            )

    def append(self, data: bytes, required_acks: int) -> AppendInfo:
        """Append a producer's batches as leader. ``required_acks`` -1 (all) first checks
        ``min.insync.replicas`` against the ISR (NOT_ENOUGH_REPLICAS)."""
        state = self._leader(NO_EPOCH)
        if required_acks == -1:
            code = state.check_min_isr()
            if code != ErrorCode.NONE:
                raise PartitionError(
                    code,
                    f"{self.topic_partition}: the ISR {list(state.isr)} is smaller than "
                    f"min.insync.replicas={state.effective_min_isr}",
                )
        info = self.log.append_as_leader(data, self.leader_epoch)
        state.on_append(self.log.log_end_offset, self.clock())
        self._sync_high_watermark()
        return info

    def produce_completion(self, required_offset: int) -> ProduceCompletion:
        """Whether an acks=all produce that ended at ``required_offset`` is complete (and
        with which error); NOT_LEADER_OR_FOLLOWER once this replica stopped leading."""
        if self.leader_state is None:
            return ProduceCompletion(True, ErrorCode.NOT_LEADER_OR_FOLLOWER)
        return self.leader_state.can_complete_produce(required_offset)

    def read(
        self,
        fetch_offset: int,
        max_bytes: int,
        current_leader_epoch: int,
        *,
        min_one_batch: bool = True,
    ) -> FetchData:
        """Whole batches from ``fetch_offset`` up to the high watermark (a consumer's read);
        with ``min_one_batch`` the first even when it is larger than ``max_bytes``."""
        self.check_leader(current_leader_epoch)
        try:
            return self.log.read(
                fetch_offset,
                max_bytes,
                max_offset=self.high_watermark,
                min_one_batch=min_one_batch,
            )
        except OffsetOutOfRangeError as e:
            raise PartitionError(ErrorCode.OFFSET_OUT_OF_RANGE, str(e)) from None

    def read_for_follower(
        self,
        replica_id: int,
        fetch_offset: int,
        last_fetched_epoch: int,
        max_bytes: int,
        current_leader_epoch: int,
        *,
        min_one_batch: bool = True,
    ) -> FollowerRead:
        """A follower's fetch: its log end is ``fetch_offset``. Where its last epoch ends
        before that in the leader's log, the answer is the diverging epoch (KIP-320);
        otherwise records past the high watermark too, and the follower's progress counts
        toward the high watermark and the ISR."""
        state = self._leader(current_leader_epoch)
        try:
            diverging = find_diverging_epoch(
                fetch_offset, last_fetched_epoch, self.log.latest_epoch_end_offset
            )
            if diverging is not None:
                return FollowerRead(None, diverging, None)
            log_end = self.log.log_end_offset
            data = self.log.read(fetch_offset, max_bytes, min_one_batch=min_one_batch)
            outcome = state.on_follower_fetch(
                replica_id, fetch_offset, self.clock(), log_end, current_leader_epoch=None
            )
        except OffsetOutOfRangeError as e:
            raise PartitionError(ErrorCode.OFFSET_OUT_OF_RANGE, str(e)) from None
        except UnknownReplicaError as e:
            raise PartitionError(ErrorCode.NOT_LEADER_OR_FOLLOWER, str(e)) from None
        self._sync_high_watermark()
        return FollowerRead(data, None, outcome.proposal, outcome.high_watermark_moved)

    def note_session_fetch(
        self, replica_id: int, fetch_offset: int, fetched_at_ms: int, leader_log_end_offset: int
    ) -> None:
        """A follower's fetch session fetched at ``fetched_at_ms`` without naming this
        partition, still at ``fetch_offset`` while this log ended at
        ``leader_log_end_offset`` (see
        :meth:`~highwater.broker.replication.LeaderReplicationState.on_follower_session_fetch`);
        nothing when this replica does not lead."""
        if self.leader_state is not None:
            self.leader_state.on_follower_session_fetch(
                replica_id, fetch_offset, fetched_at_ms, leader_log_end_offset
            )

    # --- as follower ---------------------------------------------------------------------

    @property
    def last_fetched_epoch(self) -> int:
        """The leader epoch of the log's last batch (-1: none), for a follower's fetch."""
        latest = self.log.leader_epoch_cache.latest_epoch
        return NO_EPOCH if latest is None else latest

    def _follower(self) -> FollowerReplicationState:
        state = self.follower_state
        if state is None:
            raise PartitionError(
                ErrorCode.NOT_LEADER_OR_FOLLOWER,
                f"{self.topic_partition}: broker {self.broker_id} leads it, it does not follow",
            )
        return state

    def append_as_follower(self, records: bytes, leader_high_watermark: int) -> bool:
        """A fetch answer from the leader: append its ``records`` as they are (offsets and
        epochs kept), then take the leader's high watermark as the follower state rules
        (``min(LEO, leader's HW)``, never backwards). True if the high watermark moved.

        PartitionError NOT_LEADER_OR_FOLLOWER when this replica leads now; the storage
        engine's error when the records do not continue the log (nothing changes then).
        """
        state = self._follower()
        if records:
            self.log.append_as_follower(records)
        moved = state.on_fetch_response(leader_high_watermark, self.log.log_end_offset)
        self.log.update_high_watermark(state.high_watermark)
        return moved

    async def truncate_to_diverging_epoch(self, diverging: EpochEndOffset) -> TruncationDecision:
        """The leader's answer named where the logs diverge (KIP-320): truncate the log to
        the follower state's decision (:func:`~highwater.broker.replication.truncation_offset`,
        by leader epoch, never the high watermark), which caps the high watermark there.

        The log truncates on a batch boundary at or below the decision; the state takes
        the log end the log has then.
        """
        state = self._follower()
        decision = state.on_diverging_epoch(diverging, self.log.latest_epoch_end_offset)
        if self.truncate_log is None:
            self.log.truncate_to(decision.offset)
        else:
            await self.truncate_log(self.topic_partition, decision.offset)
        if self.follower_state is state:  # still following (the checkpoints were awaited)
            state.on_truncated(self.log.log_end_offset)
            self.log.update_high_watermark(state.high_watermark)
        return decision

    # --- upkeep -----------------------------------------------------------------------------

    def maybe_shrink_isr(self) -> AlterPartitionProposal | None:
        """The ISR without the followers that fell behind, to propose; None if none did."""
        if self.leader_state is None:
            return None
        return self.leader_state.maybe_shrink_isr(self.clock())

    def list_offset(self, timestamp: int, current_leader_epoch: int) -> tuple[int, int, int]:
        """ListOffsets for a consumer: (timestamp, offset, leader epoch); -1, -1, -1 when no
        record matches.

        The epoch is Kafka's (``UnifiedLog.fetchOffsetByTimestamp``, ``Partition``): for
        ``EARLIEST`` the leader epoch cache's first entry, for ``LATEST`` the current leader
        epoch, for ``MAX_TIMESTAMP`` and a timestamp the partition leader epoch of the batch
        holding the record found, as the log says."""
        self.check_leader(current_leader_epoch)
        if timestamp == EARLIEST_TIMESTAMP:
            return -1, self.log.log_start_offset, self.log.earliest_epoch
        if timestamp == LATEST_TIMESTAMP:
            return -1, self.high_watermark, self.leader_epoch
        if timestamp == MAX_TIMESTAMP:
            found = self.log.max_timestamp_and_offset(self.high_watermark)
        elif timestamp >= 0:
            found = self.log.offset_for_timestamp(timestamp)
        else:
            raise PartitionError(
                ErrorCode.INVALID_REQUEST, f"{timestamp} is not a timestamp ListOffsets knows"
            )
        if found is None or found[1] >= self.high_watermark:
            return -1, -1, -1
        return found[0], found[1], self.log.epoch_of_batch_at(found[1])


class PartitionManager:
    """This broker's partitions, kept in step with the metadata image (see the module
    docstring)."""

    def __init__(
        self,
        broker_id: int,
        log_manager: LogManager,
        *,
        clock: Callable[[], int] = wall_clock_ms,
        replica_lag_time_max_ms: int = 30_000,
    ) -> None:
        self.broker_id = broker_id
        self.log_manager = log_manager
        self.clock = clock
        self.replica_lag_time_max_ms = replica_lag_time_max_ms
        self._partitions: dict[TopicPartition, Partition] = {}
        self._unopened: dict[TopicPartition, str] = {}
        """Replicas assigned here whose log could not be opened (a failed log directory
        may hold it), by why."""
        self._creating: set[TopicPartition] = set()
        """Replicas assigned here whose log is being created off the event loop."""
        self._adopted_unused: list[TopicPartition] = []
        """Logs :meth:`create_logs` made that no image has given a role yet: removed if
        the next image no longer assigns them here (their topic was deleted meanwhile)."""
        self._settled: dict[str, tuple[TopicImage, tuple[TopicPartition, ...]]] = {}
        """By topic name: the topic image :meth:`apply_image` last applied in full (every
        replica assigned here open or offline, none left to create), and those replicas."""
        self._settled_cluster: ClusterImage | None = None
        """The brokers' image the settled topics' roles and eligibility were taken under."""
        self._log_configs: dict[str, tuple[tuple[Mapping[str, str], ...], LogConfig]] = {}
        """By topic name: the config mappings its effective config was parsed from (its
        overrides, the static and dynamic cluster defaults) and that config."""
        self._applied_configs: ConfigurationsImage | None = None
        """The configs image whose changes the open logs have taken."""
        self._strays_removed = False
        """Whether the first image has removed the stray logs found at start."""
        self.image = MetadataImage()
        self.on_change: Callable[[TopicPartition], None] | None = None
        """Told of each partition whose role, ISR, eligibility or high watermark an image
        changed, that was created, removed or went offline: what a leader's fetch sessions
        mark (:mod:`highwater.broker.replica_sessions`)."""
        self.roles_version = 0
        """Goes up whenever a partition is added, removed, goes offline or changes leader or
        leader epoch: the replica fetchers work out what they follow again only then."""

    def _changed(self, tp: TopicPartition, *, role: bool = True) -> None:
        if role:
            self.roles_version += 1
        if self.on_change is not None:
            self.on_change(tp)

    def __iter__(self) -> Iterator[Partition]:
        """The partitions this broker serves: not those on a failed log directory."""
        return iter([p for p in self._partitions.values() if not p.log.offline])

    def replica(self, tp: TopicPartition) -> Partition | None:
        """This broker's replica of ``tp``, served or offline; None if it has none open."""
        return self._partitions.get(tp)

    def offline(self) -> dict[TopicPartition, str]:
        """The replicas assigned here that cannot be served (their log directory failed,
        or it may hold them), by topic id."""
        result = {
            tp: partition.topic_id
            for tp, partition in self._partitions.items()
            if partition.log.offline
        }
        for tp in self._unopened:
            topic = self.image.topic(tp.topic)
            if topic is not None:
                result[tp] = topic.topic_id
        return result

    def missing_committed_records(self) -> dict[TopicPartition, str]:
        """The replicas whose log came back from a crash shorter than the high watermark
        they had checkpointed (``PartitionLog.missing_committed_records``), by topic id:
        they serve as followers, but the controller must neither elect them nor keep them
        in an ISR until they have fetched those records again. A copy that lost committed
        records and leads makes its followers truncate them away (docs/chaos.md)."""
        return {
            tp: partition.topic_id
            for tp, partition in self._partitions.items()
            if not partition.log.offline and partition.log.missing_committed_records
        }

    def replica_log_info(self, topic_id: str, partition_id: int) -> ReplicaLogInfo:
        """This replica's log for the controller's unclean recovery (KIP-966's
        GetReplicaLogInfo): its last batch's leader epoch and its log end offset.
        UNKNOWN_TOPIC_OR_PARTITION when there is no open replica of it here (not yet
        opened after a restart: the controller asks again), KAFKA_STORAGE_ERROR when its
        log directory failed."""
        for partition in self._partitions.values():
            if partition.topic_id == topic_id and partition.topic_partition.partition == (
                partition_id
            ):
                if partition.log.offline:
                    return ReplicaLogInfo(
                        topic_id, partition_id, error=ErrorCode.KAFKA_STORAGE_ERROR
                    )
                return ReplicaLogInfo(
                    topic_id,
                    partition_id,
                    last_leader_epoch=partition.last_fetched_epoch,
                    log_end_offset=partition.log_end_offset,
                )
        return ReplicaLogInfo(topic_id, partition_id, error=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)

    def get(self, topic: str, partition: int) -> Partition:
        """The partition, or PartitionError UNKNOWN_TOPIC_OR_PARTITION /
        NOT_LEADER_OR_FOLLOWER (it exists, on other brokers) / KAFKA_STORAGE_ERROR (its
        log directory failed)."""
        # (A plain tuple finds a TopicPartition key: a NamedTuple hashes and compares as one.)
        found = self._partitions.get((topic, partition))  # type: ignore[call-overload]
        if found is not None and not found.log.offline:
            return found
        tp = TopicPartition(topic, partition)
        if found is not None:
            if found.log.offline:
                raise PartitionError(
                    ErrorCode.KAFKA_STORAGE_ERROR,
                    f"{tp}: its log directory on broker {self.broker_id} is offline",
                )
            return found
        if tp in self._unopened:
            raise PartitionError(ErrorCode.KAFKA_STORAGE_ERROR, self._unopened[tp])
        if tp in self._creating:
            raise PartitionError(
                ErrorCode.NOT_LEADER_OR_FOLLOWER,
                f"{tp}: broker {self.broker_id} is still creating its log",
            )
        topic_image = self.image.topic(topic)
        if topic_image is None or topic_image.partition(partition) is None:
            raise PartitionError(
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{topic}-{partition} does not exist"
            )
        raise PartitionError(
            ErrorCode.NOT_LEADER_OR_FOLLOWER,
            f"{topic}-{partition} has no replica on broker {self.broker_id}",
        )

    def stop_offline(self) -> list[TopicPartition]:
        """A log directory failed: its replicas stop leading and following at once (not at
        the next metadata change); returns those that were still replicating."""
        stopped = []
        for tp, partition in self._partitions.items():
            if partition.log.offline and (
                partition.leader_state is not None or partition.follower_state is not None
            ):
                partition.stop_replicating()
                stopped.append(tp)
                self._changed(tp)
        return stopped

    def offline_report(self) -> tuple[list[str], list[m.OfflineReplica]]:
        """What the heartbeat says of failed log directories (KIP-858): their ids, and
        the replicas this broker cannot serve, or may not lead because a crash took
        committed records from them (the controller handles both alike: out of the ISR,
        passed over in elections)."""
        offline = self.offline() | self.missing_committed_records()
        return (
            # A directory that failed at start may have no id: it could not be read.
            [d.directory_id for d in self.log_manager.offline_dirs if d.directory_id],
            [m.OfflineReplica(topic_id, tp.partition) for tp, topic_id in sorted(offline.items())],
        )

    def _take_role(self, partition: Partition, registration: PartitionRegistration) -> None:
        """``partition.update``, unless its directory fails meanwhile (a new leader writes
        its epoch's start to the leader-epoch file): then it stops replicating."""
        before = partition.registration
        self._changed(
            partition.topic_partition,
            role=before.leader != registration.leader
            or before.leader_epoch != registration.leader_epoch,
        )
        try:
            partition.update(registration)
        except KafkaStorageError as e:
            if not partition.log.offline:
                raise
            log.error(
                "broker %d: %s is offline, it takes no role: %s",
                self.broker_id,
                partition.topic_partition,
                e,
            )
            partition.stop_replicating(registration)

    def apply_image(
        self, image: MetadataImage, *, create_logs: bool = True
    ) -> list[tuple[TopicPartition, LogConfig]]:
        """Open logs for the partitions assigned here and take the roles the image gives;
        partitions no longer assigned here (a deleted topic) are removed with their logs.

        With ``create_logs=False`` the replicas that have no log yet are left out and
        returned, with their configs, for the caller to create off the event loop
        (:meth:`create_logs`, then this again); until then they answer
        NOT_LEADER_OR_FOLLOWER, retriable, as Kafka's broker does before it has become
        leader or follower of a new partition.

        Images share the topics no record touched (:mod:`highwater.metadata.image`), so a
        topic whose image is the one applied in full last time, under the same brokers'
        image, is passed over: an image costs the topics it changed, not every partition
        held here (a cluster of 10,000 partitions created topic by topic would otherwise
        scan them all once per topic)."""
        self.image = image
        if image.configs is not self._applied_configs:
            self._apply_log_configs(image)
        wanted: set[TopicPartition] = set()
        to_create: list[tuple[TopicPartition, LogConfig]] = []
        if image.cluster is not self._settled_cluster:
            # A broker fenced, unfenced or shutting down changes who is eligible for the
            # ISR of any partition: every topic again.
            self._settled = {}
        settled: dict[str, tuple[TopicImage, tuple[TopicPartition, ...]]] = {}
        for topic in image.topics.by_name.values():
            previous = self._settled.get(topic.name)
            if previous is not None and previous[0] is topic:
                settled[topic.name] = previous
                wanted.update(previous[1])
                continue
            here, done = self._apply_topic(image, topic, create_logs, to_create)
            wanted.update(here)
            if done:
                settled[topic.name] = (topic, here)
        self._settled = settled
        self._settled_cluster = image.cluster
        self._creating = {tp for tp, _ in to_create}
        # Removed in one call: the checkpoints are written once, not once per log.
        gone = [tp for tp in self._unopened if tp not in wanted]
        for tp in gone:
            del self._unopened[tp]
        for tp in [tp for tp in self._partitions if tp not in wanted]:
            del self._partitions[tp]
            gone.append(tp)
            self._changed(tp)
            log.info("broker %d: %s removed", self.broker_id, tp)
        # Logs made off the loop for replicas the image no longer assigns here.
        gone.extend(
            tp for tp in self._adopted_unused if tp not in wanted and tp not in self._partitions
        )
        self._adopted_unused = []
        if not self._strays_removed:
            self._strays_removed = True
            gone.extend(self._strays(wanted))
        self.log_manager.delete_logs(gone)
        return to_create

    def _strays(self, wanted: set[TopicPartition]) -> list[TopicPartition]:
        """The logs found at start that the first image does not assign here: a topic
        deleted, or a replica moved away, while this broker was down. Kafka's KRaft broker
        removes them on its first image (``LogManager.findStrayReplicas``, KAFKA-14616);
        kept, they would fill the disk, and a topic created later under the name would find
        them. The broker applies images only once they hold its own registration, so the
        first is at least as new as any deletion before its start."""
        strays = [
            tp
            for tp in self.log_manager.logs
            if tp not in wanted and tp not in self._partitions and tp.topic != _METADATA_TOPIC
        ]
        for tp in strays:
            log.info(
                "broker %d: stray log of %s (topic id %s) removed: the image does not "
                "assign it here",
                self.broker_id,
                tp,
                self.log_manager.topic_id(tp),
            )
        return strays

    def _apply_topic(
        self,
        image: MetadataImage,
        topic: TopicImage,
        create_logs: bool,
        to_create: list[tuple[TopicPartition, LogConfig]],
    ) -> tuple[tuple[TopicPartition, ...], bool]:
        """:meth:`apply_image` for one topic: its replicas assigned here, and whether each
        of them is settled (its log open or offline; none to create or refused, which
        the next image tries again)."""
        here: list[TopicPartition] = []
        done = True
        config = None
        self._drop_replaced(topic)
        for index in range(len(topic.partitions)):
            registration = topic.partition(index)
            if registration is None or self.broker_id not in registration.replicas:
                continue
            tp = TopicPartition(topic.name, index)
            here.append(tp)
            existing = self._partitions.get(tp)
            if existing is not None:
                if existing.log.offline:
                    existing.stop_replicating(registration)
                elif existing.registration != registration:
                    self._take_role(existing, registration)
                if existing.update_eligibility(image):
                    self._changed(tp, role=False)
                continue
            if config is None:
                config = self._log_config(image, topic.name)
            self._drop_former_log(tp, topic.topic_id)
            try:
                if create_logs or self.log_manager.get_log(tp) is not None:
                    partition_log = self.log_manager.get_or_create_log(tp, config)
                    if create_logs:
                        self.log_manager.assign_topic_id(tp, topic.topic_id)
                    else:
                        # A log made before partition.metadata existed (the first image
                        # after an upgrade names them all) takes the id now; its file is
                        # written in the storage's background, off the event loop.
                        self.log_manager.record_topic_id(tp, topic.topic_id)
                else:
                    self.log_manager.check_creatable(tp)
                    self._unopened.pop(tp, None)
                    to_create.append((tp, config))
                    done = False
                    continue
            except KafkaStorageError as e:
                self._refuse(tp, str(e))
                done = False
                continue
            self._unopened.pop(tp, None)
            created = Partition(
                tp,
                topic.topic_id,
                partition_log,
                registration,
                self.broker_id,
                clock=self.clock,
                replica_lag_time_max_ms=self.replica_lag_time_max_ms,
                truncate_log=self.log_manager.truncate_to,
            )
            self._take_role(created, registration)
            created.update_eligibility(image)
            self._partitions[tp] = created
            self._changed(tp)
            log.info(
                "broker %d: %s as %s in leader epoch %d",
                self.broker_id,
                tp,
                "leader" if created.is_leader else "follower",
                registration.leader_epoch,
            )
        return tuple(here), done

    def _drop_replaced(self, topic: TopicImage) -> None:
        """Remove, with their logs, the replicas held here under ``topic``'s name but of
        another topic id: the name's topic was deleted and created again, and this image
        is the first to show it (a delta holding both changes, or a whole image after
        missed ones). Before the new topic's replicas are made, so that they start with
        empty logs instead of taking the old topic's records as theirs."""
        replaced = [
            tp
            for index in range(len(topic.partitions))
            if (held := self._partitions.get(tp := TopicPartition(topic.name, index))) is not None
            and held.topic_id != topic.topic_id
        ]
        if not replaced:
            return
        for tp in replaced:
            del self._partitions[tp]
            self._changed(tp)
        self.log_manager.delete_logs(replaced)
        log.info(
            "broker %d: %d replicas of a former topic %s removed: the name is topic %s now",
            self.broker_id,
            len(replaced),
            topic.name,
            topic.topic_id,
        )

    def _drop_former_log(self, tp: TopicPartition, topic_id: str) -> None:
        """Remove the log found here for ``tp`` when its ``partition.metadata`` records
        another topic id: the name's topic was deleted and created again while this broker
        was down, and the log on disk is the former topic's (Kafka's broker refuses it with
        ``InconsistentTopicIdException``; its KRaft start removes it as a stray). The new
        topic's replica starts with an empty log instead of serving the old records with
        a log end offset that makes it look caught up. A log recording no id (made before
        the file existed) is kept and takes ``topic_id``."""
        recorded = self.log_manager.topic_id(tp)
        if recorded is None or recorded == topic_id:
            return
        self.log_manager.delete_logs([tp])
        log.info(
            "broker %d: the log of %s found here is of a former topic %s: removed, "
            "the name is topic %s now",
            self.broker_id,
            tp,
            recorded,
            topic_id,
        )

    def _log_config(self, image: MetadataImage, topic: str) -> LogConfig:
        """``topic``'s effective config in ``image``, parsed again only when its overrides
        or the cluster defaults changed: an image shares the config mappings its records
        left alone with the image before it, so the mappings' identity says which.

        A stored value that does not validate (written by a release that allowed it: the
        controllers validate what they write) is left out, the setting taking the value
        of the layer below, and logged as an error each time the topic's config is parsed
        again: the broker keeps serving the topic, as Kafka's does."""
        sources = (
            image.topic_config(topic),
            image.configs.get(_STATIC_CLUSTER_DEFAULTS),
            image.broker_config(""),
        )
        cached = self._log_configs.get(topic)
        if cached is not None and all(
            now is before for now, before in zip(sources, cached[0], strict=True)
        ):
            return cached[1]
        invalid: list[str] = []
        config = image.log_config(topic, self.log_manager.default_config, invalid=invalid)
        if invalid:
            log.error(
                "broker %d: topic %s: stored configs left out, their settings taking the "
                "cluster's or the default: %s",
                self.broker_id,
                topic,
                "; ".join(invalid),
            )
        self._log_configs[topic] = (sources, config)
        return config

    def _apply_log_configs(self, image: MetadataImage) -> None:
        """The open logs take their topics' configs as ``image`` has them (a topic's
        AlterConfigs, or the cluster defaults, changed): each topic whose config mappings
        changed is parsed once, the others keep their config object. A leader takes a
        changed ``min.insync.replicas`` at once (:meth:`Partition.apply_config`), which
        recomputes its high watermark; one that moved is a change its followers' fetch
        sessions hear of, and the broker wakes the produces and consumers that wait
        (``Purgatory.notify`` after every image)."""
        self._applied_configs = image.configs
        names = image.topics.by_name
        for topic in [t for t in self._log_configs if t not in names]:
            del self._log_configs[topic]
        for tp, partition in self._partitions.items():
            config = self._log_config(image, tp.topic)
            if partition.log.config is not config and partition.apply_config(config):
                self._changed(tp, role=False)

    def _refuse(self, tp: TopicPartition, why: str) -> None:
        """``tp``'s log cannot be opened here (a failed directory may hold it)."""
        if tp not in self._unopened:
            log.error("broker %d: %s is offline: %s", self.broker_id, tp, why)
        self._unopened[tp] = why

    async def create_logs(self, requests: Sequence[tuple[TopicPartition, LogConfig]]) -> None:
        """Create the logs :meth:`apply_image` left out, their files (``partition.metadata``
        with the topic id too) in a worker thread so the event loop keeps serving (a
        thousand new logs take seconds of directory creation and fsyncs); the next
        :meth:`apply_image` gives them their roles."""
        topic_ids = {
            tp.topic: topic.topic_id
            for tp, _ in requests
            if (topic := self.image.topic(tp.topic)) is not None
        }
        try:
            new_logs = self.log_manager.plan_new_logs(requests, topic_ids)
        except KafkaStorageError as e:
            for tp, _ in requests:
                self._refuse(tp, str(e))
            return
        await asyncio.to_thread(self.log_manager.load_new_logs, new_logs)
        for tp, why in self.log_manager.adopt_new_logs(new_logs):
            self._refuse(tp, why)
        self._adopted_unused.extend(
            new_log.topic_partition for new_log in new_logs if new_log.log is not None
        )
