"""Cluster metadata as an immutable ``MetadataImage``, and the ``MetadataDelta`` that advances it.

Every broker replays the committed records of ``__cluster_metadata`` into a
:class:`MetadataDelta` on top of its current image and, at the end of each batch, calls
:meth:`MetadataDelta.apply` for the next image; the quorum controller builds the very
same image with the very same code. An image says which log offset (and Raft epoch) it
reflects, so "how stale is this metadata" is a comparison of offsets.

Images share structure: :meth:`MetadataDelta.apply` copies only what the records
changed. A sub-image that no record touched (brokers, topics, configs...) is the same
object in the next image; a changed topic shares the untouched chunks of its partition
vector (:class:`PartitionMap`), so one ISR change in a topic of 100,000 partitions copies
a chunk of :data:`PARTITION_CHUNK` entries and the chunk directory, not the topic.

The per-broker lookups (partitions a broker leads, hosts, is in the ISR of) come from a
:class:`PartitionSet` index built on first use; the next image derives its index from
the previous one by the partitions that changed, copying only the hash buckets they
touch, so a controller that asks every time pays for the changes, not for the cluster.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final, NamedTuple, TypeAlias, overload

from highwater.config.server import merge_cluster_defaults, topic_defaults
from highwater.config.topic import LogConfig
from highwater.errors import HighwaterError
from highwater.metadata.records import (
    NO_LEADER,
    BrokerEndpoint,
    BrokerRegistrationChangeRecord,
    ConfigRecord,
    ConfigResourceType,
    CoordinatorAssignmentRecord,
    FenceBrokerRecord,
    MetadataRecord,
    NoOpRecord,
    PartitionChangeRecord,
    PartitionRecord,
    ProducerIdsRecord,
    RegisterBrokerRecord,
    RegisterCoordinatorRecord,
    RemoveTopicRecord,
    TopicRecord,
    UnfenceBrokerRecord,
    UnregisterBrokerRecord,
    UnregisterCoordinatorRecord,
)
from highwater.v1.common_pb2 import ErrorCode

PARTITION_CHUNK: Final = 512
"""Partitions per chunk of a :class:`PartitionMap`: the unit of copy-on-write."""

SET_BUCKETS: Final = 64
"""Hash buckets of a :class:`PartitionSet`: the unit of copy-on-write of the broker index."""

_EMPTY_MAP: Final[Mapping[Any, Any]] = MappingProxyType({})


def _no_entries() -> Mapping[Any, Any]:
    """The shared empty read-only mapping, the default of every map in an image."""
    return _EMPTY_MAP


class MetadataReplayError(HighwaterError):
    """A record that cannot apply to the image (an unknown topic, a stale broker epoch...).

    Committed records always apply; this error means the log and the image disagree, a bug.
    """

    code = ErrorCode.UNKNOWN_SERVER_ERROR


class TopicIdPartition(NamedTuple):
    """A partition named by its topic's id, which survives renames and tells re-creations apart."""

    topic_id: str
    partition_id: int


class ConfigResource(NamedTuple):
    """What a dynamic config belongs to: a topic by name, a broker by id ("" for the cluster)."""

    type: ConfigResourceType
    name: str


# --- Brokers and coordinators ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BrokerRegistration:
    """A registered broker: its epoch, listeners, rack, and fencing and shutdown state."""

    broker_id: int
    incarnation_id: str
    broker_epoch: int
    listeners: tuple[BrokerEndpoint, ...] = ()
    rack: str | None = None
    fenced: bool = True
    in_controlled_shutdown: bool = False

    @property
    def is_active(self) -> bool:
        """Unfenced and not shutting down: may lead partitions and join ISRs (Kafka's "active")."""
        return not self.fenced and not self.in_controlled_shutdown

    def listener(self, name: str) -> BrokerEndpoint | None:
        for endpoint in self.listeners:
            if endpoint.name == name:
                return endpoint
        return None

    def to_record(self) -> RegisterBrokerRecord:
        return RegisterBrokerRecord(
            broker_id=self.broker_id,
            incarnation_id=self.incarnation_id,
            broker_epoch=self.broker_epoch,
            listeners=self.listeners,
            rack=self.rack,
            fenced=self.fenced,
            in_controlled_shutdown=self.in_controlled_shutdown,
        )


@dataclass(frozen=True, slots=True)
class CoordinatorRegistration:
    """A registered group coordinator."""

    coordinator_id: int
    incarnation_id: str
    registration_epoch: int
    listeners: tuple[BrokerEndpoint, ...] = ()
    rack: str | None = None

    def to_record(self) -> RegisterCoordinatorRecord:
        return RegisterCoordinatorRecord(
            coordinator_id=self.coordinator_id,
            incarnation_id=self.incarnation_id,
            registration_epoch=self.registration_epoch,
            listeners=self.listeners,
            rack=self.rack,
        )


@dataclass(frozen=True, slots=True)
class CoordinatorAssignment:
    """Who owns one ``__consumer_offsets`` partition, and since which coordinator epoch."""

    coordinator_id: int
    coordinator_epoch: int


@dataclass(frozen=True, slots=True)
class ClusterImage:
    """The registered brokers and coordinators, by id."""

    brokers: Mapping[int, BrokerRegistration] = field(default_factory=_no_entries)
    coordinators: Mapping[int, CoordinatorRegistration] = field(default_factory=_no_entries)


# --- Partitions and topics -------------------------------------------------------------


