"""Kafka requests answered by the broker's own request handling: a translation, no semantics.

Each Kafka request becomes the ``highwater.v1`` request the gRPC API takes, goes to the same
code (:class:`~highwater.broker.request_handler.RequestHandler` for the data plane, the
active controller for the admin calls as :mod:`~highwater.broker.forwarding` sends them,
the group's coordinator for the group calls), and the answer is translated back. Error
codes are Kafka's numbers on both sides, so they pass unchanged.

What is Kafka's only and lives here: the API versions answer (KIP-511), fetch sessions
(KIP-227, over the broker's :mod:`highwater.broker.fetch_sessions`), Metadata's and
FindCoordinator's addresses (each broker's Kafka listener, registered as the listener
named ``KAFKA``; a group's coordinator is the broker asked, which relays the group calls
to the coordinator service), and the null/empty conventions of the wire format.
``throttle_time_ms`` is 0 in every answer: no quota throttles a Kafka connection yet.

**ACLs.** Each request runs as its connection's principal (the listener sets it with
:func:`~highwater.rpc.auth.serve_as`), and the checks are the gRPC handlers' own
(``broker/authorization.py``, ``controller_api/authorization.py``), run here before the
request goes on, their refusals answered in Kafka's shapes: a refused topic's partitions
TOPIC_AUTHORIZATION_FAILED in Produce, Fetch, ListOffsets, OffsetsForLeaderEpoch and
DeleteRecords, nothing of it written or read; Metadata shows only the topics the caller may
describe (one asked by id and refused is answered with a null name); FindCoordinator is
GROUP_AUTHORIZATION_FAILED for a group it may not describe; InitProducerId needs
IDEMPOTENT_WRITE (KIP-679: or WRITE on some topic); the admin calls are split per topic or
resource, and those checked whole (ElectLeaders, reassignments, DescribeLogDirs, the ACL
calls) answer CLUSTER_AUTHORIZATION_FAILED. The admin calls go on to the controller, and
the group calls to the coordinator, with the caller's principal as forwarded calls carry
it, so the controller and the coordinator check it again (the group calls are checked there
only: GROUP_AUTHORIZATION_FAILED, and ListGroups shows only the groups the caller may
describe).

**CreateAcls, DescribeAcls, DeleteAcls** go to the controller as the gRPC admin calls do,
and act on the same ACL records; a filter's ANY codes and null strings match anything.
"""

from __future__ import annotations

import base64
import logging
import re
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any, Final, Protocol

from google.protobuf.message import Message
from kafka.protocol.admin import (
    AlterConfigsResponse,
    AlterPartitionReassignmentsResponse,
    CreateAclsResponse,
    CreatePartitionsResponse,
    CreateTopicsResponse,
    DeleteAclsResponse,
    DeleteGroupsResponse,
    DeleteRecordsResponse,
    DeleteTopicsResponse,
    DescribeAclsResponse,
    DescribeClusterResponse,
    DescribeConfigsResponse,
    DescribeGroupsResponse,
    DescribeLogDirsResponse,
    ElectLeadersResponse,
    IncrementalAlterConfigsResponse,
    ListGroupsResponse,
    ListPartitionReassignmentsResponse,
)
from kafka.protocol.consumer import (
    FetchResponse,
    HeartbeatResponse,
    JoinGroupResponse,
    LeaveGroupResponse,
    ListOffsetsResponse,
    OffsetCommitResponse,
    OffsetDeleteResponse,
    OffsetFetchResponse,
    OffsetForLeaderEpochResponse,
    SyncGroupResponse,
)
from kafka.protocol.metadata import ApiVersionsResponse, FindCoordinatorResponse, MetadataResponse
from kafka.protocol.producer import InitProducerIdResponse, ProduceResponse

from highwater.broker.authorization import (
    add_refused_topics,
    authorize_coordinators,
    authorize_fetch,
    authorize_init_producer_id,
    filter_metadata,
    split_topics,
    topic_describer,
)
from highwater.broker.fetch_sessions import FetchPartitionState, FetchSessionCache
from highwater.broker.kafka_protocol.codec import (
    SUPPORTED,
    DescribeTopicPartitionsResponse,
    KafkaRequest,
    Spliced,
    placeholders,
)
from highwater.broker.request_handler import RequestHandler
from highwater.broker.topic_descriptions import describe_topic_partitions
from highwater.controller_api import codec as controller_codec
from highwater.controller_api.authorization import merge_refusals, split_admin_request
from highwater.controller_api.client import ControllerClient, ControllerUnavailableError
from highwater.controller_api.codec import ControllerRpc
from highwater.errors import HighwaterError, InvalidRequestError
from highwater.metadata.consumer_offsets import ADMIN_CLIENT_ID
from highwater.metadata.image import MetadataImage
from highwater.records.header import BATCH_HEADER_SIZE
from highwater.rpc.auth import authorize, authorizer_enabled, forwarded_principal_metadata
from highwater.security.acl import AclOperation, ResourceType
from highwater.security.rpc_access import CLUSTER_NAME
from highwater.storage.log import wall_clock_ms
from highwater.v1 import admin_pb2, coordinator_pb2
from highwater.v1 import broker_pb2 as pb
from highwater.v1.common_pb2 import ErrorCode

__all__ = ["KAFKA_LISTENER_NAME", "CloseConnectionError", "GroupCalls", "KafkaApis"]

log = logging.getLogger(__name__)

KAFKA_LISTENER_NAME: Final = "KAFKA"
"""The name under which a broker registers its Kafka listener with the controller."""

CLUSTER_ID: Final = "highwater"
NONE: Final = 0
UNKNOWN_SERVER_ERROR: Final = -1
UNSUPPORTED_VERSION: Final = 35
INVALID_REQUEST: Final = 42
UNSUPPORTED_COMPRESSION_TYPE: Final = 76
INVALID_RECORD: Final = 87
_SOFTWARE: Final = re.compile(r"[a-zA-Z0-9](?:[a-zA-Z0-9\-.]*[a-zA-Z0-9])?")
"""A valid client software name or version (ApiVersions v3+, KIP-511)."""
MISMATCHED_ENDPOINT_TYPE: Final = 114
UNSUPPORTED_ENDPOINT_TYPE: Final = 115
_BROKER_ENDPOINT: Final = 1
_CONTROLLER_ENDPOINT: Final = 2
"""DescribeCluster's endpoint types (KIP-919)."""
COORDINATOR_NOT_AVAILABLE: Final = 15
REQUEST_TIMED_OUT: Final = 7
CLUSTER_AUTHORIZATION_FAILED: Final = int(ErrorCode.CLUSTER_AUTHORIZATION_FAILED)
TOPIC_AUTHORIZATION_FAILED: Final = int(ErrorCode.TOPIC_AUTHORIZATION_FAILED)
UNKNOWN_TOPIC_ID: Final = int(ErrorCode.UNKNOWN_TOPIC_ID)

_LIST_OFFSETS_SINCE: Final = {-1: 0, -2: 0, -3: 7, -4: 8, -5: 9}
"""ListOffsets' special timestamps (LATEST, EARLIEST, MAX_TIMESTAMP, EARLIEST_LOCAL,
LATEST_TIERED) by the first version that has each; other negative ones are none."""
_TOPIC_RESOURCE: Final = 2
_BROKER_RESOURCE: Final = 4
_CONFIG_RESOURCE_TYPES: Final = frozenset({_TOPIC_RESOURCE, _BROKER_RESOURCE})
"""Kafka's ``ConfigResource.Type`` numbers whose configs the controller keeps."""
_ALTER_CONFIG_OPS: Final = frozenset({0, 1, 2, 3})
"""IncrementalAlterConfigs' operations: SET, DELETE, APPEND, SUBTRACT."""

# Kafka's DescribeConfigs ConfigType (int8) by the controller's type names.
_CONFIG_TYPES: Final = {
    "boolean": 1,
    "string": 2,
    "int": 3,
    "short": 4,
    "long": 5,
    "double": 6,
    "list": 7,
    "class": 8,
    "password": 9,
}


class GroupCalls(Protocol):
    """Where group calls go: the coordinator service that owns a group (over gRPC)."""

    async def call(self, group_id: str, method: str, request: Message) -> Any:
        """``method`` of ``highwater.v1.GroupCoordinator`` at the group's coordinator.
        :raises HighwaterError: no coordinator could be reached."""
        ...

    async def call_every(self, method: str, request: Message) -> list[Any]:
        """``method`` at every registered coordinator (ListGroups)."""
        ...


def topic_uuid(topic_id: str) -> uuid.UUID:
    """Kafka's UUID of a topic id (Highwater keeps Kafka's base64url string form)."""
    try:
        return uuid.UUID(bytes=base64.urlsafe_b64decode(topic_id + "=" * (-len(topic_id) % 4)))
    except ValueError:
        return uuid.UUID(int=0)


def topic_id_string(value: uuid.UUID) -> str:
    return base64.urlsafe_b64encode(value.bytes).rstrip(b"=").decode("ascii")


class CloseConnectionError(Exception):
    """A request answered by closing its connection, as Kafka's ``closeConnection``: a
    Produce with acks=0 that failed (its client reads no answer: the closed connection
    makes it refresh its metadata and reconnect, rather than keep sending where its
    records are refused). The message says why, for the log."""


