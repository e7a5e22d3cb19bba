"""The records of the metadata log as immutable values, and their bytes in the Raft log.

One class per message of ``protos/highwater/internal/v1/metadata.proto``, field for field (KIP-631
and KIP-746 names). The quorum controller produces them, the Raft log stores each as one
value (:func:`encode_record`), and every broker and controller decodes them
(:func:`decode_record`) and replays them into a :class:`~highwater.metadata.image.MetadataImage`.

Conventions, as in the proto: ``-1`` (:data:`NO_LEADER`) is "no leader"; in a
:class:`PartitionChangeRecord` (and :class:`BrokerRegistrationChangeRecord`) a ``None``
field is "unchanged"; a :class:`ConfigRecord` without a value deletes the key.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Final, TypeAlias

from google.protobuf.message import DecodeError

from highwater.config.listeners import Listeners
from highwater.errors import CorruptRecordError
from highwater.internal.v1 import metadata_pb2 as pb
from highwater.security import AclBinding

NO_LEADER: Final = -1
"""The leader of a partition that has none (offline), and "no broker" in general."""

DEFAULT_SECURITY_PROTOCOL: Final = "PLAINTEXT"


class ConfigResourceType(enum.IntEnum):
    """What a :class:`ConfigRecord` configures; the numbers are Kafka's ``ConfigResource.Type``."""

    TOPIC = 2
    BROKER = 4
    STATIC_CLUSTER_DEFAULT = 1000
    """Not Kafka's: the cluster defaults of the controllers' config files (name ``""``),
    beneath the dynamic ones of ``BROKER ""``."""


@dataclass(frozen=True, slots=True)
class BrokerEndpoint:
    """One listener of a broker or coordinator: where clients and peers connect."""

    name: str
    host: str
    port: int
    security_protocol: str = DEFAULT_SECURITY_PROTOCOL

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


def registered_endpoints(listeners: Listeners) -> tuple[BrokerEndpoint, ...]:
    """What a broker or coordinator registers: each advertised listener, the inter-broker
    one first (peers that know no listener names take the first)."""
    return tuple(
        BrokerEndpoint(listener.name, listener.host, listener.port)
        for listener in listeners.advertised
    )


# --- Brokers ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RegisterBrokerRecord:
    """A broker registered; its epoch is the offset of this record. New registrations are fenced."""

    broker_id: int
    incarnation_id: str
    broker_epoch: int
    listeners: tuple[BrokerEndpoint, ...] = ()
    rack: str | None = None
    fenced: bool = True
    in_controlled_shutdown: bool = False
    log_dirs: tuple[str, ...] = ()
    """The ids of its online log directories (KIP-858's directory ids)."""
    principal: str = ""
    """With the ACL checks on, the principal that registered it: the one that speaks for
    this node id until it is unregistered (``security/node_identities.py``); "" without."""
    unclean_shutdown: bool = False
    """Registered without the previous incarnation's clean-shutdown epoch (KIP-966), or
    replacing an incarnation that still owed its removals: the broker may have lost
    records it had not flushed, and must leave every ELR (an ISR it is in for the last
    known ELR) before it is unfenced. Its first unfencing clears it (a snapshot's record
    says whether it is still owed); false in logs written before the field."""


@dataclass(frozen=True, slots=True)
class FenceBrokerRecord:
    """The broker of this epoch is fenced: it leads nothing and is no ISR candidate."""

    broker_id: int
    broker_epoch: int


@dataclass(frozen=True, slots=True)
class UnfenceBrokerRecord:
    """The broker of this epoch has caught up with the metadata log and may lead."""

    broker_id: int
    broker_epoch: int


@dataclass(frozen=True, slots=True)
class BrokerRegistrationChangeRecord:
    """A change of fencing or controlled-shutdown state; ``None`` is unchanged."""

    broker_id: int
    broker_epoch: int
    fenced: bool | None = None
    in_controlled_shutdown: bool | None = None


@dataclass(frozen=True, slots=True)
class UnregisterBrokerRecord:
    """The broker's registration is removed."""

    broker_id: int
    broker_epoch: int