class PartitionRegistration(NamedTuple):
    """The replicas, ISR, leader and epochs of one partition.

    ``replicas[0]`` is the preferred leader. ``leader`` is :data:`NO_LEADER` when the
    partition is offline. The leader epoch grows at every leader change, the partition
    epoch at every change. A named tuple: the image holds one per partition, so it is
    built and stored as cheaply as Python allows.
    """

    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    leader: int
    leader_epoch: int = 0
    partition_epoch: int = 0
    removing_replicas: tuple[int, ...] = ()
    adding_replicas: tuple[int, ...] = ()

    @property
    def preferred_leader(self) -> int:
        return self.replicas[0] if self.replicas else NO_LEADER

    @property
    def has_leader(self) -> bool:
        return self.leader != NO_LEADER

    def merge(self, change: PartitionChangeRecord) -> PartitionRegistration:
        """This partition with ``change`` applied: the partition epoch grows by one, the
        leader epoch too when the change names a leader."""
        leader, leader_epoch = self.leader, self.leader_epoch
        if change.leader is not None:
            leader, leader_epoch = change.leader, leader_epoch + 1
        replicas = self.replicas if change.replicas is None else change.replicas
        isr = self.isr if change.isr is None else _share(change.isr, replicas)
        return PartitionRegistration(
            replicas=replicas,
            isr=isr,
            leader=leader,
            leader_epoch=leader_epoch,
            partition_epoch=self.partition_epoch + 1,
            removing_replicas=(
                self.removing_replicas
                if change.removing_replicas is None
                else change.removing_replicas
            ),
            adding_replicas=(
                self.adding_replicas if change.adding_replicas is None else change.adding_replicas
            ),
        )

    @classmethod
    def from_record(cls, record: PartitionRecord) -> PartitionRegistration:
        return cls(
            replicas=record.replicas,
            isr=_share(record.isr, record.replicas),
            leader=record.leader,
            leader_epoch=record.leader_epoch,
            partition_epoch=record.partition_epoch,
            removing_replicas=record.removing_replicas,
            adding_replicas=record.adding_replicas,
        )

    def to_record(self, topic_id: str, partition_id: int) -> PartitionRecord:
        return PartitionRecord(
            topic_id=topic_id,
            partition_id=partition_id,
            replicas=self.replicas,
            isr=self.isr,
            leader=self.leader,
            leader_epoch=self.leader_epoch,
            partition_epoch=self.partition_epoch,
            removing_replicas=self.removing_replicas,
            adding_replicas=self.adding_replicas,
        )


def _share(isr: tuple[int, ...], replicas: tuple[int, ...]) -> tuple[int, ...]:
    """``isr``, or ``replicas`` when equal: most partitions then hold one tuple, not two."""
    return replicas if isr == replicas else isr


