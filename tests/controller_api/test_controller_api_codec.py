"""The Controller RPC codec: every request and response survives protobuf both ways."""

from __future__ import annotations

import enum
import types
import typing
from collections.abc import Mapping
from dataclasses import fields, is_dataclass
from typing import Any

import pytest
from highwater.controller_api import codec
from highwater.controller_api import messages as m
from highwater.controller_api.codec import RPCS, InvalidRequestError, rpc_for_request
from highwater.internal.v1 import controller_pb2 as pb
from highwater.metadata.records import BrokerEndpoint, ConfigResourceType
from highwater.v1.common_pb2 import ErrorCode
from hypothesis import given, settings
from hypothesis import strategies as st

INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)
TEXT = st.text(st.characters(codec="utf-8"), max_size=12)
FLOATS = st.floats(allow_nan=False)
ERRORS = st.sampled_from(sorted(ErrorCode.values()))
UNKNOWN_TYPE: Any = 0
TOPIC_TYPE: Any = int(ConfigResourceType.TOPIC)
UNKNOWN_OP: Any = 7


def _int_strategy(fd: Any) -> st.SearchStrategy[int]:
    if fd.enum_type is not None:  # error codes
        return ERRORS
    return INT32 if fd.cpp_type == fd.CPPTYPE_INT32 else INT64


def strategy(cls: type[Any]) -> st.SearchStrategy[Any]:
    """Values of a ``controller.messages`` dataclass that fit its proto message."""
    proto = getattr(pb, cls.__name__)
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, st.SearchStrategy[Any]] = {}
    for f in fields(cls):
        fd = proto.DESCRIPTOR.fields_by_name[f.name]
        hint = hints[f.name]
        origin, args = typing.get_origin(hint), typing.get_args(hint)
        s: st.SearchStrategy[Any]
        if isinstance(hint, type) and issubclass(hint, enum.IntEnum):
            s = st.sampled_from(list(hint))
        elif origin is types.UnionType:
            s = st.none() | (_int_strategy(fd) if int in args else TEXT)
        elif origin is tuple:
            item = args[0]
            if item is BrokerEndpoint:
                s = st.lists(
                    st.builds(
                        BrokerEndpoint, TEXT, TEXT, INT32, st.sampled_from(["PLAINTEXT", "SSL"])
                    ),
                    max_size=3,
                ).map(tuple)
            elif typing.get_origin(item) is tuple:
                s = st.lists(st.lists(INT32, max_size=4).map(tuple), max_size=4).map(tuple)
            elif is_dataclass(item):
                s = st.lists(strategy(item), max_size=3).map(tuple)  # type: ignore[arg-type]
            elif item is int:
                s = st.lists(_int_strategy(fd), max_size=5).map(tuple)
            else:
                s = st.lists(TEXT, max_size=4).map(tuple)
        elif origin is Mapping:
            values = FLOATS if args[1] is float else TEXT
            s = st.dictionaries(TEXT, values, max_size=3).map(types.MappingProxyType)
        elif isinstance(hint, type) and is_dataclass(hint):
            s = strategy(hint)  # a singular message field
        elif hint is bytes:
            s = st.binary(max_size=16)
        elif hint is bool:
            s = st.booleans()
        elif hint is float:
            s = FLOATS
        elif hint is int:
            s = _int_strategy(fd)
            if cls is m.CreatePartitionsTopic and f.name == "count":
                s = st.integers(-(2**31) + 8, 2**31 - 1)  # partition ids count-n.. fit int32
        else:
            s = TEXT
        kwargs[f.name] = s
    return st.builds(cls, **kwargs)


REQUESTS = st.one_of([strategy(rpc.request_type) for rpc in RPCS.values()])
RESPONSES = st.one_of([strategy(rpc.response_type) for rpc in RPCS.values()])
_BY_RESPONSE = {rpc.response_type: rpc for rpc in RPCS.values()}


def _wire(message: Any) -> Any:
    """Through bytes, as gRPC sends it."""
    return type(message).FromString(message.SerializeToString())


@settings(max_examples=400)
@given(REQUESTS)
def test_requests_round_trip(request: Any) -> None:
    rpc = rpc_for_request(request)
    encoded = rpc.request_to_proto(request)
    assert isinstance(encoded, rpc.proto_request)
    message: Any = encoded
    assert rpc.request_from_proto(_wire(message)) == request
    # And the other way: a request decoded from the wire encodes to the same message.
    assert rpc.request_to_proto(rpc.request_from_proto(message)) == message