# --- Topics and partitions -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TopicRecord:
    """A topic was created; its :class:`PartitionRecord` s follow."""

    name: str
    topic_id: str


@dataclass(frozen=True, slots=True)
class PartitionRecord:
    """The full state of one partition, at creation and in snapshots.

    ``eligible_leader_replicas`` (KIP-966's ELR) are replicas out of the ISR that still hold
    every record below the high watermark, so they may be elected when no ISR member can
    lead; ``last_known_elr`` are former ELR members that lost that guarantee (an unclean
    shutdown), kept as the best choice of a last-resort unclean election.
    """

    topic_id: str
    partition_id: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    leader: int
    leader_epoch: int = 0
    partition_epoch: int = 0
    removing_replicas: tuple[int, ...] = ()
    adding_replicas: tuple[int, ...] = ()
    eligible_leader_replicas: tuple[int, ...] = ()
    last_known_elr: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class PartitionChangeRecord:
    """A change to one partition; ``None`` fields are unchanged.

    Applying it bumps the partition epoch; a ``leader`` that is set (even to the same
    broker) bumps the leader epoch.
    """

    topic_id: str
    partition_id: int
    isr: tuple[int, ...] | None = None
    leader: int | None = None
    replicas: tuple[int, ...] | None = None
    removing_replicas: tuple[int, ...] | None = None
    adding_replicas: tuple[int, ...] | None = None
    eligible_leader_replicas: tuple[int, ...] | None = None
    last_known_elr: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class PartitionsRecord:
    """Consecutive partitions of one topic, column by column: a snapshot's compact form of
    one :class:`PartitionRecord` per partition (no removing or adding replicas, no ELR).

    Partition ``first_partition_id + i`` has ``replica_counts[i]`` replicas, the next ones
    of the flat ``replicas``; its ISR is the next ``isr_counts[i]`` of ``isr``, or its
    replicas when the count is ``-1``. One record carries thousands of partitions as a few
    packed integer columns, so a snapshot is encoded and parsed by protobuf's C code, not a
    Python object per partition (:mod:`highwater.metadata.snapshot`).
    """

    topic_id: str
    first_partition_id: int
    leaders: tuple[int, ...]
    leader_epochs: tuple[int, ...]
    partition_epochs: tuple[int, ...]
    replica_counts: tuple[int, ...]
    replicas: tuple[int, ...]
    isr_counts: tuple[int, ...]
    isr: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class RemoveTopicRecord:
    """The topic, its partitions and its configs are deleted."""

    topic_id: str


# --- Configs, producer ids -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ConfigRecord:
    """One dynamic config key of a topic or broker set to ``value``, or deleted (``None``)."""

    resource_type: ConfigResourceType
    resource_name: str
    name: str
    value: str | None = None


@dataclass(frozen=True, slots=True)
class ProducerIdsRecord:
    """A block of producer ids went to a broker; the next block starts at ``next_producer_id``."""

    broker_id: int
    broker_epoch: int
    next_producer_id: int


# --- Coordinators ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RegisterCoordinatorRecord:
    """A group coordinator registered; its epoch is the offset of this record."""

    coordinator_id: int
    incarnation_id: str
    registration_epoch: int
    listeners: tuple[BrokerEndpoint, ...] = ()
    rack: str | None = None


@dataclass(frozen=True, slots=True)
class UnregisterCoordinatorRecord:
    """The coordinator's registration is removed."""

    coordinator_id: int
    registration_epoch: int


@dataclass(frozen=True, slots=True)
class CoordinatorAssignmentRecord:
    """A ``__consumer_offsets`` partition is owned by a coordinator (``-1``: by none).

    ``revoked_from`` (with owner ``-1``): the partition is being taken from that live
    coordinator, and nobody gets it until that coordinator has let it go
    (:mod:`highwater.controller.coordinators`)."""

    partition_id: int
    coordinator_id: int
    coordinator_epoch: int
    revoked_from: int | None = None


@dataclass(frozen=True, slots=True)
class NoOpRecord:
    """Changes nothing; written by the active controller to show it is alive (KIP-835)."""


