"""``AdminClient``: create, delete, grow, describe and configure topics, like Kafka's Admin API.

An asyncio client built from ``bootstrap.servers`` (``"host1:9092,host2:9092"``):

* **Writes and configs** (``create_topics``, ``delete_topics``, ``create_partitions``,
  ``describe_configs``, ``alter_configs``, ``elect_leaders``,
  ``alter_partition_reassignments``, ``list_partition_reassignments``,
  ``unregister_broker``) go to the Controller API through a
  :class:`~highwater.controller_api.client.ControllerClient` given the same addresses; it
  finds the active controller and retries there. Brokers forward these calls to the
  active controller (Kafka's KIP-590), and in ``highwater server`` the Controller
  service answers on the broker's port, so the bootstrap address is all that is needed;
  ``controllers=`` (the CLI's ``--controllers``) sends them to the controllers directly.
* **Descriptions** (``list_topics``, ``describe_topics``, ``describe_cluster``) come from
  the ``Metadata`` RPC of any broker among the bootstrap addresses (tried in turn).
  Metadata reaches brokers by replicating the metadata log, so a topic created a moment
  ago may take a short while to appear in them.

Errors follow one rule. A failure of the whole call (no controller or broker answered,
a request the server rejects as a whole) raises an :class:`AdminError`. Batch operations
over several topics or partitions (``create_topics``, ``delete_topics``,
``create_partitions``, ``elect_leaders``) do not raise for one item's failure: they return
one result per item whose ``error`` is ``None`` or a typed :class:`AdminError`
(``result.raise_for_error()`` raises it). Operations on named resources that return
descriptions (``describe_topics``, ``describe_configs``, ``alter_configs``) raise the typed
error of the first resource that failed (an unknown topic: :class:`UnknownTopicOrPartitionError`).
Every error carries Kafka's error code (``code``, ``code_name``) and the server's message.

**Consumer groups** (``list_consumer_groups``, ``describe_consumer_groups``,
``delete_consumer_groups``, ``list_consumer_group_offsets``,
``alter_consumer_group_offsets``, ``delete_consumer_group_offsets``) go to the group
coordinators: a group's requests to the coordinator ``FindCoordinator`` names (asked of
the bootstrap brokers), ``ListGroups`` to every registered coordinator (the brokers'
Metadata lists them; each knows only the groups of its partitions of
``__consumer_offsets``). ``NOT_COORDINATOR``,
``COORDINATOR_NOT_AVAILABLE`` and ``COORDINATOR_LOAD_IN_PROGRESS`` (a coordinator moving or
loading) are retried, the coordinator looked up again, until ``request_timeout_s`` runs
out. ``list_offsets`` asks partition leaders for earliest, latest or by-time offsets.

The Controller API (its messages, codec and client, and through them
the metadata records) is imported by the methods that call the controllers, not by this
module: every ``highwater`` command on the admin client imports it, and the commands that
only describe (from the brokers) do not pay for it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Final, TypeVar

import grpc
import grpc.aio

from highwater.client.cluster import BROKER_MESSAGE_MAX_BYTES, BrokerPolicy, ClusterMetadata
from highwater.client.errors import (
    AdminError,
    BrokerUnavailableError,
    ControllerNotAvailableError,
    CoordinatorLoadInProgressError,
    CoordinatorNotAvailableError,
    ElectionNotNeededError,
    EligibleLeadersNotAvailableError,
    GroupAuthorizationFailedError,
    GroupIdNotFoundError,
    GroupNotEmptyError,
    InvalidConfigurationError,
    InvalidGroupIdError,
    InvalidPartitionsError,
    InvalidReplicaAssignmentError,
    InvalidReplicationFactorError,
    InvalidRequestError,
    InvalidTopicNameError,
    NoReassignmentInProgressError,
    NotCoordinatorError,
    PreferredLeaderNotAvailableError,
    TopicExistsError,
    UnknownMemberIdError,
    UnknownTopicOrPartitionError,
    error_for_code,
)
from highwater.client.security_config import security_from_config
from highwater.group.protocol import (
    MalformedConsumerProtocolError,
    TopicPartitionKey,
    decode_assignment,
)
from highwater.rpc.endpoints import format_endpoint, parse_endpoint
from highwater.security import (
    AclBinding,
)
from highwater.security.scram import (
    DEFAULT_ITERATIONS as DEFAULT_SCRAM_ITERATIONS,
)
from highwater.security.scram import (
    MECHANISM_NAMES,
    MECHANISM_NUMBERS,
    salted_password,
)
from highwater.v1 import broker_pb2 as pb
from highwater.v1 import broker_pb2_grpc, coordinator_pb2_grpc
from highwater.v1 import coordinator_pb2 as cpb
from highwater.v1.common_pb2 import ErrorCode

log = logging.getLogger(__name__)

__all__ = [
    "AdminClient",
    "AdminError",
    "BrokerUnavailableError",
    "ClusterDescription",
    "ConfigEntry",
    "ConfigSource",
    "ConsumerGroupDescription",
    "ConsumerGroupListing",
    "ControllerNotAvailableError",
    "CoordinatorLoadInProgressError",
    "CoordinatorNotAvailableError",
    "CreateTopicResult",
    "ElectionNotNeededError",
    "ElectionType",
    "EligibleLeadersNotAvailableError",
    "GroupIdNotFoundError",
    "GroupNotEmptyError",
    "GroupResult",
    "InvalidConfigurationError",
    "InvalidGroupIdError",
    "InvalidPartitionsError",
    "InvalidReplicaAssignmentError",
    "InvalidReplicationFactorError",
    "InvalidRequestError",
    "InvalidTopicNameError",
    "ListOffsetsResultInfo",
    "LogDirDescription",
    "MemberDescription",
    "NewTopic",
    "NoReassignmentInProgressError",
    "Node",
    "NotCoordinatorError",
    "OffsetAndMetadata",
    "OffsetSpec",
    "PartitionInfo",
    "PartitionReassignment",
    "PreferredLeaderNotAvailableError",
    "ReplicaInfo",
    "TopicDescription",
    "TopicExistsError",
    "TopicListing",
    "TopicResult",
    "UnknownMemberIdError",
    "UnknownTopicOrPartitionError",
    "error_for_code",
]

Req = TypeVar("Req")
Resp = TypeVar("Resp")
_T = TypeVar("_T")

if TYPE_CHECKING:
    from highwater.controller_api import messages as m
    from highwater.controller_api.client import ControllerClient
    from highwater.metadata.client_quotas import ClientQuotaEntity
    from highwater.metadata.records import ConfigResourceType

    ElectionType = m.ElectionType
    ConfigSource = m.ConfigSource

_CONTROLLER_API_NAMES: Final = frozenset({"ElectionType", "ConfigSource"})
"""The Controller API's enums this module re-exports, imported on first use
(:func:`__getattr__`)."""


def __getattr__(name: str) -> object:
    """``ElectionType`` and ``ConfigSource``, from the Controller API's messages on first
    use: importing this module does not load the Controller API (its messages and codec
    are a third of the import's CPU), which only the calls to the controllers need."""
    if name in _CONTROLLER_API_NAMES:
        from highwater.controller_api import messages

        value = getattr(messages, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_RETRIABLE_BROKER_CODES: Final = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.CANCELLED,
        # A bootstrap address that serves no Broker service (a controller's): try the next.
        grpc.StatusCode.UNIMPLEMENTED,
    }
)

#: Group coordinator errors that mean "ask FindCoordinator again and retry".
_RETRIABLE_GROUP_CODES: Final = frozenset(
    {
        ErrorCode.NOT_COORDINATOR,
        ErrorCode.COORDINATOR_NOT_AVAILABLE,
        ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
    }
)
#: Partition errors of ListOffsets after which the leader is looked up again.
_RETRIABLE_LEADER_CODES: Final = frozenset(
    {
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
        ErrorCode.LEADER_NOT_AVAILABLE,
        ErrorCode.FENCED_LEADER_EPOCH,
        ErrorCode.UNKNOWN_LEADER_EPOCH,
        ErrorCode.REPLICA_NOT_AVAILABLE,
    }
)
_RETRY_BACKOFF_S: Final = 0.1
_CONSUMER_PROTOCOL: Final = "consumer"


def _error_or_none(code: int, message: str) -> AdminError | None:
    return None if code == ErrorCode.NONE else error_for_code(code, message)


