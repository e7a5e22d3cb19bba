"""The etcd key layout of a cluster's metadata, and the codec between it and an image (pure).

Every key lives under ``/highwater/<cluster>/`` (:attr:`KeySpace.prefix`), in the shape
ZooKeeper-era Kafka gave its znodes::

    cluster_id                                  the cluster's id (created once)
    controller                                  {"broker_id", "address", "epoch"}, leased
    controller_epoch                            "7": the fencing token of the controller
    metadata_offset                             "1234": the image's offset (a counter)
    brokers/ids/<id>                            {"listeners": [...]}, leased by the broker
    brokers/registrations/<id>                  the broker's registration record
    brokers/topics/<topic>                      {"topic_id", "partitions": {"0": [1, 2]}}
    brokers/topics/<topic>/partitions/<p>/state {"leader", "leader_epoch", "isr",
                                                 "partition_epoch", "controller_epoch",
                                                 and "elr", "last_known_elr" if any}
    config/<topics|brokers|cluster>/<name>      {"retention.ms": "..."}
    records/<NN>-<kind>/<digest>                any other record (coordinators, producer
                                                ids, ACLs, SCRAM, quotas)

The leased keys are liveness (a broker's ``brokers/ids``, the controller's claim); the rest
is the state the active controller writes. :func:`image_keys` turns an image into the
state keys (a canonical encoding: equal images, equal values), :func:`records_from_keys`
reads them back into the records that recreate the image (the snapshot order of
:mod:`highwater.metadata.snapshot`), refusing an impossible state with
:class:`InconsistentMetadataError` naming the key: a partition leader outside the ISR, an
ISR member outside the assignment, an assignment naming a broker never registered, a
partition without its state key or a state key without its topic. Records other than
registrations, topics, partitions and configs are kept as their protobuf JSON.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from google.protobuf import json_format

from highwater.errors import HighwaterError
from highwater.internal.v1 import metadata_pb2
from highwater.metadata.image import (
    ConfigResource,
    MetadataImage,
    PartitionRegistration,
    TopicImage,
)
from highwater.metadata.records import (
    BrokerRegistrationChangeRecord,
    ConfigRecord,
    ConfigResourceType,
    FenceBrokerRecord,
    MetadataRecord,
    NoOpRecord,
    PartitionChangeRecord,
    PartitionRecord,
    PartitionsRecord,
    RegisterBrokerRecord,
    RemoveTopicRecord,
    TopicRecord,
    UnfenceBrokerRecord,
    UnregisterBrokerRecord,
    from_proto,
    to_proto,
)
from highwater.metadata.snapshot import load_snapshot, other_records
from highwater.v1.common_pb2 import ErrorCode

__all__ = [
    "InconsistentMetadataError",
    "KeyChanges",
    "KeySpace",
    "StateKeys",
    "changed_keys",
    "image_from_keys",
    "image_keys",
    "partition_state_value",
    "records_from_keys",
]


class InconsistentMetadataError(HighwaterError):
    """The keys in etcd describe an impossible state; ``key`` is the one at fault."""

    code = ErrorCode.INVALID_REQUEST

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"etcd key {key}: {problem}")
        self.key = key
        self.problem = problem


_CONFIG_DIRS: Final[Mapping[ConfigResourceType, str]] = {
    ConfigResourceType.TOPIC: "topics",
    ConfigResourceType.BROKER: "brokers",
    ConfigResourceType.STATIC_CLUSTER_DEFAULT: "cluster",
}
_CONFIG_TYPES: Final = {name: kind for kind, name in _CONFIG_DIRS.items()}
_DEFAULT_NAME: Final = "<default>"
"""The name of a resource whose name is empty (the cluster-wide broker defaults), as
ZooKeeper-era Kafka's ``/config/brokers/<default>``."""

_RECORD_ORDER: Final = (
    "register_coordinator",
    "producer_ids",
    "coordinator_assignment",
    "user_scram_credential",
    "client_quota",
    "access_control_entry",
)
"""The kinds kept under ``records/``, in the order a snapshot replays them."""