class KafkaApis:
    """Answers Kafka requests for broker ``node_id`` (see the module docstring)."""

    def __init__(
        self,
        *,
        node_id: int,
        requests: RequestHandler,
        controller: ControllerClient,
        groups: GroupCalls,
        image: Callable[[], MetadataImage],
        fetch_sessions: FetchSessionCache | None = None,
        cluster_id: Callable[[], str | None] = lambda: None,
        clock: Callable[[], int] = wall_clock_ms,
    ) -> None:
        """``cluster_id``: the cluster's id as the broker knows it (Metadata and
        DescribeCluster answer it; ``highwater`` while it is not known); ``clock``: the
        time in ms the fetch sessions are used at (their eviction follows it)."""
        self.node_id = node_id
        self._cluster_id = cluster_id
        self.requests = requests
        self.controller = controller
        self.groups = groups
        self._image = image
        self.fetch_sessions = FetchSessionCache() if fetch_sessions is None else fetch_sessions
        self._clock = clock
        self._handlers: dict[int, Callable[[KafkaRequest], Awaitable[Any]]] = {
            0: self.produce,
            1: self.fetch,
            2: self.list_offsets,
            3: self.metadata,
            8: self.offset_commit,
            9: self.offset_fetch,
            10: self.find_coordinator,
            11: self.join_group,
            12: self.heartbeat,
            13: self.leave_group,
            14: self.sync_group,
            15: self.describe_groups,
            16: self.list_groups,
            18: self.api_versions,
            19: self.create_topics,
            20: self.delete_topics,
            21: self.delete_records,
            22: self.init_producer_id,
            23: self.offset_for_leader_epoch,
            32: self.describe_configs,
            33: self.alter_configs,
            37: self.create_partitions,
            42: self.delete_groups,
            43: self.elect_leaders,
            44: self.incremental_alter_configs,
            45: self.alter_partition_reassignments,
            46: self.list_partition_reassignments,
            35: self.describe_log_dirs,
            47: self.offset_delete,
            60: self.describe_cluster,
            75: self.describe_topic_partitions,
            29: self.describe_acls,
            30: self.create_acls,
            31: self.delete_acls,
        }
        # SaslHandshake and SaslAuthenticate are the listener's (they change the connection).
        assert set(self._handlers) | {17, 36} == set(SUPPORTED), "every API has a handler"

    async def handle(self, request: KafkaRequest) -> Any:
        """The answer to ``request`` (a ``kafka.protocol`` response, or for Fetch a
        :class:`~highwater.broker.kafka_protocol.codec.Spliced` one: the records go out
        as read), or ``None`` for a request that gets none (Produce with acks=0).

        :raises CloseConnectionError: a Produce with acks=0 failed."""
        return await self._handlers[request.api_key](request)

    def cluster_id(self) -> str:
        """The cluster's id: the metadata quorum's (KRaft), the one etcd holds (etcd mode),
        or :data:`CLUSTER_ID` while neither is known."""
        return self._cluster_id() or CLUSTER_ID

    def _topic_name_of(self, topic_id: str) -> str | None:
        topic = self._image().topics.by_id.get(topic_id)
        return topic.name if topic is not None else None

    @staticmethod
    def _on_cluster(operation: AclOperation) -> bool:
        """May the caller do ``operation`` on the cluster (always, with the checks off)?"""
        return authorize(None, operation, ResourceType.CLUSTER, CLUSTER_NAME)

    # --- the address of this broker and the others ------------------------------------------

    def kafka_endpoint(self, broker_id: int) -> tuple[str, int] | None:
        registration = self._image().broker(broker_id)
        if registration is None:
            return None
        endpoint = registration.listener(KAFKA_LISTENER_NAME)
        return None if endpoint is None else (endpoint.host, endpoint.port)

    # --- ApiVersions ---------------------------------------------------------------------------

    async def api_versions(self, request: KafkaRequest) -> Any:
        body = request.body
        if request.api_version >= 3 and not (
            _SOFTWARE.fullmatch(body.client_software_name or "")
            and _SOFTWARE.fullmatch(body.client_software_version or "")
        ):
            # Kafka's ApiVersionsRequest.isValid: INVALID_REQUEST, no versions; the
            # connection goes on.
            R = ApiVersionsResponse
            return R(error_code=INVALID_REQUEST, api_keys=[], throttle_time_ms=0)
        return api_versions_response(NONE)

    # --- Produce ------------------------------------------------------------------------------

    async def produce(self, request: KafkaRequest) -> Any:
        body = request.body
        message = pb.ProduceRequest(acks=body.acks, timeout_ms=body.timeout_ms)
        refused: list[tuple[str, int, int, str]] = []
        # Each partition's batches go to the request handler beside the protobuf, as the
        # decoder made them (the protobuf holds the first batch's header for the ACL
        # check of idempotent writes): not copied into it and out again. A partition
        # named twice in one request (Kafka's clients never do) goes inside, as it came.
        named = [(t.name, p.index) for t in body.topic_data for p in t.partition_data]
        aside: dict[tuple[str, int], bytes] | None = {} if len(set(named)) == len(named) else None
        for topic in body.topic_data:
            produce_topic = message.topics.add(topic=topic.name)
            for item in topic.partition_data:
                if body.transactional_id is not None:
                    refused.append((topic.name, item.index, INVALID_REQUEST, "no transactions"))
                    continue
                records = item.records or b""
                invalid = invalid_produce_records(records, request.api_version)
                if invalid is not None:
                    refused.append((topic.name, item.index, *invalid))
                    continue
                if aside is not None:
                    aside[(topic.name, item.index)] = records
                    records = records[:BATCH_HEADER_SIZE]
                produce_topic.partitions.add(partition=item.index, record_batches=records)
        allowed, denied = split_topics(message, None, AclOperation.WRITE)
        if denied and not allowed.topics:
            answer = pb.ProduceResponse()
        else:
            answer = await self.requests.produce(
                allowed,
                records_aside=aside,
                failures_with_acks_0=True,
                internal_topics_allowed=request.client_id == ADMIN_CLIENT_ID,
            )
        add_refused_topics(answer, denied)
        if body.acks == 0:
            failed = [
                f"{t.topic}-{p.partition}: {p.error}"
                for t in answer.topics
                for p in t.partitions
                if p.error != NONE
            ] + [f"{name}-{index}: {code}" for name, index, code, _ in refused]
            if failed:
                raise CloseConnectionError(
                    f"Produce with acks=0 (correlation id {request.correlation_id}) failed: "
                    + ", ".join(failed)
                )
            return None
        R = ProduceResponse
        P = R.TopicProduceResponse.PartitionProduceResponse
        # (Lists are built here and handed over whole: a codec object's default list is
        # shared by every instance that did not get one.)
        topics: dict[str, list[Any]] = {}
        for topic_answer in answer.topics:
            out = topics.setdefault(topic_answer.topic, [])
            for p in topic_answer.partitions:
                out.append(
                    P(
                        index=p.partition,
                        error_code=p.error,
                        base_offset=p.base_offset,
                        log_append_time_ms=p.log_append_time_ms,
                        log_start_offset=p.log_start_offset if p.error == NONE else -1,
                        error_message=p.error_message or None,
                    )
                )
        for name, index, code, text in refused:
            topics.setdefault(name, []).append(
                P(index=index, error_code=code, base_offset=-1, error_message=text)
            )
        return R(
            responses=[
                R.TopicProduceResponse(name=name, partition_responses=parts)
                for name, parts in topics.items()
            ],
            throttle_time_ms=0,
        )

    # --- Fetch --------------------------------------------------------------------------------

    async def fetch(self, request: KafkaRequest) -> Any:
        body = request.body
        version = request.api_version
        session_id = body.session_id if version >= 7 else 0
        epoch = body.session_epoch if version >= 7 else -1
        requested = [
            (
                (topic.topic, item.partition),
                FetchPartitionState(
                    fetch_offset=item.fetch_offset,
                    partition_max_bytes=item.partition_max_bytes,
                    current_leader_epoch=item.current_leader_epoch if version >= 9 else -1,
                ),
            )
            for topic in body.topics
            for item in topic.partitions
        ]
        forgotten = (
            [(t.topic, p) for t in body.forgotten_topics_data for p in t.partitions]
            if version >= 7
            else []
        )
        resolved = self.fetch_sessions.resolve(
            session_id, epoch, requested, forgotten, now_ms=self._clock()
        )
        R = FetchResponse
        if resolved.error:
            return R(throttle_time_ms=0, error_code=resolved.error, session_id=0, responses=[])
        message = pb.FetchRequest(
            # Kafka answers min_bytes 0 at once; the broker's FetchRequest reads 0 as 1.
            max_wait_ms=body.max_wait_ms if body.min_bytes > 0 else 0,
            min_bytes=body.min_bytes,
            max_bytes=body.max_bytes if body.max_bytes > 0 else 0x7FFFFFFF,
        )
        last_topic: Any = None
        for (topic_name, partition), state in resolved.partitions:
            if last_topic is None or last_topic.topic != topic_name:
                last_topic = message.topics.add(topic=topic_name)
            item = last_topic.partitions.add(
                partition=partition,
                fetch_offset=state.fetch_offset,
                partition_max_bytes=state.partition_max_bytes,
            )
            if state.current_leader_epoch >= 0:
                item.current_leader_epoch = state.current_leader_epoch
        allowed, denied = authorize_fetch(message, None)
        read: dict[tuple[str, int], bytes] = {}
        if denied and not allowed.topics:
            answer = pb.FetchResponse()
        else:
            answer = await self.requests.fetch(allowed, records_aside=read)
        add_refused_topics(answer, denied)
        responses: list[Any] = []
        spliced: dict[bytes, bytes] = {}
        standing_in = iter(placeholders(len(read)))
        for topic_answer in answer.topics:
            partitions = []
            for p in topic_answer.partitions:
                records = read.get((topic_answer.topic, p.partition), b"")
                if not resolved.include(
                    (topic_answer.topic, p.partition),
                    p.high_watermark,
                    p.log_start_offset,
                    p.error,
                    bool(records),
                ):
                    continue
                if records:  # written out as read, in place of a placeholder
                    placeholder = next(standing_in)
                    spliced[placeholder] = records
                    records = placeholder
                partitions.append(
                    R.FetchableTopicResponse.PartitionData(
                        partition_index=p.partition,
                        error_code=p.error,
                        high_watermark=p.high_watermark,
                        last_stable_offset=p.high_watermark,
                        log_start_offset=p.log_start_offset,
                        aborted_transactions=[],
                        preferred_read_replica=-1,
                        records=records,
                    )
                )
            if partitions:
                responses.append(
                    R.FetchableTopicResponse(topic=topic_answer.topic, partitions=partitions)
                )
        return Spliced(
            R(
                throttle_time_ms=0,
                error_code=NONE,
                session_id=resolved.session_id,
                responses=responses,
            ),
            spliced,
        )

    # --- offsets ------------------------------------------------------------------------------

    async def list_offsets(self, request: KafkaRequest) -> Any:
        """ListOffsets, by the broker's request handling. Answered here, for the partition
        alone, as Kafka's ``handleListOffsetRequestV1AndAbove`` answers it: a partition
        asked more than once (INVALID_REQUEST, each time), a negative timestamp that is
        no special one or came after the request's version (UNSUPPORTED_VERSION; Kafka's
        ``isListOffsetsTimestampUnsupported``: MAX_TIMESTAMP -3 from v7 on)."""
        R = ListOffsetsResponse
        P = R.ListOffsetsTopicResponse.ListOffsetsPartitionResponse
        version = request.api_version
        asked = Counter(
            (topic.name, item.partition_index)
            for topic in request.body.topics
            for item in topic.partitions
        )
        message = pb.ListOffsetsRequest()
        local: dict[str, list[Any]] = {}
        for topic in request.body.topics:
            t = message.topics.add(topic=topic.name)
            for item in topic.partitions:
                error = NONE
                if asked[topic.name, item.partition_index] > 1:
                    error = INVALID_REQUEST
                elif item.timestamp < 0 and version < _LIST_OFFSETS_SINCE.get(
                    item.timestamp, version + 1
                ):
                    error = UNSUPPORTED_VERSION
                if error != NONE:
                    local.setdefault(topic.name, []).append(
                        P(
                            partition_index=item.partition_index,
                            error_code=error,
                            timestamp=-1,
                            offset=-1,
                            leader_epoch=-1,
                        )
                    )
                    continue
                p = t.partitions.add(partition=item.partition_index, timestamp=item.timestamp)
                if version >= 4 and item.current_leader_epoch >= 0:
                    p.current_leader_epoch = item.current_leader_epoch
        allowed, denied = split_topics(message, None, AclOperation.DESCRIBE)
        answer = add_refused_topics(self.requests.list_offsets(allowed), denied)
        topics: dict[str, list[Any]] = {}
        for answered in answer.topics:
            topics.setdefault(answered.topic, []).extend(
                P(
                    partition_index=a.partition,
                    error_code=a.error,
                    timestamp=a.timestamp,
                    offset=a.offset,
                    leader_epoch=a.leader_epoch,
                )
                for a in answered.partitions
            )
        for name, refused in local.items():
            topics.setdefault(name, []).extend(refused)
        return R(
            throttle_time_ms=0,
            topics=[
                R.ListOffsetsTopicResponse(name=name, partitions=partitions)
                for name, partitions in topics.items()
            ],
        )

    async def offset_for_leader_epoch(self, request: KafkaRequest) -> Any:
        message = pb.OffsetsForLeaderEpochRequest()
        for topic in request.body.topics:
            t = message.topics.add(topic=topic.topic)
            for item in topic.partitions:
                p = t.partitions.add(partition=item.partition, leader_epoch=item.leader_epoch)
                if item.current_leader_epoch >= 0:
                    p.current_leader_epoch = item.current_leader_epoch
        allowed, denied = split_topics(message, None, AclOperation.DESCRIBE)
        answer = add_refused_topics(self.requests.offsets_for_leader_epoch(allowed), denied)
        R = OffsetForLeaderEpochResponse
        return R(
            throttle_time_ms=0,
            topics=[
                R.OffsetForLeaderTopicResult(
                    topic=t.topic,
                    partitions=[
                        R.OffsetForLeaderTopicResult.EpochEndOffset(
                            error_code=p.error,
                            partition=p.partition,
                            leader_epoch=p.leader_epoch,
                            end_offset=p.end_offset,
                        )
                        for p in t.partitions
                    ],
                )
                for t in answer.topics
            ],
        )

    async def delete_records(self, request: KafkaRequest) -> Any:
        message = pb.DeleteRecordsRequest(timeout_ms=request.body.timeout_ms)
        for topic in request.body.topics:
            t = message.topics.add(topic=topic.name)
            for item in topic.partitions:
                t.partitions.add(partition=item.partition_index, offset=item.offset)
        allowed, denied = split_topics(message, None, AclOperation.DELETE)
        answer = add_refused_topics(self.requests.delete_records(allowed), denied)
        R = DeleteRecordsResponse
        return R(
            throttle_time_ms=0,
            topics=[
                R.DeleteRecordsTopicResult(
                    name=t.topic,
                    partitions=[
                        R.DeleteRecordsTopicResult.DeleteRecordsPartitionResult(
                            partition_index=p.partition,
                            low_watermark=p.low_watermark,
                            error_code=p.error,
                        )
                        for p in t.partitions
                    ],
                )
                for t in answer.topics
            ],
        )

    async def init_producer_id(self, request: KafkaRequest) -> Any:
        body = request.body
        R = InitProducerIdResponse
        if body.transactional_id is not None:
            return R(
                throttle_time_ms=0, error_code=INVALID_REQUEST, producer_id=-1, producer_epoch=-1
            )
        if authorizer_enabled() and not authorize_init_producer_id(None):
            return R(
                throttle_time_ms=0,
                error_code=CLUSTER_AUTHORIZATION_FAILED,
                producer_id=-1,
                producer_epoch=-1,
            )
        message = pb.InitProducerIdRequest()
        if request.api_version >= 3 and body.producer_id >= 0:
            message.producer_id = body.producer_id
            message.producer_epoch = body.producer_epoch
        answer = await self.requests.init_producer_id(message)
        if answer.error != NONE:
            return R(throttle_time_ms=0, error_code=answer.error, producer_id=-1, producer_epoch=-1)
        return R(
            throttle_time_ms=0,
            error_code=NONE,
            producer_id=answer.producer_id,
            producer_epoch=answer.producer_epoch,
        )

    # --- Metadata, FindCoordinator, DescribeCluster ----------------------------------------------

    def _brokers(self) -> list[tuple[int, str, int, str | None]]:
        """Every active broker with a Kafka listener: (id, host, port, rack)."""
        found = []
        for broker in sorted(self._image().brokers.values(), key=lambda b: b.broker_id):
            endpoint = broker.listener(KAFKA_LISTENER_NAME)
            if broker.is_active and endpoint is not None:
                found.append((broker.broker_id, endpoint.host, endpoint.port, broker.rack))
        return found

    def _controller_id(self, brokers: list[tuple[int, str, int, str | None]]) -> int:
        """The ``controller_id`` Metadata and DescribeCluster answer. KRaft mode: this
        broker, which forwards the admin calls a client sends to "the controller" (KIP-590).
        etcd mode: the broker whose candidate is the controller, as ZooKeeper-era brokers
        answered, while it is among ``brokers`` (it serves a Kafka listener); else this
        broker, which forwards the admin calls to it all the same."""
        if self.requests.control_plane is not None:
            controller_id = self.requests.control_plane()[1]
            if any(broker_id == controller_id for broker_id, *_ in brokers):
                return controller_id
        return self.node_id

    async def metadata(self, request: KafkaRequest) -> Any:
        body = request.body
        R = MetadataResponse
        if request.api_version < 12 and any(
            t.name is None or (t.topic_id is not None and t.topic_id.int != 0)
            for t in body.topics or ()
        ):
            # v10 and v11 carry a topic id but cannot look a topic up by it: Kafka's
            # handleTopicMetadataRequest refuses such a request whole (INVALID_REQUEST),
            # and MetadataRequest's error response answers each entry asked (a null name
            # as "": no null names before v12), with no brokers.
            return R(
                throttle_time_ms=0,
                brokers=[],
                cluster_id=None,
                controller_id=-1,
                topics=[
                    R.MetadataResponseTopic(
                        error_code=INVALID_REQUEST,
                        name=t.name or "",
                        topic_id=t.topic_id or uuid.UUID(int=0),
                        is_internal=False,
                        partitions=[],
                    )
                    for t in body.topics
                ],
            )
        image = self._image()
        names: list[str] | None
        # Topics asked by id (v12): the id each known one was asked by, and the unknown ids.
        asked_by_id: dict[str, uuid.UUID] = {}
        unknown_ids: list[uuid.UUID] = []
        if body.topics is None:
            names = None
        else:
            # Kafka reads the topics asked as a set: each is answered once, however
            # often it is named.
            named: dict[str, None] = {}  # insertion-ordered, each name once
            unknown: dict[uuid.UUID, None] = {}
            for topic in body.topics:
                if topic.name is not None:
                    named[topic.name] = None
                    continue
                topic_id = topic.topic_id or uuid.UUID(int=0)
                found = image.topics.by_id.get(topic_id_string(topic_id))
                if found is None:
                    unknown[topic_id] = None
                elif found.name not in named:
                    named[found.name] = None
                    asked_by_id[found.name] = topic_id
            names = list(named)
            unknown_ids = list(unknown)
        asked = pb.MetadataRequest(topics=names or [])
        answer = filter_metadata(asked, self.requests.metadata(asked), None)
        topics = []
        if names is None or names:
            for t in answer.topics:
                if t.name in asked_by_id and t.error == TOPIC_AUTHORIZATION_FAILED:
                    # Asked by id but not to be described: Kafka answers the id (ids are
                    # not secret) and a null name (names are).
                    topics.append(
                        R.MetadataResponseTopic(
                            error_code=TOPIC_AUTHORIZATION_FAILED,
                            name=None,
                            topic_id=asked_by_id[t.name],
                            is_internal=False,
                            partitions=[],
                        )
                    )
                    continue
                topics.append(
                    R.MetadataResponseTopic(
                        error_code=t.error,
                        name=t.name,
                        topic_id=topic_uuid(t.topic_id) if t.topic_id else uuid.UUID(int=0),
                        is_internal=t.is_internal,
                        partitions=[
                            R.MetadataResponseTopic.MetadataResponsePartition(
                                error_code=p.error,
                                partition_index=p.partition,
                                leader_id=p.leader_id,
                                leader_epoch=p.leader_epoch,
                                replica_nodes=list(p.replicas),
                                isr_nodes=list(p.isr),
                                offline_replicas=list(p.offline_replicas),
                            )
                            for p in t.partitions
                        ],
                    )
                )
        topics.extend(
            R.MetadataResponseTopic(
                error_code=UNKNOWN_TOPIC_ID,
                name=None,
                topic_id=topic_id,
                is_internal=False,
                partitions=[],
            )
            for topic_id in unknown_ids
        )
        brokers = self._brokers()
        return R(
            throttle_time_ms=0,
            brokers=[
                R.MetadataResponseBroker(node_id=i, host=h, port=p, rack=rack)
                for i, h, p, rack in brokers
            ],
            cluster_id=answer.cluster_id or self.cluster_id(),
            controller_id=self._controller_id(brokers),
            topics=topics,
        )

    async def describe_topic_partitions(self, request: KafkaRequest) -> Any:
        """KIP-966's pages of topic descriptions, by the gRPC call's rule
        (:mod:`~highwater.broker.topic_descriptions`). A request that rule refuses (a
        cursor naming a topic not asked for, a negative cursor partition) is answered as
        Kafka's ``getErrorResponse`` answers it: INVALID_REQUEST for each topic asked."""
        body = request.body
        R = DescribeTopicPartitionsResponse
        none = uuid.UUID(int=0)
        cursor = (
            None if body.cursor is None else (body.cursor.topic_name, body.cursor.partition_index)
        )
        try:
            answer = describe_topic_partitions(
                self._image(),
                [t.name for t in body.topics],
                cursor,
                min(
                    body.response_partition_limit,
                    self.requests.settings.max_request_partition_size_limit,
                ),
                topic_describer(None),
            )
        except InvalidRequestError:
            return R(
                throttle_time_ms=0,
                topics=[
                    R.DescribeTopicPartitionsResponseTopic(
                        error_code=INVALID_REQUEST, name=t.name, topic_id=none, partitions=[]
                    )
                    for t in body.topics
                ],
                next_cursor=None,
            )
        P = R.DescribeTopicPartitionsResponseTopic.DescribeTopicPartitionsResponsePartition
        return R(
            throttle_time_ms=0,
            topics=[
                R.DescribeTopicPartitionsResponseTopic(
                    error_code=t.error,
                    name=t.name,
                    topic_id=topic_uuid(t.topic_id) if t.topic_id else none,
                    is_internal=t.is_internal,
                    partitions=[
                        P(
                            error_code=p.error,
                            partition_index=p.partition,
                            leader_id=p.leader_id,
                            leader_epoch=p.leader_epoch,
                            replica_nodes=list(p.replicas),
                            isr_nodes=list(p.isr),
                            eligible_leader_replicas=list(p.eligible_leader_replicas),
                            last_known_elr=list(p.last_known_elr),
                            offline_replicas=list(p.offline_replicas),
                        )
                        for p in t.partitions
                    ],
                )
                for t in answer.topics
            ],
            next_cursor=(
                R.Cursor(
                    topic_name=answer.next_cursor.topic,
                    partition_index=answer.next_cursor.partition,
                )
                if answer.HasField("next_cursor")
                else None
            ),
        )

    async def describe_cluster(self, request: KafkaRequest) -> Any:
        """The brokers and the controller id. A v1 request for another endpoint type is
        refused as Kafka's ``AuthHelper.computeDescribeClusterResponse`` refuses it: the
        controllers' (2) MISMATCHED_ENDPOINT_TYPE (this is a broker's listener), an
        unknown one UNSUPPORTED_ENDPOINT_TYPE."""
        R = DescribeClusterResponse
        wanted = request.body.endpoint_type if request.api_version >= 1 else _BROKER_ENDPOINT
        if wanted != _BROKER_ENDPOINT:
            error, why = (
                (
                    MISMATCHED_ENDPOINT_TYPE,
                    "The request was sent to an endpoint of type BROKER, but we wanted an "
                    "endpoint of type CONTROLLER",
                )
                if wanted == _CONTROLLER_ENDPOINT
                else (UNSUPPORTED_ENDPOINT_TYPE, f"Unsupported endpoint type {wanted}")
            )
            return R(
                throttle_time_ms=0,
                error_code=error,
                error_message=why,
                endpoint_type=_BROKER_ENDPOINT,
                cluster_id=self.cluster_id(),
                controller_id=-1,
                brokers=[],
            )
        brokers = self._brokers()
        return R(
            throttle_time_ms=0,
            error_code=NONE,
            error_message=None,
            endpoint_type=1,
            cluster_id=self.cluster_id(),
            controller_id=self._controller_id(brokers),
            brokers=[
                R.DescribeClusterBroker(broker_id=i, host=h, port=p, rack=rack)
                for i, h, p, rack in brokers
            ],
        )

    async def find_coordinator(self, request: KafkaRequest) -> Any:
        """A group's coordinator, as Kafka clients see it, is this broker: its Kafka
        listener relays the group calls to the coordinator service that owns the group.
        The group's owner is looked up as the gRPC answer does, so a group with no
        coordinator yet is COORDINATOR_NOT_AVAILABLE here too."""
        body = request.body
        version = request.api_version
        keys = list(body.coordinator_keys) if version >= 4 else [body.key]
        key_type = body.key_type if version >= 1 else 0
        allowed, denied = authorize_coordinators(
            pb.FindCoordinatorRequest(key_type=pb.COORDINATOR_TYPE_GROUP, keys=keys), None
        )
        found = self.requests.find_coordinator(allowed)
        found.coordinators.extend(denied)
        endpoint = self.kafka_endpoint(self.node_id)
        R = FindCoordinatorResponse
        results: list[tuple[str, int, str, int, int, str | None]] = []
        for c in found.coordinators:
            error: int = c.error
            message: str | None = c.error_message or None
            if key_type != 0:
                error, message = INVALID_REQUEST, f"key type {key_type} is not served"
            elif error == NONE and endpoint is None:
                error, message = (
                    COORDINATOR_NOT_AVAILABLE,
                    "this broker's Kafka listener is not registered yet",
                )
            if error != NONE:
                results.append((c.key, -1, "", -1, error, message))
            else:
                assert endpoint is not None
                results.append((c.key, self.node_id, endpoint[0], endpoint[1], NONE, None))
        if version >= 4:
            return R(
                throttle_time_ms=0,
                coordinators=[
                    R.Coordinator(key=k, node_id=n, host=h, port=p, error_code=e, error_message=m)
                    for k, n, h, p, e, m in results
                ],
            )
        (_, n, h, p, e, m) = results[0]
        return R(throttle_time_ms=0, error_code=e, error_message=m, node_id=n, host=h, port=p)

    # --- groups: relayed to the coordinator -------------------------------------------------------

    async def _group_call(self, group_id: str, method: str, message: Message) -> Any | int:
        """The coordinator's answer, or an error code when it could not be reached."""
        try:
            return await self.groups.call(group_id, method, message)
        except HighwaterError as e:
            log.info("group %s: %s not relayed: %s", group_id, method, e)
            return int(getattr(e, "code", COORDINATOR_NOT_AVAILABLE))

    async def join_group(self, request: KafkaRequest) -> Any:
        body = request.body
        version = request.api_version
        message = coordinator_pb2.JoinGroupRequest(
            group_id=body.group_id,
            session_timeout_ms=body.session_timeout_ms,
            rebalance_timeout_ms=(
                body.rebalance_timeout_ms if version >= 1 else body.session_timeout_ms
            ),
            member_id=body.member_id,
            protocol_type=body.protocol_type,
            client_id=request.client_id or "",
            reason=(body.reason or "") if version >= 8 else "",
        )
        if version >= 5 and body.group_instance_id is not None:
            message.group_instance_id = body.group_instance_id
        for protocol in body.protocols:
            message.protocols.add(name=protocol.name, metadata=bytes(protocol.metadata))
        answer = await self._group_call(body.group_id, "JoinGroup", message)
        R = JoinGroupResponse
        if isinstance(answer, int):
            return R(
                throttle_time_ms=0,
                error_code=answer,
                generation_id=-1,
                leader="",
                member_id=body.member_id,
                members=[],
            )
        if version < 4 and answer.error == ErrorCode.MEMBER_ID_REQUIRED:
            # Before KIP-394 a client cannot join with an id it is given: join it at once.
            message.member_id = answer.member_id
            answer = await self._group_call(body.group_id, "JoinGroup", message)
            if isinstance(answer, int):
                return R(
                    throttle_time_ms=0,
                    error_code=answer,
                    generation_id=-1,
                    leader="",
                    member_id=body.member_id,
                    members=[],
                )
        return R(
            throttle_time_ms=0,
            error_code=answer.error,
            generation_id=answer.generation_id,
            protocol_type=answer.protocol_type or None,
            protocol_name=answer.protocol_name or (None if version >= 7 else ""),
            leader=answer.leader,
            skip_assignment=answer.skip_assignment,
            member_id=answer.member_id,
            members=[
                R.JoinGroupResponseMember(
                    member_id=m.member_id,
                    group_instance_id=(
                        m.group_instance_id if m.HasField("group_instance_id") else None
                    ),
                    metadata=m.metadata,
                )
                for m in answer.members
            ],
        )

    async def sync_group(self, request: KafkaRequest) -> Any:
        body = request.body
        version = request.api_version
        message = coordinator_pb2.SyncGroupRequest(
            group_id=body.group_id,
            generation_id=body.generation_id,
            member_id=body.member_id,
            protocol_type=(body.protocol_type or "") if version >= 5 else "",
            protocol_name=(body.protocol_name or "") if version >= 5 else "",
        )
        if version >= 3 and body.group_instance_id is not None:
            message.group_instance_id = body.group_instance_id
        for a in body.assignments:
            message.assignments.add(member_id=a.member_id, assignment=bytes(a.assignment))
        answer = await self._group_call(body.group_id, "SyncGroup", message)
        R = SyncGroupResponse
        if isinstance(answer, int):
            return R(throttle_time_ms=0, error_code=answer, assignment=b"")
        return R(
            throttle_time_ms=0,
            error_code=answer.error,
            protocol_type=answer.protocol_type or None,
            protocol_name=answer.protocol_name or None,
            assignment=answer.assignment,
        )

    async def heartbeat(self, request: KafkaRequest) -> Any:
        body = request.body
        message = coordinator_pb2.HeartbeatRequest(
            group_id=body.group_id, generation_id=body.generation_id, member_id=body.member_id
        )
        if request.api_version >= 3 and body.group_instance_id is not None:
            message.group_instance_id = body.group_instance_id
        answer = await self._group_call(body.group_id, "Heartbeat", message)
        code = answer if isinstance(answer, int) else answer.error
        return HeartbeatResponse(throttle_time_ms=0, error_code=code)

    async def leave_group(self, request: KafkaRequest) -> Any:
        body = request.body
        version = request.api_version
        message = coordinator_pb2.LeaveGroupRequest(group_id=body.group_id)
        if version < 3:
            message.members.add(member_id=body.member_id)
        else:
            for member in body.members:
                leaving = message.members.add(
                    member_id=member.member_id,
                    reason=(member.reason or "") if version >= 5 else "",
                )
                if member.group_instance_id is not None:
                    leaving.group_instance_id = member.group_instance_id
        answer = await self._group_call(body.group_id, "LeaveGroup", message)
        R = LeaveGroupResponse
        if isinstance(answer, int):
            return R(throttle_time_ms=0, error_code=answer, members=[])
        code = answer.error
        if version < 3 and code == NONE and answer.members:
            code = answer.members[0].error
        return R(
            throttle_time_ms=0,
            error_code=code,
            members=[
                R.MemberResponse(
                    member_id=m.member_id,
                    group_instance_id=(
                        m.group_instance_id if m.HasField("group_instance_id") else None
                    ),
                    error_code=m.error,
                )
                for m in answer.members
            ],
        )

    async def offset_commit(self, request: KafkaRequest) -> Any:
        body = request.body
        version = request.api_version
        message = coordinator_pb2.OffsetCommitRequest(
            group_id=body.group_id, member_id=body.member_id or ""
        )
        if body.generation_id_or_member_epoch >= 0 or body.member_id:
            message.generation_id = body.generation_id_or_member_epoch
        if version >= 7 and body.group_instance_id is not None:
            message.group_instance_id = body.group_instance_id
        for topic in body.topics:
            t = message.topics.add(name=topic.name)
            for item in topic.partitions:
                p = t.partitions.add(
                    partition_index=item.partition_index,
                    committed_offset=item.committed_offset,
                    metadata=item.committed_metadata or "",
                )
                if version >= 6 and item.committed_leader_epoch >= 0:
                    p.committed_leader_epoch = item.committed_leader_epoch
        answer = await self._group_call(body.group_id, "OffsetCommit", message)
        if not isinstance(answer, int) and answer.error != NONE and not answer.topics:
            # Refused whole (GROUP_AUTHORIZATION_FAILED): Kafka's answer lists the code
            # in every partition, as a client reads it.
            answer = int(answer.error)
        R = OffsetCommitResponse
        T = R.OffsetCommitResponseTopic
        if isinstance(answer, int):
            return R(
                throttle_time_ms=0,
                topics=[
                    T(
                        name=topic.name,
                        partitions=[
                            T.OffsetCommitResponsePartition(
                                partition_index=item.partition_index, error_code=answer
                            )
                            for item in topic.partitions
                        ],
                    )
                    for topic in body.topics
                ],
            )
        return R(
            throttle_time_ms=0,
            topics=[
                T(
                    name=t.name,
                    partitions=[
                        T.OffsetCommitResponsePartition(
                            partition_index=p.partition_index,
                            error_code=p.error if answer.error == NONE else answer.error,
                        )
                        for p in t.partitions
                    ],
                )
                for t in answer.topics
            ],
        )

    async def offset_fetch(self, request: KafkaRequest) -> Any:
        body = request.body
        message = coordinator_pb2.OffsetFetchRequest(group_id=body.group_id)
        if body.topics is None:
            message.all_topics = True
        else:
            for topic in body.topics:
                message.topics.add(name=topic.name, partition_indexes=topic.partition_indexes)
        answer = await self._group_call(body.group_id, "OffsetFetch", message)
        R = OffsetFetchResponse
        T = R.OffsetFetchResponseTopic
        group_error = answer if isinstance(answer, int) else int(answer.error)
        if group_error != NONE and request.api_version < 2:
            # v0 and v1 have no top-level error: Kafka's OffsetFetchResponse puts the group's
            # error (NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS, GROUP_AUTHORIZATION_FAILED)
            # in each partition asked, with no offset, else the client reads "nothing
            # committed". A request that named no partition gets none, as in Kafka.
            return R(
                throttle_time_ms=0,
                error_code=group_error,
                topics=[
                    T(
                        name=topic.name,
                        partitions=[
                            T.OffsetFetchResponsePartition(
                                partition_index=index,
                                committed_offset=-1,
                                committed_leader_epoch=-1,
                                metadata="",
                                error_code=group_error,
                            )
                            for index in topic.partition_indexes
                        ],
                    )
                    for topic in body.topics or []
                ],
            )
        if isinstance(answer, int):
            return R(throttle_time_ms=0, topics=[], error_code=answer)
        return R(
            throttle_time_ms=0,
            error_code=answer.error,
            topics=[
                T(
                    name=t.name,
                    partitions=[
                        T.OffsetFetchResponsePartition(
                            partition_index=p.partition_index,
                            committed_offset=p.committed_offset,
                            committed_leader_epoch=p.committed_leader_epoch,
                            metadata=p.metadata,
                            error_code=p.error,
                        )
                        for p in t.partitions
                    ],
                )
                for t in answer.topics
            ],
        )

    async def describe_groups(self, request: KafkaRequest) -> Any:
        R = DescribeGroupsResponse
        G = R.DescribedGroup
        groups = []
        for group_id in request.body.groups:
            answer = await self._group_call(
                group_id,
                "DescribeGroups",
                coordinator_pb2.DescribeGroupsRequest(group_ids=[group_id]),
            )
            if isinstance(answer, int) or not answer.groups:
                code = answer if isinstance(answer, int) else COORDINATOR_NOT_AVAILABLE
                groups.append(
                    G(
                        error_code=code,
                        group_id=group_id,
                        group_state="",
                        protocol_type="",
                        protocol_data="",
                        members=[],
                    )
                )
                continue
            g = answer.groups[0]
            groups.append(
                G(
                    error_code=g.error,
                    error_message=g.error_message or None,
                    group_id=g.group_id,
                    group_state=g.group_state,
                    protocol_type=g.protocol_type,
                    protocol_data=g.protocol_name,
                    members=[
                        G.DescribedGroupMember(
                            member_id=m.member_id,
                            group_instance_id=(
                                m.group_instance_id if m.HasField("group_instance_id") else None
                            ),
                            client_id=m.client_id,
                            client_host=m.client_host,
                            member_metadata=m.member_metadata,
                            member_assignment=m.member_assignment,
                        )
                        for m in g.members
                    ],
                )
            )
        return R(throttle_time_ms=0, groups=groups)

    async def list_groups(self, request: KafkaRequest) -> Any:
        states = list(request.body.states_filter) if request.api_version >= 4 else []
        R = ListGroupsResponse
        try:
            answers = await self.groups.call_every(
                "ListGroups", coordinator_pb2.ListGroupsRequest(states_filter=states)
            )
        except HighwaterError:
            return R(throttle_time_ms=0, error_code=COORDINATOR_NOT_AVAILABLE, groups=[])
        code = next((a.error for a in answers if a.error != NONE), NONE)
        seen: set[str] = set()
        groups = []
        for answer in answers:
            for g in answer.groups:
                if g.group_id not in seen:
                    seen.add(g.group_id)
                    groups.append(
                        R.ListedGroup(
                            group_id=g.group_id,
                            protocol_type=g.protocol_type,
                            group_state=g.group_state,
                        )
                    )
        return R(throttle_time_ms=0, error_code=code, groups=groups)

    async def delete_groups(self, request: KafkaRequest) -> Any:
        R = DeleteGroupsResponse
        results = []
        for group_id in request.body.groups_names:
            answer = await self._group_call(
                group_id, "DeleteGroups", coordinator_pb2.DeleteGroupsRequest(group_ids=[group_id])
            )
            if isinstance(answer, int) or not answer.results:
                code = answer if isinstance(answer, int) else COORDINATOR_NOT_AVAILABLE
            else:
                code = answer.results[0].error
            results.append(R.DeletableGroupResult(group_id=group_id, error_code=code))
        return R(throttle_time_ms=0, results=results)

    async def offset_delete(self, request: KafkaRequest) -> Any:
        body = request.body
        message = coordinator_pb2.OffsetDeleteRequest(group_id=body.group_id)
        for topic in body.topics:
            message.topics.add(
                name=topic.name, partition_indexes=[p.partition_index for p in topic.partitions]
            )
        answer = await self._group_call(body.group_id, "OffsetDelete", message)
        R = OffsetDeleteResponse
        if isinstance(answer, int):
            return R(error_code=answer, throttle_time_ms=0, topics=[])
        return R(
            error_code=answer.error,
            throttle_time_ms=0,
            topics=[
                R.OffsetDeleteResponseTopic(
                    name=t.name,
                    partitions=[
                        R.OffsetDeleteResponseTopic.OffsetDeleteResponsePartition(
                            partition_index=p.partition_index, error_code=p.error
                        )
                        for p in t.partitions
                    ],
                )
                for t in answer.topics
            ],
        )

    # --- this broker's log directories ------------------------------------------------------------

    async def describe_log_dirs(self, request: KafkaRequest) -> Any:
        message = pb.DescribeLogDirsRequest()
        for topic in request.body.topics or ():  # null: every partition
            message.topics.add(topic=topic.topic, partitions=topic.partitions)
        R = DescribeLogDirsResponse
        if not self._on_cluster(AclOperation.DESCRIBE):
            return R(throttle_time_ms=0, error_code=CLUSTER_AUTHORIZATION_FAILED, results=[])
        answer = self.requests.describe_log_dirs(message)
        Result = R.DescribeLogDirsResult
        return R(
            throttle_time_ms=0,
            error_code=answer.error,
            results=[
                Result(
                    error_code=d.error,
                    log_dir=d.log_dir,
                    topics=[
                        Result.DescribeLogDirsTopic(
                            name=t.name,
                            partitions=[
                                Result.DescribeLogDirsTopic.DescribeLogDirsPartition(
                                    partition_index=p.partition_index,
                                    partition_size=p.partition_size,
                                    offset_lag=p.offset_lag,
                                    is_future_key=p.is_future_key,
                                )
                                for p in t.partitions
                            ],
                        )
                        for t in d.topics
                    ],
                    total_bytes=d.total_bytes,
                    usable_bytes=d.usable_bytes,
                )
                for d in answer.results
            ],
        )

    # --- admin: forwarded to the active controller -----------------------------------------------

    async def _forward_on_cluster(
        self, rpc: ControllerRpc[Any, Any], message: Message, operation: AclOperation
    ) -> Any | int:
        """:meth:`_forward` if the caller may do ``operation`` on the cluster, else
        CLUSTER_AUTHORIZATION_FAILED."""
        if not self._on_cluster(operation):
            return CLUSTER_AUTHORIZATION_FAILED
        return await self._forward(rpc, message)

    async def _forward(
        self,
        rpc: ControllerRpc[Any, Any],
        message: Message,
        failed: Callable[[Message, int], Message] | None = None,
    ) -> Any | int:
        """The controller's answer (a ``highwater.v1`` message) or an error code; the
        items the caller may not act on are answered here with their refusals
        (``controller_api/authorization.py``) and the rest goes on with its principal.

        ``failed``: the answer to the items sent on when the call fails (from them and the
        error code), with the refusals kept; without it the call's error code is returned
        (and the caller answers every item with it)."""
        to_run, denied = split_admin_request(rpc.name, message, None, self._topic_name_of)
        if to_run is None:
            return merge_refusals(rpc.name, rpc.proto_response(), denied)
        try:
            response = await self.controller.call(
                rpc, rpc.request_from_proto(to_run), metadata=forwarded_principal_metadata(None)
            )
        except (InvalidRequestError, controller_codec.InvalidRequestError) as e:
            log.info("%s refused: %s", rpc.name, e)
            error = INVALID_REQUEST
        except ControllerUnavailableError as e:
            log.warning("%s: %s", rpc.name, e)
            error = REQUEST_TIMED_OUT
        else:
            return merge_refusals(rpc.name, rpc.response_to_proto(response), denied)
        return error if failed is None else merge_refusals(rpc.name, failed(to_run, error), denied)

    async def create_topics(self, request: KafkaRequest) -> Any:
        """CreateTopics, decided by the controller, except what the gRPC message cannot
        carry, answered here for its topic alone: a config with a null value
        (INVALID_CONFIG, as Kafka's controller answers it), an assignment that names a
        partition twice or not the partitions from 0 (INVALID_REPLICA_ASSIGNMENT, Kafka's
        messages). A name given more than once goes on bare: the controller answers it
        once, "Duplicate topic name.", whatever its entries say.

        A topic created (or that would be, ``validate_only``) is answered with its
        configs from v5 on, never null: Kafka's Java AdminClient reads them. They are the
        topic's effective configs as DescribeConfigs gives them (Kafka's answer), or
        none for ``validate_only``, with ``topic_config_error_code`` if they could not
        be described."""
        body = request.body
        R = CreateTopicsResponse
        message = admin_pb2.CreateTopicsRequest(validate_only=bool(body.validate_only))
        given = Counter(topic.name for topic in body.topics)
        refused: list[Any] = []
        for topic in body.topics:
            t = admin_pb2.CreatableTopic(name=topic.name)
            if given[topic.name] == 1:
                problem = _creatable_topic_problem(topic)
                if problem is not None:
                    refused.append(
                        R.CreatableTopicResult(
                            name=topic.name,
                            topic_id=uuid.UUID(int=0),
                            error_code=problem[0],
                            error_message=problem[1],
                            num_partitions=-1,
                            replication_factor=-1,
                            configs=[],
                        )
                    )
                    continue
                # -1 is the cluster default; any other value is the controller's to judge.
                t.num_partitions = topic.num_partitions
                t.replication_factor = topic.replication_factor
                for a in topic.assignments:
                    t.assignments.add(partition_id=a.partition_index, broker_ids=a.broker_ids)
                for c in topic.configs:
                    t.configs[c.name] = c.value
            message.topics.append(t)
        answer = await self._forward(controller_codec.CREATE_TOPICS, message)
        if isinstance(answer, int):
            results = [
                R.CreatableTopicResult(name=t.name, error_code=answer, configs=[])
                for t in message.topics
            ]
        elif answer.error != NONE and not answer.topics:
            # Refused whole (etcd mode: a change larger than one etcd transaction): each
            # topic asked for gets the refusal and its message.
            results = [
                R.CreatableTopicResult(
                    name=t.name,
                    error_code=answer.error,
                    error_message=answer.error_message or None,
                    configs=[],
                )
                for t in message.topics
            ]
        else:
            created = [t.name for t in answer.topics if t.error == NONE and answer.error == NONE]
            configs = (
                await self._created_topic_configs(created)
                if created and not body.validate_only and request.api_version >= 5
                else {}
            )
            results = [
                R.CreatableTopicResult(
                    name=t.name,
                    topic_id=topic_uuid(t.topic_id) if t.topic_id else uuid.UUID(int=0),
                    error_code=t.error if answer.error == NONE else answer.error,
                    error_message=t.error_message or answer.error_message or None,
                    num_partitions=t.num_partitions if t.error == NONE else -1,
                    replication_factor=t.replication_factor if t.error == NONE else -1,
                    topic_config_error_code=configs.get(t.name, (NONE, []))[0],
                    configs=configs.get(t.name, (NONE, []))[1],
                )
                for t in answer.topics
            ]
        return R(throttle_time_ms=0, topics=refused + results)

    async def _created_topic_configs(self, names: list[str]) -> dict[str, tuple[int, list[Any]]]:
        """Each topic's effective configs in CreateTopics' shape, with the error code of
        describing them (TOPIC_AUTHORIZATION_FAILED without DESCRIBE_CONFIGS on it, as
        Kafka answers)."""
        message = admin_pb2.DescribeConfigsRequest()
        for name in names:
            message.resources.add(resource_type=_TOPIC_RESOURCE, resource_name=name)
        answer = await self._forward(controller_codec.DESCRIBE_CONFIGS, message)
        if isinstance(answer, int):
            return {name: (answer, []) for name in names}
        C = CreateTopicsResponse.CreatableTopicResult.CreatableTopicConfigs
        return {
            r.resource_name: (
                r.error if answer.error == NONE else answer.error,
                [
                    C(
                        name=c.name,
                        value=c.value if c.HasField("value") else None,
                        read_only=c.read_only,
                        config_source=c.source,
                        is_sensitive=c.sensitive,
                    )
                    for c in r.configs
                ],
            )
            for r in answer.results
        }

    async def delete_topics(self, request: KafkaRequest) -> Any:
        body = request.body
        message = admin_pb2.DeleteTopicsRequest()
        R = DeleteTopicsResponse
        # Each topic is named by its name or by its id (v6): Kafka's controller answers an
        # entry with neither, or both, INVALID_REQUEST, and goes on with the others.
        invalid: list[Any] = []
        if request.api_version >= 6:
            for topic in body.topics:
                topic_id = topic.topic_id or uuid.UUID(int=0)
                if (topic.name is None) == (topic_id.int == 0):
                    invalid.append(
                        R.DeletableTopicResult(
                            name=topic.name,
                            topic_id=topic_id,
                            error_code=INVALID_REQUEST,
                            error_message=(
                                "neither a topic name nor a topic id"
                                if topic.name is None
                                else "a topic name and a topic id both"
                            ),
                        )
                    )
                elif topic.name is not None:
                    message.names.append(topic.name)
                else:
                    message.topic_ids.append(topic_id_string(topic_id))
        else:
            message.names.extend(body.topic_names)
        if invalid and not message.names and not message.topic_ids:
            return R(throttle_time_ms=0, responses=invalid)

        def unanswered(sent: Message, error: int, why: str = "") -> admin_pb2.DeleteTopicsResponse:
            """Each topic ``sent`` answered ``error`` (the forwarding failed, or the
            controller refused the request whole)."""
            assert isinstance(sent, admin_pb2.DeleteTopicsRequest)
            return admin_pb2.DeleteTopicsResponse(
                topics=[
                    admin_pb2.DeletableTopicResult(
                        name=n, error=ErrorCode.ValueType(error), error_message=why
                    )
                    for n in sent.names
                ]
                + [
                    admin_pb2.DeletableTopicResult(
                        topic_id=i, error=ErrorCode.ValueType(error), error_message=why
                    )
                    for i in sent.topic_ids
                ]
            )

        answer = await self._forward(controller_codec.DELETE_TOPICS, message, unanswered)
        assert not isinstance(answer, int)  # (a failed call is answered by ``unanswered``)
        if answer.error != NONE:
            # Refused whole (etcd mode: a change larger than one etcd transaction): the
            # controller answered no topic, and the refusals made here stand.
            refused = list(answer.topics)
            names = {t.name for t in refused if t.name}
            ids = {t.topic_id for t in refused if t.topic_id}
            rest = admin_pb2.DeleteTopicsRequest(
                names=[n for n in message.names if n not in names],
                topic_ids=[i for i in message.topic_ids if i not in ids],
            )
            answer = unanswered(rest, answer.error, answer.error_message)
            answer.topics.extend(refused)
        return R(
            throttle_time_ms=0,
            responses=invalid
            + [
                R.DeletableTopicResult(
                    # A topic asked by id is answered without its name where the caller
                    # may not know it (null, from v6 on).
                    name=t.name or (None if request.api_version >= 6 else ""),
                    topic_id=topic_uuid(t.topic_id) if t.topic_id else uuid.UUID(int=0),
                    error_code=t.error,
                    error_message=t.error_message or None,
                )
                for t in answer.topics
            ],
        )

    async def create_partitions(self, request: KafkaRequest) -> Any:
        """CreatePartitions, decided by the controller topic by topic. Kafka's assignments
        are the new partitions' in order, with no ids: they go on as the last partitions
        of ``count`` (the gRPC message's numbering), so the controller judges whether
        there is one per new partition. An empty list (not null) is zero assignments to
        Kafka, and the gRPC message cannot tell it from none: a topic growing with one is
        answered here, INVALID_REPLICA_ASSIGNMENT, as Kafka's controller answers it."""
        body = request.body
        R = CreatePartitionsResponse
        message = admin_pb2.CreatePartitionsRequest(validate_only=bool(body.validate_only))
        refused: list[Any] = []
        for topic in body.topics:
            assignments = topic.assignments or []
            if topic.assignments is not None and not assignments:
                image_topic = self._image().topic(topic.name)
                current = 0 if image_topic is None else len(image_topic.partitions)
                if image_topic is not None and topic.count > current:
                    refused.append(
                        R.CreatePartitionsTopicResult(
                            name=topic.name,
                            error_code=ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                            error_message=f"Attempted to add {topic.count - current} additional "
                            "partition(s), but only 0 assignment(s) were specified.",
                        )
                    )
                    continue
            t = message.topics.add(name=topic.name, count=topic.count)
            first = topic.count - len(assignments)
            for offset, a in enumerate(assignments):
                t.assignments.add(partition_id=first + offset, broker_ids=a.broker_ids)
        answer = await self._forward(controller_codec.CREATE_PARTITIONS, message)
        if isinstance(answer, int):
            results = [
                R.CreatePartitionsTopicResult(name=t.name, error_code=answer)
                for t in message.topics
            ]
        elif answer.error != NONE and not answer.topics:  # refused whole
            results = [
                R.CreatePartitionsTopicResult(
                    name=t.name,
                    error_code=answer.error,
                    error_message=answer.error_message or None,
                )
                for t in message.topics
            ]
        else:
            results = [
                R.CreatePartitionsTopicResult(
                    name=t.name,
                    error_code=t.error if answer.error == NONE else answer.error,
                    error_message=t.error_message or None,
                )
                for t in answer.topics
            ]
        return R(throttle_time_ms=0, results=refused + results)

    async def describe_configs(self, request: KafkaRequest) -> Any:
        """DescribeConfigs of topics and brokers, from the controller. Answered here, for
        the resource alone, as Kafka's broker answers it (``ConfigHelper.describeConfigs``):
        a resource type other than TOPIC and BROKER (INVALID_REQUEST; there are no broker
        logger configs), a BROKER resource naming another broker (INVALID_REQUEST: a
        broker describes itself, or the cluster default as ``""``)."""
        body = request.body
        R = DescribeConfigsResponse
        D = R.DescribeConfigsResult
        message = admin_pb2.DescribeConfigsRequest()
        local: dict[int, Any] = {}
        for index, resource in enumerate(body.resources):
            why = self._config_resource_problem(resource.resource_type, resource.resource_name)
            if why is not None:
                local[index] = D(
                    error_code=INVALID_REQUEST,
                    error_message=why,
                    resource_type=resource.resource_type,
                    resource_name=resource.resource_name,
                    configs=[],
                )
                continue
            message.resources.add(
                resource_type=resource.resource_type,
                resource_name=resource.resource_name,
                config_names=resource.configuration_keys or [],
            )
        answer = (
            await self._forward(controller_codec.DESCRIBE_CONFIGS, message)
            if message.resources
            else admin_pb2.DescribeConfigsResponse()
        )
        if isinstance(answer, int):
            results = [
                D(
                    error_code=answer,
                    resource_type=r.resource_type,
                    resource_name=r.resource_name,
                    configs=[],
                )
                for r in message.resources
            ]
        else:
            results = [
                D(
                    error_code=r.error if answer.error == NONE else answer.error,
                    error_message=r.error_message or None,
                    resource_type=r.resource_type,
                    resource_name=r.resource_name,
                    configs=[
                        D.DescribeConfigsResourceResult(
                            name=c.name,
                            value=c.value if c.HasField("value") else None,
                            read_only=c.read_only,
                            config_source=c.source,
                            is_default=c.source == admin_pb2.CONFIG_SOURCE_DEFAULT_CONFIG,
                            is_sensitive=c.sensitive,
                            synonyms=[],
                            config_type=_CONFIG_TYPES.get(c.type, 0),
                            documentation=(
                                c.documentation or None if body.include_documentation else None
                            ),
                        )
                        for c in r.configs
                    ],
                )
                for r in answer.results
            ]
        return R(throttle_time_ms=0, results=_in_request_order(local, results))

    def _config_resource_problem(
        self, resource_type: int, name: str, *, altered: bool = False
    ) -> str | None:
        """Why a config resource of a Kafka request is refused here (INVALID_REQUEST), or
        None: a type other than TOPIC and BROKER; for a description, a broker other than
        this one."""
        if resource_type not in _CONFIG_RESOURCE_TYPES:
            # Kafka's ConfigAdminManager.preprocess (altering) and ConfigHelper (describing).
            return (
                f"Unknown resource type {resource_type}"
                if altered
                else f"Unsupported resource type {resource_type}"
            )
        node_id = self.requests.node_id
        if (
            not altered
            and resource_type == _BROKER_RESOURCE
            and name.isdigit()
            and int(name) != node_id
        ):
            return f"Unexpected broker id, expected {node_id} or empty string, but received {name}"
        return None

    async def _alter_configs(self, request: KafkaRequest, incremental: bool) -> Any:
        """AlterConfigs and IncrementalAlterConfigs, decided by the controller resource by
        resource. Answered here, for the resource alone: a resource type other than TOPIC
        and BROKER, an operation IncrementalAlterConfigs does not have (INVALID_REQUEST;
        Kafka's ``ConfigAdminManager.preprocess``)."""
        body = request.body
        R = IncrementalAlterConfigsResponse if incremental else AlterConfigsResponse
        A = R.AlterConfigsResourceResponse
        message = admin_pb2.AlterConfigsRequest(validate_only=bool(body.validate_only))
        local: dict[int, Any] = {}
        for index, resource in enumerate(body.resources):
            why = self._config_resource_problem(
                resource.resource_type, resource.resource_name, altered=True
            )
            unknown_ops = sorted(
                {c.config_operation for c in resource.configs if incremental} - _ALTER_CONFIG_OPS
            )
            if why is None and unknown_ops:
                why = f"Unknown alter config operation {unknown_ops[0]}"
            if why is not None:
                local[index] = A(
                    error_code=INVALID_REQUEST,
                    error_message=why,
                    resource_type=resource.resource_type,
                    resource_name=resource.resource_name,
                )
                continue
            r = message.resources.add(
                resource_type=resource.resource_type,
                resource_name=resource.resource_name,
            )
            for c in resource.configs:
                # Kafka's IncrementalAlterConfigs ops (SET 0, DELETE 1, APPEND 2, SUBTRACT 3)
                # are admin.proto's; a legacy AlterConfigs sets each config it names.
                op = c.config_operation if incremental else 0
                config = r.configs.add(name=c.name, op=op)
                if c.value is not None:
                    config.value = c.value
        answer = (
            await self._forward(controller_codec.ALTER_CONFIGS, message)
            if message.resources
            else admin_pb2.AlterConfigsResponse()
        )
        if isinstance(answer, int):
            results = [
                A(error_code=answer, resource_type=r.resource_type, resource_name=r.resource_name)
                for r in message.resources
            ]
        else:
            results = [
                A(
                    error_code=r.error if answer.error == NONE else answer.error,
                    error_message=r.error_message or None,
                    resource_type=r.resource_type,
                    resource_name=r.resource_name,
                )
                for r in answer.resources
            ]
        return R(throttle_time_ms=0, responses=_in_request_order(local, results))

    async def alter_configs(self, request: KafkaRequest) -> Any:
        return await self._alter_configs(request, incremental=False)

    async def incremental_alter_configs(self, request: KafkaRequest) -> Any:
        return await self._alter_configs(request, incremental=True)

    async def elect_leaders(self, request: KafkaRequest) -> Any:
        body = request.body
        message = admin_pb2.ElectLeadersRequest(
            election_type=body.election_type if request.api_version >= 1 else 0  # type: ignore[arg-type]
        )
        if body.topic_partitions is None:
            message.all_partitions = True
        else:
            for tp in body.topic_partitions:
                message.topic_partitions.add(topic=tp.topic, partitions=tp.partitions)
        R = ElectLeadersResponse
        T = R.ReplicaElectionResult
        answer = await self._forward_on_cluster(
            controller_codec.ELECT_LEADERS, message, AclOperation.ALTER
        )
        if isinstance(answer, int):
            return R(throttle_time_ms=0, error_code=answer, replica_election_results=[])
        by_topic: dict[str, list[Any]] = {}
        for p in answer.partitions:
            by_topic.setdefault(p.topic, []).append(
                T.PartitionResult(
                    partition_id=p.partition_id,
                    error_code=p.error,
                    error_message=p.error_message or None,
                )
            )
        return R(
            throttle_time_ms=0,
            error_code=answer.error,
            replica_election_results=[
                T(topic=topic, partition_result=results) for topic, results in by_topic.items()
            ],
        )

    async def alter_partition_reassignments(self, request: KafkaRequest) -> Any:
        body = request.body
        message = admin_pb2.AlterPartitionReassignmentsRequest()
        for topic in body.topics:
            for p in topic.partitions:
                message.partitions.add(
                    topic=topic.name,
                    partition_id=p.partition_index,
                    replicas=p.replicas or [],
                    cancel=p.replicas is None,
                )
        answer = await self._forward_on_cluster(
            controller_codec.ALTER_PARTITION_REASSIGNMENTS, message, AclOperation.ALTER
        )
        R = AlterPartitionReassignmentsResponse
        T = R.ReassignableTopicResponse
        if isinstance(answer, int):
            return R(throttle_time_ms=0, error_code=answer, error_message=None, responses=[])
        by_topic: dict[str, list[Any]] = {}
        for p in answer.partitions:
            by_topic.setdefault(p.topic, []).append(
                T.ReassignablePartitionResponse(
                    partition_index=p.partition_id,
                    error_code=p.error,
                    error_message=p.error_message or None,
                )
            )
        return R(
            throttle_time_ms=0,
            error_code=answer.error,
            error_message=answer.error_message or None,
            responses=[T(name=name, partitions=parts) for name, parts in by_topic.items()],
        )

    async def list_partition_reassignments(self, request: KafkaRequest) -> Any:
        body = request.body
        message = admin_pb2.ListPartitionReassignmentsRequest()
        for topic in body.topics or []:
            message.topic_partitions.add(topic=topic.name, partitions=topic.partition_indexes)
        answer = await self._forward_on_cluster(
            controller_codec.LIST_PARTITION_REASSIGNMENTS, message, AclOperation.DESCRIBE
        )
        R = ListPartitionReassignmentsResponse
        T = R.OngoingTopicReassignment
        if isinstance(answer, int):
            return R(throttle_time_ms=0, error_code=answer, error_message=None, topics=[])
        by_topic: dict[str, list[Any]] = {}
        for r in answer.reassignments:
            by_topic.setdefault(r.topic, []).append(
                T.OngoingPartitionReassignment(
                    partition_index=r.partition_id,
                    replicas=list(r.replicas),
                    adding_replicas=list(r.adding_replicas),
                    removing_replicas=list(r.removing_replicas),
                )
            )
        return R(
            throttle_time_ms=0,
            error_code=answer.error,
            error_message=answer.error_message or None,
            topics=[T(name=name, partitions=parts) for name, parts in by_topic.items()],
        )

    # --- ACLs: the controller's ACL records -------------------------------------------------------

    async def create_acls(self, request: KafkaRequest) -> Any:
        creations = request.body.creations
        R = CreateAclsResponse
        message = admin_pb2.CreateAclsRequest()
        for c in creations:
            message.creations.add(
                resource_type=c.resource_type,
                resource_name=c.resource_name,
                pattern_type=c.resource_pattern_type,
                principal=c.principal,
                host=c.host,
                operation=c.operation,
                permission_type=c.permission_type,
            )
        answer = await self._forward_on_cluster(
            controller_codec.CREATE_ACLS, message, AclOperation.ALTER
        )
        if isinstance(answer, int) or answer.error != NONE:
            code = answer if isinstance(answer, int) else answer.error
            text = None if isinstance(answer, int) else answer.error_message or None
            return R(
                throttle_time_ms=0,
                results=[
                    R.AclCreationResult(error_code=code, error_message=text) for _ in creations
                ],
            )
        return R(
            throttle_time_ms=0,
            results=[
                R.AclCreationResult(error_code=r.error, error_message=r.error_message or None)
                for r in answer.results
            ],
        )

    async def describe_acls(self, request: KafkaRequest) -> Any:
        body = request.body
        R = DescribeAclsResponse
        message = admin_pb2.DescribeAclsRequest(
            filter=_acl_filter(
                body.resource_type_filter,
                body.resource_name_filter,
                body.pattern_type_filter,
                body.principal_filter,
                body.host_filter,
                body.operation,
                body.permission_type,
            )
        )
        answer = await self._forward_on_cluster(
            controller_codec.DESCRIBE_ACLS, message, AclOperation.DESCRIBE
        )
        if isinstance(answer, int) or answer.error != NONE:
            code = answer if isinstance(answer, int) else answer.error
            text = None if isinstance(answer, int) else answer.error_message or None
            return R(throttle_time_ms=0, error_code=code, error_message=text, resources=[])
        by_resource: dict[tuple[int, str, int], list[Any]] = {}
        for acl in answer.acls:
            by_resource.setdefault(
                (acl.resource_type, acl.resource_name, acl.pattern_type), []
            ).append(
                R.DescribeAclsResource.AclDescription(
                    principal=acl.principal,
                    host=acl.host,
                    operation=acl.operation,
                    permission_type=acl.permission_type,
                )
            )
        return R(
            throttle_time_ms=0,
            error_code=NONE,
            error_message=None,
            resources=[
                R.DescribeAclsResource(
                    resource_type=kind, resource_name=name, pattern_type=pattern, acls=acls
                )
                for (kind, name, pattern), acls in by_resource.items()
            ],
        )

    async def delete_acls(self, request: KafkaRequest) -> Any:
        filters = request.body.filters
        R = DeleteAclsResponse
        F = R.DeleteAclsFilterResult
        message = admin_pb2.DeleteAclsRequest(
            filters=[
                _acl_filter(
                    f.resource_type_filter,
                    f.resource_name_filter,
                    f.pattern_type_filter,
                    f.principal_filter,
                    f.host_filter,
                    f.operation,
                    f.permission_type,
                )
                for f in filters
            ]
        )
        answer = await self._forward_on_cluster(
            controller_codec.DELETE_ACLS, message, AclOperation.ALTER
        )
        if isinstance(answer, int) or answer.error != NONE:
            code = answer if isinstance(answer, int) else answer.error
            text = None if isinstance(answer, int) else answer.error_message or None
            return R(
                throttle_time_ms=0,
                filter_results=[
                    F(error_code=code, error_message=text, matching_acls=[]) for _ in filters
                ],
            )
        return R(
            throttle_time_ms=0,
            filter_results=[
                F(
                    error_code=r.error,
                    error_message=r.error_message or None,
                    matching_acls=[
                        F.DeleteAclsMatchingAcl(
                            error_code=NONE,
                            error_message=None,
                            resource_type=acl.resource_type,
                            resource_name=acl.resource_name,
                            pattern_type=acl.pattern_type,
                            principal=acl.principal,
                            host=acl.host,
                            operation=acl.operation,
                            permission_type=acl.permission_type,
                        )
                        for acl in r.deleted
                    ],
                )
                for r in answer.results
            ],
        )


