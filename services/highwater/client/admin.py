"""``AdminClient``: create, delete, grow, describe and configure topics, like Kafka's Admin API.

An asyncio client built from ``bootstrap.servers`` (``"host1:9092,host2:9092"``):

* **Writes and configs** (``create_topics``, ``delete_topics``, ``create_partitions``,
  ``describe_configs``, ``alter_configs``, ``elect_leaders``) go to the Controller API
  through a :class:`~highwater.controller.client.ControllerClient` given the same
  addresses; it finds the active controller and retries there. In ``highwater server``
  the Controller service answers on the broker's port, so the bootstrap address is all
  that is needed. Brokers do not forward admin calls yet: the admin client of a
  multi-process cluster must be given the *controllers'* addresses for these calls with
  ``controllers=`` (the CLI's ``--controllers``), and the brokers' as
  ``bootstrap.servers`` for the descriptions.
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
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, TypeVar

import grpc
import grpc.aio

from highwater import errors as hw_errors
from highwater.controller import messages as m
from highwater.controller.client import ControllerClient
from highwater.errors import HighwaterError
from highwater.metadata.records import ConfigResourceType
from highwater.raft.service import channel_options, format_endpoint, parse_endpoint
from highwater.v1 import broker_pb2 as pb
from highwater.v1 import broker_pb2_grpc
from highwater.v1.common_pb2 import ErrorCode

__all__ = [
    "AdminClient",
    "AdminError",
    "BrokerUnavailableError",
    "ClusterDescription",
    "ConfigEntry",
    "ConfigSource",
    "CreateTopicResult",
    "ElectionNotNeededError",
    "ElectionType",
    "EligibleLeadersNotAvailableError",
    "InvalidConfigurationError",
    "InvalidPartitionsError",
    "InvalidReplicaAssignmentError",
    "InvalidReplicationFactorError",
    "InvalidRequestError",
    "InvalidTopicNameError",
    "NewTopic",
    "Node",
    "PartitionInfo",
    "PreferredLeaderNotAvailableError",
    "TopicDescription",
    "TopicExistsError",
    "TopicListing",
    "TopicResult",
    "UnknownTopicOrPartitionError",
    "error_for_code",
]

Req = TypeVar("Req")
Resp = TypeVar("Resp")

ElectionType = m.ElectionType
ConfigSource = m.ConfigSource

_RETRIABLE_BROKER_CODES: Final = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.CANCELLED,
        # A bootstrap address that serves no Broker service (a controller's): try the next.
        grpc.StatusCode.UNIMPLEMENTED,
    }
)

# --- Errors ---------------------------------------------------------------------------


class AdminError(HighwaterError):
    """An admin operation, or one topic or partition of it, failed; ``code`` is Kafka's code.

    The subclasses name the common cases; any other code is an ``AdminError`` carrying it.
    """

    code: int = ErrorCode.UNKNOWN_SERVER_ERROR

    def __init__(self, message: str, *, code: int | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code
        self.message = message


class TopicExistsError(AdminError):
    """TOPIC_ALREADY_EXISTS: a topic of that name exists."""

    code = ErrorCode.TOPIC_ALREADY_EXISTS


class UnknownTopicOrPartitionError(AdminError):
    """UNKNOWN_TOPIC_OR_PARTITION: no such topic, or no such partition of it."""

    code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


class InvalidTopicNameError(AdminError, hw_errors.InvalidTopicError):
    """INVALID_TOPIC_EXCEPTION: an illegal name, or one that collides with another topic's."""

    code = ErrorCode.INVALID_TOPIC_EXCEPTION


class InvalidConfigurationError(AdminError, hw_errors.InvalidConfigError):
    """INVALID_CONFIG: an unknown config key, or a value of the wrong type or range."""

    code = ErrorCode.INVALID_CONFIG


class InvalidReplicationFactorError(AdminError):
    """INVALID_REPLICATION_FACTOR: below 1, or above the number of usable brokers."""

    code = ErrorCode.INVALID_REPLICATION_FACTOR


class InvalidPartitionsError(AdminError):
    """INVALID_PARTITIONS: a partition count below 1, or one that does not grow the topic."""

    code = ErrorCode.INVALID_PARTITIONS


class InvalidReplicaAssignmentError(AdminError):
    """INVALID_REPLICA_ASSIGNMENT: a manual assignment that names unknown or repeated brokers."""

    code = ErrorCode.INVALID_REPLICA_ASSIGNMENT


class InvalidRequestError(AdminError):
    """INVALID_REQUEST: a request the controller refuses as malformed."""

    code = ErrorCode.INVALID_REQUEST


class ElectionNotNeededError(AdminError):
    """ELECTION_NOT_NEEDED: the partition already has the leader the election would pick."""

    code = ErrorCode.ELECTION_NOT_NEEDED


class PreferredLeaderNotAvailableError(AdminError):
    """PREFERRED_LEADER_NOT_AVAILABLE: the preferred replica cannot lead now."""

    code = ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE


class EligibleLeadersNotAvailableError(AdminError):
    """ELIGIBLE_LEADERS_NOT_AVAILABLE: no live replica may be elected."""

    code = ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE


class BrokerUnavailableError(AdminError):
    """No bootstrap broker answered the Metadata RPC before the deadline."""

    code = ErrorCode.NETWORK_EXCEPTION


_ERRORS_BY_CODE: Final[Mapping[int, type[AdminError]]] = {
    cls.code: cls
    for cls in (
        TopicExistsError,
        UnknownTopicOrPartitionError,
        InvalidTopicNameError,
        InvalidConfigurationError,
        InvalidReplicationFactorError,
        InvalidPartitionsError,
        InvalidReplicaAssignmentError,
        InvalidRequestError,
        ElectionNotNeededError,
        PreferredLeaderNotAvailableError,
        EligibleLeadersNotAvailableError,
    )
}