@dataclass(frozen=True, slots=True)
class KeySpace:
    """The keys of one cluster, under ``prefix`` (``/highwater/<cluster>/``)."""

    prefix: str

    @property
    def cluster_id(self) -> str:
        return self.prefix + "cluster_id"

    @property
    def controller(self) -> str:
        return self.prefix + "controller"

    @property
    def controller_epoch(self) -> str:
        return self.prefix + "controller_epoch"

    @property
    def metadata_offset(self) -> str:
        return self.prefix + "metadata_offset"

    @property
    def broker_ids(self) -> str:
        """The prefix of the brokers' leased keys."""
        return self.prefix + "brokers/ids/"

    def broker_id(self, broker_id: int) -> str:
        return f"{self.broker_ids}{broker_id}"

    def registration(self, broker_id: int) -> str:
        return f"{self.prefix}brokers/registrations/{broker_id}"

    def topic(self, name: str) -> str:
        return f"{self.prefix}brokers/topics/{name}"

    def partition_state(self, topic: str, partition: int) -> str:
        return f"{self.prefix}brokers/topics/{topic}/partitions/{partition}/state"

    def config(self, resource_type: ConfigResourceType, name: str) -> str:
        return f"{self.prefix}config/{_CONFIG_DIRS[resource_type]}/{name or _DEFAULT_NAME}"

    def record(self, kind: str, value: bytes) -> str:
        rank = _RECORD_ORDER.index(kind)
        digest = hashlib.sha1(value, usedforsecurity=False).hexdigest()
        return f"{self.prefix}records/{rank:02d}-{kind}/{digest}"

    def is_state(self, key: str) -> bool:
        """Whether ``key`` is one the active controller writes (not a lease, not a
        counter, not the election)."""
        relative = key[len(self.prefix) :] if key.startswith(self.prefix) else ""
        return relative.startswith(("brokers/registrations/", "brokers/topics/", "config/")) or (
            relative.startswith("records/")
        )

    def broker_id_of(self, key: str) -> int | None:
        """The broker id of a ``brokers/ids/<id>`` key; None for another key."""
        if not key.startswith(self.broker_ids):
            return None
        tail = key[len(self.broker_ids) :]
        return int(tail) if tail.isdigit() else None


StateKeys = dict[str, bytes]
"""State keys and their canonical values."""


def _json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def _record_json(record: MetadataRecord) -> bytes:
    message = to_proto(record)
    return json_format.MessageToJson(message, sort_keys=True, indent=None).encode()


def partition_state_value(state: bytes, controller_epoch: int) -> bytes:
    """A canonical partition state as written: stamped with the writer's controller epoch."""
    fields = json.loads(state)
    fields["controller_epoch"] = controller_epoch
    return _json(fields)


def image_keys(image: MetadataImage, space: KeySpace) -> StateKeys:
    """The state keys of ``image`` (canonical values; partition states without the
    controller epoch, which the writer stamps: :func:`partition_state_value`)."""
    keys: StateKeys = {}
    for broker in image.cluster.brokers.values():
        keys[space.registration(broker.broker_id)] = _record_json(broker.to_record())
    for topic in image.topics.by_name.values():
        keys.update(_topic_keys(topic, space))
    for resource, values in image.configs.resources.items():
        value = _config_value(values)
        if value is not None:
            keys[space.config(resource.type, resource.name)] = value
    keys.update(_other_keys(image, space))
    return keys


def _partition_state(registration: PartitionRegistration) -> bytes:
    fields: dict[str, object] = {
        "leader": registration.leader,
        "leader_epoch": registration.leader_epoch,
        "isr": list(registration.isr),
        "partition_epoch": registration.partition_epoch,
        "adding_replicas": list(registration.adding_replicas),
        "removing_replicas": list(registration.removing_replicas),
    }
    # KIP-966's ELR, which the controller's elections read: only when there is one, so a
    # partition with its ISR at min.insync.replicas or above is written as before.
    if registration.elr:
        fields["elr"] = list(registration.elr)
    if registration.last_known_elr:
        fields["last_known_elr"] = list(registration.last_known_elr)
    return _json(fields)


def _state_fields(registration: PartitionRegistration) -> tuple[object, ...]:
    """What a partition's state key holds of its registration (see :func:`_partition_state`)."""
    return (
        registration.leader,
        registration.leader_epoch,
        registration.isr,
        registration.partition_epoch,
        registration.adding_replicas,
        registration.removing_replicas,
        registration.elr,
        registration.last_known_elr,
    )