def _check_reply(operation: str, code: int, message: str) -> None:
    """Raise for a failure of a whole request."""
    if code != ErrorCode.NONE:
        raise error_for_code(code, f"{operation}: {message}" if message else operation)


# --- Requests and results -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NewTopic:
    """A topic to create (Kafka's ``NewTopic``).

    Either a partition count and replication factor (-1: the cluster's ``num.partitions``
    and ``default.replication.factor``) or ``replica_assignment``: partition id ->
    broker ids, preferred leader first, for partitions 0..n-1. ``config`` holds topic
    config overrides by Kafka name (``retention.ms``, ``cleanup.policy``...).
    """

    name: str
    num_partitions: int = -1
    replication_factor: int = -1
    replica_assignment: Mapping[int, Sequence[int]] | None = None
    config: Mapping[str, str] | None = None


@dataclass(frozen=True, slots=True)
class TopicResult:
    """The outcome of one topic of a batch operation: ``error`` is ``None`` on success."""

    name: str
    error: AdminError | None = None

    @property
    def succeeded(self) -> bool:
        """Whether this topic's part of the operation succeeded."""
        return self.error is None

    def raise_for_error(self) -> None:
        """Raise this topic's typed error, if it has one."""
        if self.error is not None:
            raise self.error


@dataclass(frozen=True, slots=True)
class CreateTopicResult(TopicResult):
    """One topic of ``create_topics``: on success, its id, partition count and replication."""

    topic_id: str = ""
    num_partitions: int = -1
    replication_factor: int = -1


@dataclass(frozen=True, slots=True)
class Node:
    """A broker as the Metadata RPC describes it."""

    node_id: int
    host: str
    port: int
    rack: str | None = None

    @property
    def address(self) -> str:
        """``host:port`` (``[host]:port`` for IPv6)."""
        return format_endpoint(self.host, self.port)


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    """One partition of a topic (Kafka's ``TopicPartitionInfo``); ``leader`` is None if none."""

    partition: int
    leader: int | None
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    offline_replicas: tuple[int, ...] = ()
    eligible_leader_replicas: tuple[int, ...] = ()
    """Out of the ISR but holding every committed record (KIP-966): electable cleanly."""
    last_known_elr: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class TopicDescription:
    """A topic's id and partitions (Kafka's ``TopicDescription``)."""

    name: str
    topic_id: str
    is_internal: bool
    partitions: tuple[PartitionInfo, ...]

    @property
    def replication_factor(self) -> int:
        """The number of replicas of the first partition (0 for a topic without partitions)."""
        return len(self.partitions[0].replicas) if self.partitions else 0


@dataclass(frozen=True, slots=True)
class TopicListing:
    """A topic's name and id (Kafka's ``TopicListing``)."""

    name: str
    topic_id: str
    is_internal: bool = False


@dataclass(frozen=True, slots=True)
class ClusterDescription:
    """The live brokers, and the cluster id and active controller when the broker knows them."""

    nodes: tuple[Node, ...]
    controller_id: int | None = None
    cluster_id: str | None = None
    metadata_mode: str | None = None
    """Where the metadata lives ("kraft", "etcd"), when the broker says."""


@dataclass(frozen=True, slots=True)
class ConfigEntry:
    """One topic config: its value (None: unset), where it comes from, and its type and doc."""

    name: str
    value: str | None
    source: m.ConfigSource
    read_only: bool = False
    sensitive: bool = False
    type: str = ""
    documentation: str = ""

    @property
    def is_default(self) -> bool:
        """Whether the value is the config's default (not an override of any kind)."""
        from highwater.controller_api import messages as m

        return self.source == m.ConfigSource.DEFAULT_CONFIG


@dataclass(frozen=True, slots=True)
class ConsumerGroupListing:
    """A group as ListGroups names it (Kafka's ``ConsumerGroupListing``).

    ``state`` is the coordinator's: ``Empty``, ``PreparingRebalance``,
    ``CompletingRebalance``, ``Stable`` or ``Dead``. A *simple* group has no protocol type:
    only offsets committed from outside group management (``assign()``).
    """

    group_id: str
    state: str
    protocol_type: str = _CONSUMER_PROTOCOL

    @property
    def is_simple_consumer_group(self) -> bool:
        """Whether the group has never had members (offsets committed with ``assign()``)."""
        return not self.protocol_type


@dataclass(frozen=True, slots=True)
class MemberDescription:
    """One member of a group (Kafka's ``MemberDescription``); ``assignment`` is its share of
    the partitions, decoded from the consumer protocol (empty while it rebalances)."""

    member_id: str
    client_id: str
    host: str
    assignment: tuple[TopicPartitionKey, ...] = ()
    group_instance_id: str | None = None


@dataclass(frozen=True, slots=True)
class ConsumerGroupDescription:
    """A group's state, protocol and members (Kafka's ``ConsumerGroupDescription``)."""

    group_id: str
    state: str
    protocol_type: str
    partition_assignor: str
    """The protocol the group chose: the assignor's name (``range``...)."""
    members: tuple[MemberDescription, ...]
    coordinator: Node
    generation_id: int = -1
    leader: str = ""

    @property
    def is_simple_consumer_group(self) -> bool:
        """Whether the group has never had members (offsets committed with ``assign()``)."""
        return not self.protocol_type


@dataclass(frozen=True, slots=True)
class PartitionReassignment:
    """A partition being moved (Kafka's ``PartitionReassignment``): its replicas now (the
    target ones first), the brokers being added and those being removed."""

    replicas: tuple[int, ...]
    adding_replicas: tuple[int, ...]
    removing_replicas: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class OffsetAndMetadata:
    """A committed offset: the next offset to consume, the leader epoch of the last consumed
    record (None: unknown) and the committer's metadata string."""

    offset: int
    leader_epoch: int | None = None
    metadata: str = ""


@dataclass(frozen=True, slots=True)
class GroupResult:
    """The outcome of one group of a batch operation: ``error`` is ``None`` on success."""

    group_id: str
    error: AdminError | None = None

    @property
    def succeeded(self) -> bool:
        """Whether this group's part of the operation succeeded."""
        return self.error is None

    def raise_for_error(self) -> None:
        """Raise this group's typed error, if it has one."""
        if self.error is not None:
            raise self.error


class OffsetSpec:
    """What :meth:`AdminClient.list_offsets` looks up (Kafka's ``OffsetSpec``): the
    ``EARLIEST`` or ``LATEST`` offset, or ``for_timestamp(ms)``: the first record at or
    after that time."""

    EARLIEST: Final = -2
    LATEST: Final = -1
    MAX_TIMESTAMP: Final = -3

    @staticmethod
    def for_timestamp(timestamp_ms: int | datetime) -> int:
        """The spec of the first offset whose record's timestamp is at or after the time."""
        if isinstance(timestamp_ms, datetime):
            timestamp_ms = int(timestamp_ms.timestamp() * 1000)
        if timestamp_ms < 0:
            raise ValueError(f"a timestamp must not be negative, not {timestamp_ms}")
        return timestamp_ms


@dataclass(frozen=True, slots=True)
class ListOffsetsResultInfo:
    """One partition's answer to ``list_offsets``: the offset (-1 when no record is at or
    after the time asked for), its record's timestamp (-1 for earliest and latest) and the
    leader epoch."""

    offset: int
    timestamp: int
    leader_epoch: int | None


@dataclass(frozen=True, slots=True)
class ReplicaInfo:
    """One replica in a log directory (Kafka's ``ReplicaInfo``)."""

    size: int
    """Bytes of its segments."""
    offset_lag: int
    """How far its log end lags the high watermark (a future replica's: its current one)."""
    is_future: bool = False


@dataclass(frozen=True, slots=True)
class LogDirDescription:
    """One log directory of a broker (Kafka's ``LogDirDescription``)."""

    path: str
    directory_id: str
    error: AdminError | None
    """None, or the KAFKA_STORAGE_ERROR of a failed (offline) directory."""
    replica_infos: Mapping[TopicPartitionKey, ReplicaInfo]
    total_bytes: int | None
    """The file system's size; None when unknown (offline)."""
    usable_bytes: int | None


def _split_addresses(servers: Sequence[str] | str) -> list[str]:
    parts = servers.split(",") if isinstance(servers, str) else list(servers)
    addresses = []
    for part in parts:
        text = part.strip()
        if not text:
            continue
        host, port = parse_endpoint(text)
        addresses.append(format_endpoint(host, port))
    if not addresses:
        raise ValueError("bootstrap.servers names no HOST:PORT address")
    return addresses