def error_for_code(code: int, message: str = "") -> AdminError:
    """The typed :class:`AdminError` for Kafka error ``code`` (a plain one if it has no class)."""
    cls = _ERRORS_BY_CODE.get(code)
    if not message:
        try:
            message = ErrorCode.Name(code)  # type: ignore[arg-type]
        except ValueError:
            message = f"error code {code}"
    if cls is None:
        return AdminError(message, code=code)
    return cls(message)


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
        return self.source == m.ConfigSource.DEFAULT_CONFIG


@dataclass
class _BrokerChannels:
    channels: dict[str, grpc.aio.Channel] = field(default_factory=dict)
    stubs: dict[str, broker_pb2_grpc.BrokerStub] = field(default_factory=dict)


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
        if isinstance(bootstrap_servers, Mapping):
            if "bootstrap.servers" not in bootstrap_servers:
                raise ValueError("the config needs bootstrap.servers")
            servers: str | Sequence[str] = bootstrap_servers["bootstrap.servers"]
        else:
            servers = bootstrap_servers
        self.bootstrap_servers: tuple[str, ...] = tuple(_split_addresses(servers))
        self.controllers: tuple[str, ...] = (
            self.bootstrap_servers if controllers is None else tuple(_split_addresses(controllers))
        )
        self.request_timeout_s = request_timeout_s
        self._controller = ControllerClient(
            list(self.controllers),
            timeout_s=request_timeout_s,
            attempt_timeout_s=min(5.0, request_timeout_s),
        )
        self._brokers = _BrokerChannels()
        self._next_broker = 0
        self._closed = False

    async def __aenter__(self) -> AdminClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close every channel; the client cannot be used afterwards."""
        self._closed = True
        channels = list(self._brokers.channels.values())
        self._brokers.channels.clear()
        self._brokers.stubs.clear()
        try:
            for channel in channels:
                await channel.close()
        finally:
            await self._controller.close()

    # --- Topics ---------------------------------------------------------------------------

    async def create_topics(
        self, new_topics: Iterable[NewTopic], *, validate_only: bool = False
    ) -> dict[str, CreateTopicResult]:
        """Create topics; one :class:`CreateTopicResult` per name (a failure in ``error``).

        With ``validate_only`` the controller only checks the request (names, counts,
        replication factor, configs) and creates nothing.
        """
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
        )

    # --- Configs --------------------------------------------------------------------------

    async def describe_configs(
        self, topic: str, names: Iterable[str] = ()
    ) -> dict[str, ConfigEntry]:
        """Every config of ``topic`` (or the named ones) by name, with value and source.

        Overrides have source ``DYNAMIC_TOPIC_CONFIG``; ``entry.is_default`` tells the rest.
        Raises :class:`UnknownTopicOrPartitionError` for an unknown topic.
        """
        resource = m.DescribeConfigsResource(ConfigResourceType.TOPIC, topic, tuple(names))
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
    ) -> None:
        """Change ``topic``'s config overrides incrementally (Kafka's IncrementalAlterConfigs).

        ``{key: value}`` sets an override; ``{key: None}`` deletes it (back to the default);
        keys not named are left as they are. Raises the typed error if the topic is unknown
        or a key or value is invalid; then nothing is changed.
        """
        if not changes:
            return
        ops = tuple(
            m.AlterableConfig(key, m.AlterConfigOp.DELETE)
            if value is None
            else m.AlterableConfig(key, m.AlterConfigOp.SET, value)
            for key, value in changes.items()
        )
        resource = m.AlterConfigsResource(ConfigResourceType.TOPIC, topic, ops)
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

    # --- Plumbing -------------------------------------------------------------------------

    async def _call_controller(
        self, method: Callable[[Req], Awaitable[Resp]], request: Req
    ) -> Resp:
        """Call the Controller API; a request it rejects as a whole is an AdminError."""
        self._check_open()
        try:
            return await method(request)
        except grpc.aio.AioRpcError as e:
            raise _rpc_error(e) from None

    async def _metadata(
        self, topics: Sequence[str], *, topics_wanted: bool = True
    ) -> pb.MetadataResponse:
        """Ask bootstrap brokers for Metadata in turn, starting with the last that answered.

        ``topics_wanted=False`` still asks for every topic (the RPC has no way to ask for
        none); only the brokers are used.
        """
        self._check_open()
        request = pb.MetadataRequest(topics=list(topics))
        problems: list[str] = []
        count = len(self.bootstrap_servers)
        for attempt in range(count):
            index = (self._next_broker + attempt) % count
            address = self.bootstrap_servers[index]
            try:
                reply: pb.MetadataResponse = await self._broker_stub(address).Metadata(
                    request, timeout=self.request_timeout_s
                )
            except grpc.aio.AioRpcError as e:
                if e.code() not in _RETRIABLE_BROKER_CODES:
                    raise _rpc_error(e) from None
                problems.append(f"{address}: {e.code().name}")
                continue
            self._next_broker = index
            return reply
        raise BrokerUnavailableError(
            "Metadata: no bootstrap broker answered (" + "; ".join(problems) + ")"
        )

    def _broker_stub(self, address: str) -> broker_pb2_grpc.BrokerStub:
        stub = self._brokers.stubs.get(address)
        if stub is None:
            channel = grpc.aio.insecure_channel(address, options=channel_options(64 << 20))
            self._brokers.channels[address] = channel
            stub = broker_pb2_grpc.BrokerStub(channel)
            self._brokers.stubs[address] = stub
        return stub

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


def _creatable(topic: NewTopic) -> m.CreatableTopic:
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
