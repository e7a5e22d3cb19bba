"""Controller RPC messages: ``highwater.v1`` protobuf to and from ``controller.messages`` values.

The dataclasses of :mod:`highwater.controller_api.messages` mirror ``controller.proto`` field
for field, so one conversion plan per message pair, built from the dataclass's type hints
and the proto descriptor when this module is imported, does the work (and refuses to
import if the two drift apart). What the proto spells differently:

* a replica assignment is ``ReplicaAssignment(partition_id, broker_ids)``; the
  dataclasses hold the lists in partition order. For ``CreatableTopic`` they are the
  partitions ``0..n-1``; for ``CreatePartitionsTopic`` the new partitions, the last of
  which is ``count - 1``. Decoding sorts by ``partition_id`` and requires exactly that
  run of ids;
* ``CreatableTopic.configs`` is a ``map<string, string>``: a ``None`` value (the key is
  left out by the controller anyway) is not sent;
* a proto ``optional`` scalar left unset decodes as the dataclass field's default (an
  unset ``CreatableTopic.num_partitions`` is ``-1``, the cluster default), not as zero;
* enums become their ``IntEnum`` (an unknown ``ConfigResourceType``, ``ElectionType``,
  ``AlterConfigOp`` or ``ConfigSource`` is an :class:`InvalidRequestError`); error codes
  stay ints;
* every response also carries ``controller_id`` and ``controller_address``, which the
  core does not know: the servicer fills them in on NOT_CONTROLLER
  (:meth:`ControllerRpc.not_controller`) and the client reads them off the proto.

:data:`RPCS` names each RPC with its four conversions, for the servicer (requests from
proto, responses to proto) and the client (the reverse).
"""

from __future__ import annotations

import enum
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, dataclass, fields, is_dataclass
from typing import Any, Final, Generic, TypeVar

from google.protobuf.message import Message

from highwater.controller_api import messages as m
from highwater.errors import InvalidRequestError
from highwater.internal.v1 import controller_pb2 as pb
from highwater.metadata.records import DEFAULT_SECURITY_PROTOCOL, BrokerEndpoint
from highwater.v1.common_pb2 import ErrorCode

__all__ = [
    "CONTROLLER_HEALTH_ALIASES",
    "CONTROLLER_SERVICE_NAME",
    "RPCS",
    "ControllerRpc",
    "InvalidRequestError",
    "assignment_problem",
    "rpc_for_request",
]

_Setter = Callable[[Any, Any], None]
_Getter = Callable[[Any], Any]

# The fields every response has in the proto and no response dataclass has.
_ROUTING_FIELDS: Final = frozenset({"controller_id", "controller_address"})


@dataclass(frozen=True, slots=True)
class _Plan:
    """How to convert one dataclass to and from one proto message type."""

    cls: type[Any]
    proto: type[Message]
    setters: tuple[_Setter, ...]
    getters: tuple[_Getter, ...]

    def to_proto(self, value: Any, message: Any | None = None) -> Any:
        if message is None:
            message = self.proto()
        for setter in self.setters:
            setter(value, message)
        return message

    def from_proto(self, message: Any) -> Any:
        return self.cls(*[getter(message) for getter in self.getters])


# --- field converters ------------------------------------------------------------------


def _scalar(name: str) -> tuple[_Setter, _Getter]:
    def set_(value: Any, message: Any) -> None:
        setattr(message, name, getattr(value, name))

    def get(message: Any) -> Any:
        return getattr(message, name)

    return set_, get


def _defaulted(name: str, default: Any) -> tuple[_Setter, _Getter]:
    """A proto ``optional`` scalar whose dataclass field has a default: an unset field is
    that default (``-1``: the cluster's default partition count, say), never proto3's zero."""

    def set_(value: Any, message: Any) -> None:
        setattr(message, name, getattr(value, name))

    def get(message: Any) -> Any:
        return getattr(message, name) if message.HasField(name) else default

    return set_, get


_PROTO_ALIASES: Final[Mapping[type[enum.IntEnum], Mapping[int, enum.IntEnum]]] = {
    m.ElectionType: {2: m.ElectionType.PREFERRED},
    m.AlterConfigOp: {4: m.AlterConfigOp.SET},
}
"""Proto numbers that are not Kafka's: an enum whose Kafka zero became ``_UNSPECIFIED``
(read as Kafka's zero, and sent as it, so older peers read it alike) names Kafka's zero
value with a number of its own too (admin.proto)."""