# --- The client -----------------------------------------------------------------------


class AdminClient:
    """Administers topics of a Highwater cluster (see the module docstring).

    ``AdminClient("localhost:9092")`` or ``AdminClient({"bootstrap.servers": ...})``; use as
    ``async with AdminClient(...) as admin: ...`` or call :meth:`close`. ``controllers``
    overrides the addresses admin calls go to (by default the bootstrap addresses);
    ``request_timeout_s`` bounds each operation, retries included.
    """

    def __init__(
        self,
        bootstrap_servers: str | Sequence[str] | Mapping[str, str],
        *,
        controllers: str | Sequence[str] | None = None,
        request_timeout_s: float = 30.0,
    ) -> None:
        security = None
        if isinstance(bootstrap_servers, Mapping):
            if "bootstrap.servers" not in bootstrap_servers:
                raise ValueError("the config needs bootstrap.servers")
            servers: str | Sequence[str] = bootstrap_servers["bootstrap.servers"]
            security = security_from_config(bootstrap_servers)
        else:
            servers = bootstrap_servers
        self.bootstrap_servers: tuple[str, ...] = tuple(_split_addresses(servers))
        self.controllers: tuple[str, ...] = (
            self.bootstrap_servers if controllers is None else tuple(_split_addresses(controllers))
        )
        self.request_timeout_s = request_timeout_s
        self._security = security
        self._controller_client: ControllerClient | None = None
        self.cluster = ClusterMetadata(
            self.bootstrap_servers,
            request_timeout_s=request_timeout_s,
            max_message_bytes=BROKER_MESSAGE_MAX_BYTES,
            policy=_ADMIN_BROKERS,
            security=security,
        )
        """The brokers' channels, Metadata and FindCoordinator: the cluster layer the
        producer and consumer use, asking the bootstrap brokers as :data:`_ADMIN_BROKERS`
        says."""
        self._closed = False

    async def __aenter__(self) -> AdminClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close every channel; the client cannot be used afterwards."""
        self._closed = True
        try:
            await self.cluster.close()
        finally:
            if self._controller_client is not None:
                await self._controller_client.close()

    @property
    def _controller(self) -> ControllerClient:
        """The Controller API client, made by the first call that goes to the controllers:
        a client that only describes topics, groups or offsets (from the brokers) never
        imports the Controller API's messages and codec."""
        client = self._controller_client
        if client is None:
            self._check_open()
            from highwater.controller_api.client import ControllerClient

            client = self._controller_client = ControllerClient(
                list(self.controllers),
                timeout_s=self.request_timeout_s,
                attempt_timeout_s=min(5.0, self.request_timeout_s),
                security=self._security,
            )
        return client

    # --- Topics ---------------------------------------------------------------------------

    async def create_topics(
        self, new_topics: Iterable[NewTopic], *, validate_only: bool = False
    ) -> dict[str, CreateTopicResult]:
        """Create topics; one :class:`CreateTopicResult` per name (a failure in ``error``).

        With ``validate_only`` the controller only checks the request (names, counts,
        replication factor, configs) and creates nothing.
        """
        from highwater.controller_api import messages as m

        topics = tuple(_creatable(topic) for topic in new_topics)
        if not topics:
            return {}
        reply = await self._call_controller(
            self._controller.create_topics, m.CreateTopicsRequest(topics, validate_only)
        )
        _check_reply("CreateTopics", reply.error, reply.error_message)
        return {
            result.name: CreateTopicResult(
                result.name,
                _error_or_none(result.error, result.error_message),
                topic_id=result.topic_id,
                num_partitions=result.num_partitions,
                replication_factor=result.replication_factor,
            )
            for result in reply.topics
        }

    async def delete_topics(self, names: Iterable[str]) -> dict[str, TopicResult]:
        """Delete topics by name; one :class:`TopicResult` per name (unknown: an error)."""
        from highwater.controller_api import messages as m

        wanted = tuple(names)
        if not wanted:
            return {}
        reply = await self._call_controller(
            self._controller.delete_topics, m.DeleteTopicsRequest(names=wanted)
        )
        _check_reply("DeleteTopics", reply.error, reply.error_message)
        return {
            result.name: TopicResult(
                result.name, _error_or_none(result.error, result.error_message)
            )
            for result in reply.topics
        }

    async def create_partitions(
        self, new_counts: Mapping[str, int], *, validate_only: bool = False
    ) -> dict[str, TopicResult]:
        """Grow each topic to its new *total* partition count (Kafka's ``NewPartitions``).

        The controller places the new partitions; a count that does not grow the topic is
        an :class:`InvalidPartitionsError` in that topic's result.
        """
        from highwater.controller_api import messages as m

        topics = tuple(m.CreatePartitionsTopic(name, count) for name, count in new_counts.items())
        if not topics:
            return {}
        reply = await self._call_controller(
            self._controller.create_partitions, m.CreatePartitionsRequest(topics, validate_only)
        )
        _check_reply("CreatePartitions", reply.error, reply.error_message)
        return {
            result.name: TopicResult(
                result.name, _error_or_none(result.error, result.error_message)
            )
            for result in reply.topics
        }

    async def list_topics(self, *, include_internal: bool = False) -> list[TopicListing]:
        """Every topic, sorted by name; internal ones (``__...``) only if asked for."""
        reply = await self._metadata([])
        return [
            TopicListing(topic.name, topic.topic_id, topic.is_internal)
            for topic in sorted(reply.topics, key=lambda t: t.name)
            if topic.error == ErrorCode.NONE and (include_internal or not topic.is_internal)
        ]

    async def describe_topics(self, names: Iterable[str]) -> dict[str, TopicDescription]:
        """The partitions of each named topic: leader, leader epoch, replicas, ISR, offline.

        Raises the typed error of the first topic that cannot be described (an unknown
        topic: :class:`UnknownTopicOrPartitionError`), as Kafka's ``allTopicNames()`` does.
        """
        wanted = list(dict.fromkeys(names))
        if not wanted:
            return {}
        reply = await self._metadata(wanted)
        described: dict[str, TopicDescription] = {}
        for topic in reply.topics:
            if topic.error != ErrorCode.NONE:
                message = (
                    f"Topic '{topic.name}' does not exist."
                    if topic.error == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                    else f"Topic '{topic.name}' cannot be described"
                )
                raise error_for_code(topic.error, message)
            described[topic.name] = TopicDescription(
                name=topic.name,
                topic_id=topic.topic_id,
                is_internal=topic.is_internal,
                partitions=tuple(
                    PartitionInfo(
                        partition=p.partition,
                        leader=p.leader_id if p.leader_id >= 0 else None,
                        leader_epoch=p.leader_epoch,
                        replicas=tuple(p.replicas),
                        isr=tuple(p.isr),
                        offline_replicas=tuple(p.offline_replicas),
                        eligible_leader_replicas=tuple(p.eligible_leader_replicas),
                        last_known_elr=tuple(p.last_known_elr),
                    )
                    for p in sorted(topic.partitions, key=lambda p: p.partition)
                ),
            )
        missing = [name for name in wanted if name not in described]
        if missing:
            raise UnknownTopicOrPartitionError(f"Topic '{missing[0]}' does not exist.")
        return {name: described[name] for name in wanted}

    async def describe_cluster(self) -> ClusterDescription:
        """The live (unfenced) brokers; the controller id and cluster id if the broker knows."""
        reply = await self._metadata([], topics_wanted=False)
        return ClusterDescription(
            nodes=tuple(
                Node(b.node_id, b.host, b.port, b.rack or None)
                for b in sorted(reply.brokers, key=lambda b: b.node_id)
            ),
            controller_id=reply.controller_id if reply.controller_id >= 0 else None,
            cluster_id=reply.cluster_id or None,
            metadata_mode=reply.metadata_mode or None,
        )

    # --- Configs --------------------------------------------------------------------------

    # --- ACLs and SCRAM credentials (docs/security.md) ----------------------------------

    async def create_acls(self, acls: Iterable[AclBinding]) -> list[AdminError | None]:
        """Create ACLs (Kafka's ``createAcls``): one outcome per ACL, in order (``None``:
        created, or there already). An ACL that exists already is not created twice."""
        from highwater.controller_api import messages as m

        entries = tuple(m.AclEntry.of(acl) for acl in acls)
        if not entries:
            return []
        reply = await self._call_controller(
            self._controller.create_acls, m.CreateAclsRequest(entries)
        )
        _check_reply("CreateAcls", reply.error, reply.error_message)
        return [_error_or_none(r.error, r.error_message) for r in reply.results]

    async def describe_acls(self, acl_filter: m.AclFilter | None = None) -> list[AclBinding]:
        """The ACLs ``acl_filter`` matches (every ACL without one): Kafka's ``describeAcls``
        (an unset field matches anything; pattern type 2, MATCH, every pattern covering
        the name)."""
        from highwater.controller_api import messages as m

        reply = await self._call_controller(
            self._controller.describe_acls, m.DescribeAclsRequest(acl_filter or m.AclFilter())
        )
        _check_reply("DescribeAcls", reply.error, reply.error_message)
        return [entry.binding() for entry in reply.acls]

    async def delete_acls(self, filters: Iterable[m.AclFilter]) -> list[list[AclBinding]]:
        """Delete the ACLs each filter matches (Kafka's ``deleteAcls``): what each
        removed, in order. A filter with an unknown code raises :class:`AdminError`."""
        from highwater.controller_api import messages as m

        wanted = tuple(filters)
        if not wanted:
            return []
        reply = await self._call_controller(
            self._controller.delete_acls, m.DeleteAclsRequest(wanted)
        )
        _check_reply("DeleteAcls", reply.error, reply.error_message)
        deleted = []
        for result in reply.results:
            if result.error != ErrorCode.NONE:
                raise error_for_code(result.error, result.error_message)
            deleted.append([entry.binding() for entry in result.deleted])
        return deleted

    async def alter_user_scram_credentials(
        self,
        upsertions: Iterable[tuple[str, str, str]] = (),
        deletions: Iterable[tuple[str, str]] = (),
        *,
        iterations: int = DEFAULT_SCRAM_ITERATIONS,
    ) -> dict[str, AdminError | None]:
        """Set ``(user, mechanism, password)`` credentials and remove ``(user, mechanism)``
        ones (Kafka's ``alterUserScramCredentials``): an outcome per user. The password
        never leaves this process: a fresh salt and the salted password are sent."""
        from highwater.controller_api import messages as m

        upserts = []
        for user, mechanism, password in upsertions:
            salt = os.urandom(16)
            number = MECHANISM_NUMBERS.get(mechanism, 0)
            salted = salted_password(mechanism, password, salt, iterations) if number else b""
            upserts.append(m.ScramCredentialUpsertion(user, number, iterations, salt, salted))
        removes = tuple(
            m.ScramCredentialDeletion(user, MECHANISM_NUMBERS.get(mechanism, 0))
            for user, mechanism in deletions
        )
        reply = await self._call_controller(
            self._controller.alter_user_scram_credentials,
            m.AlterUserScramCredentialsRequest(removes, tuple(upserts)),
        )
        _check_reply("AlterUserScramCredentials", reply.error, reply.error_message)
        return {r.user: _error_or_none(r.error, r.error_message) for r in reply.results}

    async def describe_user_scram_credentials(
        self, users: Iterable[str] = ()
    ) -> dict[str, list[tuple[str, int]]]:
        """Each user's SCRAM mechanisms and iteration counts (every user without
        ``users``); a user named that has none raises :class:`AdminError`."""
        from highwater.controller_api import messages as m

        reply = await self._call_controller(
            self._controller.describe_user_scram_credentials,
            m.DescribeUserScramCredentialsRequest(tuple(users)),
        )
        _check_reply("DescribeUserScramCredentials", reply.error, reply.error_message)
        described: dict[str, list[tuple[str, int]]] = {}
        for result in reply.results:
            if result.error != ErrorCode.NONE:
                raise error_for_code(result.error, result.error_message)
            described[result.user] = [
                (MECHANISM_NAMES.get(c.mechanism, str(c.mechanism)), c.iterations)
                for c in result.credentials
            ]
        return described

    async def alter_client_quotas(
        self,
        alterations: Iterable[tuple[ClientQuotaEntity, Mapping[str, float | None]]],
        *,
        validate_only: bool = False,
    ) -> list[AdminError | None]:
        """Set and remove quota keys (Kafka's ``alterClientQuotas``): per ``(entity,
        {key: value})``, a ``None`` value removing the key; one outcome per entity, in order
        (``None``: done). An unknown key or a value that is not positive (whole, for the
        byte rates) refuses that entity's changes, naming the key."""
        from highwater.controller_api import messages as m

        entries = tuple(
            m.ClientQuotaAlteration(
                _quota_components(entity),
                tuple(
                    m.ClientQuotaOp(key, 0.0, True)
                    if value is None
                    else m.ClientQuotaOp(key, float(value))
                    for key, value in ops.items()
                ),
            )
            for entity, ops in alterations
        )
        if not entries:
            return []
        reply = await self._call_controller(
            self._controller.alter_client_quotas,
            m.AlterClientQuotasRequest(entries, validate_only),
        )
        _check_reply("AlterClientQuotas", reply.error, reply.error_message)
        return [_error_or_none(r.error, r.error_message) for r in reply.results]

    async def describe_client_quotas(
        self, components: Iterable[m.ClientQuotaFilterComponent] = (), *, strict: bool = False
    ) -> dict[ClientQuotaEntity, dict[str, float]]:
        """The quota entities the filter matches and their keys (Kafka's
        ``describeClientQuotas``; no components: every entity)."""
        from highwater.controller_api import messages as m
        from highwater.metadata.client_quotas import ClientQuotaEntity

        reply = await self._call_controller(
            self._controller.describe_client_quotas,
            m.DescribeClientQuotasRequest(tuple(components), strict),
        )
        _check_reply("DescribeClientQuotas", reply.error, reply.error_message)
        return {
            ClientQuotaEntity.of({c.entity_type: c.entity_name for c in entry.entity}): dict(
                entry.values
            )
            for entry in reply.entries
        }

    async def describe_configs(
        self,
        topic: str,
        names: Iterable[str] = (),
        *,
        resource_type: ConfigResourceType | None = None,
    ) -> dict[str, ConfigEntry]:
        """Every config of ``topic`` (or the named ones) by name, with value and source.

        Overrides have source ``DYNAMIC_TOPIC_CONFIG``; ``entry.is_default`` tells the rest.
        Raises :class:`UnknownTopicOrPartitionError` for an unknown topic. With
        ``resource_type`` BROKER, ``topic`` is a broker id, or ``""`` for the cluster-wide
        defaults (Kafka's default broker resource); TOPIC when not given.
        """
        from highwater.controller_api import messages as m
        from highwater.metadata.records import ConfigResourceType

        if resource_type is None:
            resource_type = ConfigResourceType.TOPIC
        resource = m.DescribeConfigsResource(resource_type, topic, tuple(names))
        reply = await self._call_controller(
            self._controller.describe_configs, m.DescribeConfigsRequest((resource,))
        )
        _check_reply("DescribeConfigs", reply.error, reply.error_message)
        for result in reply.results:
            if result.error != ErrorCode.NONE:
                raise error_for_code(result.error, result.error_message)
            return {
                c.name: ConfigEntry(
                    c.name,
                    c.value,
                    m.ConfigSource(c.source),
                    c.read_only,
                    c.sensitive,
                    c.type,
                    c.documentation,
                )
                for c in result.configs
            }
        raise AdminError(f"DescribeConfigs: no answer for topic {topic!r}")

    async def alter_configs(
        self,
        topic: str,
        changes: Mapping[str, str | None],
        *,
        validate_only: bool = False,
        resource_type: ConfigResourceType | None = None,
    ) -> None:
        """Change ``topic``'s config overrides incrementally (Kafka's IncrementalAlterConfigs).

        ``{key: value}`` sets an override; ``{key: None}`` deletes it (back to the default);
        keys not named are left as they are. Raises the typed error if the topic is unknown
        or a key or value is invalid; then nothing is changed. ``resource_type`` as for
        :meth:`describe_configs`.
        """
        from highwater.controller_api import messages as m
        from highwater.metadata.records import ConfigResourceType

        if not changes:
            return
        ops = tuple(
            m.AlterableConfig(key, m.AlterConfigOp.DELETE)
            if value is None
            else m.AlterableConfig(key, m.AlterConfigOp.SET, value)
            for key, value in changes.items()
        )
        if resource_type is None:
            resource_type = ConfigResourceType.TOPIC
        resource = m.AlterConfigsResource(resource_type, topic, ops)
        reply = await self._call_controller(
            self._controller.alter_configs, m.AlterConfigsRequest((resource,), validate_only)
        )
        _check_reply("AlterConfigs", reply.error, reply.error_message)
        for result in reply.resources:
            if result.error != ErrorCode.NONE:
                raise error_for_code(result.error, result.error_message)

    # --- Leaders --------------------------------------------------------------------------

    async def elect_leaders(
        self,
        election_type: m.ElectionType | str,
        partitions: Iterable[tuple[str, int]] | None = None,
    ) -> dict[tuple[str, int], AdminError | None]:
        """Run a ``preferred`` or ``unclean`` election for ``(topic, partition)`` pairs.

        ``None`` means every partition of every topic; then only the partitions where an
        election was needed are reported. Each pair maps to ``None`` (a new leader) or
        its typed error (``ElectionNotNeededError`` when the leader is already right).
        """
        from highwater.controller_api import messages as m

        kind = (
            m.ElectionType[election_type.upper()]
            if isinstance(election_type, str)
            else election_type
        )
        if partitions is None:
            request = m.ElectLeadersRequest(kind, all_partitions=True)
        else:
            by_topic: dict[str, list[int]] = {}
            for topic, partition in partitions:
                by_topic.setdefault(topic, []).append(partition)
            if not by_topic:
                return {}
            request = m.ElectLeadersRequest(
                kind,
                tuple(m.TopicPartitions(t, tuple(ps)) for t, ps in by_topic.items()),
            )
        reply = await self._call_controller(self._controller.elect_leaders, request)
        _check_reply("ElectLeaders", reply.error, reply.error_message)
        return {
            (r.topic, r.partition_id): _error_or_none(r.error, r.error_message)
            for r in reply.partitions
        }

    # --- Partition reassignment -----------------------------------------------------------

    async def alter_partition_reassignments(
        self, reassignments: Mapping[TopicPartitionKey, Sequence[int] | None]
    ) -> dict[TopicPartitionKey, AdminError | None]:
        """Move each ``(topic, partition)`` to its target replicas (preferred leader first),
        or cancel its move in progress (``None``), as Kafka's
        ``alterPartitionReassignments``: the new replicas are added, and the old ones
        dropped once every new one has caught up (into the ISR). Returns ``None`` (started)
        or the partition's typed error (``InvalidReplicaAssignmentError``,
        ``NoReassignmentInProgressError``, ``UnknownTopicOrPartitionError``).
        """
        from highwater.controller_api import messages as m

        items = tuple(
            m.PartitionReassignment(topic, partition, cancel=True)
            if replicas is None
            else m.PartitionReassignment(topic, partition, tuple(replicas))
            for (topic, partition), replicas in reassignments.items()
        )
        if not items:
            return {}
        reply = await self._call_controller(
            self._controller.alter_partition_reassignments,
            m.AlterPartitionReassignmentsRequest(items),
        )
        _check_reply("AlterPartitionReassignments", reply.error, reply.error_message)
        return {
            (r.topic, r.partition_id): _error_or_none(r.error, r.error_message)
            for r in reply.partitions
        }

    async def list_partition_reassignments(
        self, partitions: Iterable[TopicPartitionKey] | None = None
    ) -> dict[TopicPartitionKey, PartitionReassignment]:
        """The reassignments in progress (of ``partitions``, or of every partition)."""
        from highwater.controller_api import messages as m

        by_topic: dict[str, list[int]] = {}
        for topic, partition in partitions or ():
            by_topic.setdefault(topic, []).append(partition)
        request = m.ListPartitionReassignmentsRequest(
            tuple(m.TopicPartitions(t, tuple(ps)) for t, ps in by_topic.items())
        )
        reply = await self._call_controller(self._controller.list_partition_reassignments, request)
        _check_reply("ListPartitionReassignments", reply.error, reply.error_message)
        return {
            (r.topic, r.partition_id): PartitionReassignment(
                r.replicas, r.adding_replicas, r.removing_replicas
            )
            for r in reply.reassignments
        }

    async def unregister_broker(self, broker_id: int) -> None:
        """Remove a broker from the cluster for good (scaling down): refused with a typed
        error while it still holds replicas, which must be reassigned first."""
        from highwater.controller_api import messages as m

        reply = await self._call_controller(
            self._controller.unregister_broker, m.UnregisterBrokerRequest(broker_id)
        )
        _check_reply("UnregisterBroker", reply.error, reply.error_message)

    # --- Offsets of partitions -------------------------------------------------------------

    async def list_offsets(
        self, partitions: Mapping[TopicPartitionKey, int]
    ) -> dict[TopicPartitionKey, ListOffsetsResultInfo]:
        """The offset each ``(topic, partition)`` asks for with its :class:`OffsetSpec`
        (earliest, latest, or by time), from the partitions' leaders.

        Leader moves are retried until ``request_timeout_s``; raises
        :class:`UnknownTopicOrPartitionError` for an unknown topic or partition and the
        partition's typed error for other failures.
        """
        return await self._at_leaders(dict(partitions), self._list_offsets_at)

    async def delete_records(
        self, offsets: Mapping[TopicPartitionKey, int]
    ) -> dict[TopicPartitionKey, int]:
        """Delete the records of each ``(topic, partition)`` below its offset (-1: below the
        high watermark), as Kafka's ``deleteRecords``: the partitions' new log start offsets
        (low watermarks). Raises the partition's typed error (an offset above the high
        watermark: OFFSET_OUT_OF_RANGE)."""
        return await self._at_leaders(dict(offsets), self._delete_records_at)

    async def _at_leaders(
        self,
        wanted: dict[TopicPartitionKey, int],
        call: Callable[
            [str, Sequence[TopicPartitionKey], Mapping[TopicPartitionKey, int], float],
            Awaitable[tuple[dict[TopicPartitionKey, _T], list[TopicPartitionKey]]],
        ],
    ) -> dict[TopicPartitionKey, _T]:
        """Send each partition's request to its leader (one request per leader broker),
        retrying leader moves until ``request_timeout_s``."""
        if not wanted:
            return {}
        deadline = time.monotonic() + self.request_timeout_s
        results: dict[TopicPartitionKey, _T] = {}
        while True:
            todo = {tp: value for tp, value in wanted.items() if tp not in results}
            reply = await self._metadata(sorted({t for t, _ in todo}))
            leaders, retry = _leaders(reply, todo)
            brokers = {b.node_id: format_endpoint(b.host, b.port) for b in reply.brokers}
            by_address: dict[str, list[TopicPartitionKey]] = {}
            for tp, leader in leaders.items():
                address = brokers.get(leader)
                if address is None:
                    retry.append(tp)
                else:
                    by_address.setdefault(address, []).append(tp)
            answers = await asyncio.gather(
                *(call(a, tps, todo, deadline) for a, tps in by_address.items())
            )
            last: AdminError | None = None
            for found, failed in answers:
                results.update(found)
                retry.extend(failed)
                if failed:
                    last = error_for_code(ErrorCode.LEADER_NOT_AVAILABLE)
            if not retry:
                return {tp: results[tp] for tp in wanted}
            if time.monotonic() + _RETRY_BACKOFF_S >= deadline:
                tp = retry[0]
                raise last or error_for_code(
                    ErrorCode.LEADER_NOT_AVAILABLE, f"{tp[0]}-{tp[1]} has no leader"
                )
            await asyncio.sleep(_RETRY_BACKOFF_S)

    async def _delete_records_at(
        self,
        address: str,
        partitions: Sequence[TopicPartitionKey],
        offsets: Mapping[TopicPartitionKey, int],
        deadline: float,
    ) -> tuple[dict[TopicPartitionKey, int], list[TopicPartitionKey]]:
        """One DeleteRecords request to a leader: the low watermarks, and what to retry."""
        timeout_ms = max(int((deadline - time.monotonic()) * 1000), 100)
        request = pb.DeleteRecordsRequest(timeout_ms=timeout_ms)
        topics: dict[str, pb.DeleteRecordsTopic] = {}
        for topic, partition in partitions:
            entry = topics.get(topic)
            if entry is None:
                entry = topics[topic] = request.topics.add(topic=topic)
            entry.partitions.add(partition=partition, offset=offsets[(topic, partition)])
        try:
            reply: pb.DeleteRecordsResponse = await self._broker_stub(address).DeleteRecords(
                request, timeout=max(deadline - time.monotonic(), 0.1)
            )
        except grpc.aio.AioRpcError as e:
            if e.code() not in _RETRIABLE_BROKER_CODES:
                raise _rpc_error(e) from None
            return {}, list(partitions)
        found: dict[TopicPartitionKey, int] = {}
        retry: list[TopicPartitionKey] = []
        for topic_answer in reply.topics:
            for answer in topic_answer.partitions:
                tp = (topic_answer.topic, answer.partition)
                if tp not in offsets:
                    continue
                if answer.error in _RETRIABLE_LEADER_CODES:
                    retry.append(tp)
                elif answer.error != ErrorCode.NONE:
                    raise error_for_code(answer.error, f"DeleteRecords of {tp[0]}-{tp[1]}")
                else:
                    found[tp] = answer.low_watermark
        retry.extend(tp for tp in partitions if tp not in found and tp not in retry)
        return found, retry

    async def _list_offsets_at(
        self,
        address: str,
        partitions: Sequence[TopicPartitionKey],
        specs: Mapping[TopicPartitionKey, int],
        deadline: float,
    ) -> tuple[dict[TopicPartitionKey, ListOffsetsResultInfo], list[TopicPartitionKey]]:
        """One ListOffsets request to a leader: the answers, and the partitions to retry."""
        try:
            answers = await self.cluster.list_offsets(
                address,
                [
                    (topic, partition, specs[(topic, partition)], None)
                    for topic, partition in partitions
                ],
                max(deadline - time.monotonic(), 0.1),
            )
        except grpc.aio.AioRpcError as e:
            if e.code() not in _RETRIABLE_BROKER_CODES:
                raise _rpc_error(e) from None
            return {}, list(partitions)
        found: dict[TopicPartitionKey, ListOffsetsResultInfo] = {}
        retry: list[TopicPartitionKey] = []
        for tp, answer in zip(partitions, answers, strict=True):
            if answer is None or answer.error in _RETRIABLE_LEADER_CODES:
                retry.append(tp)
            elif answer.error != ErrorCode.NONE:
                raise error_for_code(answer.error, f"ListOffsets of {tp[0]}-{tp[1]}")
            else:
                found[tp] = ListOffsetsResultInfo(
                    answer.offset,
                    answer.timestamp,
                    answer.leader_epoch if answer.leader_epoch >= 0 else None,
                )
        return found, retry

    # --- Consumer groups ------------------------------------------------------------------

    # --- Log directories ---------------------------------------------------------------

    async def describe_log_dirs(
        self,
        broker_ids: Iterable[int] | None = None,
        *,
        topics: Iterable[str] | None = None,
    ) -> dict[int, dict[str, LogDirDescription]]:
        """Each broker's log directories by path (Kafka's ``describeLogDirs``): health,
        disk usage and the replicas in each, of ``topics`` or of every topic.

        ``broker_ids``: the brokers to ask (all registered, unfenced brokers when None);
        one the cluster does not list is refused with :class:`InvalidRequestError`
        naming it. Each broker answers for itself (the call is not forwarded).
        """
        reply = await self._metadata([], topics_wanted=False)
        known = {b.node_id: format_endpoint(b.host, b.port) for b in reply.brokers}
        wanted = sorted(known) if broker_ids is None else list(dict.fromkeys(broker_ids))
        missing = [b for b in wanted if b not in known]
        if missing:
            raise InvalidRequestError(
                f"brokers {', '.join(map(str, missing))} do not exist; the brokers are "
                f"{', '.join(map(str, sorted(known))) or 'none'}"
            )
        request = pb.DescribeLogDirsRequest(
            topics=[pb.DescribeLogDirsTopic(topic=t) for t in dict.fromkeys(topics or ())]
        )
        deadline = time.monotonic() + self.request_timeout_s
        answers = await asyncio.gather(
            *(self._describe_log_dirs_at(known[b], request, deadline) for b in wanted)
        )
        return dict(zip(wanted, answers, strict=True))

    async def _describe_log_dirs_at(
        self, address: str, request: pb.DescribeLogDirsRequest, deadline: float
    ) -> dict[str, LogDirDescription]:
        while True:
            try:
                reply: pb.DescribeLogDirsResponse = await self._broker_stub(
                    address
                ).DescribeLogDirs(request, timeout=max(deadline - time.monotonic(), 0.1))
                break
            except grpc.aio.AioRpcError as e:
                if e.code() not in _RETRIABLE_BROKER_CODES or time.monotonic() >= deadline:
                    raise _rpc_error(e) from None
            await asyncio.sleep(_RETRY_BACKOFF_S)
        _check_reply(f"DescribeLogDirs at {address}", reply.error, "")
        result = {}
        for described in reply.results:
            result[described.log_dir] = LogDirDescription(
                path=described.log_dir,
                directory_id=described.directory_id,
                error=_error_or_none(described.error, described.error_message),
                replica_infos={
                    (topic.name, p.partition_index): ReplicaInfo(
                        p.partition_size, p.offset_lag, p.is_future_key
                    )
                    for topic in described.topics
                    for p in topic.partitions
                },
                total_bytes=described.total_bytes if described.total_bytes >= 0 else None,
                usable_bytes=described.usable_bytes if described.usable_bytes >= 0 else None,
            )
        return result

    async def list_consumer_groups(
        self, states: Iterable[str] | None = None
    ) -> list[ConsumerGroupListing]:
        """Every group of every coordinator, sorted by id; only those in ``states``
        (``Stable``, ``Empty``..., any case) if given."""
        reply = await self._metadata([], topics_wanted=False)
        nodes = reply.coordinators or reply.brokers
        addresses = sorted({format_endpoint(n.host, n.port) for n in nodes})
        if not addresses:
            raise CoordinatorNotAvailableError("ListGroups: the cluster has no coordinator")
        request = cpb.ListGroupsRequest(states_filter=list(states or ()))
        deadline = time.monotonic() + self.request_timeout_s
        replies = await asyncio.gather(
            *(self._list_groups_at(address, request, deadline) for address in addresses)
        )
        groups: dict[str, ConsumerGroupListing] = {}
        for listed in replies:
            for group in listed.groups:
                groups[group.group_id] = ConsumerGroupListing(
                    group.group_id, group.group_state, group.protocol_type
                )
        return [groups[g] for g in sorted(groups)]

    async def _list_groups_at(
        self, address: str, request: cpb.ListGroupsRequest, deadline: float
    ) -> cpb.ListGroupsResponse:
        """ListGroups to one coordinator, retried while it loads or cannot be reached."""
        while True:
            try:
                reply: cpb.ListGroupsResponse = await self._coordinator_stub(address).ListGroups(
                    request, timeout=max(deadline - time.monotonic(), 0.1)
                )
            except grpc.aio.AioRpcError as e:
                if e.code() not in _RETRIABLE_BROKER_CODES or time.monotonic() >= deadline:
                    raise _rpc_error(e) from None
            else:
                if reply.error not in _RETRIABLE_GROUP_CODES:
                    _check_reply(f"ListGroups at {address}", reply.error, reply.error_message)
                    return reply
                if time.monotonic() >= deadline:
                    _check_reply(f"ListGroups at {address}", reply.error, reply.error_message)
            await asyncio.sleep(_RETRY_BACKOFF_S)

    async def describe_consumer_groups(
        self, group_ids: Iterable[str]
    ) -> dict[str, ConsumerGroupDescription]:
        """State, assignor and members (with their decoded assignments) of each group.

        Raises the typed error of the first group that cannot be described; a group that
        does not exist is a :class:`GroupIdNotFoundError`.
        """
        wanted = list(dict.fromkeys(group_ids))
        described = await asyncio.gather(*(self._describe_group(g) for g in wanted))
        return dict(zip(wanted, described, strict=True))

    async def _describe_group(self, group_id: str) -> ConsumerGroupDescription:
        request = cpb.DescribeGroupsRequest(group_ids=[group_id])
        node, reply = await self._coordinator_call(
            group_id,
            lambda stub, timeout: stub.DescribeGroups(request, timeout=timeout),
            lambda r: r.groups[0].error if r.groups else ErrorCode.NONE,
        )
        if not reply.groups:
            raise AdminError(f"DescribeGroups: no answer for group '{group_id}'")
        group = reply.groups[0]
        if group.error != ErrorCode.NONE:
            raise _group_error(group_id, group.error, group.error_message)
        if group.group_state == "Dead" and not group.members:
            raise GroupIdNotFoundError(f"Consumer group '{group_id}' does not exist.")
        members = tuple(
            MemberDescription(
                member.member_id,
                member.client_id,
                member.client_host,
                _assignment(group.protocol_type, member.member_assignment),
                member.group_instance_id if member.HasField("group_instance_id") else None,
            )
            for member in group.members
        )
        return ConsumerGroupDescription(
            group_id=group_id,
            state=group.group_state,
            protocol_type=group.protocol_type,
            partition_assignor=group.protocol_name,
            members=members,
            coordinator=node,
            generation_id=group.generation_id,
            leader=group.leader,
        )

    async def delete_consumer_groups(self, group_ids: Iterable[str]) -> dict[str, GroupResult]:
        """Delete empty groups and their committed offsets; one :class:`GroupResult` per id
        (a group with members: :class:`GroupNotEmptyError`; none such:
        :class:`GroupIdNotFoundError`)."""
        wanted = list(dict.fromkeys(group_ids))
        results = await asyncio.gather(*(self._delete_group(g) for g in wanted))
        return dict(zip(wanted, results, strict=True))

    async def _delete_group(self, group_id: str) -> GroupResult:
        request = cpb.DeleteGroupsRequest(group_ids=[group_id])
        try:
            _, reply = await self._coordinator_call(
                group_id,
                lambda stub, timeout: stub.DeleteGroups(request, timeout=timeout),
                lambda r: r.results[0].error if r.results else ErrorCode.NONE,
            )
        except AdminError as e:
            return GroupResult(group_id, e)
        if not reply.results:
            return GroupResult(group_id, AdminError(f"DeleteGroups: no answer for '{group_id}'"))
        result = reply.results[0]
        if result.error == ErrorCode.NONE:
            return GroupResult(group_id)
        return GroupResult(group_id, _group_error(group_id, result.error, result.error_message))

    async def delete_consumer_group_offsets(
        self, group_id: str, partitions: Iterable[TopicPartitionKey]
    ) -> dict[TopicPartitionKey, AdminError | None]:
        """Delete the group's committed offsets of ``partitions`` (Kafka's
        ``deleteConsumerGroupOffsets``, KIP-496): ``None`` per partition whose offset is
        gone (or had none), else its error (GROUP_SUBSCRIBED_TO_TOPIC: a member subscribes
        to the topic). A failure of the whole group raises (:class:`GroupIdNotFoundError`,
        :class:`GroupNotEmptyError` for a non-consumer group with members)."""
        wanted = list(dict.fromkeys(partitions))
        if not wanted:
            return {}
        request = cpb.OffsetDeleteRequest(group_id=group_id)
        by_topic: dict[str, list[int]] = {}
        for topic, partition in wanted:
            by_topic.setdefault(topic, []).append(partition)
        for topic, indexes in by_topic.items():
            request.topics.add(name=topic, partition_indexes=indexes)
        _, reply = await self._coordinator_call(
            group_id,
            lambda stub, timeout: stub.OffsetDelete(request, timeout=timeout),
            lambda r: r.error,
        )
        if reply.error != ErrorCode.NONE:
            raise _group_error(group_id, reply.error, reply.error_message)
        found: dict[TopicPartitionKey, AdminError | None] = {}
        for topic in reply.topics:
            for p in topic.partitions:
                found[(topic.name, p.partition_index)] = (
                    None
                    if p.error == ErrorCode.NONE
                    else error_for_code(p.error, p.error_message or ErrorCode.Name(p.error))
                )
        return {
            tp: found.get(tp, AdminError(f"OffsetDelete: no answer for {tp[0]}-{tp[1]}"))
            for tp in wanted
        }

    async def list_consumer_group_offsets(
        self, group_id: str, partitions: Iterable[TopicPartitionKey] | None = None
    ) -> dict[TopicPartitionKey, OffsetAndMetadata]:
        """The group's committed offsets: of every partition it has one for, or of the
        ``(topic, partition)`` pairs given (those without one are left out).

        A group that does not exist has no offsets: the answer is empty. A group-level
        error raises its typed error; a partition answered an error (a topic the caller
        may not describe: TOPIC_AUTHORIZATION_FAILED) is left out with a warning, as
        Kafka's ``ListConsumerGroupOffsetsHandler`` does, and the others are returned.
        """
        request = cpb.OffsetFetchRequest(group_id=group_id)
        if partitions is None:
            request.all_topics = True
        else:
            by_topic: dict[str, list[int]] = {}
            for topic, partition in partitions:
                by_topic.setdefault(topic, []).append(partition)
            if not by_topic:
                return {}
            for topic, indexes in by_topic.items():
                request.topics.add(name=topic, partition_indexes=sorted(set(indexes)))
        _, reply = await self._coordinator_call(
            group_id,
            lambda stub, timeout: stub.OffsetFetch(request, timeout=timeout),
            lambda r: r.error,
        )
        if reply.error != ErrorCode.NONE:
            raise _group_error(group_id, reply.error, reply.error_message)
        offsets: dict[TopicPartitionKey, OffsetAndMetadata] = {}
        for topic in reply.topics:
            for p in topic.partitions:
                if p.error != ErrorCode.NONE:
                    log.warning(
                        "group %r: offset of %s-%d left out: %s: %s",
                        group_id,
                        topic.name,
                        p.partition_index,
                        _code_name(p.error),
                        p.error_message,
                    )
                    continue
                if p.committed_offset >= 0:
                    offsets[(topic.name, p.partition_index)] = OffsetAndMetadata(
                        p.committed_offset,
                        p.committed_leader_epoch if p.committed_leader_epoch >= 0 else None,
                        p.metadata,
                    )
        return dict(sorted(offsets.items()))

    async def alter_consumer_group_offsets(
        self, group_id: str, offsets: Mapping[TopicPartitionKey, int | OffsetAndMetadata]
    ) -> None:
        """Set the group's committed offsets of the partitions given (Kafka's
        ``alterConsumerGroupOffsets``): an OffsetCommit from outside group management.

        The coordinator takes it only while the group has no members: otherwise
        :class:`GroupNotEmptyError` ("the group has active members", with the
        coordinator's code UNKNOWN_MEMBER_ID). Other failures raise the first partition's
        typed error; then the other partitions may have been stored.
        """
        if not offsets:
            return
        request = cpb.OffsetCommitRequest(group_id=group_id, generation_id=-1, member_id="")
        by_topic: dict[str, cpb.OffsetCommitTopic] = {}
        for (topic, partition), value in sorted(offsets.items()):
            given = value if isinstance(value, OffsetAndMetadata) else OffsetAndMetadata(value)
            if given.offset < 0:
                raise ValueError(f"{topic}-{partition}: an offset must be >= 0, not {given.offset}")
            entry = by_topic.get(topic)
            if entry is None:
                entry = by_topic[topic] = request.topics.add(name=topic)
            entry.partitions.add(
                partition_index=partition,
                committed_offset=given.offset,
                committed_leader_epoch=-1 if given.leader_epoch is None else given.leader_epoch,
                metadata=given.metadata,
            )
        _, reply = await self._coordinator_call(
            group_id,
            lambda stub, timeout: stub.OffsetCommit(request, timeout=timeout),
            _commit_error,
        )
        codes = [(p.error, p.error_message) for t in reply.topics for p in t.partitions]
        if reply.error != ErrorCode.NONE:
            codes.insert(0, (reply.error, reply.error_message))
        for code, message in codes:
            if code == ErrorCode.UNKNOWN_MEMBER_ID:
                raise GroupNotEmptyError(
                    f"Consumer group '{group_id}' has active members: its offsets can only "
                    "be altered while it has none.",
                    code=ErrorCode.UNKNOWN_MEMBER_ID,
                )
            if code != ErrorCode.NONE:
                raise _group_error(group_id, code, message)

    async def _coordinator_call(
        self,
        group_id: str,
        send: Callable[[coordinator_pb2_grpc.GroupCoordinatorStub, float], Awaitable[Resp]],
        error_of: Callable[[Resp], int],
    ) -> tuple[Node, Resp]:
        """Send a request to the group's coordinator; coordinator moves and loads are
        retried (the coordinator looked up again) until ``request_timeout_s``."""
        self._check_open()
        if not group_id:
            raise InvalidGroupIdError("the group id is empty")
        deadline = time.monotonic() + self.request_timeout_s
        while True:
            try:
                node = await self._find_coordinator(group_id, deadline)
                reply = await send(
                    self._coordinator_stub(node.address), max(deadline - time.monotonic(), 0.1)
                )
            except grpc.aio.AioRpcError as e:
                if e.code() not in _RETRIABLE_BROKER_CODES:
                    raise _rpc_error(e) from None
                last: AdminError = CoordinatorNotAvailableError(
                    f"group '{group_id}': the coordinator did not answer ({e.code().name})"
                )
            else:
                code = error_of(reply)
                if code not in _RETRIABLE_GROUP_CODES:
                    return node, reply
                last = error_for_code(code, f"group '{group_id}': {_code_name(code)}")
            if time.monotonic() + _RETRY_BACKOFF_S >= deadline:
                raise last
            await asyncio.sleep(_RETRY_BACKOFF_S)

    async def _find_coordinator(self, group_id: str, deadline: float) -> Node:
        """The group's coordinator, from FindCoordinator to the bootstrap brokers in turn
        (:meth:`ClusterMetadata.coordinator`); COORDINATOR_NOT_AVAILABLE and unreachable
        brokers are retried until ``deadline``."""
        while True:
            try:
                answer = await self.cluster.coordinator(
                    group_id,
                    timeout_s=max(deadline - time.monotonic(), 0.1),
                    what=f"FindCoordinator for group '{group_id}'",
                )
            except BrokerUnavailableError as e:
                last_code: int = ErrorCode.COORDINATOR_NOT_AVAILABLE
                message = str(e)
            else:
                if answer.error == ErrorCode.NONE:
                    return Node(answer.node_id, answer.host, answer.port)
                if answer.error == ErrorCode.INVALID_REQUEST:
                    raise InvalidGroupIdError(f"group '{group_id}': {answer.error_message}")
                if answer.error == ErrorCode.GROUP_AUTHORIZATION_FAILED:  # not retriable
                    raise GroupAuthorizationFailedError(
                        f"group '{group_id}': GROUP_AUTHORIZATION_FAILED: {answer.error_message}"
                    )
                last_code = answer.error
                problem = answer.error_message or str(answer.error)
                message = f"FindCoordinator for group '{group_id}': {problem}"
            if time.monotonic() + _RETRY_BACKOFF_S >= deadline:
                raise error_for_code(last_code, message)
            await asyncio.sleep(_RETRY_BACKOFF_S)

    def _coordinator_stub(self, address: str) -> coordinator_pb2_grpc.GroupCoordinatorStub:
        return self.cluster.coordinator_stub(address)

    # --- Plumbing -------------------------------------------------------------------------

    async def _call_controller(
        self, method: Callable[[Req], Awaitable[Resp]], request: Req
    ) -> Resp:
        """Call the Controller API; a request it rejects as a whole is an AdminError."""
        from highwater.controller_api.client import ControllerUnavailableError

        self._check_open()
        try:
            return await method(request)
        except grpc.aio.AioRpcError as e:
            raise _rpc_error(e) from None
        except ControllerUnavailableError as e:
            raise ControllerNotAvailableError(str(e)) from e

    async def _metadata(
        self, topics: Sequence[str], *, topics_wanted: bool = True
    ) -> pb.MetadataResponse:
        """Ask bootstrap brokers for Metadata in turn, starting with the last that answered
        (:meth:`ClusterMetadata.refresh`, as :data:`_ADMIN_BROKERS` says).

        ``topics_wanted=False`` still asks for every topic (the RPC has no way to ask for
        none); only the brokers are used.
        """
        self._check_open()
        return await self.cluster.refresh(topics)

    def _broker_stub(self, address: str) -> broker_pb2_grpc.BrokerStub:
        return self.cluster.stub(address)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the admin client is closed")