@dataclass(frozen=True, slots=True)
class MigrationStateRecord:
    """The state of the migration from the etcd metadata mode (KIP-866's
    ZkMigrationStateRecord): :data:`MIGRATING` closes the batch that copies etcd's state,
    :data:`ENDED` marks the migration over. ``etcd_metadata_offset``: etcd's
    ``metadata_offset`` when it was copied (the pushes to brokers still in etcd mode number
    their images after it); ``copied_offset``: where the copy is in this log (a broker
    registered after it is one that moved)."""

    MIGRATING: ClassVar[int] = 1
    ENDED: ClassVar[int] = 2

    state: int
    etcd_metadata_offset: int = 0
    copied_offset: int = 0
    """The offset of the batch that copied etcd's state (0 in that batch: its own)."""


# --- Access control --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AccessControlEntryRecord:
    """An ACL (KIP-801): the numbers are Kafka's codes (see :mod:`highwater.security.acl`)."""

    id: str
    resource_type: int
    resource_name: str
    pattern_type: int
    principal: str
    host: str
    operation: int
    permission_type: int

    @classmethod
    def of(cls, acl_id: str, acl: AclBinding) -> AccessControlEntryRecord:
        """The record of ``acl`` under ``acl_id``."""
        return cls(
            acl_id,
            int(acl.resource_type),
            acl.resource_name,
            int(acl.pattern_type),
            acl.principal,
            acl.host,
            int(acl.operation),
            int(acl.permission),
        )


@dataclass(frozen=True, slots=True)
class RemoveAccessControlEntryRecord:
    """The ACL with this id is removed."""

    id: str


@dataclass(frozen=True, slots=True)
class UserScramCredentialRecord:
    """A user's SCRAM credential for one mechanism (1: SCRAM-SHA-256, 2: SCRAM-SHA-512)."""

    name: str
    mechanism: int
    salt: bytes
    stored_key: bytes = field(repr=False)  # secrets: never in a log line
    server_key: bytes = field(repr=False)
    iterations: int


@dataclass(frozen=True, slots=True)
class RemoveUserScramCredentialRecord:
    """The user's credential for this mechanism is removed."""

    name: str
    mechanism: int


@dataclass(frozen=True, slots=True)
class ClientQuotaRecord:
    """One key of a client-quota entity set (``value``) or removed (``None``); an absent
    component is ``None``, a type's default entity is named ``<default>``."""

    user: str | None
    client_id: str | None
    key: str
    value: float | None


MetadataRecord: TypeAlias = (
    RegisterBrokerRecord
    | FenceBrokerRecord
    | UnfenceBrokerRecord
    | BrokerRegistrationChangeRecord
    | UnregisterBrokerRecord
    | TopicRecord
    | PartitionRecord
    | PartitionChangeRecord
    | PartitionsRecord
    | ConfigRecord
    | ProducerIdsRecord
    | RemoveTopicRecord
    | RegisterCoordinatorRecord
    | UnregisterCoordinatorRecord
    | CoordinatorAssignmentRecord
    | NoOpRecord
    | AccessControlEntryRecord
    | RemoveAccessControlEntryRecord
    | UserScramCredentialRecord
    | RemoveUserScramCredentialRecord
    | ClientQuotaRecord
    | MigrationStateRecord
)
"""Any record of the metadata log."""

# The oneof field of MetadataRecord that carries each record type.
_ONEOF_FIELDS: Final[dict[type[Any], str]] = {
    RegisterBrokerRecord: "register_broker",
    FenceBrokerRecord: "fence_broker",
    UnfenceBrokerRecord: "unfence_broker",
    BrokerRegistrationChangeRecord: "broker_registration_change",
    UnregisterBrokerRecord: "unregister_broker",
    TopicRecord: "topic",
    PartitionRecord: "partition",
    PartitionChangeRecord: "partition_change",
    PartitionsRecord: "partitions",
    ConfigRecord: "config",
    ProducerIdsRecord: "producer_ids",
    RemoveTopicRecord: "remove_topic",
    RegisterCoordinatorRecord: "register_coordinator",
    UnregisterCoordinatorRecord: "unregister_coordinator",
    CoordinatorAssignmentRecord: "coordinator_assignment",
    NoOpRecord: "no_op",
    AccessControlEntryRecord: "access_control_entry",
    RemoveAccessControlEntryRecord: "remove_access_control_entry",
    UserScramCredentialRecord: "user_scram_credential",
    RemoveUserScramCredentialRecord: "remove_user_scram_credential",
    ClientQuotaRecord: "client_quota",
    MigrationStateRecord: "migration_state",
}