def _enum(name: str, enum_type: type[enum.IntEnum]) -> tuple[_Setter, _Getter]:
    # Each proto number's member, aliases included: one dict lookup per field, where
    # calling the enum type runs ``EnumType.__call__`` and ``__new__`` in Python.
    members: dict[int, enum.IntEnum] = {
        **{member.value: member for member in enum_type},
        **_PROTO_ALIASES.get(enum_type, {}),
    }

    def set_(value: Any, message: Any) -> None:
        setattr(message, name, int(getattr(value, name)))

    def get(message: Any) -> Any:
        raw = getattr(message, name)
        member = members.get(raw)
        if member is None:
            raise InvalidRequestError(
                f"{type(message).__name__}.{name}: {raw} is not a known {enum_type.__name__}"
            )
        return member

    return set_, get


def _optional(name: str) -> tuple[_Setter, _Getter]:
    def set_(value: Any, message: Any) -> None:
        field_value = getattr(value, name)
        if field_value is not None:
            setattr(message, name, field_value)

    def get(message: Any) -> Any:
        return getattr(message, name) if message.HasField(name) else None

    return set_, get


def _repeated(name: str) -> tuple[_Setter, _Getter]:
    def set_(value: Any, message: Any) -> None:
        getattr(message, name).extend(getattr(value, name))

    def get(message: Any) -> Any:
        return tuple(getattr(message, name))

    return set_, get


def _endpoints(name: str) -> tuple[_Setter, _Getter]:
    def set_(value: Any, message: Any) -> None:
        out = getattr(message, name)
        for endpoint in getattr(value, name):
            out.add(
                name=endpoint.name,
                host=endpoint.host,
                port=endpoint.port,
                security_protocol=endpoint.security_protocol,
            )

    def get(message: Any) -> Any:
        return tuple(
            BrokerEndpoint(e.name, e.host, e.port, e.security_protocol or DEFAULT_SECURITY_PROTOCOL)
            for e in getattr(message, name)
        )

    return set_, get


def _messages(name: str, plan: _Plan) -> tuple[_Setter, _Getter]:
    def set_(value: Any, message: Any) -> None:
        out = getattr(message, name)
        for item in getattr(value, name):
            plan.to_proto(item, out.add())

    def get(message: Any) -> Any:
        return tuple([plan.from_proto(item) for item in getattr(message, name)])

    return set_, get


def _message(name: str, plan: _Plan) -> tuple[_Setter, _Getter]:
    """A singular message field (an unset one decodes as the message's defaults)."""

    def set_(value: Any, message: Any) -> None:
        out = getattr(message, name)
        out.SetInParent()
        plan.to_proto(getattr(value, name), out)

    def get(message: Any) -> Any:
        return plan.from_proto(getattr(message, name))

    return set_, get


def _config_map(name: str) -> tuple[_Setter, _Getter]:
    def set_(value: Any, message: Any) -> None:
        out = getattr(message, name)
        for key, config_value in getattr(value, name).items():
            if config_value is not None:
                out[key] = config_value

    def get(message: Any) -> Any:
        return types.MappingProxyType(dict(getattr(message, name)))

    return set_, get


def _assignments(name: str, first_partition: Callable[[int, int], int]) -> tuple[_Setter, _Getter]:
    """``first_partition(count, n)``: the id of the first of ``n`` assigned partitions
    (``count`` is the message's ``count`` field, 0 if it has none)."""

    def set_(value: Any, message: Any) -> None:
        assignments = getattr(value, name)
        first = first_partition(getattr(value, "count", 0), len(assignments))
        out = getattr(message, name)
        for index, replicas in enumerate(assignments):
            out.add(partition_id=first + index, broker_ids=replicas)

    def get(message: Any) -> Any:
        items = sorted(getattr(message, name), key=lambda a: a.partition_id)
        first = first_partition(getattr(message, "count", 0), len(items))
        ids = [item.partition_id for item in items]
        problem = assignment_problem(ids, first)
        if problem is not None:
            raise InvalidRequestError(
                f"{type(message).__name__} {getattr(message, 'name', '')!r}: {problem}; the "
                f"assignments must cover partitions {first}..{first + len(items) - 1} once "
                f"each, not {ids}"
            )
        return tuple(tuple(item.broker_ids) for item in items)

    return set_, get