def _assignment_value(topic: TopicImage) -> bytes:
    partitions = {
        str(p): list(registration.replicas)
        for p, registration in enumerate(topic.partitions.registrations())
    }
    return _json({"topic_id": topic.topic_id, "partitions": partitions})


def _topic_keys(topic: TopicImage, space: KeySpace) -> StateKeys:
    """A topic's key (its assignment) and its partitions' state keys."""
    keys = {space.topic(topic.name): _assignment_value(topic)}
    for partition_id, registration in enumerate(topic.partitions.registrations()):
        keys[space.partition_state(topic.name, partition_id)] = _partition_state(registration)
    return keys


def _config_value(values: Mapping[str, str | None]) -> bytes | None:
    present = {k: v for k, v in values.items() if v is not None}
    return _json(present) if present else None


def _other_keys(image: MetadataImage, space: KeySpace) -> StateKeys:
    """The ``records/`` keys: every record kind the key space keeps as protobuf JSON."""
    keys: StateKeys = {}
    for record in other_records(image):
        kind = to_proto(record).WhichOneof("record")
        assert kind is not None
        value = _record_json(record)
        keys[space.record(kind, value)] = value
    return keys


@dataclass(frozen=True, slots=True)
class KeyChanges:
    """What a change does to the state keys: ``updated`` keys that existed (new values),
    ``created`` keys, ``deleted`` keys. Partition states carry no controller epoch yet."""

    updated: StateKeys
    created: StateKeys
    deleted: frozenset[str]

    def __len__(self) -> int:
        return len(self.updated) + len(self.created) + len(self.deleted)


_BROKER_RECORDS: Final = (
    RegisterBrokerRecord,
    FenceBrokerRecord,
    UnfenceBrokerRecord,
    BrokerRegistrationChangeRecord,
    UnregisterBrokerRecord,
)


def changed_keys(
    parent: MetadataImage,
    image: MetadataImage,
    records: Iterable[MetadataRecord],
    space: KeySpace,
) -> KeyChanges:
    """The state keys ``records`` changed between ``parent`` and ``image`` (the image the
    records make from it): equal to comparing :func:`image_keys` of both, at the cost of
    what the records touch, not of the whole image. Each record names its scope (a
    broker's registration, a topic with all its partitions, one partition's state, one
    config resource, the ``records/`` keys), and only the keys of those scopes are
    encoded, before and after; a partition's state is compared by its fields and encoded
    only when they changed."""
    brokers: set[int] = set()
    topics: set[str] = set()
    partitions: set[tuple[str, int]] = set()
    assignments: set[str] = set()
    configs: set[ConfigResource] = set()
    others = False
    for record in records:
        if isinstance(record, PartitionChangeRecord):
            partitions.add((record.topic_id, record.partition_id))
            if record.replicas is not None:
                assignments.add(record.topic_id)
        elif isinstance(record, _BROKER_RECORDS):
            brokers.add(record.broker_id)
        elif isinstance(record, TopicRecord):
            topics.add(record.name)
        elif isinstance(record, PartitionRecord | PartitionsRecord | RemoveTopicRecord):
            for side in (parent, image):
                name = side.topic_name(record.topic_id)
                if name is not None:
                    topics.add(name)
                    configs.add(ConfigResource(ConfigResourceType.TOPIC, name))
        elif isinstance(record, ConfigRecord):
            configs.add(ConfigResource(record.resource_type, record.resource_name))
        elif not isinstance(record, NoOpRecord):
            others = True
    before: StateKeys = {}
    after: StateKeys = {}
    for broker_id in brokers:
        for side, keys in ((parent, before), (image, after)):
            broker = side.cluster.brokers.get(broker_id)
            if broker is not None:
                keys[space.registration(broker_id)] = _record_json(broker.to_record())
    for name in topics:
        for side, keys in ((parent, before), (image, after)):
            topic = side.topic(name)
            if topic is not None:
                keys.update(_topic_keys(topic, space))
    updated: StateKeys = {}
    for topic_id, partition_id in partitions:
        old_topic, new_topic = parent.topics.by_id.get(topic_id), image.topics.by_id.get(topic_id)
        if old_topic is None or new_topic is None or new_topic.name in topics:
            continue  # the topic came or went in this change: its whole scope is compared
        old, new = old_topic.partition(partition_id), new_topic.partition(partition_id)
        if old is None or new is None:
            continue
        # The state's fields compared before encoding: only a changed state is encoded.
        if _state_fields(old) != _state_fields(new):
            updated[space.partition_state(new_topic.name, partition_id)] = _partition_state(new)
    for topic_id in assignments:
        for side, keys in ((parent, before), (image, after)):
            topic = side.topics.by_id.get(topic_id)
            if topic is not None and topic.name not in topics:
                keys[space.topic(topic.name)] = _assignment_value(topic)
    for resource in configs:
        for side, keys in ((parent, before), (image, after)):
            value = _config_value(side.configs.get(resource))
            if value is not None:
                keys[space.config(resource.type, resource.name)] = value
    if others:
        before.update(_other_keys(parent, space))
        after.update(_other_keys(image, space))
    created: StateKeys = {}
    for key, value in after.items():
        previous = before.get(key)
        if previous is None:
            created[key] = value
        elif previous != value:
            updated[key] = value
    return KeyChanges(updated, created, frozenset(before.keys() - after.keys()))