def _rpc_error(e: grpc.aio.AioRpcError) -> AdminError:
    """A gRPC failure of a whole request as an AdminError."""
    code = (
        ErrorCode.INVALID_REQUEST
        if e.code() == grpc.StatusCode.INVALID_ARGUMENT
        else ErrorCode.UNKNOWN_SERVER_ERROR
    )
    return error_for_code(code, f"{e.code().name}: {e.details()}")


def _no_bootstrap_broker_answered(
    what: str, tried: Sequence[str], failures: Sequence[tuple[str, grpc.aio.AioRpcError]]
) -> AdminError:
    """The admin client's error when none of its bootstrap brokers answered a request."""
    problems = "; ".join(f"{address}: {e.code().name}" for address, e in failures)
    return BrokerUnavailableError(f"{what}: no bootstrap broker answered ({problems})")


#: How the admin client asks Metadata and FindCoordinator of its brokers: the bootstrap
#: ones only, starting with the last that answered; an unreachable broker (or one that
#: serves no Broker service) makes it ask the next, any other failure is an AdminError.
_ADMIN_BROKERS: Final = BrokerPolicy(
    bootstrap_only=True,
    retriable_status=_RETRIABLE_BROKER_CODES,
    rpc_error=_rpc_error,
    unavailable=_no_bootstrap_broker_answered,
)