@settings(max_examples=400)
@given(RESPONSES)
def test_responses_round_trip(response: Any) -> None:
    rpc = _BY_RESPONSE[type(response)]
    encoded = rpc.response_to_proto(response)
    assert isinstance(encoded, rpc.proto_response)
    message: Any = encoded
    assert message.controller_id == 0 and message.controller_address == ""
    assert rpc.response_from_proto(_wire(message)) == response


def test_every_rpc_of_the_service_has_a_codec() -> None:
    service = pb.DESCRIPTOR.services_by_name["Controller"]
    assert set(RPCS) | codec.STREAMS == {method.name for method in service.methods}
    assert not set(RPCS) & codec.STREAMS
    assert codec.CONTROLLER_SERVICE_NAME == "highwater.internal.v1.Controller"
    with pytest.raises(TypeError):
        rpc_for_request(object())


def test_not_controller_names_the_active_controller() -> None:
    answer = codec.CREATE_TOPICS.not_controller(2, "10.0.0.2:9093")
    assert isinstance(answer, pb.CreateTopicsResponse)
    assert answer.error == ErrorCode.NOT_CONTROLLER
    assert (answer.controller_id, answer.controller_address) == (2, "10.0.0.2:9093")
    unknown = codec.BROKER_HEARTBEAT.not_controller(None, None)
    assert isinstance(unknown, pb.BrokerHeartbeatResponse)
    assert (unknown.controller_id, unknown.controller_address) == (-1, "")
    decoded = codec.BROKER_HEARTBEAT.response_from_proto(unknown)
    assert decoded.error == ErrorCode.NOT_CONTROLLER


def test_topic_configs_without_a_value_are_not_sent() -> None:
    request = m.CreateTopicsRequest(
        (m.CreatableTopic("t", configs={"retention.ms": "1000", "segment.bytes": None}),)
    )
    message: Any = codec.CREATE_TOPICS.request_to_proto(request)
    assert dict(message.topics[0].configs) == {"retention.ms": "1000"}
    decoded = codec.CREATE_TOPICS.request_from_proto(message)
    assert dict(decoded.topics[0].configs) == {"retention.ms": "1000"}


def test_replica_assignments_carry_partition_ids() -> None:
    create = m.CreateTopicsRequest((m.CreatableTopic("t", assignments=((1, 2), (2, 3), (3, 1))),))
    message: Any = codec.CREATE_TOPICS.request_to_proto(create)
    assert [(a.partition_id, list(a.broker_ids)) for a in message.topics[0].assignments] == [
        (0, [1, 2]),
        (1, [2, 3]),
        (2, [3, 1]),
    ]
    # Any order on the wire; the values hold them in partition order.
    message.topics[0].assignments.reverse()
    assert codec.CREATE_TOPICS.request_from_proto(message) == create

    grow = m.CreatePartitionsRequest((m.CreatePartitionsTopic("t", 5, ((1,), (2,))),))
    message = codec.CREATE_PARTITIONS.request_to_proto(grow)
    assert [a.partition_id for a in message.topics[0].assignments] == [3, 4]
    assert codec.CREATE_PARTITIONS.request_from_proto(message) == grow


@pytest.mark.parametrize("ids", [[1, 2], [0, 0], [0, 2], [-1, 0]])
def test_misnumbered_assignments_are_refused(ids: list[int]) -> None:
    message = pb.CreateTopicsRequest(
        topics=[
            pb.CreatableTopic(
                name="t",
                assignments=[pb.ReplicaAssignment(partition_id=i, broker_ids=[1]) for i in ids],
            )
        ]
    )
    with pytest.raises(InvalidRequestError, match=r"must cover partitions 0\.\.1"):
        codec.CREATE_TOPICS.request_from_proto(message)
    grow = pb.CreatePartitionsRequest(
        topics=[
            pb.CreatePartitionsTopic(
                name="t",
                count=3,
                assignments=[pb.ReplicaAssignment(partition_id=i, broker_ids=[1]) for i in ids],
            )
        ]
    )
    if ids != [1, 2]:
        with pytest.raises(InvalidRequestError, match=r"must cover partitions 1\.\.2"):
            codec.CREATE_PARTITIONS.request_from_proto(grow)