def assignment_problem(partition_ids: Sequence[int], first: int = 0) -> str | None:
    """Why replica assignments for ``partition_ids`` cannot be read as the partitions
    ``first, first + 1, ...`` (a topic's from 0 when it is created), or None: a partition
    given twice, or ids that are not that run. Kafka's messages
    (``ReplicationControlManager.createTopic``), which its clients show.

    The messages hold assignments in partition order, so an assignment with such ids has
    no form there: the Kafka listener answers its topic INVALID_REPLICA_ASSIGNMENT with
    this, and decoding refuses it (:class:`InvalidRequestError`)."""
    seen: set[int] = set()
    for partition_id in partition_ids:
        if partition_id in seen:
            return f"Found multiple manual partition assignments for partition {partition_id}"
        seen.add(partition_id)
    if sorted(seen) != list(range(first, first + len(seen))):
        if first == 0:
            return "partitions should be a consecutive 0-based integer sequence"
        return f"partitions should be a consecutive integer sequence from {first}"
    return None


def _from_zero(count: int, n: int) -> int:
    return 0


def _new_partitions(count: int, n: int) -> int:
    return count - n


# --- plans -----------------------------------------------------------------------------

_PLANS: dict[type[Any], _Plan] = {}


def _plan(cls: type[Any], proto: type[Message]) -> _Plan:
    """The plan for ``cls`` <-> ``proto``, nested message types included."""
    existing = _PLANS.get(cls)
    if existing is not None:
        return existing
    hints = typing.get_type_hints(cls)
    descriptor = proto.DESCRIPTOR
    setters: list[_Setter] = []
    getters: list[_Getter] = []
    defaults = {f.name: f.default for f in fields(cls)}
    names = list(defaults)
    for name in names:
        fd = descriptor.fields_by_name.get(name)
        if fd is None:
            raise RuntimeError(f"{cls.__name__}.{name} is not in {descriptor.full_name}")
        hint = hints[name]
        origin, args = typing.get_origin(hint), typing.get_args(hint)
        pair: tuple[_Setter, _Getter]
        if isinstance(hint, type) and issubclass(hint, enum.IntEnum):
            pair = _enum(name, hint)
        elif origin in (types.UnionType, typing.Union) and type(None) in args:
            pair = _optional(name)
        elif origin is tuple:
            item = args[0]
            if item is BrokerEndpoint:
                pair = _endpoints(name)
            elif typing.get_origin(item) is tuple:
                first = _new_partitions if cls is m.CreatePartitionsTopic else _from_zero
                pair = _assignments(name, first)
            elif isinstance(item, type) and is_dataclass(item) and fd.message_type is not None:
                item_proto = getattr(pb, fd.message_type.name)
                pair = _messages(name, _plan(item, item_proto))
            else:
                pair = _repeated(name)
        elif isinstance(hint, type) and is_dataclass(hint) and fd.message_type is not None:
            pair = _message(name, _plan(hint, getattr(pb, fd.message_type.name)))
        elif origin is Mapping:
            pair = _config_map(name)
        elif fd.has_presence and defaults[name] is not MISSING:
            pair = _defaulted(name, defaults[name])
        else:
            pair = _scalar(name)
        setters.append(pair[0])
        getters.append(pair[1])
    extra = set(descriptor.fields_by_name) - set(names) - _ROUTING_FIELDS
    if extra:
        raise RuntimeError(
            f"{descriptor.full_name} has fields {sorted(extra)} that {cls.__name__} lacks"
        )
    plan = _Plan(cls, proto, tuple(setters), tuple(getters))
    _PLANS[cls] = plan
    return plan


Req = TypeVar("Req")
Resp = TypeVar("Resp")