def _group_error(group_id: str, code: int, message: str) -> AdminError:
    """A coordinator's error code about a group as its typed error, in plain words."""
    if code == ErrorCode.GROUP_ID_NOT_FOUND:
        return GroupIdNotFoundError(f"Consumer group '{group_id}' does not exist.")
    if code == ErrorCode.NON_EMPTY_GROUP:
        return GroupNotEmptyError(
            f"Consumer group '{group_id}' is not empty: it has active members."
        )
    detail = f": {message}" if message else ""
    return error_for_code(code, f"group '{group_id}': {_code_name(code)}{detail}")


def _code_name(code: int) -> str:
    try:
        return ErrorCode.Name(code)  # type: ignore[arg-type]
    except ValueError:
        return f"error code {code}"


def _commit_error(reply: cpb.OffsetCommitResponse) -> int:
    """The coordinator error of an OffsetCommit answer (in every partition), else its error."""
    for topic in reply.topics:
        for p in topic.partitions:
            if p.error in _RETRIABLE_GROUP_CODES:
                return p.error
    return reply.error


def _assignment(protocol_type: str, data: bytes) -> tuple[TopicPartitionKey, ...]:
    """A consumer member's assignment bytes, decoded (empty when not a consumer's, or bad)."""
    if protocol_type != _CONSUMER_PROTOCOL or not data:
        return ()
    try:
        return decode_assignment(data).partitions
    except MalformedConsumerProtocolError:
        return ()