class PartitionMap(Mapping[int, PartitionRegistration]):
    """A topic's partitions ``0..n-1`` as an immutable, chunked vector.

    :meth:`updated` returns a new map that shares every chunk it did not touch, so a
    change costs a chunk copy plus the chunk directory, whatever the topic's size.
    """

    __slots__ = ("_chunks", "_size")

    def __init__(self, partitions: Iterable[PartitionRegistration] = ()) -> None:
        flat = tuple(partitions)
        self._size = len(flat)
        self._chunks: tuple[tuple[PartitionRegistration, ...], ...] = tuple(
            flat[i : i + PARTITION_CHUNK] for i in range(0, len(flat), PARTITION_CHUNK)
        )

    @classmethod
    def _of(cls, chunks: tuple[tuple[PartitionRegistration, ...], ...], size: int) -> PartitionMap:
        new = cls.__new__(cls)
        new._chunks = chunks
        new._size = size
        return new

    def __getitem__(self, partition_id: int) -> PartitionRegistration:
        if not isinstance(partition_id, int) or not 0 <= partition_id < self._size:
            raise KeyError(partition_id)
        return self._chunks[partition_id // PARTITION_CHUNK][partition_id % PARTITION_CHUNK]

    def get(self, partition_id: int, default: object = None) -> PartitionRegistration | None:  # type: ignore[override]
        if 0 <= partition_id < self._size:
            return self._chunks[partition_id // PARTITION_CHUNK][partition_id % PARTITION_CHUNK]
        return default  # type: ignore[return-value]

    def __contains__(self, partition_id: object) -> bool:
        return isinstance(partition_id, int) and 0 <= partition_id < self._size

    def __len__(self) -> int:
        return self._size

    def __iter__(self) -> Iterator[int]:
        return iter(range(self._size))

    def registrations(self) -> Iterator[PartitionRegistration]:
        """Every partition's registration, in partition order."""
        for chunk in self._chunks:
            yield from chunk

    def updated(self, changes: Mapping[int, PartitionRegistration]) -> PartitionMap:
        """This map with ``changes`` applied; new partitions must extend ``0..n-1`` densely."""
        if not changes:
            return self
        size = self._size
        new_size = max(size, max(changes) + 1)
        if len([p for p in changes if p >= size]) != new_size - size or min(changes) < 0:
            raise MetadataReplayError(
                f"partitions {sorted(changes)} do not extend partitions 0..{size - 1} densely"
            )
        chunks = list(self._chunks)
        by_chunk: dict[int, list[tuple[int, PartitionRegistration]]] = {}
        for partition_id, registration in changes.items():
            by_chunk.setdefault(partition_id // PARTITION_CHUNK, []).append(
                (partition_id % PARTITION_CHUNK, registration)
            )
        for index in sorted(by_chunk):
            if index < len(chunks):
                chunk = list(chunks[index])
            else:
                chunk = []
                chunks.append(())
            for slot, registration in sorted(by_chunk[index], key=lambda item: item[0]):
                if slot < len(chunk):
                    chunk[slot] = registration
                else:
                    chunk.append(registration)
            chunks[index] = tuple(chunk)
        return PartitionMap._of(tuple(chunks), new_size)

    def __repr__(self) -> str:
        return f"PartitionMap({self._size} partitions)"


@dataclass(frozen=True, slots=True)
class TopicImage:
    """One topic: its name, id and partitions."""

    name: str
    topic_id: str
    partitions: PartitionMap = field(default_factory=PartitionMap)
    _keys: tuple[TopicIdPartition, ...] | None = field(default=None, compare=False, repr=False)

    def partition(self, partition_id: int) -> PartitionRegistration | None:
        return self.partitions.get(partition_id)

    def partition_keys(self) -> tuple[TopicIdPartition, ...]:
        """A :class:`TopicIdPartition` per partition, made once and shared by every index."""
        keys = self._keys
        if keys is None or len(keys) != len(self.partitions):
            keys = tuple(TopicIdPartition(self.topic_id, p) for p in range(len(self.partitions)))
            object.__setattr__(self, "_keys", keys)
        return keys


class PartitionSet(AbstractSet[TopicIdPartition]):
    """An immutable set of partitions kept in hash buckets.

    :meth:`updated` copies only the buckets it touches, so adding or removing a few
    partitions of a broker that hosts 30,000 costs a few hundred entries, not 30,000.
    """

    __slots__ = ("_buckets", "_size")

    def __init__(self, keys: Iterable[TopicIdPartition] = ()) -> None:
        grouped: list[list[TopicIdPartition]] = [[] for _ in range(SET_BUCKETS)]
        for key in keys:
            grouped[hash(key) % SET_BUCKETS].append(key)
        self._buckets = tuple(frozenset(bucket) if bucket else _NO_KEYS for bucket in grouped)
        self._size = sum(len(bucket) for bucket in self._buckets)

    def __contains__(self, key: object) -> bool:
        try:
            return key in self._buckets[hash(key) % SET_BUCKETS]
        except TypeError:
            return False

    def __iter__(self) -> Iterator[TopicIdPartition]:
        for bucket in self._buckets:
            yield from bucket

    def __len__(self) -> int:
        return self._size

    def __repr__(self) -> str:
        return f"PartitionSet({sorted(self)!r})"

    def updated(
        self, added: Iterable[TopicIdPartition], removed: Iterable[TopicIdPartition]
    ) -> PartitionSet:
        """This set with ``added`` and without ``removed``; untouched buckets are shared."""
        changes: dict[int, tuple[set[TopicIdPartition], set[TopicIdPartition]]] = {}
        for key in added:
            changes.setdefault(hash(key) % SET_BUCKETS, (set(), set()))[0].add(key)
        for key in removed:
            changes.setdefault(hash(key) % SET_BUCKETS, (set(), set()))[1].add(key)
        if not changes:
            return self
        buckets = list(self._buckets)
        size = self._size
        for index, (adds, removes) in changes.items():
            old = buckets[index]
            new = (old - removes) | adds
            size += len(new) - len(old)
            buckets[index] = frozenset(new) if new else _NO_KEYS
        result = PartitionSet.__new__(PartitionSet)
        result._buckets = tuple(buckets)
        result._size = size
        return result


_NO_KEYS: Final[frozenset[TopicIdPartition]] = frozenset()
EMPTY_PARTITION_SET: Final = PartitionSet()


class IndexKind(enum.Enum):
    """A per-broker index of partitions: the ones it leads, hosts, or is in the ISR of."""

    LEADERS = "leaders"
    REPLICAS = "replicas"
    ISR = "isr"

    def brokers(self, partition: PartitionRegistration) -> tuple[int, ...]:
        """The brokers under which ``partition`` is indexed (its leader may be NO_LEADER)."""
        if self is IndexKind.LEADERS:
            return (partition.leader,)
        if self is IndexKind.REPLICAS:
            return partition.replicas
        return partition.isr


BrokerIndex: TypeAlias = Mapping[int, PartitionSet]
"""Broker id -> the partitions indexed under it."""

IndexChange: TypeAlias = tuple[
    TopicIdPartition, PartitionRegistration | None, PartitionRegistration | None
]
"""A partition, its registration before (None: new) and after (None: deleted)."""


def build_broker_index(topics: Iterable[TopicImage], kind: IndexKind) -> BrokerIndex:
    """The index of ``kind`` over every partition of ``topics``."""
    index: dict[int, list[TopicIdPartition]] = {}
    for topic in topics:
        for key, registration in zip(
            topic.partition_keys(), topic.partitions.registrations(), strict=True
        ):
            for broker in kind.brokers(registration):
                members = index.get(broker)
                if members is None:
                    index[broker] = [key]
                else:
                    members.append(key)
    return _freeze(index)


def derive_broker_index(
    index: BrokerIndex, changes: Iterable[IndexChange], kind: IndexKind
) -> BrokerIndex:
    """``index`` after ``changes``, copying only the buckets of the brokers they touch."""
    change = _IndexChange(index)
    for key, old, new in changes:
        if old is not None:
            for broker in kind.brokers(old):
                change.remove(broker, key)
        if new is not None:
            for broker in kind.brokers(new):
                change.add(broker, key)
    return change.result()


def _freeze(index: dict[int, list[TopicIdPartition]]) -> Mapping[int, PartitionSet]:
    return MappingProxyType({broker: PartitionSet(keys) for broker, keys in index.items()})


class _IndexChange:
    """Additions and removals per broker, applied to copies of only the touched buckets."""

    def __init__(self, base: Mapping[int, PartitionSet]) -> None:
        self._base = base
        self._added: dict[int, set[TopicIdPartition]] = {}
        self._removed: dict[int, set[TopicIdPartition]] = {}

    def add(self, broker: int, key: TopicIdPartition) -> None:
        removed = self._removed.get(broker)
        if removed is not None and key in removed:
            removed.discard(key)
        else:
            self._added.setdefault(broker, set()).add(key)

    def remove(self, broker: int, key: TopicIdPartition) -> None:
        added = self._added.get(broker)
        if added is not None and key in added:
            added.discard(key)
        else:
            self._removed.setdefault(broker, set()).add(key)

    def result(self) -> Mapping[int, PartitionSet]:
        touched = {b for b, keys in self._added.items() if keys} | {
            b for b, keys in self._removed.items() if keys
        }
        if not touched:
            return self._base
        index = dict(self._base)
        for broker in touched:
            keys = index.get(broker, EMPTY_PARTITION_SET).updated(
                self._added.get(broker, ()), self._removed.get(broker, ())
            )
            if keys:
                index[broker] = keys
            else:
                index.pop(broker, None)
        return MappingProxyType(index)


@dataclass(frozen=True, slots=True)
class TopicsImage:
    """Every topic, by id and by name, and the per-broker indexes built from them on first use."""

    by_id: Mapping[str, TopicImage] = field(default_factory=_no_entries)
    by_name: Mapping[str, TopicImage] = field(default_factory=_no_entries)
    _indexes: dict[IndexKind, BrokerIndex] = field(default_factory=dict, compare=False, repr=False)

    def broker_index(self, kind: IndexKind) -> BrokerIndex:
        """The index of ``kind``, built on first use (derived, when the previous image had one)."""
        index = self._indexes.get(kind)
        if index is None:
            index = build_broker_index(self.by_id.values(), kind)
            self._indexes[kind] = index
        return index

    def built_indexes(self) -> dict[IndexKind, BrokerIndex]:
        """The indexes built so far."""
        return dict(self._indexes)


@dataclass(frozen=True, slots=True)
class ConfigurationsImage:
    """The dynamic config overrides of topics and brokers, as Kafka strings by key."""

    resources: Mapping[ConfigResource, Mapping[str, str]] = field(default_factory=_no_entries)

    def get(self, resource: ConfigResource) -> Mapping[str, str]:
        return self.resources.get(resource, _EMPTY_MAP)


@dataclass(frozen=True, slots=True)
class ProducerIdsImage:
    """The next producer id the controller hands out, and who got the last block."""

    next_producer_id: int = 0
    last_broker_id: int = NO_LEADER
    last_broker_epoch: int = -1


@dataclass(frozen=True, slots=True)
class CoordinatorsImage:
    """Which coordinator owns each ``__consumer_offsets`` partition."""

    assignments: Mapping[int, CoordinatorAssignment] = field(default_factory=_no_entries)


# --- The image -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MetadataImage:
    """The cluster metadata after the record at ``offset`` (of Raft epoch ``epoch``).

    ``offset`` is -1 for the empty image, before any record.
    """

    offset: int = -1
    epoch: int = -1
    cluster: ClusterImage = field(default_factory=ClusterImage)
    topics: TopicsImage = field(default_factory=TopicsImage)
    configs: ConfigurationsImage = field(default_factory=ConfigurationsImage)
    producer_ids: ProducerIdsImage = field(default_factory=ProducerIdsImage)
    coordinators: CoordinatorsImage = field(default_factory=CoordinatorsImage)

    @classmethod
    def empty(cls) -> MetadataImage:
        return cls()

    # Brokers ---------------------------------------------------------------------------

    @property
    def brokers(self) -> Mapping[int, BrokerRegistration]:
        return self.cluster.brokers

    def broker(self, broker_id: int) -> BrokerRegistration | None:
        return self.cluster.brokers.get(broker_id)

    def is_active_broker(self, broker_id: int) -> bool:
        """Registered, unfenced and not in controlled shutdown: may lead and join ISRs."""
        broker = self.cluster.brokers.get(broker_id)
        return broker is not None and broker.is_active

    def active_brokers(self) -> list[BrokerRegistration]:
        """The active brokers, by id."""
        return [b for _, b in sorted(self.cluster.brokers.items()) if b.is_active]

    # Topics and partitions -------------------------------------------------------------

    def topic(self, name: str) -> TopicImage | None:
        return self.topics.by_name.get(name)

    def topic_by_id(self, topic_id: str) -> TopicImage | None:
        return self.topics.by_id.get(topic_id)

    @overload
    def partition(self, topic: TopicIdPartition, /) -> PartitionRegistration | None: ...

    @overload
    def partition(self, topic: str, partition_id: int, /) -> PartitionRegistration | None: ...

    def partition(
        self, topic: str | TopicIdPartition, partition_id: int | None = None, /
    ) -> PartitionRegistration | None:
        """A partition by ``TopicIdPartition`` or by topic id and partition id."""
        if isinstance(topic, TopicIdPartition):
            topic, partition_id = topic
        assert partition_id is not None
        image = self.topics.by_id.get(topic)
        return None if image is None else image.partitions.get(partition_id)

    @property
    def partition_count(self) -> int:
        """The number of partitions of all topics."""
        return sum(len(t.partitions) for t in self.topics.by_id.values())

    def partitions(self) -> Iterator[tuple[TopicIdPartition, PartitionRegistration]]:
        """Every partition of every topic."""
        for topic in self.topics.by_id.values():
            for partition_id, registration in enumerate(topic.partitions.registrations()):
                yield TopicIdPartition(topic.topic_id, partition_id), registration

    def partitions_led_by(self, broker_id: int) -> PartitionSet:
        """The partitions ``broker_id`` leads (:data:`NO_LEADER`: those without a leader)."""
        return self.topics.broker_index(IndexKind.LEADERS).get(broker_id, EMPTY_PARTITION_SET)

    def partitions_without_leader(self) -> PartitionSet:
        return self.partitions_led_by(NO_LEADER)

    def replicas_of(self, broker_id: int) -> PartitionSet:
        """The partitions ``broker_id`` hosts a replica of."""
        return self.topics.broker_index(IndexKind.REPLICAS).get(broker_id, EMPTY_PARTITION_SET)

    def partitions_with_isr_member(self, broker_id: int) -> PartitionSet:
        """The partitions whose ISR includes ``broker_id``."""
        return self.topics.broker_index(IndexKind.ISR).get(broker_id, EMPTY_PARTITION_SET)

    def topic_name(self, topic_id: str) -> str | None:
        topic = self.topics.by_id.get(topic_id)
        return None if topic is None else topic.name

    # Configs, producer ids, coordinators -----------------------------------------------

    def topic_config(self, name: str) -> Mapping[str, str]:
        """The topic's dynamic overrides, in Kafka string form."""
        return self.configs.get(ConfigResource(ConfigResourceType.TOPIC, name))

    def log_config(self, name: str, defaults: LogConfig | None = None) -> LogConfig:
        """The topic's effective config: ``defaults`` (Kafka's), then the cluster defaults
        (:meth:`cluster_defaults`, as topic settings), then the topic's overrides."""
        base = defaults if defaults is not None else LogConfig()
        cluster = topic_defaults(self.cluster_defaults())
        if cluster:
            base = base.with_overrides(cluster)
        overrides = self.topic_config(name)
        return base.with_overrides(overrides) if overrides else base

    def cluster_defaults(self) -> dict[str, str]:
        """The cluster-wide defaults in force (server key names): the dynamic ones of the
        default-broker-config resource over the static ones of the controllers' files."""
        return merge_cluster_defaults(
            self.configs.get(ConfigResource(ConfigResourceType.STATIC_CLUSTER_DEFAULT, "")),
            self.broker_config(""),
        )

    def broker_config(self, broker: int | str) -> Mapping[str, str]:
        """A broker's dynamic overrides ("" for the cluster-wide defaults)."""
        return self.configs.get(ConfigResource(ConfigResourceType.BROKER, str(broker)))

    @property
    def next_producer_id(self) -> int:
        return self.producer_ids.next_producer_id

    def coordinator(self, coordinator_id: int) -> CoordinatorRegistration | None:
        return self.cluster.coordinators.get(coordinator_id)

    def coordinator_assignment(self, partition_id: int) -> CoordinatorAssignment | None:
        """The owner of ``__consumer_offsets`` partition ``partition_id``, if assigned."""
        return self.coordinators.assignments.get(partition_id)


# --- The delta -------------------------------------------------------------------------


class _TopicChange:
    """A topic created or changed within a delta: its base image (if any) and new partitions."""

    __slots__ = ("base", "count", "name", "partitions", "topic_id")

    def __init__(self, topic_id: str, name: str, base: TopicImage | None) -> None:
        self.topic_id = topic_id
        self.name = name
        self.base = base
        self.partitions: dict[int, PartitionRegistration] = {}
        self.count = len(base.partitions) if base is not None else 0

    def partition(self, partition_id: int) -> PartitionRegistration | None:
        registration = self.partitions.get(partition_id)
        if registration is None and self.base is not None:
            registration = self.base.partitions.get(partition_id)
        return registration

    def set_partition(self, partition_id: int, registration: PartitionRegistration) -> None:
        self.partitions[partition_id] = registration
        if partition_id >= self.count:
            self.count = partition_id + 1

    def partition_count(self) -> int:
        return self.count


class MetadataDelta:
    """Records replayed on top of an image; :meth:`apply` gives the next image.

    Reads (:meth:`broker`, :meth:`partition`...) see the replayed records, so the
    controller can stack the effects of one request's records before applying them.
    """

    def __init__(self, image: MetadataImage) -> None:
        self.image = image
        self._brokers: dict[int, BrokerRegistration | None] = {}
        self._coordinators: dict[int, CoordinatorRegistration | None] = {}
        self._assignments: dict[int, CoordinatorAssignment] = {}
        self._topics: dict[str, _TopicChange] = {}
        self._removed_topics: dict[str, TopicImage] = {}  # base topics removed, by id
        self._names: dict[str, str | None] = {}  # topic name -> id, None when removed
        self._configs: dict[ConfigResource, dict[str, str | None]] = {}
        self._cleared_configs: set[ConfigResource] = set()
        self._producer_ids: ProducerIdsImage | None = None
        self.record_count = 0

    # Reads -----------------------------------------------------------------------------

    def broker(self, broker_id: int) -> BrokerRegistration | None:
        if broker_id in self._brokers:
            return self._brokers[broker_id]
        return self.image.cluster.brokers.get(broker_id)

    def brokers(self) -> dict[int, BrokerRegistration]:
        """Every registered broker, by id."""
        brokers = dict(self.image.cluster.brokers)
        for broker_id, registration in self._brokers.items():
            if registration is None:
                brokers.pop(broker_id, None)
            else:
                brokers[broker_id] = registration
        return brokers

    def is_active_broker(self, broker_id: int) -> bool:
        broker = self.broker(broker_id)
        return broker is not None and broker.is_active

    def coordinator(self, coordinator_id: int) -> CoordinatorRegistration | None:
        if coordinator_id in self._coordinators:
            return self._coordinators[coordinator_id]
        return self.image.cluster.coordinators.get(coordinator_id)

    def coordinators(self) -> dict[int, CoordinatorRegistration]:
        coordinators = dict(self.image.cluster.coordinators)
        for coordinator_id, registration in self._coordinators.items():
            if registration is None:
                coordinators.pop(coordinator_id, None)
            else:
                coordinators[coordinator_id] = registration
        return coordinators

    def coordinator_assignment(self, partition_id: int) -> CoordinatorAssignment | None:
        if partition_id in self._assignments:
            return self._assignments[partition_id]
        return self.image.coordinators.assignments.get(partition_id)

    def coordinator_assignments(self) -> dict[int, CoordinatorAssignment]:
        """Every ``__consumer_offsets`` partition's assignment, by partition id."""
        assignments = dict(self.image.coordinators.assignments)
        assignments.update(self._assignments)
        return assignments

    def topic_id(self, name: str) -> str | None:
        """The id of the topic named ``name``, or None."""
        if name in self._names:
            return self._names[name]
        topic = self.image.topics.by_name.get(name)
        return None if topic is None else topic.topic_id

    def topic_name(self, topic_id: str) -> str | None:
        change = self._topics.get(topic_id)
        if change is not None:
            return change.name
        if topic_id in self._removed_topics:
            return None
        topic = self.image.topics.by_id.get(topic_id)
        return None if topic is None else topic.name

    def topic_names(self) -> list[str]:
        """Every topic's name."""
        names = {name for name in self.image.topics.by_name if name not in self._names}
        names.update(name for name, topic_id in self._names.items() if topic_id is not None)
        return sorted(names)

    def has_topic_id(self, topic_id: str) -> bool:
        return self.topic_name(topic_id) is not None

    def partition_count(self, topic_id: str) -> int:
        change = self._topics.get(topic_id)
        if change is not None:
            return change.partition_count()
        if topic_id in self._removed_topics:
            return 0
        topic = self.image.topics.by_id.get(topic_id)
        return 0 if topic is None else len(topic.partitions)

    def partition(self, topic_id: str, partition_id: int) -> PartitionRegistration | None:
        change = self._topics.get(topic_id)
        if change is not None:
            return change.partition(partition_id)
        if topic_id in self._removed_topics:
            return None
        return self.image.partition(topic_id, partition_id)

    def changed_partitions(self) -> Iterator[tuple[TopicIdPartition, PartitionRegistration]]:
        """The partitions the replayed records created or changed, with their new state."""
        for topic_id, change in self._topics.items():
            for partition_id, registration in change.partitions.items():
                yield TopicIdPartition(topic_id, partition_id), registration

    def config(self, resource: ConfigResource) -> dict[str, str]:
        """The resource's dynamic overrides after the replayed records."""
        values = {} if resource in self._cleared_configs else dict(self.image.configs.get(resource))
        for name, value in self._configs.get(resource, {}).items():
            if value is None:
                values.pop(name, None)
            else:
                values[name] = value
        return values

    def cluster_defaults(self) -> dict[str, str]:
        """:meth:`MetadataImage.cluster_defaults` after the replayed records."""
        return merge_cluster_defaults(
            self.config(ConfigResource(ConfigResourceType.STATIC_CLUSTER_DEFAULT, "")),
            self.config(ConfigResource(ConfigResourceType.BROKER, "")),
        )

    @property
    def next_producer_id(self) -> int:
        producer_ids = self._producer_ids or self.image.producer_ids
        return producer_ids.next_producer_id

    # Replay ----------------------------------------------------------------------------

    def replay(self, record: MetadataRecord) -> None:
        """Apply one record; :class:`MetadataReplayError` if it cannot apply."""
        handler = _HANDLERS.get(type(record))
        if handler is None:
            raise MetadataReplayError(f"no replay rule for {type(record).__name__}")
        handler(self, record)
        self.record_count += 1

    def replay_all(self, records: Iterable[MetadataRecord]) -> MetadataDelta:
        for record in records:
            self.replay(record)
        return self

    def _replay_register_broker(self, record: RegisterBrokerRecord) -> None:
        self._brokers[record.broker_id] = BrokerRegistration(
            broker_id=record.broker_id,
            incarnation_id=record.incarnation_id,
            broker_epoch=record.broker_epoch,
            listeners=record.listeners,
            rack=record.rack,
            fenced=record.fenced,
            in_controlled_shutdown=record.in_controlled_shutdown,
        )

    def _registered(self, broker_id: int, broker_epoch: int, what: str) -> BrokerRegistration:
        broker = self.broker(broker_id)
        if broker is None:
            raise MetadataReplayError(f"{what}: broker {broker_id} is not registered")
        if broker.broker_epoch != broker_epoch:
            raise MetadataReplayError(
                f"{what}: broker {broker_id} has epoch {broker.broker_epoch}, "
                f"the record names {broker_epoch}"
            )
        return broker

    def _change_broker(
        self, broker: BrokerRegistration, fenced: bool | None, in_controlled_shutdown: bool | None
    ) -> None:
        new_fenced = broker.fenced if fenced is None else fenced
        shutting_down = (
            broker.in_controlled_shutdown
            if in_controlled_shutdown is None
            else in_controlled_shutdown
        )
        if new_fenced:
            shutting_down = False  # a fenced broker is out of the cluster, not leaving it
        self._brokers[broker.broker_id] = BrokerRegistration(
            broker.broker_id,
            broker.incarnation_id,
            broker.broker_epoch,
            broker.listeners,
            broker.rack,
            new_fenced,
            shutting_down,
        )

    def _replay_fence_broker(self, record: FenceBrokerRecord) -> None:
        broker = self._registered(record.broker_id, record.broker_epoch, "FenceBrokerRecord")
        self._change_broker(broker, True, False)

    def _replay_unfence_broker(self, record: UnfenceBrokerRecord) -> None:
        broker = self._registered(record.broker_id, record.broker_epoch, "UnfenceBrokerRecord")
        self._change_broker(broker, False, None)

    def _replay_broker_registration_change(self, record: BrokerRegistrationChangeRecord) -> None:
        broker = self._registered(
            record.broker_id, record.broker_epoch, "BrokerRegistrationChangeRecord"
        )
        self._change_broker(broker, record.fenced, record.in_controlled_shutdown)

    def _replay_unregister_broker(self, record: UnregisterBrokerRecord) -> None:
        self._registered(record.broker_id, record.broker_epoch, "UnregisterBrokerRecord")
        self._brokers[record.broker_id] = None

    def _replay_topic(self, record: TopicRecord) -> None:
        if self.topic_id(record.name) is not None:
            raise MetadataReplayError(f"TopicRecord: topic {record.name!r} already exists")
        if self.has_topic_id(record.topic_id):
            raise MetadataReplayError(f"TopicRecord: topic id {record.topic_id} already exists")
        self._topics[record.topic_id] = _TopicChange(record.topic_id, record.name, None)
        self._names[record.name] = record.topic_id

    def _topic_change(self, topic_id: str, what: str) -> _TopicChange:
        change = self._topics.get(topic_id)
        if change is None:
            base = None if topic_id in self._removed_topics else self.image.topic_by_id(topic_id)
            if base is None:
                raise MetadataReplayError(f"{what}: no topic with id {topic_id}")
            change = _TopicChange(topic_id, base.name, base)
            self._topics[topic_id] = change
        return change

    def _replay_partition(self, record: PartitionRecord) -> None:
        change = self._topic_change(record.topic_id, "PartitionRecord")
        if not 0 <= record.partition_id <= change.partition_count():
            raise MetadataReplayError(
                f"PartitionRecord: partition {record.partition_id} of topic {change.name!r} "
                f"does not follow its {change.partition_count()} partitions"
            )
        change.set_partition(record.partition_id, PartitionRegistration.from_record(record))

    def _replay_partition_change(self, record: PartitionChangeRecord) -> None:
        change = self._topic_change(record.topic_id, "PartitionChangeRecord")
        current = change.partition(record.partition_id)
        if current is None:
            raise MetadataReplayError(
                f"PartitionChangeRecord: topic {change.name!r} has no partition "
                f"{record.partition_id}"
            )
        change.set_partition(record.partition_id, current.merge(record))

    def _replay_remove_topic(self, record: RemoveTopicRecord) -> None:
        name = self.topic_name(record.topic_id)
        if name is None:
            raise MetadataReplayError(f"RemoveTopicRecord: no topic with id {record.topic_id}")
        change = self._topics.pop(record.topic_id, None)
        base = change.base if change is not None else self.image.topic_by_id(record.topic_id)
        if base is not None:
            self._removed_topics[record.topic_id] = base
        self._names[name] = None
        resource = ConfigResource(ConfigResourceType.TOPIC, name)
        self._cleared_configs.add(resource)
        self._configs.pop(resource, None)

    def _replay_config(self, record: ConfigRecord) -> None:
        resource = ConfigResource(record.resource_type, record.resource_name)
        self._configs.setdefault(resource, {})[record.name] = record.value

    def _replay_producer_ids(self, record: ProducerIdsRecord) -> None:
        if record.next_producer_id < self.next_producer_id:
            raise MetadataReplayError(
                f"ProducerIdsRecord: next producer id {record.next_producer_id} is below "
                f"{self.next_producer_id}"
            )
        self._producer_ids = ProducerIdsImage(
            record.next_producer_id, record.broker_id, record.broker_epoch
        )

    def _replay_register_coordinator(self, record: RegisterCoordinatorRecord) -> None:
        self._coordinators[record.coordinator_id] = CoordinatorRegistration(
            record.coordinator_id,
            record.incarnation_id,
            record.registration_epoch,
            record.listeners,
            record.rack,
        )

    def _replay_unregister_coordinator(self, record: UnregisterCoordinatorRecord) -> None:
        coordinator = self.coordinator(record.coordinator_id)
        if coordinator is None or coordinator.registration_epoch != record.registration_epoch:
            raise MetadataReplayError(
                f"UnregisterCoordinatorRecord: coordinator {record.coordinator_id} of epoch "
                f"{record.registration_epoch} is not registered"
            )
        self._coordinators[record.coordinator_id] = None

    def _replay_coordinator_assignment(self, record: CoordinatorAssignmentRecord) -> None:
        current = self.coordinator_assignment(record.partition_id)
        if current is not None and record.coordinator_epoch <= current.coordinator_epoch:
            raise MetadataReplayError(
                f"CoordinatorAssignmentRecord: partition {record.partition_id} has coordinator "
                f"epoch {current.coordinator_epoch}, the record {record.coordinator_epoch}"
            )
        self._assignments[record.partition_id] = CoordinatorAssignment(
            record.coordinator_id, record.coordinator_epoch
        )

    def _replay_no_op(self, record: NoOpRecord) -> None:
        pass

    # Apply -----------------------------------------------------------------------------

    def apply(self, offset: int, epoch: int | None = None) -> MetadataImage:
        """The image after the replayed records, the last of which is at ``offset``.

        ``epoch`` defaults to the base image's.
        """
        image = self.image
        return MetadataImage(
            offset=offset,
            epoch=image.epoch if epoch is None else epoch,
            cluster=self._apply_cluster(),
            topics=self._apply_topics(),
            configs=self._apply_configs(),
            producer_ids=self._producer_ids or image.producer_ids,
            coordinators=self._apply_coordinators(),
        )

    def _apply_cluster(self) -> ClusterImage:
        cluster = self.image.cluster
        if not self._brokers and not self._coordinators:
            return cluster
        brokers = cluster.brokers
        if self._brokers:
            brokers = MappingProxyType(self.brokers())
        coordinators = cluster.coordinators
        if self._coordinators:
            coordinators = MappingProxyType(self.coordinators())
        return ClusterImage(brokers, coordinators)

    def _apply_topics(self) -> TopicsImage:
        topics = self.image.topics
        if not self._topics and not self._removed_topics:
            return topics
        by_id = dict(topics.by_id)
        by_name = dict(topics.by_name)
        index_changes: list[IndexChange] = []
        built = topics.built_indexes()
        track = bool(built)
        for topic_id, removed in self._removed_topics.items():
            del by_id[topic_id]
            if by_name.get(removed.name) is removed:
                del by_name[removed.name]
            if track:
                for partition_id, gone in enumerate(removed.partitions.registrations()):
                    index_changes.append((TopicIdPartition(topic_id, partition_id), gone, None))
        for topic_id, change in self._topics.items():
            base = change.base
            partitions = (base.partitions if base is not None else PartitionMap()).updated(
                change.partitions
            )
            # The partition keys stay valid as long as the topic keeps its partition count.
            keys = (
                base._keys if base is not None and len(partitions) == len(base.partitions) else None
            )
            topic = TopicImage(change.name, topic_id, partitions, keys)
            by_id[topic_id] = topic
            by_name[change.name] = topic
            if track:
                for partition_id, new in change.partitions.items():
                    old = base.partitions.get(partition_id) if base is not None else None
                    index_changes.append((TopicIdPartition(topic_id, partition_id), old, new))
        indexes = {
            kind: derive_broker_index(index, index_changes, kind) for kind, index in built.items()
        }
        return TopicsImage(MappingProxyType(by_id), MappingProxyType(by_name), indexes)

    def _apply_configs(self) -> ConfigurationsImage:
        configs = self.image.configs
        if not self._configs and not self._cleared_configs:
            return configs
        resources = dict(configs.resources)
        for resource in self._cleared_configs | set(self._configs):
            values = self.config(resource)
            if values:
                resources[resource] = MappingProxyType(values)
            else:
                resources.pop(resource, None)
        return ConfigurationsImage(MappingProxyType(resources))

    def _apply_coordinators(self) -> CoordinatorsImage:
        coordinators = self.image.coordinators
        if not self._assignments:
            return coordinators
        assignments = dict(coordinators.assignments)
        assignments.update(self._assignments)
        return CoordinatorsImage(MappingProxyType(assignments))


_HANDLERS: Final[dict[type[Any], Callable[[MetadataDelta, Any], None]]] = {
    RegisterBrokerRecord: MetadataDelta._replay_register_broker,
    FenceBrokerRecord: MetadataDelta._replay_fence_broker,
    UnfenceBrokerRecord: MetadataDelta._replay_unfence_broker,
    BrokerRegistrationChangeRecord: MetadataDelta._replay_broker_registration_change,
    UnregisterBrokerRecord: MetadataDelta._replay_unregister_broker,
    TopicRecord: MetadataDelta._replay_topic,
    PartitionRecord: MetadataDelta._replay_partition,
    PartitionChangeRecord: MetadataDelta._replay_partition_change,
    RemoveTopicRecord: MetadataDelta._replay_remove_topic,
    ConfigRecord: MetadataDelta._replay_config,
    ProducerIdsRecord: MetadataDelta._replay_producer_ids,
    RegisterCoordinatorRecord: MetadataDelta._replay_register_coordinator,
    UnregisterCoordinatorRecord: MetadataDelta._replay_unregister_coordinator,
    CoordinatorAssignmentRecord: MetadataDelta._replay_coordinator_assignment,
    NoOpRecord: MetadataDelta._replay_no_op,
}


def replay(
    records: Iterable[MetadataRecord],
    offset: int,
    epoch: int | None = None,
    image: MetadataImage | None = None,
) -> MetadataImage:
    """The image after replaying ``records`` on ``image`` (empty by default)."""
    base = image if image is not None else MetadataImage.empty()
    return MetadataDelta(base).replay_all(records).apply(offset, epoch)


class MetadataLoader:
    """Replays committed batches, in offset order, into images: what every broker runs.

    The controller's Raft layer, or any other store of the metadata log, hands it each
    committed batch (:meth:`load_batch`) or a snapshot image (:meth:`load_snapshot`);
    :attr:`image` is then the image of everything committed so far.
    """

    def __init__(self, image: MetadataImage | None = None) -> None:
        self.image = image if image is not None else MetadataImage.empty()

    def load_batch(
        self, base_offset: int, epoch: int, records: Iterable[MetadataRecord]
    ) -> MetadataImage:
        """Apply the records at ``base_offset``, ``base_offset + 1``...; returns the new image.

        The batch may start past ``image.offset + 1``: the Raft log interleaves control
        batches (a leader's epoch-start marker) that take offsets but hold no metadata.
        Raises :class:`MetadataReplayError` if the batch starts at or below the image.
        """
        if base_offset <= self.image.offset:
            raise MetadataReplayError(
                f"batch at offset {base_offset} does not follow the image at {self.image.offset}"
            )
        delta = MetadataDelta(self.image).replay_all(records)
        if delta.record_count == 0:
            return self.image
        self.image = delta.apply(base_offset + delta.record_count - 1, epoch)
        return self.image

    def load_snapshot(self, image: MetadataImage) -> MetadataImage:
        """Replace the image by a snapshot's (which must not go backwards)."""
        if image.offset < self.image.offset:
            raise MetadataReplayError(
                f"snapshot at offset {image.offset} is older than the image at {self.image.offset}"
            )
        self.image = image
        return image
