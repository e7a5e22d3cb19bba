"""Admin calls sent to a broker, forwarded to the active controller (Kafka's KIP-590).

A standalone broker serves the ``highwater.v1.Controller`` admin calls — CreateTopics,
DeleteTopics, CreatePartitions, AlterConfigs, DescribeConfigs, ElectLeaders,
AlterPartitionReassignments, ListPartitionReassignments, UnregisterBroker (an operator
removing a broker for good, Kafka's KIP-856) — by handing
each to the active controller through its
:class:`~highwater.controller_api.client.ControllerClient` and returning the answer, so an
admin client needs only a broker's address (``--bootstrap-server``). The calls that are
a broker's own business with the controller (registration, heartbeats, AlterPartition,
producer ids, coordinators) are not served: UNIMPLEMENTED. In ``highwater server`` the
controller itself answers on the same port, and nothing is forwarded.
"""

from __future__ import annotations

from typing import Any, Final

import grpc
import grpc.aio
from google.protobuf.message import Message

from highwater.controller_api import codec
from highwater.controller_api.client import ControllerClient, ControllerUnavailableError
from highwater.controller_api.codec import (
    CONTROLLER_SERVICE_NAME,
    ControllerRpc,
    InvalidRequestError,
)

__all__ = ["FORWARDED_RPCS", "add_forwarding_servicer"]

FORWARDED_RPCS: Final = (
    codec.CREATE_TOPICS,
    codec.DELETE_TOPICS,
    codec.CREATE_PARTITIONS,
    codec.ALTER_CONFIGS,
    codec.DESCRIBE_CONFIGS,
    codec.ELECT_LEADERS,
    codec.ALTER_PARTITION_REASSIGNMENTS,
    codec.LIST_PARTITION_REASSIGNMENTS,
    codec.UNREGISTER_BROKER,
)


def add_forwarding_servicer(server: grpc.aio.Server, controller: ControllerClient) -> None:
    """Serve the admin calls of ``highwater.v1.Controller`` on ``server`` by forwarding."""
    handlers = {
        rpc.name: grpc.unary_unary_rpc_method_handler(
            _forwarder(rpc, controller),
            request_deserializer=rpc.proto_request.FromString,
            response_serializer=lambda message: message.SerializeToString(),
        )
        for rpc in FORWARDED_RPCS
    }
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(CONTROLLER_SERVICE_NAME, handlers),)
    )


def _forwarder(rpc: ControllerRpc[Any, Any], controller: ControllerClient) -> Any:
    async def forward(message: Message, context: grpc.aio.ServicerContext) -> Message:
        try:
            request = rpc.request_from_proto(message)
        except InvalidRequestError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
            raise AssertionError("unreachable: abort raises") from e
        try:
            response = await controller.call(rpc, request)
        except ControllerUnavailableError as e:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(e))
            raise AssertionError("unreachable: abort raises") from e
        return rpc.response_to_proto(response)

    return forward
