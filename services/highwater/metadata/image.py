"""Cluster metadata as an immutable ``MetadataImage``: brokers, topics, configs, coordinators.

An image is the cluster metadata after one offset of ``__cluster_metadata`` (and of one
Raft epoch), so "how stale is this metadata" is a comparison of offsets. Every broker and
the quorum controller build it with the same code: records replay into a
:class:`~highwater.metadata.delta.MetadataDelta` that applies them for the next image.

Images share structure. A per-area image (:class:`ClusterImage`, :class:`TopicsImage`,
:class:`ConfigurationsImage`...) that no record touched is the same object in the next
image; a changed topic shares the untouched chunks of its partition vector (a
:class:`~highwater.metadata.persistent.PartitionMap`), so one ISR change in a topic of
100,000 partitions copies a chunk of
:data:`~highwater.metadata.persistent.PARTITION_CHUNK` entries and the chunk directory,
not the topic.

The per-broker lookups (partitions a broker leads, hosts, is in the ISR or the ELR of) come from an
index of :class:`~highwater.metadata.persistent.PartitionSet` built on first use; the
next image derives its index from the previous one by the partitions that changed
(:func:`derive_broker_index`), copying only the groups (a topic's range of partition ids)
they touch, so a controller that asks every time pays for the changes, not for the
cluster, and a sorted batch of leader moves pays for its own partitions, not for every
partition of the broker it moves them off.
"""

from __future__ import annotations

import enum
import operator
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final, NamedTuple, TypeAlias, overload

from highwater.config.server import SERVER_CONFIG_DEF, merge_cluster_defaults, topic_defaults
from highwater.config.topic import LogConfig
from highwater.metadata.client_quotas import ClientQuotasImage
from highwater.metadata.persistent import (
    EMPTY_PARTITION_SET,
    SET_SPAN,
    PartitionMap,
    PartitionSet,
)
from highwater.metadata.records import (
    NO_LEADER,
    BrokerEndpoint,
    ConfigResourceType,
    PartitionChangeRecord,
    PartitionRecord,
    RegisterBrokerRecord,
    RegisterCoordinatorRecord,
)
from highwater.security import AclAuthorizer, AclBinding
from highwater.security.scram import ScramCredential

_EMPTY_MAP: Final[Mapping[Any, Any]] = MappingProxyType({})


def _no_entries() -> Mapping[Any, Any]:
    """The shared empty read-only mapping, the default of every map in an image."""
    return _EMPTY_MAP


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
    log_dirs: tuple[str, ...] = ()
    """The ids of the log directories online when it registered (KIP-858)."""
    principal: str = ""
    """The principal that registered it with the ACL checks on ("" otherwise): the only
    one that may speak for this node id (``security/node_identities.py``)."""
    unclean_shutdown: bool = False
    """Registered after an unclean shutdown (KIP-966) and not unfenced since: the
    removals from its ELR memberships are still owed, and whichever controller is active
    writes them before unfencing it (``ReplicationControl.resume_moves``)."""

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
            log_dirs=self.log_dirs,
            principal=self.principal,
            unclean_shutdown=self.unclean_shutdown,
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
    """Who owns one ``__consumer_offsets`` partition, and since which coordinator epoch;
    ``revoked_from``: nobody, while the partition is taken from that live coordinator."""

    coordinator_id: int
    coordinator_epoch: int
    revoked_from: int | None = None


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
    elr: tuple[int, ...] = ()
    """Eligible leader replicas (KIP-966): out of the ISR, holding every committed record."""
    last_known_elr: tuple[int, ...] = ()
    """Former ELR members whose unclean shutdown may have lost records."""

    @property
    def preferred_leader(self) -> int:
        return self.replicas[0] if self.replicas else NO_LEADER

    @property
    def has_leader(self) -> bool:
        return self.leader != NO_LEADER

    def merge(self, change: PartitionChangeRecord) -> PartitionRegistration:
        """This partition with ``change`` applied: the partition epoch grows by one, the
        leader epoch too when the change names a leader.

        Every controller decision and every replay of a ``PartitionChangeRecord`` runs
        this (five times per leader move in a controlled shutdown: the decision, the
        store's replay and each broker's), so it unpacks the fields once and builds the
        tuple positionally (``tuple.__new__``), without the named tuple's keyword
        ``__new__``."""
        replicas, isr, leader, leader_epoch, epoch, removing, adding, elr, last_known = self
        if change.leader is not None:
            leader = change.leader
            leader_epoch += 1
        if change.replicas is not None:
            replicas = change.replicas
        if change.isr is not None:
            isr = replicas if change.isr == replicas else change.isr
        if change.removing_replicas is not None:
            removing = change.removing_replicas
        if change.adding_replicas is not None:
            adding = change.adding_replicas
        if change.eligible_leader_replicas is not None:
            elr = change.eligible_leader_replicas
        if change.last_known_elr is not None:
            last_known = change.last_known_elr
        return _new_tuple(
            PartitionRegistration,
            (replicas, isr, leader, leader_epoch, epoch + 1, removing, adding, elr, last_known),
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
            elr=record.eligible_leader_replicas,
            last_known_elr=record.last_known_elr,
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
            eligible_leader_replicas=self.elr,
            last_known_elr=self.last_known_elr,
        )