def _load_json(key: str, value: bytes) -> Any:
    try:
        return json.loads(value)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InconsistentMetadataError(key, f"not JSON ({e})") from None


_IDS: Final = frozenset({int})


def _broker_ids(
    key: str, value: Any, what: str, seen: dict[tuple[int, ...], tuple[int, ...]] | None = None
) -> tuple[int, ...]:
    """``value`` as a tuple of distinct broker ids, or the error naming ``key``. ``seen``:
    the lists already validated in this read, each kept once (a cluster's partitions share
    a few replica and ISR lists), so a repeated list costs one lookup and a type check."""
    if seen is not None and type(value) is list:
        try:
            known = seen.get(tuple(value))
        except TypeError:  # an unhashable member: the checks below name it
            known = None
        if known is not None and _IDS.issuperset(map(type, value)):
            return known
    if not isinstance(value, list) or not all(
        isinstance(b, int) and not isinstance(b, bool) and b >= 0 for b in value
    ):
        raise InconsistentMetadataError(key, f"{what} must be a list of broker ids, not {value!r}")
    if len(set(value)) != len(value):
        raise InconsistentMetadataError(key, f"{what} names a broker twice: {value}")
    ids = tuple(value)
    if seen is not None:
        seen[ids] = ids
    return ids


def _int(key: str, fields: Mapping[str, Any], name: str) -> int:
    value = fields.get(name)
    if not isinstance(value, int) or isinstance(value, bool):
        raise InconsistentMetadataError(key, f"{name} must be an integer, not {value!r}")
    return value


def _record_from_json(key: str, value: bytes) -> MetadataRecord:
    try:
        message = json_format.Parse(value, metadata_pb2.MetadataRecord())
        return from_proto(message)
    except (json_format.ParseError, ValueError, KeyError, TypeError) as e:
        raise InconsistentMetadataError(key, f"not a metadata record ({e})") from None