# --- Conversion ------------------------------------------------------------------------
#
# Each record class is converted field by field; how a field converts follows from its
# protobuf descriptor, worked out once per class: a plain scalar, a proto3 `optional`
# scalar (None when absent), a repeated int list (a tuple), a BrokerIdList (a tuple, or
# None when absent), a list of BrokerEndpoint, or the ConfigResourceType enum.

_Setter: TypeAlias = Callable[[Any, str, Any], None]
_Getter: TypeAlias = Callable[[Any, str], Any]


def _set_scalar(message: Any, name: str, value: Any) -> None:
    if value is not None:
        setattr(message, name, value)


def _set_ints(message: Any, name: str, value: tuple[int, ...]) -> None:
    getattr(message, name).extend(value)


def _set_id_list(message: Any, name: str, value: tuple[int, ...] | None) -> None:
    if value is not None:
        holder = getattr(message, name)
        holder.SetInParent()
        holder.ids.extend(value)


def _set_endpoints(message: Any, name: str, value: tuple[BrokerEndpoint, ...]) -> None:
    target = getattr(message, name)
    for endpoint in value:
        target.add(
            name=endpoint.name,
            host=endpoint.host,
            port=endpoint.port,
            security_protocol=endpoint.security_protocol,
        )


def _get_scalar(message: Any, name: str) -> Any:
    return getattr(message, name)


def _get_optional(message: Any, name: str) -> Any:
    return getattr(message, name) if message.HasField(name) else None


def _get_ints(message: Any, name: str) -> tuple[int, ...]:
    return tuple(getattr(message, name))


def _get_id_list(message: Any, name: str) -> tuple[int, ...] | None:
    return tuple(getattr(message, name).ids) if message.HasField(name) else None


def _get_endpoints(message: Any, name: str) -> tuple[BrokerEndpoint, ...]:
    return tuple(
        BrokerEndpoint(e.name, e.host, e.port, e.security_protocol or DEFAULT_SECURITY_PROTOCOL)
        for e in getattr(message, name)
    )


def _get_resource_type(message: Any, name: str) -> ConfigResourceType:
    value = getattr(message, name)
    try:
        return ConfigResourceType(value)
    except ValueError:
        raise CorruptRecordError(f"ConfigRecord has an unknown resource type {value}") from None


@dataclass(frozen=True, slots=True)
class _Plan:
    oneof: str
    names: tuple[str, ...]
    setters: tuple[_Setter, ...]
    getters: tuple[_Getter, ...]


def _plan(record_type: type[Any], oneof: str) -> _Plan:
    descriptor = pb.MetadataRecord.DESCRIPTOR.fields_by_name[oneof].message_type
    assert descriptor is not None
    names: list[str] = []
    setters: list[_Setter] = []
    getters: list[_Getter] = []
    for f in fields(record_type):
        fd = descriptor.fields_by_name[f.name]
        setter: _Setter
        getter: _Getter
        if fd.message_type is not None and fd.message_type.name == "BrokerIdList":
            setter, getter = _set_id_list, _get_id_list
        elif fd.message_type is not None and fd.message_type.name == "BrokerEndpoint":
            setter, getter = _set_endpoints, _get_endpoints
        elif fd.is_repeated:
            setter, getter = _set_ints, _get_ints
        elif fd.enum_type is not None:
            setter, getter = _set_scalar, _get_resource_type
        elif fd.has_presence:
            setter, getter = _set_scalar, _get_optional
        else:
            setter, getter = _set_scalar, _get_scalar
        names.append(f.name)
        setters.append(setter)
        getters.append(getter)
    if set(descriptor.fields_by_name) != set(names):
        raise RuntimeError(f"{record_type.__name__} does not match metadata.proto")
    return _Plan(oneof, tuple(names), tuple(setters), tuple(getters))