_new_tuple: Final = tuple.__new__
"""Builds a named tuple from a plain tuple of its fields, in order (no keyword parsing)."""


def _share(isr: tuple[int, ...], replicas: tuple[int, ...]) -> tuple[int, ...]:
    """``isr``, or ``replicas`` when equal: most partitions then hold one tuple, not two."""
    return replicas if isr == replicas else isr


@dataclass(frozen=True, slots=True)
class TopicImage:
    """One topic: its name, id and partitions."""

    name: str
    topic_id: str
    partitions: PartitionMap[PartitionRegistration] = field(default_factory=PartitionMap)
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


# --- Per-broker indexes ---------------------------------------------------------------


class IndexKind(enum.Enum):
    """A per-broker index of partitions: the ones it leads, hosts, is in the ISR of, or is
    an eligible leader replica of (KIP-966; Kafka's ``BrokersToElrs``)."""

    LEADERS = "leaders"
    REPLICAS = "replicas"
    ISR = "isr"
    ELR = "elr"

    def brokers(self, partition: PartitionRegistration) -> tuple[int, ...]:
        """The brokers under which ``partition`` is indexed (its leader may be NO_LEADER)."""
        if self is IndexKind.LEADERS:
            return (partition.leader,)
        if self is IndexKind.REPLICAS:
            return partition.replicas
        if self is IndexKind.ELR:
            return partition.elr
        return partition.isr


_MEMBERS: Final[dict[IndexKind, Callable[[PartitionRegistration], tuple[int, ...]]]] = {
    IndexKind.REPLICAS: operator.attrgetter("replicas"),
    IndexKind.ISR: operator.attrgetter("isr"),
    IndexKind.ELR: operator.attrgetter("elr"),
}
"""The brokers a partition is indexed under, per kind of index that holds lists of them."""

BrokerIndex: TypeAlias = Mapping[int, PartitionSet[TopicIdPartition]]
"""Broker id -> the partitions indexed under it."""

IndexChange: TypeAlias = tuple[
    TopicIdPartition, PartitionRegistration | None, PartitionRegistration | None
]
"""A partition, its registration before (None: new) and after (None: deleted)."""


def build_broker_index(topics: Iterable[TopicImage], kind: IndexKind) -> BrokerIndex:
    """The index of ``kind`` over every partition of ``topics``.

    Built a group of :data:`~highwater.metadata.persistent.SET_SPAN` partitions at a
    time, straight into each broker's :class:`PartitionSet` groups: one pass, one list
    append per (partition, broker) and one frozenset per group, nothing hashed twice.
    """
    groups: dict[int, dict[tuple[str, int], frozenset[TopicIdPartition]]] = {}
    for topic in topics:
        topic_id = topic.topic_id
        keys = topic.partition_keys()
        registrations = tuple(topic.partitions.registrations())
        for span, start in enumerate(range(0, len(keys), SET_SPAN)):
            members: defaultdict[int, list[TopicIdPartition]] = defaultdict(list)
            pairs = zip(
                keys[start : start + SET_SPAN],
                registrations[start : start + SET_SPAN],
                strict=True,
            )
            if kind is IndexKind.LEADERS:
                for key, registration in pairs:
                    members[registration.leader].append(key)
            elif kind is IndexKind.REPLICAS:
                for key, registration in pairs:
                    for broker in registration.replicas:
                        members[broker].append(key)
            elif kind is IndexKind.ELR:
                for key, registration in pairs:
                    for broker in registration.elr:
                        members[broker].append(key)
            else:
                for key, registration in pairs:
                    for broker in registration.isr:
                        members[broker].append(key)
            group = (topic_id, span)
            for broker, found in members.items():
                by_group = groups.get(broker)
                if by_group is None:
                    by_group = groups[broker] = {}
                by_group[group] = frozenset(found)
    return MappingProxyType(
        {broker: PartitionSet.of_groups(by_group) for broker, by_group in groups.items()}
    )