def records_from_keys(
    keys: Mapping[str, bytes], space: KeySpace, *, columnar: bool = False
) -> list[MetadataRecord]:
    """The records that recreate the image the state ``keys`` hold (other keys under the
    prefix are ignored); :class:`InconsistentMetadataError` naming the key of an
    impossible state. ``columnar``: each topic's partitions as :class:`PartitionsRecord`
    columns (what a snapshot stores, and what replays fastest) instead of a
    :class:`PartitionRecord` each; a partition being reassigned stays its own record."""
    prefix = space.prefix
    registrations: dict[int, MetadataRecord] = {}
    topics: dict[str, tuple[str, Any]] = {}
    states: dict[tuple[str, int], tuple[str, Any]] = {}
    configs: list[ConfigRecord] = []
    others: list[tuple[str, MetadataRecord]] = []
    seen: dict[tuple[int, ...], tuple[int, ...]] = {}
    for key in sorted(keys):
        if not key.startswith(prefix):
            continue
        value = keys[key]
        parts = key[len(prefix) :].split("/")
        if parts[:2] == ["brokers", "registrations"] and len(parts) == 3:
            record = _record_from_json(key, value)
            if not isinstance(record, RegisterBrokerRecord) or str(record.broker_id) != parts[2]:
                raise InconsistentMetadataError(key, "not the registration of that broker")
            registrations[record.broker_id] = record
        elif parts[:2] == ["brokers", "topics"] and len(parts) == 3:
            topics[parts[2]] = (key, _load_json(key, value))
        elif parts[:2] == ["brokers", "topics"] and len(parts) == 6 and parts[5] == "state":
            if parts[3] != "partitions" or not parts[4].isdigit():
                raise InconsistentMetadataError(key, "not a partition state key")
            states[(parts[2], int(parts[4]))] = (key, _load_json(key, value))
        elif parts[0] == "config" and len(parts) == 3:
            kind = _CONFIG_TYPES.get(parts[1])
            fields = _load_json(key, value)
            if kind is None or not isinstance(fields, dict):
                raise InconsistentMetadataError(key, "not a config of topics, brokers or cluster")
            name = "" if parts[2] == _DEFAULT_NAME else parts[2]
            for config_name, config_value in sorted(fields.items()):
                if not isinstance(config_value, str):
                    raise InconsistentMetadataError(key, f"{config_name} must be a string")
                configs.append(ConfigRecord(kind, name, config_name, config_value))
        elif parts[0] == "records" and len(parts) == 3:
            others.append((key, _record_from_json(key, value)))
    records: list[MetadataRecord] = list(registrations.values())
    records.extend(r for _, r in others if to_proto(r).WhichOneof("record") == _RECORD_ORDER[0])
    for name, (key, fields) in sorted(topics.items()):
        records.extend(
            _topic_records(space, name, key, fields, states, registrations, columnar, seen)
        )
        records.extend(
            c
            for c in configs
            if c.resource_type == ConfigResourceType.TOPIC and c.resource_name == name
        )
    for (name, partition), (key, _) in sorted(states.items()):
        if name not in topics:
            raise InconsistentMetadataError(
                key, f"a partition state of topic {name}, which has no key"
            )
        assignment = topics[name][1].get("partitions", {})
        if str(partition) not in assignment:
            raise InconsistentMetadataError(key, f"topic {name} has no partition {partition}")
    records.extend(
        c
        for c in configs
        if c.resource_type != ConfigResourceType.TOPIC or c.resource_name not in topics
    )
    records.extend(r for _, r in others if to_proto(r).WhichOneof("record") != _RECORD_ORDER[0])
    return records