def _in_request_order(local: dict[int, Any], answered: list[Any]) -> list[Any]:
    """The answers to a request's items in its order: ``local[i]`` for the items answered
    here, by index, and ``answered`` (in order) for the others."""
    rest = iter(answered)
    total = len(local) + len(answered)
    return [local[i] if i in local else next(rest) for i in range(total)]


def _creatable_topic_problem(topic: Any) -> tuple[int, str] | None:
    """The refusal of a CreateTopics topic the gRPC message cannot carry, or None."""
    nulls = [c.name for c in topic.configs if c.value is None]
    if nulls:
        return ErrorCode.INVALID_CONFIG, (
            f"Null value not supported for topic configs: {','.join(nulls)}"
        )
    if topic.assignments:
        problem = controller_codec.assignment_problem(
            [a.partition_index for a in topic.assignments]
        )
        if problem is not None:
            return ErrorCode.INVALID_REPLICA_ASSIGNMENT, problem
    return None


def _acl_filter(
    resource_type: int,
    resource_name: str | None,
    pattern_type: int,
    principal: str | None,
    host: str | None,
    operation: int,
    permission_type: int,
) -> admin_pb2.AclFilter:
    """Kafka's ACL binding filter as admin.proto's: a null string is left unset (matches
    anything), and the codes pass as they are (ANY, 1, matches anything there too)."""
    acl_filter = admin_pb2.AclFilter(
        resource_type=resource_type,
        pattern_type=pattern_type,
        operation=operation,
        permission_type=permission_type,
    )
    if resource_name is not None:
        acl_filter.resource_name = resource_name
    if principal is not None:
        acl_filter.principal = principal
    if host is not None:
        acl_filter.host = host
    return acl_filter