@dataclass(frozen=True, slots=True)
class ControllerRpc(Generic[Req, Resp]):
    """One Controller RPC: its name and the conversions of its request and response."""

    name: str
    request_type: type[Req]
    response_type: type[Resp]
    proto_request: type[Message]
    proto_response: type[Message]

    def request_from_proto(self, message: Message) -> Req:
        result: Req = _PLANS[self.request_type].from_proto(message)
        return result

    def request_to_proto(self, request: Req) -> Message:
        result: Message = _PLANS[self.request_type].to_proto(request)
        return result

    def response_to_proto(self, response: Resp) -> Message:
        result: Message = _PLANS[self.response_type].to_proto(response)
        return result

    def response_from_proto(self, message: Message) -> Resp:
        result: Resp = _PLANS[self.response_type].from_proto(message)
        return result

    def not_controller(
        self, controller_id: int | None, controller_address: str | None, message: str = ""
    ) -> Message:
        """The NOT_CONTROLLER answer, naming the active controller if it is known."""
        return self.proto_response(
            error=ErrorCode.NOT_CONTROLLER,
            error_message=message or "This node is not the active controller",
            controller_id=-1 if controller_id is None else controller_id,
            controller_address=controller_address or "",
        )

    def error(self, code: int, message: str) -> Message:
        """An answer refusing the whole request with ``code``."""
        return self.proto_response(error=code, error_message=message)


def _rpc(name: str, request: type[Req], response: type[Resp]) -> ControllerRpc[Req, Resp]:
    proto_request = getattr(pb, request.__name__)
    proto_response = getattr(pb, response.__name__)
    _plan(request, proto_request)
    _plan(response, proto_response)
    return ControllerRpc(name, request, response, proto_request, proto_response)


REGISTER_BROKER: Final = _rpc("RegisterBroker", m.RegisterBrokerRequest, m.RegisterBrokerResponse)
BROKER_HEARTBEAT: Final = _rpc(
    "BrokerHeartbeat", m.BrokerHeartbeatRequest, m.BrokerHeartbeatResponse
)
UNREGISTER_BROKER: Final = _rpc(
    "UnregisterBroker", m.UnregisterBrokerRequest, m.UnregisterBrokerResponse
)
ALTER_PARTITION: Final = _rpc("AlterPartition", m.AlterPartitionRequest, m.AlterPartitionResponse)
CREATE_TOPICS: Final = _rpc("CreateTopics", m.CreateTopicsRequest, m.CreateTopicsResponse)
DELETE_TOPICS: Final = _rpc("DeleteTopics", m.DeleteTopicsRequest, m.DeleteTopicsResponse)
CREATE_PARTITIONS: Final = _rpc(
    "CreatePartitions", m.CreatePartitionsRequest, m.CreatePartitionsResponse
)
ELECT_LEADERS: Final = _rpc("ElectLeaders", m.ElectLeadersRequest, m.ElectLeadersResponse)
ALTER_PARTITION_REASSIGNMENTS: Final = _rpc(
    "AlterPartitionReassignments",
    m.AlterPartitionReassignmentsRequest,
    m.AlterPartitionReassignmentsResponse,
)
LIST_PARTITION_REASSIGNMENTS: Final = _rpc(
    "ListPartitionReassignments",
    m.ListPartitionReassignmentsRequest,
    m.ListPartitionReassignmentsResponse,
)
ALTER_CONFIGS: Final = _rpc("AlterConfigs", m.AlterConfigsRequest, m.AlterConfigsResponse)
DESCRIBE_CONFIGS: Final = _rpc(
    "DescribeConfigs", m.DescribeConfigsRequest, m.DescribeConfigsResponse
)
ALLOCATE_PRODUCER_IDS: Final = _rpc(
    "AllocateProducerIds", m.AllocateProducerIdsRequest, m.AllocateProducerIdsResponse
)
REGISTER_COORDINATOR: Final = _rpc(
    "RegisterCoordinator", m.RegisterCoordinatorRequest, m.RegisterCoordinatorResponse
)
COORDINATOR_HEARTBEAT: Final = _rpc(
    "CoordinatorHeartbeat", m.CoordinatorHeartbeatRequest, m.CoordinatorHeartbeatResponse
)
UNREGISTER_COORDINATOR: Final = _rpc(
    "UnregisterCoordinator", m.UnregisterCoordinatorRequest, m.UnregisterCoordinatorResponse
)
CREATE_ACLS: Final = _rpc("CreateAcls", m.CreateAclsRequest, m.CreateAclsResponse)
DESCRIBE_ACLS: Final = _rpc("DescribeAcls", m.DescribeAclsRequest, m.DescribeAclsResponse)
DELETE_ACLS: Final = _rpc("DeleteAcls", m.DeleteAclsRequest, m.DeleteAclsResponse)
ALTER_USER_SCRAM_CREDENTIALS: Final = _rpc(
    "AlterUserScramCredentials",
    m.AlterUserScramCredentialsRequest,
    m.AlterUserScramCredentialsResponse,
)
DESCRIBE_USER_SCRAM_CREDENTIALS: Final = _rpc(
    "DescribeUserScramCredentials",
    m.DescribeUserScramCredentialsRequest,
    m.DescribeUserScramCredentialsResponse,
)
ALTER_CLIENT_QUOTAS: Final = _rpc(
    "AlterClientQuotas", m.AlterClientQuotasRequest, m.AlterClientQuotasResponse
)
DESCRIBE_CLIENT_QUOTAS: Final = _rpc(
    "DescribeClientQuotas", m.DescribeClientQuotasRequest, m.DescribeClientQuotasResponse
)