def _topic_records(
    space: KeySpace,
    name: str,
    key: str,
    fields: Any,
    states: Mapping[tuple[str, int], tuple[str, Any]],
    registrations: Mapping[int, MetadataRecord],
    columnar: bool,
    seen: dict[tuple[int, ...], tuple[int, ...]],
) -> Iterable[MetadataRecord]:
    if not isinstance(fields, dict) or not isinstance(fields.get("topic_id"), str):
        raise InconsistentMetadataError(key, "a topic needs a topic_id and partitions")
    assignment = fields.get("partitions")
    if not isinstance(assignment, dict) or not assignment:
        raise InconsistentMetadataError(key, 'a topic needs partitions: {"0": [broker ids]}')
    if sorted(assignment) != sorted(str(p) for p in range(len(assignment))):
        raise InconsistentMetadataError(
            key, f"partitions must be numbered 0..{len(assignment) - 1}, not {sorted(assignment)}"
        )
    topic_id = fields["topic_id"]
    yield TopicRecord(name=name, topic_id=topic_id)
    run = _Columns(topic_id, 0)
    # Replica lists, and (replicas, ISR) pairs, already found valid in this topic.
    placed: set[tuple[int, ...]] = set()
    checked: set[tuple[tuple[int, ...], tuple[int, ...]]] = set()
    for partition in range(len(assignment)):
        replicas = _broker_ids(key, assignment[str(partition)], f"partition {partition}", seen)
        if replicas not in placed:
            if not replicas:
                raise InconsistentMetadataError(key, f"partition {partition} has no replicas")
            for broker in replicas:
                if broker not in registrations:
                    raise InconsistentMetadataError(
                        key,
                        f"partition {partition} is assigned to broker {broker}, which never "
                        f"registered (no {space.registration(broker)})",
                    )
            placed.add(replicas)
        state_key = space.partition_state(name, partition)
        held = states.get((name, partition))
        if held is None:
            raise InconsistentMetadataError(state_key, "missing: the partition has no state")
        state = held[1]
        if not isinstance(state, dict):
            raise InconsistentMetadataError(state_key, "a partition state must be an object")
        leader = _int(state_key, state, "leader")
        isr = _broker_ids(state_key, state.get("isr"), "isr", seen)
        if (replicas, isr) not in checked:
            for member in isr:
                if member not in replicas:
                    raise InconsistentMetadataError(
                        state_key, f"ISR member {member} is not a replica {list(replicas)}"
                    )
            checked.add((replicas, isr))
        if leader != -1 and leader not in isr:
            raise InconsistentMetadataError(
                state_key, f"leader {leader} is not in the ISR {list(isr)}"
            )
        leader_epoch = _int(state_key, state, "leader_epoch")
        partition_epoch = _int(state_key, state, "partition_epoch")
        removing = _broker_ids(
            state_key, state.get("removing_replicas", []), "removing_replicas", seen
        )
        adding = _broker_ids(state_key, state.get("adding_replicas", []), "adding_replicas", seen)
        elr: tuple[int, ...] = ()
        last_known_elr: tuple[int, ...] = ()
        if "elr" in state:
            elr = _broker_ids(state_key, state["elr"], "elr", seen)
        if "last_known_elr" in state:
            last_known_elr = _broker_ids(state_key, state["last_known_elr"], "last_known_elr")
        for member in (*elr, *last_known_elr):
            if member not in replicas:
                raise InconsistentMetadataError(
                    state_key, f"ELR member {member} is not a replica {list(replicas)}"
                )
        if columnar and not removing and not adding and not elr and not last_known_elr:
            run.add(replicas, isr, leader, leader_epoch, partition_epoch)
            continue
        if run.leaders:
            yield run.record()
        run = _Columns(topic_id, partition + 1)
        yield PartitionRecord(
            topic_id=topic_id,
            partition_id=partition,
            replicas=replicas,
            isr=isr,
            leader=leader,
            leader_epoch=leader_epoch,
            partition_epoch=partition_epoch,
            removing_replicas=removing,
            adding_replicas=adding,
            eligible_leader_replicas=elr,
            last_known_elr=last_known_elr,
        )
    if run.leaders:
        yield run.record()


class _Columns:
    """Consecutive partitions of one topic gathered into a :class:`PartitionsRecord`."""

    def __init__(self, topic_id: str, first: int) -> None:
        self.topic_id = topic_id
        self.first = first
        self.leaders: list[int] = []
        self.leader_epochs: list[int] = []
        self.partition_epochs: list[int] = []
        self.replica_counts: list[int] = []
        self.replicas: list[int] = []
        self.isr_counts: list[int] = []
        self.isr: list[int] = []

    def add(
        self,
        replicas: tuple[int, ...],
        isr: tuple[int, ...],
        leader: int,
        leader_epoch: int,
        partition_epoch: int,
    ) -> None:
        self.leaders.append(leader)
        self.leader_epochs.append(leader_epoch)
        self.partition_epochs.append(partition_epoch)
        self.replica_counts.append(len(replicas))
        self.replicas += replicas
        if isr == replicas:
            self.isr_counts.append(-1)
        else:
            self.isr_counts.append(len(isr))
            self.isr += isr

    def record(self) -> PartitionsRecord:
        return PartitionsRecord(
            topic_id=self.topic_id,
            first_partition_id=self.first,
            leaders=tuple(self.leaders),
            leader_epochs=tuple(self.leader_epochs),
            partition_epochs=tuple(self.partition_epochs),
            replica_counts=tuple(self.replica_counts),
            replicas=tuple(self.replicas),
            isr_counts=tuple(self.isr_counts),
            isr=tuple(self.isr),
        )


def image_from_keys(keys: Mapping[str, bytes], space: KeySpace, offset: int) -> MetadataImage:
    """The image the state ``keys`` hold, as of ``offset``."""
    return load_snapshot(records_from_keys(keys, space, columnar=True), offset, 0)
