"""Partitions and their leadership (Kafka's ``ReplicationControlManager``): topics, ISRs, elections.

Creates, grows and deletes topics (validated names, counts, replication factors and
configs; replicas placed by :mod:`~highwater.metadata.placement`), applies the ISR
changes partition leaders ask for (AlterPartition, guarded by leader epoch and partition
epoch), and elects leaders: when a broker is fenced, shuts down or comes back, when an
operator asks (ElectLeaders), when a topic allows unclean election, and when a broker's
leader imbalance passes ``leader.imbalance.per.broker.percentage``. Every change of a
partition goes through :class:`~highwater.controller.partition_change.PartitionChangeBuilder`.
"""

from __future__ import annotations

import base64
import functools
import itertools
import random
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from highwater.controller.config import ControllerConfig
from highwater.controller.config_control import (
    UNCLEAN_LEADER_ELECTION_ENABLE,
    validate_topic_configs,
)
from highwater.controller.partition_change import (
    Election,
    PartitionChangeBuilder,
    Undecided,
    removal_change,
)
from highwater.controller.reassignment import (
    is_reassigning,
    original_replicas,
    plan_start,
    ready_to_complete,
    target_replicas,
)
from highwater.controller.results import ControllerApiError, ControllerResult, error_of, refuse
from highwater.controller_api.messages import (
    INVALID_UPDATE_VERSION,
    AlterPartitionItem,
    AlterPartitionReassignmentsRequest,
    AlterPartitionReassignmentsResponse,
    AlterPartitionRequest,
    AlterPartitionResponse,
    AlterPartitionResult,
    CreatableTopic,
    CreatableTopicResult,
    CreatePartitionsRequest,
    CreatePartitionsResponse,
    CreatePartitionsTopic,
    CreatePartitionsTopicResult,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeletableTopicResult,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
    ElectionType,
    ElectLeadersRequest,
    ElectLeadersResponse,
    ListPartitionReassignmentsRequest,
    ListPartitionReassignmentsResponse,
    OngoingReassignment,
    PartitionReassignment,
    PartitionResult,
    ReplicaLogInfoRequest,
    ReplicaLogInfoResponse,
)
from highwater.errors import InvalidConfigError, InvalidTopicError
from highwater.metadata.consumer_offsets import CONSUMER_OFFSETS_TOPIC
from highwater.metadata.delta import MetadataDelta
from highwater.metadata.image import (
    ConfigResource,
    MetadataImage,
    PartitionRegistration,
    TopicIdPartition,
)
from highwater.metadata.persistent import SET_SPAN
from highwater.metadata.placement import (
    InvalidReplicationFactorError,
    PlacementBroker,
    place_replicas,
)
from highwater.metadata.records import (
    NO_LEADER,
    ConfigRecord,
    ConfigResourceType,
    MetadataRecord,
    PartitionChangeRecord,
    PartitionRecord,
    RemoveTopicRecord,
    TopicRecord,
)
from highwater.storage.topic_partition import validate_topic_name
from highwater.v1.common_pb2 import ErrorCode

METADATA_TOPIC = "__cluster_metadata"

INTERNAL_TOPICS = frozenset({METADATA_TOPIC, CONSUMER_OFFSETS_TOPIC})
"""Topics only the cluster creates; users may neither create nor delete them (Kafka's
``Topic.INTERNAL_TOPICS`` plus the metadata log)."""

DUPLICATE_TOPIC_NAME = "Duplicate topic name."
"""The refusal of a name a CreateTopics or CreatePartitions request gives twice (Kafka's)."""

NUM_PARTITIONS = "num.partitions"
DEFAULT_REPLICATION_FACTOR = "default.replication.factor"
MIN_INSYNC_REPLICAS = "min.insync.replicas"


def check_min_insync_replicas(
    delta: MetadataDelta, topic_configs: Mapping[str, str], replication_factor: int
) -> None:
    """Refuse a topic whose ``min.insync.replicas`` (its own, else the cluster default)
    is above its replication factor: no acks=all produce could ever succeed.

    Raises :class:`~highwater.errors.InvalidConfigError` naming the key.
    """
    own = topic_configs.get(MIN_INSYNC_REPLICAS)
    value = own if own is not None else delta.cluster_defaults().get(MIN_INSYNC_REPLICAS)
    if value is not None and int(value) > replication_factor:
        whose = "" if own is not None else " (the cluster default)"
        raise InvalidConfigError(
            f"Invalid value {value} for configuration {MIN_INSYNC_REPLICAS}{whose}: it is "
            f"above the replication factor {replication_factor}, so no acks=all produce "
            "could succeed"
        )


RECOVERY_ASK_INTERVAL_MS = 1000
"""How often unclean recovery asks a candidate that has not answered again."""


@dataclass(frozen=True, slots=True)
class RecoveryAnswer:
    """A candidate's log, as it answered unclean recovery's question: valid while its
    registration (``broker_epoch``) and the partition (``partition_epoch``) are the same."""

    broker_epoch: int
    partition_epoch: int
    last_leader_epoch: int
    log_end_offset: int


@dataclass(slots=True)
class LeaderMoves:
    """A broker's partitions whose leadership or ISR membership is still to move off it
    (:meth:`ReplicationControl.move_away_from`), as a lazy sequence of candidates.

    The candidates come from the image of the decision (immutable, so the sequence stays
    valid while later batches change the latest image): first the partitions changed in
    the decision's own batch, then those the broker *leads* (their clients wait for a new
    leader), then the rest of its ISR memberships, then, after an unclean shutdown, its
    ELR memberships. Each index is walked topic by topic and group by
    group (:class:`~highwater.metadata.persistent.PartitionSet`), each group sorted: the
    order is deterministic, a batch touches few groups, and nothing proportional to the
    broker's partitions is built or sorted before the first batch. A candidate already
    moved (a partition both led and in the ISR) is skipped when its turn comes again."""

    broker_epoch: int
    unclean_shutdown: bool
    candidates: Iterator[TopicIdPartition]
    before_unfence: bool = False
    """The broker may not be unfenced before these moves are written: they take an old
    incarnation's leaderships and memberships from a new one's registration."""