_LOG_OVERHEAD: Final = 12  # a batch's base offset and length
_MAGIC_AT: Final = 16
_ATTRIBUTES_AT: Final = 21
_ZSTD: Final = 4


def _batch_end(records: bytes, start: int) -> int | None:
    """Where the batch at ``start`` ends, or ``None`` if ``records`` hold no whole batch
    there (as Kafka's batch iterator: a length running past the end is no batch)."""
    if len(records) - start < _LOG_OVERHEAD:
        return None
    end = start + _LOG_OVERHEAD + int.from_bytes(records[start + 8 : start + 12], signed=True)
    return end if end <= len(records) else None


def invalid_produce_records(records: bytes, version: int) -> tuple[int, str] | None:
    """Kafka's ``ProduceRequest.validateRecords`` (Produce v3+): a partition's records are
    exactly one batch, of magic 2, compressed with zstd only from v7; else the error
    code and message its partition is answered (a batch too short to have a magic is
    the log's to refuse, CORRUPT_MESSAGE)."""
    first_end = _batch_end(records, 0)
    if first_end is None:
        return INVALID_RECORD, f"Produce v{version} must have at least one record batch"
    if first_end <= _ATTRIBUTES_AT + 1:
        return None
    if records[_MAGIC_AT] != 2:
        return INVALID_RECORD, f"Produce v{version} takes record batches of magic 2 only"
    if version < 7 and records[_ATTRIBUTES_AT + 1] & 0x07 == _ZSTD:
        return UNSUPPORTED_COMPRESSION_TYPE, f"Produce v{version} cannot carry zstd (v7+)"
    if _batch_end(records, first_end) is not None:
        return INVALID_RECORD, f"Produce v{version} takes exactly one record batch per partition"
    return None


def api_versions_response(error_code: int) -> Any:
    """The versions of every API served (KIP-511); with ``error_code`` UNSUPPORTED_VERSION
    for an ApiVersions request of a version the listener does not know (answered as v0)."""
    R = ApiVersionsResponse
    return R(
        error_code=error_code,
        api_keys=[
            R.ApiVersion(api_key=key, min_version=api.min_version, max_version=api.max_version)
            for key, api in sorted(SUPPORTED.items())
        ],
        throttle_time_ms=0,
    )