def _leaders(
    reply: pb.MetadataResponse, wanted: Mapping[TopicPartitionKey, int]
) -> tuple[dict[TopicPartitionKey, int], list[TopicPartitionKey]]:
    """The leader of each wanted partition, and those without one now (to retry); raises
    :class:`UnknownTopicOrPartitionError` for an unknown topic or partition."""
    topics = {t.name: t for t in reply.topics}
    leaders: dict[TopicPartitionKey, int] = {}
    leaderless: list[TopicPartitionKey] = []
    for topic, partition in wanted:
        described = topics.get(topic)
        if described is None or described.error == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
            raise UnknownTopicOrPartitionError(f"Topic '{topic}' does not exist.")
        found = next((p for p in described.partitions if p.partition == partition), None)
        if found is None:
            raise UnknownTopicOrPartitionError(
                f"Topic '{topic}' has no partition {partition} "
                f"(it has {len(described.partitions)})."
            )
        if found.leader_id < 0 or found.error != ErrorCode.NONE:
            leaderless.append((topic, partition))
        else:
            leaders[(topic, partition)] = found.leader_id
    return leaders, leaderless


def _creatable(topic: NewTopic) -> m.CreatableTopic:
    from highwater.controller_api import messages as m

    assignments: tuple[tuple[int, ...], ...] = ()
    if topic.replica_assignment is not None:
        given = dict(topic.replica_assignment)
        if sorted(given) != list(range(len(given))):
            raise InvalidReplicaAssignmentError(
                f"Topic {topic.name!r}: the replica assignment must name partitions "
                f"0..{len(given) - 1} exactly, not {sorted(given)}"
            )
        assignments = tuple(tuple(given[p]) for p in range(len(given)))
    return m.CreatableTopic(
        topic.name,
        topic.num_partitions,
        topic.replication_factor,
        assignments,
        dict(topic.config or {}),
    )


def _quota_components(entity: ClientQuotaEntity) -> tuple[m.ClientQuotaEntityComponent, ...]:
    """The wire components of a quota entity (a default has no name)."""
    from highwater.controller_api import messages as m

    return tuple(m.ClientQuotaEntityComponent(t, n) for t, n in entity.components().items())
