"""Admin calls sent to a broker, forwarded to the active controller (Kafka's KIP-590).

Every broker serves the admin calls of admin.proto — CreateTopics, DeleteTopics,
CreatePartitions, AlterConfigs, DescribeConfigs, ElectLeaders,
AlterPartitionReassignments, ListPartitionReassignments, UnregisterBroker (an operator
removing a broker for good, Kafka's KIP-856), CreateAcls, DescribeAcls, DeleteAcls,
AlterUserScramCredentials, DescribeUserScramCredentials, AlterClientQuotas,
DescribeClientQuotas — as methods of its own
``highwater.v1.Broker`` service (:class:`ForwardedAdminCalls`), so that a client needs one
address and one service.
A standalone broker also serves them under ``highwater.internal.v1.Controller``
(:func:`add_forwarding_servicer`), the names the project's admin client uses. Either way the
broker hands each call to the active controller through its
:class:`~highwater.controller_api.client.ControllerClient`, which follows NOT_CONTROLLER
redirects, and returns the answer. The calls that are a broker's own business with the
controller (registration, heartbeats, AlterPartition, producer ids, coordinators) are not
served: UNIMPLEMENTED. In ``highwater server`` the controller itself answers the
``Controller`` service on the same port, and the ``Broker`` service's calls go to it.
"""

from __future__ import annotations

from typing import Any, Final

import grpc
import grpc.aio
from google.protobuf.message import Message

from highwater.controller_api import codec
from highwater.controller_api.authorization import (
    TopicNameOf,
    merge_refusals,
    split_admin_request,
)
from highwater.controller_api.client import ControllerClient, ControllerUnavailableError
from highwater.controller_api.codec import (
    CONTROLLER_SERVICE_NAME,
    ControllerRpc,
    InvalidRequestError,
)
from highwater.rpc.auth import forwarded_principal_metadata
from highwater.v1 import admin_pb2

__all__ = ["FORWARDED_RPCS", "ForwardedAdminCalls", "add_forwarding_servicer", "forward"]

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
    codec.CREATE_ACLS,
    codec.DESCRIBE_ACLS,
    codec.DELETE_ACLS,
    codec.ALTER_USER_SCRAM_CREDENTIALS,
    codec.DESCRIBE_USER_SCRAM_CREDENTIALS,
    codec.ALTER_CLIENT_QUOTAS,
    codec.DESCRIBE_CLIENT_QUOTAS,
)


def add_forwarding_servicer(server: grpc.aio.Server, controller: ControllerClient) -> None:
    """Serve the admin calls of ``highwater.internal.v1.Controller`` on ``server`` by forwarding."""
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