RPCS: Final[dict[str, ControllerRpc[Any, Any]]] = {
    rpc.name: rpc
    for rpc in (
        REGISTER_BROKER,
        BROKER_HEARTBEAT,
        UNREGISTER_BROKER,
        ALTER_PARTITION,
        CREATE_TOPICS,
        DELETE_TOPICS,
        CREATE_PARTITIONS,
        ELECT_LEADERS,
        ALTER_PARTITION_REASSIGNMENTS,
        LIST_PARTITION_REASSIGNMENTS,
        ALTER_CONFIGS,
        DESCRIBE_CONFIGS,
        ALLOCATE_PRODUCER_IDS,
        REGISTER_COORDINATOR,
        COORDINATOR_HEARTBEAT,
        UNREGISTER_COORDINATOR,
        CREATE_ACLS,
        DESCRIBE_ACLS,
        DELETE_ACLS,
        ALTER_USER_SCRAM_CREDENTIALS,
        DESCRIBE_USER_SCRAM_CREDENTIALS,
        ALTER_CLIENT_QUOTAS,
        DESCRIBE_CLIENT_QUOTAS,
    )
}
"""Every RPC of ``highwater.internal.v1.Controller``, by method name."""

CONTROLLER_SERVICE_NAME: Final = pb.DESCRIPTOR.services_by_name["Controller"].full_name
CONTROLLER_HEALTH_ALIASES: Final = ("highwater.v1.Controller",)
"""The Controller service's name before it moved to ``highwater.internal.v1``: health
reports its status under it too."""


STREAMS: Final = frozenset({"BrokerLiveness"})
"""The streaming RPCs of ``highwater.internal.v1.Controller``: no request-response codec;
the broker's lifecycle and the controller server speak their proto messages directly."""


def _check_service() -> None:
    service = pb.DESCRIPTOR.services_by_name["Controller"]
    streams = {m.name for m in service.methods if m.client_streaming or m.server_streaming}
    if streams != STREAMS:
        raise RuntimeError(f"{service.full_name}'s streaming RPCs are {sorted(streams)}")
    for method in service.methods:
        if method.name in STREAMS:
            continue
        rpc = RPCS.get(method.name)
        if (
            rpc is None
            or rpc.proto_request.DESCRIPTOR is not method.input_type
            or rpc.proto_response.DESCRIPTOR is not method.output_type
        ):
            raise RuntimeError(f"{service.full_name}.{method.name} has no matching codec")
    if len(RPCS) + len(STREAMS) != len(service.methods):
        raise RuntimeError(f"the codec has RPCs that {service.full_name} lacks")


_check_service()

_BY_REQUEST_TYPE: Final[dict[type[Any], ControllerRpc[Any, Any]]] = {
    rpc.request_type: rpc for rpc in RPCS.values()
}


def rpc_for_request(request: object) -> ControllerRpc[Any, Any]:
    """The RPC whose request ``request`` (a ``controller.messages`` value) is."""
    rpc = _BY_REQUEST_TYPE.get(type(request))
    if rpc is None:
        raise TypeError(f"not a Controller request: {request!r}")
    return rpc