def derive_broker_index(
    index: BrokerIndex, changes: Iterable[IndexChange], kind: IndexKind
) -> BrokerIndex:
    """``index`` after ``changes`` (each partition at most once), copying only the groups
    of the brokers they touch.

    Only the brokers a change really moves the partition between count: a leader move
    touches the old and the new leader's entries of the leader index, an ISR shrink the
    ISR entry of the broker that left, and a change that keeps them (an epoch bump, an
    ELR update) touches nothing. The keys are gathered per broker in one pass and each
    broker's entry is updated once (:meth:`PartitionSet.updated`, group by group): a
    controlled shutdown's batch costs the index one list append per partition the broker
    leaves, not a set operation per ISR member and leader of every partition it changed.
    """
    added: dict[int, list[TopicIdPartition]] = {}
    removed: dict[int, list[TopicIdPartition]] = {}

    def note(into: dict[int, list[TopicIdPartition]], broker: int, key: TopicIdPartition) -> None:
        keys = into.get(broker)
        if keys is None:
            into[broker] = [key]
        else:
            keys.append(key)

    if kind is IndexKind.LEADERS:
        for key, old, new in changes:
            leader_before = NO_LEADER if old is None else old.leader
            leader_after = NO_LEADER if new is None else new.leader
            if old is not None and new is not None and leader_before == leader_after:
                continue
            if old is not None:
                note(removed, leader_before, key)
            if new is not None:
                note(added, leader_after, key)
    else:
        members = _MEMBERS[kind]
        for key, old, new in changes:
            before: tuple[int, ...] = () if old is None else members(old)
            after: tuple[int, ...] = () if new is None else members(new)
            if before is after or before == after:
                continue
            for broker in before:
                if broker not in after:
                    note(removed, broker, key)
            for broker in after:
                if broker not in before:
                    note(added, broker, key)
    if not added and not removed:
        return index
    result = dict(index)
    for broker in added.keys() | removed.keys():
        keys = result.get(broker, EMPTY_PARTITION_SET).updated(
            added.get(broker, ()), removed.get(broker, ())
        )
        if keys:
            result[broker] = keys
        else:
            result.pop(broker, None)
    return MappingProxyType(result)


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


class AclsImage:
    """The cluster's ACLs by id, and the authorizer over them.

    The authorizer's index is built once per image that changed the ACLs, and once per
    broker setting of ``super.users`` / ``allow.everyone.if.no.acl.found``: an image whose
    records left the ACLs alone shares this object, and so its authorizer, with the image
    before it.
    """

    __slots__ = ("_authorizers", "by_id")

    def __init__(self, by_id: Mapping[str, AclBinding] | None = None) -> None:
        self.by_id: Mapping[str, AclBinding] = MappingProxyType(dict(by_id or {}))
        self._authorizers: dict[tuple[frozenset[str], bool], AclAuthorizer] = {}

    def __len__(self) -> int:
        return len(self.by_id)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, AclsImage):
            return NotImplemented
        return self.by_id == other.by_id

    def __hash__(self) -> int:
        return hash(frozenset(self.by_id.items()))

    def __repr__(self) -> str:
        return f"AclsImage({dict(self.by_id)!r})"

    def authorizer(
        self, super_users: Iterable[str] = (), *, allow_everyone_if_no_acl_found: bool = False
    ) -> AclAuthorizer:
        key = (frozenset(super_users), allow_everyone_if_no_acl_found)
        authorizer = self._authorizers.get(key)
        if authorizer is None:
            authorizer = self._authorizers[key] = AclAuthorizer(
                self.by_id.values(),
                super_users=key[0],
                allow_everyone_if_no_acl_found=allow_everyone_if_no_acl_found,
            )
        return authorizer