_PLANS: Final[dict[type[Any], _Plan]] = {t: _plan(t, o) for t, o in _ONEOF_FIELDS.items()}
_TYPES_BY_ONEOF: Final[dict[str, type[Any]]] = {o: t for t, o in _ONEOF_FIELDS.items()}


def to_proto(record: MetadataRecord) -> pb.MetadataRecord:
    """The ``MetadataRecord`` protobuf message of a record."""
    plan = _PLANS[type(record)]
    wrapper = pb.MetadataRecord()
    message = getattr(wrapper, plan.oneof)
    message.SetInParent()
    for name, setter in zip(plan.names, plan.setters, strict=True):
        setter(message, name, getattr(record, name))
    return wrapper


def from_proto(wrapper: pb.MetadataRecord) -> MetadataRecord:
    """The record a ``MetadataRecord`` protobuf message carries.

    Raises :class:`~highwater.errors.CorruptRecordError` if it carries none, or a value
    no record may hold (an unknown config resource type).
    """
    oneof = wrapper.WhichOneof("record")
    if oneof is None:
        raise CorruptRecordError("metadata record carries no record")
    record_type = _TYPES_BY_ONEOF[oneof]
    plan = _PLANS[record_type]
    message = getattr(wrapper, oneof)
    values = [getter(message, name) for name, getter in zip(plan.names, plan.getters, strict=True)]
    record: MetadataRecord = record_type(*values)
    return record


def encode_record(record: MetadataRecord) -> bytes:
    """The bytes of one record as the Raft log stores it (a serialized ``MetadataRecord``)."""
    if type(record) is PartitionChangeRecord:
        return _encode_partition_change(record)
    return to_proto(record).SerializeToString(deterministic=True)


def decode_record(data: bytes) -> MetadataRecord:
    """The record stored as ``data``; :class:`~highwater.errors.CorruptRecordError` if none is."""
    if data[:1] == _PARTITION_CHANGE_TAG:
        change = _decode_partition_change(data)
        if change is not None:
            return change
    wrapper = pb.MetadataRecord()
    try:
        wrapper.ParseFromString(data)
    except DecodeError as e:
        raise CorruptRecordError(f"metadata record does not parse: {e}") from None
    return from_proto(wrapper)


# --- PartitionChangeRecord's bytes, without a protobuf message ------------------------
#
# A controlled shutdown or a fence writes one PartitionChangeRecord per partition moved
# (a million at a million partitions), each encoded once by the controller and decoded
# by every broker and standby. Through protobuf messages that is about 6 µs to encode
# and 13 µs to decode one, most of it building the message and reading its fields one by
# one from Python. The record is small and flat, so it is written here directly in the
# protobuf wire format, byte for byte what ``to_proto(...).SerializeToString(
# deterministic=True)`` writes (fields in number order; a list that is set, even empty,
# as a BrokerIdList; a leader that is set, even 0; packed ids), and read back the same
# way. The reader takes only that form (each field at most once, packed ids, nothing
# else in the message): any other valid encoding, and every malformed one, goes to
# protobuf's parser, which decides. ``tests/metadata/test_metadata_records.py`` checks
# both directions against protobuf.

_PARTITION_CHANGE_TAG: Final = b"\x42"
"""MetadataRecord field 8 (``partition_change``), length-delimited."""
_ID_LIST_TAGS: Final = (b"\x1a", b"\x2a", b"\x32", b"\x3a", b"\x42", b"\x4a")
"""Fields 3, 5, 6, 7, 8, 9 of PartitionChangeRecord: the broker id lists, in number order."""
_FIELD_SLOTS: Final = {
    0x0A: 0,
    0x10: 1,
    0x1A: 2,
    0x20: 3,
    0x2A: 4,
    0x32: 5,
    0x3A: 6,
    0x42: 7,
    0x4A: 8,
}
"""Each PartitionChangeRecord field's tag (one byte: fields 1 to 9) and its position in
the record's constructor: topic_id, partition_id, isr, leader, replicas,
removing_replicas, adding_replicas, eligible_leader_replicas, last_known_elr."""