class ForwardedAdminCalls:
    """The admin methods of a ``highwater.v1.Broker`` servicer (admin.proto), each
    forwarded through :attr:`controller` by :func:`forward`."""

    controller: ControllerClient
    """Set by the servicer that mixes this in: the broker's client of the controllers."""
    topic_name_of: TopicNameOf = staticmethod(lambda _topic_id: None)
    """A topic's name from its id, for the ACL check of DeleteTopics by id."""

    async def CreateTopics(
        self, request: admin_pb2.CreateTopicsRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.CreateTopicsResponse:
        return await forward(
            codec.CREATE_TOPICS, self.controller, request, context, self.topic_name_of
        )

    async def DeleteTopics(
        self, request: admin_pb2.DeleteTopicsRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.DeleteTopicsResponse:
        return await forward(
            codec.DELETE_TOPICS, self.controller, request, context, self.topic_name_of
        )

    async def CreatePartitions(
        self, request: admin_pb2.CreatePartitionsRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.CreatePartitionsResponse:
        return await forward(
            codec.CREATE_PARTITIONS, self.controller, request, context, self.topic_name_of
        )

    async def AlterConfigs(
        self, request: admin_pb2.AlterConfigsRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.AlterConfigsResponse:
        return await forward(
            codec.ALTER_CONFIGS, self.controller, request, context, self.topic_name_of
        )

    async def DescribeConfigs(
        self, request: admin_pb2.DescribeConfigsRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.DescribeConfigsResponse:
        return await forward(
            codec.DESCRIBE_CONFIGS, self.controller, request, context, self.topic_name_of
        )

    async def ElectLeaders(
        self, request: admin_pb2.ElectLeadersRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.ElectLeadersResponse:
        return await forward(
            codec.ELECT_LEADERS, self.controller, request, context, self.topic_name_of
        )

    async def AlterPartitionReassignments(
        self,
        request: admin_pb2.AlterPartitionReassignmentsRequest,
        context: grpc.aio.ServicerContext,
    ) -> admin_pb2.AlterPartitionReassignmentsResponse:
        return await forward(
            codec.ALTER_PARTITION_REASSIGNMENTS,
            self.controller,
            request,
            context,
            self.topic_name_of,
        )

    async def ListPartitionReassignments(
        self,
        request: admin_pb2.ListPartitionReassignmentsRequest,
        context: grpc.aio.ServicerContext,
    ) -> admin_pb2.ListPartitionReassignmentsResponse:
        return await forward(
            codec.LIST_PARTITION_REASSIGNMENTS,
            self.controller,
            request,
            context,
            self.topic_name_of,
        )

    async def CreateAcls(
        self, request: admin_pb2.CreateAclsRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.CreateAclsResponse:
        return await forward(
            codec.CREATE_ACLS, self.controller, request, context, self.topic_name_of
        )

    async def DescribeAcls(
        self, request: admin_pb2.DescribeAclsRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.DescribeAclsResponse:
        return await forward(
            codec.DESCRIBE_ACLS, self.controller, request, context, self.topic_name_of
        )

    async def DeleteAcls(
        self, request: admin_pb2.DeleteAclsRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.DeleteAclsResponse:
        return await forward(
            codec.DELETE_ACLS, self.controller, request, context, self.topic_name_of
        )

    async def AlterUserScramCredentials(
        self,
        request: admin_pb2.AlterUserScramCredentialsRequest,
        context: grpc.aio.ServicerContext,
    ) -> admin_pb2.AlterUserScramCredentialsResponse:
        return await forward(
            codec.ALTER_USER_SCRAM_CREDENTIALS,
            self.controller,
            request,
            context,
            self.topic_name_of,
        )

    async def DescribeUserScramCredentials(
        self,
        request: admin_pb2.DescribeUserScramCredentialsRequest,
        context: grpc.aio.ServicerContext,
    ) -> admin_pb2.DescribeUserScramCredentialsResponse:
        return await forward(
            codec.DESCRIBE_USER_SCRAM_CREDENTIALS,
            self.controller,
            request,
            context,
            self.topic_name_of,
        )

    async def AlterClientQuotas(
        self, request: admin_pb2.AlterClientQuotasRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.AlterClientQuotasResponse:
        return await forward(codec.ALTER_CLIENT_QUOTAS, self.controller, request, context)

    async def DescribeClientQuotas(
        self, request: admin_pb2.DescribeClientQuotasRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.DescribeClientQuotasResponse:
        return await forward(codec.DESCRIBE_CLIENT_QUOTAS, self.controller, request, context)

    async def UnregisterBroker(
        self, request: admin_pb2.UnregisterBrokerRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.UnregisterBrokerResponse:
        return await forward(
            codec.UNREGISTER_BROKER, self.controller, request, context, self.topic_name_of
        )


async def forward(
    rpc: ControllerRpc[Any, Any],
    controller: ControllerClient,
    message: Message,
    context: grpc.aio.ServicerContext,
    topic_name_of: TopicNameOf = lambda _topic_id: None,
) -> Any:
    """``message`` sent to the active controller as ``rpc``; its answer. A request the
    controller's codec cannot hold is INVALID_ARGUMENT, no reachable controller UNAVAILABLE.

    With the authorizer on, the items the caller may not act on are refused here
    (``controller_api/authorization.py``; the whole-call checks ran in the interceptor),
    and the rest goes on with the caller's principal in its metadata, which the
    controller takes from this broker because it may CLUSTER_ACTION."""
    to_run, refused = split_admin_request(rpc.name, message, context, topic_name_of)
    if to_run is None:
        return merge_refusals(rpc.name, rpc.proto_response(), refused)
    try:
        request = rpc.request_from_proto(to_run)
    except InvalidRequestError as e:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        raise AssertionError("unreachable: abort raises") from e
    try:
        response = await controller.call(
            rpc, request, metadata=forwarded_principal_metadata(context)
        )
    except ControllerUnavailableError as e:
        await context.abort(grpc.StatusCode.UNAVAILABLE, str(e))
        raise AssertionError("unreachable: abort raises") from e
    return merge_refusals(rpc.name, rpc.response_to_proto(response), refused)


def _forwarder(rpc: ControllerRpc[Any, Any], controller: ControllerClient) -> Any:
    async def forwarded(message: Message, context: grpc.aio.ServicerContext) -> Message:
        return await forward(rpc, controller, message, context)

    return forwarded