@dataclass(frozen=True, slots=True)
class ScramImage:
    """The users' SCRAM credentials, by user name and mechanism name."""

    credentials: Mapping[tuple[str, str], ScramCredential] = field(default_factory=_no_entries)

    def credential(self, user: str, mechanism: str) -> ScramCredential | None:
        """What a SCRAM exchange checks ``user`` against (``None``: no such credential)."""
        return self.credentials.get((user, mechanism))

    def users(self) -> dict[str, list[ScramCredential]]:
        """Every user with a credential, and its credentials, by name."""
        found: dict[str, list[ScramCredential]] = {}
        for (user, _), credential in sorted(self.credentials.items()):
            found.setdefault(user, []).append(credential)
        return found


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


@dataclass(frozen=True, slots=True)
class MigrationImage:
    """Where a migration from the etcd metadata mode stands (0: none in this log, else a
    :class:`~highwater.metadata.records.MigrationStateRecord` state) and etcd's
    ``metadata_offset`` when its state was copied, and the offset of the batch that copied
    it (-1: none)."""

    state: int = 0
    etcd_metadata_offset: int = 0
    copied_offset: int = -1


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
    acls: AclsImage = field(default_factory=AclsImage)
    scram: ScramImage = field(default_factory=ScramImage)
    client_quotas: ClientQuotasImage = field(default_factory=ClientQuotasImage)
    migration: MigrationImage = field(default_factory=MigrationImage)

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

    def partitions_led_by(self, broker_id: int) -> PartitionSet[TopicIdPartition]:
        """The partitions ``broker_id`` leads (:data:`NO_LEADER`: those without a leader)."""
        return self.topics.broker_index(IndexKind.LEADERS).get(broker_id, EMPTY_PARTITION_SET)

    def partitions_without_leader(self) -> PartitionSet[TopicIdPartition]:
        return self.partitions_led_by(NO_LEADER)

    def replicas_of(self, broker_id: int) -> PartitionSet[TopicIdPartition]:
        """The partitions ``broker_id`` hosts a replica of."""
        return self.topics.broker_index(IndexKind.REPLICAS).get(broker_id, EMPTY_PARTITION_SET)

    def partitions_with_isr_member(self, broker_id: int) -> PartitionSet[TopicIdPartition]:
        """The partitions whose ISR includes ``broker_id``."""
        return self.topics.broker_index(IndexKind.ISR).get(broker_id, EMPTY_PARTITION_SET)

    def partitions_with_elr_member(self, broker_id: int) -> PartitionSet[TopicIdPartition]:
        """The partitions whose eligible leader replicas (KIP-966) include ``broker_id``."""
        return self.topics.broker_index(IndexKind.ELR).get(broker_id, EMPTY_PARTITION_SET)

    def topic_name(self, topic_id: str) -> str | None:
        topic = self.topics.by_id.get(topic_id)
        return None if topic is None else topic.name

    # Configs, producer ids, coordinators -----------------------------------------------

    def topic_config(self, name: str) -> Mapping[str, str]:
        """The topic's dynamic overrides, in Kafka string form."""
        return self.configs.get(ConfigResource(ConfigResourceType.TOPIC, name))

    def log_config(
        self, name: str, defaults: LogConfig | None = None, *, invalid: list[str] | None = None
    ) -> LogConfig:
        """The topic's effective config: ``defaults`` (Kafka's), then the cluster defaults
        (:meth:`cluster_defaults`, as topic settings), then the topic's overrides.

        A stored value that does not validate raises :class:`InvalidConfigError`; with
        ``invalid`` given it is left out instead (the setting keeps the value of the layer
        below) and its error appended to ``invalid``: a broker keeps serving a topic whose
        stored config a later release validates more strictly, as Kafka's does."""
        base = defaults if defaults is not None else LogConfig()
        cluster_defaults = self.cluster_defaults()
        if invalid is not None:
            cluster_defaults = SERVER_CONFIG_DEF.valid_entries(
                {k: v for k, v in cluster_defaults.items() if k in SERVER_CONFIG_DEF}, invalid
            )
        cluster = topic_defaults(cluster_defaults)
        if cluster and invalid is not None:
            cluster = LogConfig.DEFINITION.valid_entries(cluster, invalid)
        if cluster:
            base = base.with_overrides(cluster)
        overrides = self.topic_config(name)
        if overrides and invalid is not None:
            overrides = LogConfig.DEFINITION.valid_entries(overrides, invalid)
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