def _varint(value: int) -> bytes:
    """An int32 or length as a protobuf varint (a negative int32 takes 10 bytes)."""
    if 0 <= value < 0x80:
        return bytes((value,))
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


@functools.lru_cache(maxsize=4096)
def _id_list(tag: bytes, ids: tuple[int, ...]) -> bytes:
    """A broker id list field: the same few ISRs and replica sets recur in every batch."""
    if not ids:
        return tag + b"\x00"
    packed = b"".join(_varint(b) for b in ids)
    inner = b"\x0a" + _varint(len(packed)) + packed
    return tag + _varint(len(inner)) + inner


@functools.lru_cache(maxsize=4096)
def _topic_field(topic_id: str) -> bytes:
    """The topic id field: a batch moves many partitions of each topic."""
    topic = topic_id.encode()
    return b"\x0a" + _varint(len(topic)) + topic


def _encode_partition_change(record: PartitionChangeRecord) -> bytes:
    parts: list[bytes] = []
    if record.topic_id:
        parts.append(_topic_field(record.topic_id))
    if record.partition_id:
        parts.append(b"\x10" + _varint(record.partition_id))
    lists = (
        record.isr,
        record.replicas,
        record.removing_replicas,
        record.adding_replicas,
        record.eligible_leader_replicas,
        record.last_known_elr,
    )
    if lists[0] is not None:
        parts.append(_id_list(_ID_LIST_TAGS[0], lists[0]))
    if record.leader is not None:
        parts.append(b"\x20" + _varint(record.leader))
    for tag, ids in zip(_ID_LIST_TAGS[1:], lists[1:], strict=True):
        if ids is not None:
            parts.append(_id_list(tag, ids))
    body = b"".join(parts)
    return _PARTITION_CHANGE_TAG + _varint(len(body)) + body


def _read_varint(data: bytes, at: int) -> tuple[int, int]:
    """The varint at ``at`` and the offset after it; IndexError past the end."""
    value = 0
    shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7
        if shift > 63:
            raise IndexError("varint too long")


def _int32(value: int) -> int:
    """A varint read as protobuf reads an int32: its low 32 bits, signed."""
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def _read_ids(data: bytes, at: int, end: int) -> tuple[int, ...] | None:
    """A BrokerIdList's ids in its canonical form (one packed field, or none); None for
    anything else."""
    if at == end:
        return ()
    if data[at] != 0x0A:
        return None
    length, at = _read_varint(data, at + 1)
    if at + length != end:
        return None
    chunk = data[at:end]
    if all(b < 0x80 for b in chunk):
        return tuple(chunk)
    ids = []
    while at < end:
        value, at = _read_varint(data, at)
        ids.append(_int32(value))
    return tuple(ids) if at == end else None


def _decode_partition_change(data: bytes) -> PartitionChangeRecord | None:
    """The record of ``data`` in the form :func:`_encode_partition_change` writes, or None
    (another form, or malformed: protobuf's parser decides)."""
    try:
        length = data[1]
        at = 2
        if length >= 0x80:
            length, at = _read_varint(data, 1)
        end = at + length
        if end != len(data):
            return None
        values: list[Any] = ["", 0, None, None, None, None, None, None, None]
        slots = _FIELD_SLOTS
        last_tag = 0
        while at < end:
            tag = data[at]
            slot = slots.get(tag)
            if slot is None or tag <= last_tag:
                return None  # unknown, out of order or repeated: not the canonical form
            last_tag = tag
            value = data[at + 1]
            at += 2
            if value >= 0x80:
                value, at = _read_varint(data, at - 1)
            if slot == 1 or slot == 3:  # partition_id, leader: int32 varints
                values[slot] = value if value < 0x80000000 else _int32(value)
                continue
            # A length-delimited field of ``value`` bytes.
            if at + value > end:
                return None
            if slot == 0:
                values[0] = data[at : at + value].decode()
            else:
                ids = _read_ids(data, at, at + value)
                if ids is None:
                    return None
                values[slot] = ids
            at += value
        if at != end:
            return None
        return PartitionChangeRecord(*values)
    except (IndexError, UnicodeDecodeError):
        return None