class ReplicationControl:
    """Topic and partition decisions over a :class:`MetadataDelta` or image; no state but
    the seeded random source of placement and topic ids, the replicas brokers report
    offline and the leader moves still to finish."""

    def __init__(self, config: ControllerConfig, rng: random.Random) -> None:
        self.config = config
        self._rng = rng
        self.offline_replicas: dict[int, frozenset[TopicIdPartition]] = {}
        """Per broker, the replicas it reported offline in its last heartbeat (a failed
        log directory, KIP-858): soft state, like the sessions, repeated by every
        heartbeat. Elections never pick a broker for a partition it cannot serve."""
        self.moves: dict[int, LeaderMoves] = {}
        """Per inactive broker, the leaderships and ISR memberships still to move off it
        when :meth:`move_away_from` stopped at its batch size: soft state, recomputed
        from the image by :meth:`resume_moves` when a controller becomes active."""
        self.log_infos: dict[TopicIdPartition, dict[int, RecoveryAnswer]] = {}
        """Unclean recovery's answers so far, per waiting partition and candidate: soft
        state (a new active controller asks again)."""
        self._asked: dict[tuple[TopicIdPartition, int], int] = {}
        self._none_awaiting: MetadataImage | None = None
        """An image in which no partition waits for unclean recovery (asked every tick)."""

    def _unclean_allowed(self, delta: MetadataDelta, topic_id: str) -> bool:
        name = delta.topic_name(topic_id)
        if name is not None:
            value = delta.config(ConfigResource(ConfigResourceType.TOPIC, name)).get(
                UNCLEAN_LEADER_ELECTION_ENABLE
            )
            if value is not None:
                return value.lower() == "true"
        value = delta.cluster_defaults().get(UNCLEAN_LEADER_ELECTION_ENABLE)
        if value is not None:
            return value.lower() == "true"
        return self.config.unclean_leader_election_enable

    def _unclean_lookup(self, delta: MetadataDelta) -> Callable[[str], bool]:
        cache: dict[str, bool] = {}

        def allowed(topic_id: str) -> bool:
            if topic_id not in cache:
                cache[topic_id] = self._unclean_allowed(delta, topic_id)
            return cache[topic_id]

        return allowed

    def _min_isr_lookup(self, delta: MetadataDelta) -> Callable[[str], int]:
        """:meth:`_min_isr` of each topic, looked up once per topic (a move of thousands
        of partitions touches a few topics many times)."""
        cache: dict[str, int] = {}

        def min_isr(topic_id: str) -> int:
            value = cache.get(topic_id)
            if value is None:
                value = cache[topic_id] = self._min_isr(delta, topic_id)
            return value

        return min_isr

    def _min_isr(self, delta: MetadataDelta, topic_id: str) -> int:
        """The topic's ``min.insync.replicas`` for its ELR, or 1 when the ELR is off."""
        if not self.config.eligible_leader_replicas_enable:
            return 1
        name = delta.topic_name(topic_id)
        value = None
        if name is not None:
            value = delta.config(ConfigResource(ConfigResourceType.TOPIC, name)).get(
                MIN_INSYNC_REPLICAS
            )
        if value is None:
            value = delta.cluster_defaults().get(MIN_INSYNC_REPLICAS)
        return int(value) if value is not None else 1

    def _change(
        self,
        delta: MetadataDelta,
        key: TopicIdPartition,
        partition: PartitionRegistration,
        unclean_allowed: bool,
        configure: Callable[[PartitionChangeBuilder], object],
        *,
        min_isr: int | None = None,
    ) -> PartitionChangeBuilder:
        offline = self.offline_replicas

        def is_active(broker_id: int) -> bool:
            return delta.is_active_broker(broker_id) and key not in offline.get(
                broker_id, frozenset()
            )

        builder = PartitionChangeBuilder(
            partition,
            key.topic_id,
            key.partition_id,
            is_active if offline else delta.is_active_broker,
            unclean_allowed=unclean_allowed,
            min_isr=self._min_isr(delta, key.topic_id) if min_isr is None else min_isr,
        )
        configure(builder)
        return builder

    def move_away_from(
        self,
        delta: MetadataDelta,
        broker_id: int,
        *,
        unclean_shutdown: bool = False,
        limit: int | None = None,
        before_unfence: bool = False,
    ) -> list[MetadataRecord]:
        """Records that move leadership off ``broker_id`` (already made inactive in
        ``delta``) and drop it from every ISR where it is not the last member. After an
        ``unclean_shutdown`` (a registration without the clean-shutdown epoch) it also
        leaves every ELR: it may have lost records it had not flushed.

        With a ``limit``, at most that many records: the partitions left are remembered
        (:attr:`moves`) and :meth:`continue_moves` writes them in later batches, so a
        broker leading hundreds of thousands of partitions does not make one batch that
        long to decide, append and replay before the first of them has a new leader.
        ``before_unfence``: the broker stays fenced until they are all written
        (:meth:`unfence_waits_for_moves`), as a registration's moves need."""
        broker = delta.broker(broker_id)
        moves = LeaderMoves(
            broker.broker_epoch if broker else -1,
            unclean_shutdown,
            self._move_candidates(delta, broker_id, unclean_shutdown),
            before_unfence,
        )
        self.moves.pop(broker_id, None)
        return self._move(delta, broker_id, moves, limit)

    def continue_moves(self, delta: MetadataDelta, limit: int) -> list[MetadataRecord]:
        """Up to ``limit`` records more of the moves :meth:`move_away_from` left, broker by
        broker; a broker that is active again or registered anew needs none of them."""
        records: list[MetadataRecord] = []
        for broker_id in sorted(self.moves):
            moves = self.moves.pop(broker_id)
            broker = delta.broker(broker_id)
            if (
                broker is None
                or broker.broker_epoch != moves.broker_epoch
                or delta.is_active_broker(broker_id)
            ):
                continue
            if len(records) >= limit:
                self.moves[broker_id] = moves
                continue
            records.extend(self._move(delta, broker_id, moves, limit - len(records)))
        return records

    def unfence_waits_for_moves(self, broker_id: int, broker_epoch: int) -> bool:
        """Whether this incarnation of ``broker_id`` must stay fenced for moves not
        written yet (a registration's, or any a newly active controller resumed)."""
        moves = self.moves.get(broker_id)
        return moves is not None and moves.before_unfence and moves.broker_epoch == broker_epoch

    def resume_moves(self, image: MetadataImage) -> None:
        """On a newly active controller: the moves of every inactive broker, recomputed
        from ``image``, so a fence a former controller wrote in part is finished by
        :meth:`continue_moves` (moving a partition off an inactive broker twice changes
        nothing: the moves are idempotent). A broker registered after an unclean shutdown
        and not unfenced since (``BrokerRegistration.unclean_shutdown``, from its
        ``RegisterBrokerRecord``) gets an unclean shutdown's moves: it also leaves every
        ELR, whether or not it still leads or is in an ISR. Whether moves were a
        registration's is not in the image, so every resumed move keeps its broker fenced
        until it is written."""
        self.moves.clear()
        delta = MetadataDelta(image)
        for broker_id, broker in sorted(image.brokers.items()):
            if delta.is_active_broker(broker_id):
                continue
            unclean_shutdown = broker.unclean_shutdown
            if (
                image.partitions_led_by(broker_id)
                or image.partitions_with_isr_member(broker_id)
                or (unclean_shutdown and image.partitions_with_elr_member(broker_id))
            ):
                self.moves[broker_id] = LeaderMoves(
                    broker.broker_epoch,
                    unclean_shutdown,
                    self._move_candidates(delta, broker_id, unclean_shutdown),
                    before_unfence=True,
                )

    def _move_candidates(
        self, delta: MetadataDelta, broker_id: int, unclean_shutdown: bool
    ) -> Iterator[TopicIdPartition]:
        """The candidates of :class:`LeaderMoves`, in its order; only the delta's own
        changes (a batch's worth) are gathered now."""
        base = delta.image
        changed = sorted(
            key
            for key, partition in delta.changed_partitions()
            if broker_id in partition.isr
            or partition.leader == broker_id
            or (unclean_shutdown and broker_id in partition.elr)
        )
        indexes = [base.partitions_led_by(broker_id), base.partitions_with_isr_member(broker_id)]
        if unclean_shutdown:
            # Its ELR memberships (Kafka's BrokersToElrs), not all of its replicas: most of
            # a restarted broker's partitions hold it in neither, and walking them cost the
            # decision (and a new controller's first tick) the broker's partition count.
            indexes.append(base.partitions_with_elr_member(broker_id))
        spans = [
            (topic_id, span)
            for topic_id, topic in sorted(base.topics.by_id.items())
            for span in range(-(-len(topic.partitions) // SET_SPAN))
        ]
        return itertools.chain(
            changed,
            itertools.chain.from_iterable(
                sorted(index.group(topic_id, span)) for index in indexes for topic_id, span in spans
            ),
        )

    def _move(
        self, delta: MetadataDelta, broker_id: int, moves: LeaderMoves, limit: int | None
    ) -> list[MetadataRecord]:
        """Up to ``limit`` records of ``moves``, each replayed on ``delta`` as it is made
        (a partition met again further on sees its change). The common change (the
        broker leaves an ISR that keeps ``min.insync.replicas`` and an active member, no
        ELR involved) is decided by :func:`removal_change` against the active brokers,
        read once: the brokers' states do not change while the batch is decided; the
        rest, and every partition a broker reported offline, by the builder."""
        unclean_shutdown = moves.unclean_shutdown

        def configure(builder: PartitionChangeBuilder) -> None:
            builder.remove_from_isr(broker_id)
            if unclean_shutdown:
                builder.mark_unclean_shutdown(broker_id)

        unclean = self._unclean_lookup(delta)
        min_isr = self._min_isr_lookup(delta)
        active = frozenset(b for b, r in delta.brokers().items() if r.is_active)
        offline = [keys for keys in self.offline_replicas.values() if keys]
        fast = not unclean_shutdown
        replay = delta.replay
        partition_of = delta.partition
        records: list[MetadataRecord] = []
        candidates = moves.candidates
        while limit is None or len(records) < limit:
            key = next(candidates, None)
            if key is None:
                return records
            topic_id, partition_id = key
            partition = partition_of(topic_id, partition_id)
            if partition is None or (
                broker_id not in partition.isr
                and partition.leader != broker_id
                and not (unclean_shutdown and broker_id in partition.elr)
            ):
                continue
            record: PartitionChangeRecord | Undecided | None = Undecided.BUILDER
            if fast and (not offline or not any(key in keys for keys in offline)):
                record = removal_change(
                    partition, topic_id, partition_id, broker_id, active, min_isr(topic_id)
                )
            if record is Undecided.BUILDER:
                record = self._change(
                    delta,
                    key,
                    partition,
                    unclean(topic_id),
                    configure,
                    min_isr=min_isr(topic_id),
                ).build()
            if record is not None:
                replay(record)
                records.append(record)
        self.moves[broker_id] = moves
        return records

    def set_offline_replicas(
        self, delta: MetadataDelta, broker_id: int, replicas: frozenset[TopicIdPartition]
    ) -> list[MetadataRecord]:
        """``broker_id`` cannot serve ``replicas`` (a failed log directory): remember it
        for later elections, and the records that move their leadership off the broker
        and take it out of their ISRs (unless it is the last member: then the partition
        has no leader, or an unclean one where the topic allows it), as Kafka's
        ``handleDirectoriesOffline``. Nothing when they are off already."""
        if replicas:
            self.offline_replicas[broker_id] = replicas
        else:
            self.offline_replicas.pop(broker_id, None)
        unclean = self._unclean_lookup(delta)
        records: list[MetadataRecord] = []
        for key in sorted(replicas):
            partition = delta.partition(key.topic_id, key.partition_id)
            if partition is None or (
                broker_id not in partition.isr and partition.leader != broker_id
            ):
                continue
            if partition.isr == (broker_id,) and partition.leader != broker_id:
                continue  # the last ISR member, leaderless already
            record = self._change(
                delta,
                key,
                partition,
                unclean(key.topic_id),
                lambda b: b.remove_from_isr(broker_id),
            ).build()
            if record is not None:
                delta.replay(record)
                records.append(record)
        return records

    def forget_offline_replicas(self, broker_id: int) -> None:
        """A new registration of ``broker_id``: it reports its offline replicas afresh."""
        self.offline_replicas.pop(broker_id, None)

    def _leaderless(self, delta: MetadataDelta) -> list[TopicIdPartition]:
        without = delta.image.partitions_without_leader()
        changed = [key for key, p in delta.changed_partitions() if not p.has_leader]
        if not changed:
            # Every tick asks, and most find none: no set to build then.
            return sorted(without) if without else []
        keys = set(without)
        keys.update(changed)
        return sorted(keys)

    def elect_for_unfenced(self, delta: MetadataDelta, broker_id: int) -> list[MetadataRecord]:
        """Leaders for the leaderless partitions that the newly active broker can lead."""
        unclean = self._unclean_lookup(delta)
        records: list[MetadataRecord] = []
        for key in self._leaderless(delta):
            partition = delta.partition(key.topic_id, key.partition_id)
            if partition is None or partition.has_leader or broker_id not in partition.replicas:
                continue
            record = self._change(
                delta, key, partition, unclean(key.topic_id), lambda b: None
            ).build()
            if record is not None:
                delta.replay(record)
                records.append(record)
        return records

    def unclean_elections(self, delta: MetadataDelta) -> list[MetadataRecord]:
        """Unclean leaders for leaderless partitions whose topic allows it (its config
        may have changed since the partition went offline)."""
        unclean = self._unclean_lookup(delta)
        records: list[MetadataRecord] = []
        for key in self._leaderless(delta):
            if not unclean(key.topic_id):
                continue
            partition = delta.partition(key.topic_id, key.partition_id)
            if partition is None or partition.has_leader:
                continue
            record = self._change(delta, key, partition, True, lambda b: None).build()
            if record is not None:
                delta.replay(record)
                records.append(record)
        return records

    # --- Unclean recovery (KIP-966) -------------------------------------------------

    def _awaiting_recovery(
        self, delta: MetadataDelta
    ) -> list[tuple[TopicIdPartition, PartitionRegistration]]:
        """Leaderless partitions with neither ISR nor ELR, whose last known ELR unclean
        recovery elects from (a topic allowing unclean elections has them already)."""
        if self.config.unclean_recovery_strategy == "None":
            return []
        unclean = self._unclean_lookup(delta)
        waiting = []
        for key in self._leaderless(delta):
            partition = delta.partition(key.topic_id, key.partition_id)
            if (
                partition is not None
                and not partition.has_leader
                and not partition.isr
                and not partition.elr
                and partition.last_known_elr
                and not unclean(key.topic_id)
            ):
                waiting.append((key, partition))
        return waiting

    def replica_log_info_requests(
        self, image: MetadataImage, now_ms: int
    ) -> list[ReplicaLogInfoRequest]:
        """What to ask which broker (KIP-966's GetReplicaLogInfo): every replica of every
        partition waiting for unclean recovery that has not answered for its current
        partition epoch, each asked again at most every :data:`RECOVERY_ASK_INTERVAL_MS`.
        Every replica, not only the last known ELR: a replica that left the ISR while it
        kept ``min.insync.replicas`` members was never eligible, but may have run on and
        hold the longest log (docs/simulation.md, seed 9700852). Registered brokers
        only, fenced or not: a broker answers from its logs as soon as it runs."""
        if image is self._none_awaiting and not self.log_infos:
            return []  # as below with nothing waiting, asked again on the same image
        delta = MetadataDelta(image)
        waiting = self._awaiting_recovery(delta)
        if not waiting:
            self._none_awaiting = image
        live = {key for key, _ in waiting}
        for key in [k for k in self.log_infos if k not in live]:
            del self.log_infos[key]
        asks: dict[int, list[tuple[str, int]]] = {}
        for key, partition in waiting:
            answers = self.log_infos.get(key, {})
            for broker_id in partition.replicas:
                broker = image.broker(broker_id)
                if broker is None:
                    continue
                answer = answers.get(broker_id)
                if (
                    answer is not None
                    and answer.broker_epoch == broker.broker_epoch
                    and answer.partition_epoch == partition.partition_epoch
                ):
                    continue
                asked = self._asked.get((key, broker_id))
                if asked is not None and now_ms - asked < RECOVERY_ASK_INTERVAL_MS:
                    continue
                self._asked[(key, broker_id)] = now_ms
                asks.setdefault(broker_id, []).append((key.topic_id, key.partition_id))
        return [
            ReplicaLogInfoRequest(b, image.brokers[b].broker_epoch, tuple(parts))
            for b, parts in sorted(asks.items())
        ]

    def replica_log_info(self, image: MetadataImage, response: ReplicaLogInfoResponse) -> None:
        """Remember a broker's answer for the partitions still waiting, against the
        broker's registration and each partition's epoch it describes. An error (the
        replica not open yet, or offline) is asked again after the interval."""
        broker = image.broker(response.broker_id)
        if broker is None or broker.broker_epoch != response.broker_epoch:
            return
        for info in response.partitions:
            key = TopicIdPartition(info.topic_id, info.partition_id)
            topic = image.topic_by_id(info.topic_id)
            partition = topic.partition(info.partition_id) if topic is not None else None
            if (
                info.error != ErrorCode.NONE
                or partition is None
                or response.broker_id not in partition.replicas
            ):
                continue
            self._asked.pop((key, response.broker_id), None)
            self.log_infos.setdefault(key, {})[response.broker_id] = RecoveryAnswer(
                response.broker_epoch,
                partition.partition_epoch,
                info.last_leader_epoch,
                info.log_end_offset,
            )

    def unclean_recoveries(self, delta: MetadataDelta) -> list[MetadataRecord]:
        """Leaders for the partitions whose replicas answered: the longest log among the
        answers, the highest last leader epoch first, then the highest log end offset,
        ties to replica order. ``Aggressive`` chooses on the first answer; ``Balanced``
        waits for every member of the last known ELR and every active replica (it runs,
        and answers within a round trip), so that a shorter log is not chosen while a
        longer one is a question away. The choice waits while it is not active (a
        broker registered again is fenced until it caught up)."""
        aggressive = self.config.unclean_recovery_strategy == "Aggressive"
        offline = self.offline_replicas
        records: list[MetadataRecord] = []
        for key, partition in self._awaiting_recovery(delta):
            answers = self.log_infos.get(key)
            if not answers:
                continue
            current = {}
            for broker_id in partition.replicas:
                answer = answers.get(broker_id)
                broker = delta.broker(broker_id)
                if (
                    answer is not None
                    and broker is not None
                    and answer.broker_epoch == broker.broker_epoch
                    and answer.partition_epoch == partition.partition_epoch
                ):
                    current[broker_id] = answer
            if not current:
                continue
            if not aggressive:
                # An active replica that reports this partition offline cannot answer.
                awaited = set(partition.last_known_elr).union(
                    b
                    for b in partition.replicas
                    if delta.is_active_broker(b) and key not in offline.get(b, frozenset())
                )
                if not awaited <= current.keys():
                    continue
            order = {b: i for i, b in enumerate(partition.replicas)}
            best = max(
                current,
                key=lambda b: (
                    current[b].last_leader_epoch,
                    current[b].log_end_offset,
                    -order.get(b, len(order)),
                ),
            )
            builder = self._change(
                delta, key, partition, False, functools.partial(_recover, leader=best)
            )
            record = builder.build()
            if record is not None and record.leader == best:
                delta.replay(record)
                records.append(record)
                self.log_infos.pop(key, None)
        return records

    def rebalance_leaders(self, delta: MetadataDelta) -> list[MetadataRecord]:
        """Preferred elections for brokers whose leader imbalance ratio passes the limit."""
        image = delta.image
        preferred_counts: Counter[int] = Counter()
        not_leading: dict[int, list[tuple[TopicIdPartition, PartitionRegistration]]] = {}
        for key, partition in image.partitions():
            preferred = partition.preferred_leader
            preferred_counts[preferred] += 1
            if partition.leader != preferred:
                not_leading.setdefault(preferred, []).append((key, partition))
        limit = self.config.leader_imbalance_per_broker_percentage / 100
        records: list[MetadataRecord] = []
        for broker_id in sorted(not_leading):
            imbalanced = not_leading[broker_id]
            if len(imbalanced) / preferred_counts[broker_id] <= limit:
                continue
            if not image.is_active_broker(broker_id):
                continue
            for key, partition in sorted(imbalanced, key=lambda item: item[0]):
                if broker_id not in partition.isr:
                    continue
                record = self._change(
                    delta, key, partition, False, lambda b: b.set_election(Election.PREFERRED)
                ).build()
                if record is not None:
                    delta.replay(record)
                    records.append(record)
        return records

    def alter_partition(
        self, image: MetadataImage, request: AlterPartitionRequest
    ) -> ControllerResult[AlterPartitionResponse]:
        """ISR changes from partition leaders, each guarded by leader and partition epoch."""
        broker = image.broker(request.broker_id)
        if broker is None or broker.broker_epoch != request.broker_epoch:
            return ControllerResult(
                [],
                AlterPartitionResponse(
                    ErrorCode.STALE_BROKER_EPOCH,
                    f"Broker {request.broker_id} of epoch {request.broker_epoch} is not registered",
                ),
            )
        delta = MetadataDelta(image)
        records: list[MetadataRecord] = []
        results: list[AlterPartitionResult] = []
        seen: set[tuple[str, int]] = set()
        for item in request.partitions:
            key = (item.topic_id, item.partition_id)
            try:
                if key in seen:
                    raise refuse(ErrorCode.INVALID_REQUEST, "Partition named twice in one request")
                seen.add(key)
                record = self._alter_one(delta, request.broker_id, item)
            except ControllerApiError as e:
                results.append(
                    AlterPartitionResult(item.topic_id, item.partition_id, e.code, e.message)
                )
                continue
            if record is not None:
                delta.replay(record)
                records.append(record)
                # An ISR expansion may be the one a reassignment waited for.
                key = TopicIdPartition(item.topic_id, item.partition_id)
                completion = self._complete_reassignment(delta, key)
                if completion is not None:
                    delta.replay(completion)
                    records.append(completion)
            partition = delta.partition(item.topic_id, item.partition_id)
            assert partition is not None
            results.append(
                AlterPartitionResult(
                    item.topic_id,
                    item.partition_id,
                    leader=partition.leader,
                    leader_epoch=partition.leader_epoch,
                    isr=partition.isr,
                    partition_epoch=partition.partition_epoch,
                )
            )
        return ControllerResult(records, AlterPartitionResponse(partitions=tuple(results)))

    def _alter_one(
        self, delta: MetadataDelta, broker_id: int, item: AlterPartitionItem
    ) -> MetadataRecord | None:
        partition = delta.partition(item.topic_id, item.partition_id)
        if partition is None:
            raise refuse(
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                f"No partition {item.partition_id} of topic id {item.topic_id}",
            )
        if (
            item.leader_epoch > partition.leader_epoch
            or item.partition_epoch > partition.partition_epoch
        ):
            # The requester knows a newer state than this controller: not the active one.
            raise refuse(
                ErrorCode.NOT_CONTROLLER,
                "The request has a newer leader or partition epoch than this controller",
            )
        if item.leader_epoch < partition.leader_epoch:
            raise refuse(
                ErrorCode.FENCED_LEADER_EPOCH,
                f"Leader epoch {item.leader_epoch} is older than {partition.leader_epoch}",
            )
        if broker_id != partition.leader:
            raise refuse(
                ErrorCode.INVALID_REQUEST,
                f"Broker {broker_id} is not the leader of the partition ({partition.leader})",
            )
        if item.partition_epoch < partition.partition_epoch:
            raise refuse(
                INVALID_UPDATE_VERSION,
                f"Partition epoch {item.partition_epoch} is older than {partition.partition_epoch}",
            )
        new_isr = item.new_isr
        if len(set(new_isr)) != len(new_isr):
            raise refuse(ErrorCode.INVALID_REQUEST, f"The new ISR {list(new_isr)} has duplicates")
        if partition.leader not in new_isr:
            raise refuse(
                ErrorCode.INVALID_REQUEST,
                f"The new ISR {list(new_isr)} does not include the leader {partition.leader}",
            )
        outside = [b for b in new_isr if b not in partition.replicas]
        if outside:
            raise refuse(
                ErrorCode.INVALID_REQUEST,
                f"The new ISR {list(new_isr)} names brokers that are not replicas: {outside}",
            )
        # Only members joining the ISR must be active; shrinking is always allowed.
        ineligible = [
            b for b in new_isr if b not in partition.isr and not delta.is_active_broker(b)
        ]
        if ineligible:
            raise refuse(
                ErrorCode.INELIGIBLE_REPLICA,
                f"Brokers {ineligible} are fenced, shutting down or not registered and cannot "
                "join the ISR",
            )
        key = TopicIdPartition(item.topic_id, item.partition_id)
        return self._change(
            delta, key, partition, False, lambda b: b.set_target_isr(new_isr)
        ).build()

    def elect_leaders(
        self, image: MetadataImage, request: ElectLeadersRequest
    ) -> ControllerResult[ElectLeadersResponse]:
        """Preferred or unclean elections. An UNCLEAN request is the operator's choice and
        runs whatever the topic's ``unclean.leader.election.enable``; it still prefers a
        live ISR member."""
        delta = MetadataDelta(image)
        targets: list[tuple[str, int]] = []
        if request.all_partitions:
            for name, topic in sorted(image.topics.by_name.items()):
                targets.extend((name, p) for p in range(len(topic.partitions)))
        else:
            for entry in request.topic_partitions:
                targets.extend((entry.topic, p) for p in entry.partitions)
        records: list[MetadataRecord] = []
        results: list[PartitionResult] = []
        for name, partition_id in targets:
            try:
                record = self._elect_one(delta, request.election_type, name, partition_id)
            except ControllerApiError as e:
                if not (request.all_partitions and e.code == ErrorCode.ELECTION_NOT_NEEDED):
                    results.append(PartitionResult(name, partition_id, e.code, e.message))
                continue
            delta.replay(record)
            records.append(record)
            results.append(PartitionResult(name, partition_id))
        return ControllerResult(records, ElectLeadersResponse(partitions=tuple(results)))

    def _elect_one(
        self, delta: MetadataDelta, election_type: ElectionType, name: str, partition_id: int
    ) -> MetadataRecord:
        topic_id = delta.topic_id(name)
        partition = None if topic_id is None else delta.partition(topic_id, partition_id)
        if topic_id is None or partition is None:
            raise refuse(
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"No partition {partition_id} of {name!r}"
            )
        key = TopicIdPartition(topic_id, partition_id)
        if election_type == ElectionType.PREFERRED:
            preferred = partition.preferred_leader
            if partition.leader == preferred:
                raise refuse(ErrorCode.ELECTION_NOT_NEEDED, f"Broker {preferred} already leads it")
            builder = self._change(
                delta, key, partition, False, lambda b: b.set_election(Election.PREFERRED)
            )
            record = builder.build()
            if record is None or record.leader != preferred:
                raise refuse(
                    ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE,
                    f"The preferred leader {preferred} is not active or not in the ISR "
                    f"{list(partition.isr)}",
                )
            return record
        if partition.has_leader and delta.is_active_broker(partition.leader):
            raise refuse(
                ErrorCode.ELECTION_NOT_NEEDED, f"Broker {partition.leader} already leads it"
            )
        builder = self._change(
            delta, key, partition, True, lambda b: b.set_election(Election.UNCLEAN)
        )
        record = builder.build()
        if record is None or record.leader in (None, NO_LEADER):
            raise refuse(
                ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE,
                f"No replica of {list(partition.replicas)} is active",
            )
        return record

    # -- reassignment ---------------------------------------------------------------------

    def alter_partition_reassignments(
        self, image: MetadataImage, request: AlterPartitionReassignmentsRequest
    ) -> ControllerResult[AlterPartitionReassignmentsResponse]:
        """Start, replace or cancel partition reassignments (see :mod:`.reassignment`);
        one result per partition, the others go on when one is refused."""
        delta = MetadataDelta(image)
        records: list[MetadataRecord] = []
        results: list[PartitionResult] = []
        seen: set[tuple[str, int]] = set()
        for item in request.partitions:
            try:
                if (item.topic, item.partition_id) in seen:
                    raise refuse(ErrorCode.INVALID_REQUEST, "Partition named twice in one request")
                seen.add((item.topic, item.partition_id))
                changes = self._reassign_one(delta, item)
            except ControllerApiError as e:
                results.append(PartitionResult(item.topic, item.partition_id, e.code, e.message))
                continue
            for record in changes:
                delta.replay(record)
                records.append(record)
            results.append(PartitionResult(item.topic, item.partition_id))
        return ControllerResult(
            records, AlterPartitionReassignmentsResponse(partitions=tuple(results))
        )

    def _reassign_one(
        self, delta: MetadataDelta, item: PartitionReassignment
    ) -> list[MetadataRecord]:
        topic_id = delta.topic_id(item.topic)
        partition = None if topic_id is None else delta.partition(topic_id, item.partition_id)
        if topic_id is None or partition is None:
            raise refuse(
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                f"No partition {item.partition_id} of {item.topic!r}",
            )
        key = TopicIdPartition(topic_id, item.partition_id)
        if item.cancel:
            if item.replicas:
                raise refuse(ErrorCode.INVALID_REQUEST, "A cancellation names no replicas")
            if not is_reassigning(partition):
                raise refuse(
                    ErrorCode.NO_REASSIGNMENT_IN_PROGRESS,
                    f"{item.topic}-{item.partition_id} is not being reassigned",
                )
            original = original_replicas(partition)
            if not any(b in partition.isr for b in original):
                raise refuse(
                    ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                    f"No original replica of {item.topic}-{item.partition_id} "
                    f"{list(original)} is in the ISR {list(partition.isr)}: it cannot go back",
                )
            builder = self._change(
                delta, key, partition, False, lambda b: b.set_target_replicas(original)
            )
            record = builder.build()
            return [] if record is None else [record]
        target = item.replicas
        if not target:
            raise refuse(ErrorCode.INVALID_REPLICA_ASSIGNMENT, "The target replicas are empty")
        if len(set(target)) != len(target):
            raise refuse(
                ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                f"The target replicas {list(target)} name a broker twice",
            )
        unknown = [b for b in target if delta.broker(b) is None]
        if unknown:
            raise refuse(
                ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                f"Brokers {unknown} of the target replicas {list(target)} are not registered",
            )
        start = plan_start(partition, target)
        builder = self._change(
            delta,
            key,
            partition,
            False,
            lambda b: b.set_target_replicas(
                start.replicas, adding=start.adding, removing=start.removing
            ),
        )
        record = builder.build()
        if record is None:
            return []
        delta.replay(record)
        completion = self._complete_reassignment(delta, key)
        return [record] if completion is None else [record, completion]

    def _complete_reassignment(
        self, delta: MetadataDelta, key: TopicIdPartition
    ) -> MetadataRecord | None:
        """The record that completes ``key``'s reassignment once every target replica is
        in the ISR; None before (or when none is in progress)."""
        partition = delta.partition(key.topic_id, key.partition_id)
        if partition is None or not ready_to_complete(partition):
            return None
        target = target_replicas(partition)
        return self._change(
            delta, key, partition, False, lambda b: b.set_target_replicas(target)
        ).build()

    def list_partition_reassignments(
        self, image: MetadataImage, request: ListPartitionReassignmentsRequest
    ) -> ListPartitionReassignmentsResponse:
        """The reassignments in progress, of the partitions asked about (all by default)."""
        wanted: set[tuple[str, int]] | None = None
        if request.topic_partitions:
            wanted = {(t.topic, p) for t in request.topic_partitions for p in t.partitions}
        ongoing: list[OngoingReassignment] = []
        for name, topic in sorted(image.topics.by_name.items()):
            for partition_id in range(len(topic.partitions)):
                if wanted is not None and (name, partition_id) not in wanted:
                    continue
                partition = topic.partition(partition_id)
                if partition is None or not is_reassigning(partition):
                    continue
                ongoing.append(
                    OngoingReassignment(
                        name,
                        partition_id,
                        partition.replicas,
                        partition.adding_replicas,
                        partition.removing_replicas,
                    )
                )
        return ListPartitionReassignmentsResponse(reassignments=tuple(ongoing))

    def create_topics(
        self, image: MetadataImage, request: CreateTopicsRequest
    ) -> ControllerResult[CreateTopicsResponse]:
        """Create topics: validated names, partition counts, replication factors and
        configs; replicas placed rack-aware over the active brokers. Each topic
        succeeds or fails on its own.

        A name given more than once is answered once, INVALID_REQUEST "Duplicate topic
        name.", and none of its entries is created (Kafka's ``ControllerApis.createTopics``)."""
        delta = MetadataDelta(image)
        counts = Counter(topic.name for topic in request.topics)
        usable = [PlacementBroker(b.broker_id, b.rack) for b in image.active_brokers()]
        normalized = {_collision_key(name): name for name in image.topics.by_name}
        records: list[MetadataRecord] = []
        results: list[CreatableTopicResult] = []
        answered: set[str] = set()
        for topic in request.topics:
            if counts[topic.name] > 1:
                if topic.name not in answered:
                    answered.add(topic.name)
                    results.append(
                        CreatableTopicResult(
                            topic.name,
                            error=ErrorCode.INVALID_REQUEST,
                            error_message=DUPLICATE_TOPIC_NAME,
                        )
                    )
                continue
            try:
                topic_records, result = self._create_topic(delta, topic, usable, normalized)
            except ControllerApiError as e:
                results.append(
                    CreatableTopicResult(topic.name, error=e.code, error_message=e.message)
                )
                continue
            except (InvalidTopicError, InvalidConfigError, InvalidReplicationFactorError) as e:
                code, message = error_of(e)
                results.append(CreatableTopicResult(topic.name, error=code, error_message=message))
                continue
            results.append(result)
            if not request.validate_only:
                delta.replay_all(topic_records)
                records.extend(topic_records)
                normalized[_collision_key(topic.name)] = topic.name
        return ControllerResult(records, CreateTopicsResponse(topics=tuple(results)))

    def _create_topic(
        self,
        delta: MetadataDelta,
        topic: CreatableTopic,
        usable: list[PlacementBroker],
        normalized: Mapping[str, str],
    ) -> tuple[list[MetadataRecord], CreatableTopicResult]:
        name = topic.name
        validate_topic_name(name)
        if name in INTERNAL_TOPICS:
            raise refuse(
                ErrorCode.INVALID_REQUEST, f"Creation of internal topic {name} is prohibited."
            )
        internal_clash = [t for t in INTERNAL_TOPICS if _collision_key(t) == _collision_key(name)]
        if internal_clash:
            raise refuse(
                ErrorCode.INVALID_TOPIC_EXCEPTION,
                f"Topic '{name}' collides with internal topic {internal_clash[0]} ('.' and '_' "
                "may collide in metric names)",
            )
        if delta.topic_id(name) is not None:
            raise refuse(ErrorCode.TOPIC_ALREADY_EXISTS, f"Topic '{name}' already exists.")
        clash = normalized.get(_collision_key(name))
        if clash is not None:
            raise refuse(
                ErrorCode.INVALID_TOPIC_EXCEPTION,
                f"Topic '{name}' collides with existing topic: {clash} ('.' and '_' may collide "
                "in metric names)",
            )
        nulls = [key for key, value in topic.configs.items() if value is None]
        if nulls:
            # Kafka's ReplicationControlManager: a config with no value is refused, not
            # taken as "the default".
            raise refuse(
                ErrorCode.INVALID_CONFIG,
                f"Null value not supported for topic configs: {','.join(nulls)}",
            )
        configs = validate_topic_configs(topic.configs)
        if topic.assignments:
            if topic.num_partitions != -1 or topic.replication_factor != -1:
                raise refuse(
                    ErrorCode.INVALID_REQUEST,
                    "Both num_partitions or replication_factor and assignments were set; "
                    "give one or the other",
                )
            assignments = list(topic.assignments)
            self._validate_assignments(delta, assignments, first_partition=0)
        else:
            defaults = delta.cluster_defaults()
            num_partitions = (
                int(defaults.get(NUM_PARTITIONS, self.config.num_partitions))
                if topic.num_partitions == -1
                else topic.num_partitions
            )
            if num_partitions < 1:
                raise refuse(
                    ErrorCode.INVALID_PARTITIONS,
                    f"Number of partitions was set to an invalid non-positive value "
                    f"({num_partitions})",
                )
            factor = (
                int(
                    defaults.get(DEFAULT_REPLICATION_FACTOR, self.config.default_replication_factor)
                )
                if topic.replication_factor == -1
                else topic.replication_factor
            )
            if factor < 1:
                raise refuse(
                    ErrorCode.INVALID_REPLICATION_FACTOR,
                    "Replication factor must be larger than 0, or -1 to use the default value.",
                )
            assignments = place_replicas(usable, num_partitions, factor, self._rng)
        check_min_insync_replicas(delta, configs, len(assignments[0]))
        topic_id = self._new_topic_id(delta)
        records: list[MetadataRecord] = [TopicRecord(name=name, topic_id=topic_id)]
        records.extend(
            ConfigRecord(ConfigResourceType.TOPIC, name, key, value)
            for key, value in sorted(configs.items())
        )
        for partition_id, replicas in enumerate(assignments):
            records.append(self._new_partition(delta, topic_id, partition_id, tuple(replicas)))
        return records, CreatableTopicResult(
            name,
            topic_id=topic_id,
            num_partitions=len(assignments),
            replication_factor=len(assignments[0]),
        )

    def create_internal_topic(
        self,
        delta: MetadataDelta,
        name: str,
        num_partitions: int,
        replication_factor: int,
        configs: Mapping[str, str],
    ) -> list[MetadataRecord]:
        """The records that create the internal topic ``name`` over the active brokers of
        ``delta`` (replayed on it). The caller checked that the topic does not exist and
        that ``replication_factor`` active brokers do.

        Raises :class:`InvalidReplicationFactorError` if they do not, and
        :class:`~highwater.errors.InvalidConfigError` for bad ``configs``.
        """
        usable = [
            PlacementBroker(b.broker_id, b.rack)
            for _, b in sorted(delta.brokers().items())
            if b.is_active
        ]
        values = validate_topic_configs(configs)
        assignments = place_replicas(usable, num_partitions, replication_factor, self._rng)
        topic_id = self._new_topic_id(delta)
        records: list[MetadataRecord] = [TopicRecord(name=name, topic_id=topic_id)]
        records.extend(
            ConfigRecord(ConfigResourceType.TOPIC, name, key, value)
            for key, value in sorted(values.items())
        )
        for partition_id, replicas in enumerate(assignments):
            records.append(self._new_partition(delta, topic_id, partition_id, tuple(replicas)))
        delta.replay_all(records)
        return records

    def _validate_assignments(
        self, delta: MetadataDelta, assignments: list[tuple[int, ...]], *, first_partition: int
    ) -> None:
        width = len(assignments[0])
        for index, replicas in enumerate(assignments):
            partition_id = first_partition + index
            if not replicas:
                raise refuse(
                    ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                    f"The manual partition assignment for partition {partition_id} is empty.",
                )
            if len(set(replicas)) != len(replicas):
                raise refuse(
                    ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                    f"The manual partition assignment for partition {partition_id} names a "
                    f"broker twice: {list(replicas)}",
                )
            if len(replicas) != width:
                raise refuse(
                    ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                    f"All partitions should have the same number of replicas: partition "
                    f"{partition_id} has {len(replicas)}, not {width}",
                )
            for broker_id in replicas:
                if delta.broker(broker_id) is None:
                    raise refuse(
                        ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                        f"The manual partition assignment includes broker {broker_id}, but no "
                        "such broker is registered.",
                    )
            if not any(delta.is_active_broker(b) for b in replicas):
                raise refuse(
                    ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                    f"All brokers specified in the manual partition assignment for partition "
                    f"{partition_id} are fenced or in controlled shutdown.",
                )

    def _new_partition(
        self, delta: MetadataDelta, topic_id: str, partition_id: int, replicas: tuple[int, ...]
    ) -> PartitionRecord:
        isr = tuple(b for b in replicas if delta.is_active_broker(b))
        return PartitionRecord(
            topic_id=topic_id,
            partition_id=partition_id,
            replicas=replicas,
            isr=isr,
            leader=isr[0],
            leader_epoch=0,
            partition_epoch=0,
        )

    def _new_topic_id(self, delta: MetadataDelta) -> str:
        while True:
            raw = self._rng.getrandbits(128).to_bytes(16, "big")
            topic_id = base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")
            # Kafka never hands out ids that start with '-' (they read as CLI flags), nor
            # the zero id.
            if topic_id.startswith("-") or raw == bytes(16) or delta.has_topic_id(topic_id):
                continue
            return topic_id

    def delete_topics(
        self, image: MetadataImage, request: DeleteTopicsRequest
    ) -> ControllerResult[DeleteTopicsResponse]:
        """Delete topics by name or id: each gets a RemoveTopicRecord (which drops its
        partitions and configs).

        A topic asked for more than once (a name twice, an id twice, or a name and its
        topic's id) is not deleted: it is answered INVALID_REQUEST once, as Kafka's
        ``ControllerApis.deleteTopics`` answers it."""
        delta = MetadataDelta(image)
        records: list[MetadataRecord] = []
        results: list[DeletableTopicResult] = []
        names, ids = Counter(request.names), Counter(request.topic_ids)
        results += [
            DeletableTopicResult(name, "", ErrorCode.INVALID_REQUEST, "Duplicate topic name.")
            for name, count in names.items()
            if count > 1
        ]
        results += [
            DeletableTopicResult("", topic_id, ErrorCode.INVALID_REQUEST, "Duplicate topic id.")
            for topic_id, count in ids.items()
            if count > 1
        ]
        targets: list[tuple[str | None, str | None]] = []
        for asked_name, count in names.items():
            named_id = delta.topic_id(asked_name)
            if count > 1:
                continue
            if named_id is not None and named_id in ids:
                ids.pop(named_id)
                results.append(
                    DeletableTopicResult(
                        asked_name,
                        named_id,
                        ErrorCode.INVALID_REQUEST,
                        "The provided topic name maps to an ID that was already supplied.",
                    )
                )
            else:
                targets.append((asked_name, None))
        targets += [(None, asked_id) for asked_id, count in ids.items() if count == 1]
        for given_name, given_id in targets:
            topic_id = given_id if given_id is not None else delta.topic_id(given_name or "")
            name = delta.topic_name(topic_id) if topic_id is not None else None
            if topic_id is None or name is None:
                results.append(
                    DeletableTopicResult(
                        given_name or "",
                        given_id or "",
                        (
                            ErrorCode.UNKNOWN_TOPIC_ID
                            if given_id is not None
                            else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                        ),
                        f"No topic {given_name if given_name is not None else given_id!r}",
                    )
                )
                continue
            if name in INTERNAL_TOPICS:
                results.append(
                    DeletableTopicResult(
                        name,
                        topic_id,
                        ErrorCode.INVALID_REQUEST,
                        f"Topic {name} is an internal topic and cannot be deleted.",
                    )
                )
                continue
            record = RemoveTopicRecord(topic_id)
            delta.replay(record)
            records.append(record)
            results.append(DeletableTopicResult(name, topic_id))
        return ControllerResult(records, DeleteTopicsResponse(topics=tuple(results)))

    def create_partitions(
        self, image: MetadataImage, request: CreatePartitionsRequest
    ) -> ControllerResult[CreatePartitionsResponse]:
        """Grow topics to new partition counts (never shrink); new partitions are placed
        like the topic's first ones, with the same replication factor, or as the
        assignments of the new partitions say. Each topic succeeds or fails on its own, in
        Kafka's order (``ReplicationControlManager.createPartitions``): an unknown topic
        (UNKNOWN_TOPIC_OR_PARTITION), a count that is no increase (INVALID_PARTITIONS),
        assignments that are not one per new partition (INVALID_REPLICA_ASSIGNMENT).

        A name given more than once is answered once, INVALID_REQUEST "Duplicate topic
        name." (Kafka's ``ControllerApis.createPartitions``)."""
        delta = MetadataDelta(image)
        usable = [PlacementBroker(b.broker_id, b.rack) for b in image.active_brokers()]
        counts = Counter(topic.name for topic in request.topics)
        records: list[MetadataRecord] = []
        results: list[CreatePartitionsTopicResult] = []
        answered: set[str] = set()
        for topic in request.topics:
            if counts[topic.name] > 1:
                if topic.name not in answered:
                    answered.add(topic.name)
                    results.append(
                        CreatePartitionsTopicResult(
                            topic.name, ErrorCode.INVALID_REQUEST, DUPLICATE_TOPIC_NAME
                        )
                    )
                continue
            try:
                topic_records = self._create_partitions(delta, topic, usable)
            except ControllerApiError as e:
                results.append(CreatePartitionsTopicResult(topic.name, e.code, e.message))
                continue
            except InvalidReplicationFactorError as e:
                code, message = error_of(e)
                results.append(CreatePartitionsTopicResult(topic.name, code, message))
                continue
            results.append(CreatePartitionsTopicResult(topic.name))
            if not request.validate_only:
                delta.replay_all(topic_records)
                records.extend(topic_records)
        return ControllerResult(records, CreatePartitionsResponse(topics=tuple(results)))

    def _create_partitions(
        self, delta: MetadataDelta, topic: CreatePartitionsTopic, usable: list[PlacementBroker]
    ) -> list[MetadataRecord]:
        topic_id = delta.topic_id(topic.name)
        if topic_id is None:
            raise refuse(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"No topic {topic.name!r}")
        current = delta.partition_count(topic_id)
        if topic.count < current:
            raise refuse(
                ErrorCode.INVALID_PARTITIONS,
                f"The topic {topic.name} currently has {current} partition(s); {topic.count} "
                "would not be an increase.",
            )
        if topic.count == current:
            raise refuse(ErrorCode.INVALID_PARTITIONS, f"Topic already has {current} partition(s).")
        existing: list[tuple[int, ...]] = []
        for partition_id in range(current):
            partition = delta.partition(topic_id, partition_id)
            assert partition is not None
            existing.append(partition.replicas)
        factor = len(existing[0]) if existing else self.config.default_replication_factor
        new = topic.count - current
        if topic.assignments:
            assignments = list(topic.assignments)
            if len(assignments) != new:
                raise refuse(
                    ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                    f"Attempted to add {new} additional partition(s), but only "
                    f"{len(assignments)} assignment(s) were specified.",
                )
            self._validate_assignments(delta, assignments, first_partition=current)
            if len(assignments[0]) != factor:
                raise refuse(
                    ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                    f"The manual partition assignment has {len(assignments[0])} replica(s) per "
                    f"partition, but the topic's partitions have {factor}.",
                )
        else:
            assignments = place_replicas(usable, new, factor, self._rng, existing=existing)
        return [
            self._new_partition(delta, topic_id, current + index, tuple(replicas))
            for index, replicas in enumerate(assignments)
        ]


def _recover(builder: PartitionChangeBuilder, *, leader: int) -> None:
    builder.set_recovered_leader(leader)


def _collision_key(name: str) -> str:
    """Kafka's topic-name collision rule: '.' and '_' are the same in metric names."""
    return name.replace(".", "_")