def test_unknown_enum_values_are_refused() -> None:
    message = pb.DescribeConfigsRequest(
        resources=[pb.DescribeConfigsResource(resource_type=UNKNOWN_TYPE, resource_name="t")]
    )
    with pytest.raises(InvalidRequestError, match="not a known ConfigResourceType"):
        codec.DESCRIBE_CONFIGS.request_from_proto(message)
    alter = pb.AlterConfigsRequest(
        resources=[
            pb.AlterConfigsResource(
                resource_type=TOPIC_TYPE,
                resource_name="t",
                configs=[pb.AlterableConfig(name="retention.ms", op=UNKNOWN_OP)],
            )
        ]
    )
    with pytest.raises(InvalidRequestError, match="AlterConfigOp"):
        codec.ALTER_CONFIGS.request_from_proto(alter)


def test_optional_strings_keep_none_apart_from_empty() -> None:
    for rack in (None, "", "rack-a"):
        request = m.RegisterBrokerRequest(1, "incarnation", rack=rack)
        encoded = codec.REGISTER_BROKER.request_to_proto(request)
        assert encoded.HasField("rack") is (rack is not None)
        assert codec.REGISTER_BROKER.request_from_proto(_wire(encoded)).rack == rack
    described = m.DescribedConfig("k", None, m.ConfigSource.DEFAULT_CONFIG)
    response = m.DescribeConfigsResponse(
        results=(m.DescribeConfigsResult(ConfigResourceType.TOPIC, "t", configs=(described,)),)
    )
    message: Any = codec.DESCRIBE_CONFIGS.response_to_proto(response)
    assert not message.results[0].configs[0].HasField("value")
    assert codec.DESCRIBE_CONFIGS.response_from_proto(message) == response


def test_an_endpoint_without_a_protocol_is_plaintext() -> None:
    message = pb.RegisterBrokerRequest(broker_id=1, incarnation_id="i")
    message.listeners.add(name="PLAINTEXT", host="h", port=9092)
    request = codec.REGISTER_BROKER.request_from_proto(message)
    assert request.listeners == (BrokerEndpoint("PLAINTEXT", "h", 9092, "PLAINTEXT"),)


def test_kafka_zero_values_read_alike_from_unspecified_and_their_own_number() -> None:
    """An enum whose Kafka zero became ``_UNSPECIFIED`` (buf's rule) reads both as Kafka's
    zero, and sends Kafka's zero as 0, which an older peer reads alike."""
    for raw in (pb.ELECTION_TYPE_UNSPECIFIED, pb.ELECTION_TYPE_PREFERRED):
        request = codec.ELECT_LEADERS.request_from_proto(
            pb.ElectLeadersRequest(election_type=raw, all_partitions=True)
        )
        assert request.election_type is m.ElectionType.PREFERRED
    encoded: Any = codec.ELECT_LEADERS.request_to_proto(
        m.ElectLeadersRequest(m.ElectionType.PREFERRED, all_partitions=True)
    )
    assert encoded.election_type == 0
    for raw in (pb.ALTER_CONFIG_OP_UNSPECIFIED, pb.ALTER_CONFIG_OP_SET):
        alter = pb.AlterConfigsRequest(
            resources=[
                pb.AlterConfigsResource(
                    resource_type=TOPIC_TYPE,
                    resource_name="t",
                    configs=[pb.AlterableConfig(name="retention.ms", op=raw, value="1")],
                )
            ]
        )
        decoded = codec.ALTER_CONFIGS.request_from_proto(alter)
        assert decoded.resources[0].configs[0].op is m.AlterConfigOp.SET


@pytest.mark.parametrize(
    ("ids", "first", "problem"),
    [
        ([0, 1, 2], 0, None),
        ([2, 0, 1], 0, None),
        ([3, 4], 3, None),
        ([], 0, None),
        ([1], 0, "partitions should be a consecutive 0-based integer sequence"),
        ([0, 2], 0, "partitions should be a consecutive 0-based integer sequence"),
        ([0, 0], 0, "Found multiple manual partition assignments for partition 0"),
        ([2, 4], 3, "partitions should be a consecutive integer sequence from 3"),
    ],
)
def test_assignment_problems_are_named_as_kafka_names_them(
    ids: list[int], first: int, problem: str | None
) -> None:
    """The Kafka listener answers a CreateTopics topic INVALID_REPLICA_ASSIGNMENT with
    these (Kafka's ``ReplicationControlManager.createTopic`` messages)."""
    assert codec.assignment_problem(ids, first) == problem
