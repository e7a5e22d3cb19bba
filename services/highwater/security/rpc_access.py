"""What every RPC of every service needs: the ACL table of Kafka's ``KafkaApis``, by gRPC method.

Each method is one of:

- :data:`PUBLIC`: no check (``Authenticate``, health, reflection: a client must be able
  to log in and a probe to ask);
- :class:`OnCluster`: the whole call needs ``operation`` on the cluster resource
  (``kafka-cluster``), checked by the server interceptor before the servicer runs; a
  refusal is ``PERMISSION_DENIED`` with ``CLUSTER_AUTHORIZATION_FAILED`` in its details.
  The inter-service calls (Raft, broker and coordinator registration and heartbeats,
  AlterPartition, AllocateProducerIds, followers' ReplicaFetch, the etcd mode's
  UpdateMetadata) need ``CLUSTER_ACTION``, and ``as_node`` marks those where a broker
  speaks for a node id: only the principal that registered the node may
  (``security/node_identities.py``);
- :class:`PerItem`: the servicer checks each topic, group or resource of the request
  (``resource`` and ``operation`` say which, for the docs) and answers a refused item with
  its typed error (``TOPIC_AUTHORIZATION_FAILED``, ``GROUP_AUTHORIZATION_FAILED``,
  ``CLUSTER_AUTHORIZATION_FAILED``) while the others are served.

A method missing from the table is refused (``PERMISSION_DENIED``) when the authorizer is
on: a new RPC cannot slip through unchecked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from highwater.security.acl import AclOperation, ResourceType

__all__ = ["FORWARDABLE", "PUBLIC", "RPC_ACCESS", "OnCluster", "PerItem", "Public", "access_of"]

CLUSTER_NAME: Final = "kafka-cluster"


@dataclass(frozen=True, slots=True)
class Public:
    """No check."""


@dataclass(frozen=True, slots=True)
class OnCluster:
    """The whole call needs ``operation`` on the cluster (or ``or_operation``)."""

    operation: AclOperation
    as_node: bool = False
    or_operation: AclOperation | None = None
    """Another operation that allows the call too (DescribeQuorum: CLUSTER_ACTION)."""


@dataclass(frozen=True, slots=True)
class PerItem:
    """The servicer checks each item: ``operation`` on ``resource`` (for the docs)."""

    resource: ResourceType
    operation: AclOperation
    note: str = ""


Access = Public | OnCluster | PerItem
PUBLIC: Final = Public()

_TOPIC, _GROUP, _CLUSTER = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER
_A = AclOperation

_ADMIN: Final[dict[str, Access]] = {
    "CreateTopics": PerItem(_TOPIC, _A.CREATE, "CREATE on the cluster, else on each topic"),
    "DeleteTopics": PerItem(_TOPIC, _A.DELETE),
    "CreatePartitions": PerItem(_TOPIC, _A.ALTER),
    "AlterConfigs": PerItem(_TOPIC, _A.ALTER_CONFIGS, "topics; brokers: on the cluster"),
    "DescribeConfigs": PerItem(_TOPIC, _A.DESCRIBE_CONFIGS, "topics; brokers: on the cluster"),
    "ElectLeaders": OnCluster(_A.ALTER),
    "AlterPartitionReassignments": OnCluster(_A.ALTER),
    "ListPartitionReassignments": OnCluster(_A.DESCRIBE),
    "CreateAcls": OnCluster(_A.ALTER),
    "DescribeAcls": OnCluster(_A.DESCRIBE),
    "DeleteAcls": OnCluster(_A.ALTER),
    "AlterUserScramCredentials": OnCluster(_A.ALTER),
    "DescribeUserScramCredentials": OnCluster(_A.DESCRIBE),
    "UnregisterBroker": OnCluster(_A.ALTER),
    "AlterClientQuotas": OnCluster(_A.ALTER_CONFIGS),
    "DescribeClientQuotas": OnCluster(_A.DESCRIBE_CONFIGS),
}
"""The admin calls, served alike by the Broker service and the Controller service."""

_BROKER: Final[dict[str, Access]] = {
    "Produce": PerItem(_TOPIC, _A.WRITE, "idempotent batches too (KIP-679)"),
    "ProduceStream": PerItem(_TOPIC, _A.WRITE, "idempotent batches too (KIP-679)"),
    "Fetch": PerItem(_TOPIC, _A.READ),
    "FetchStream": PerItem(_TOPIC, _A.READ),
    "ListOffsets": PerItem(_TOPIC, _A.DESCRIBE),
    "Metadata": PerItem(_TOPIC, _A.DESCRIBE, "shows only the topics the caller may describe"),
    "DescribeTopicPartitions": PerItem(
        _TOPIC, _A.DESCRIBE, "shows only the topics the caller may describe"
    ),
    "OffsetsForLeaderEpoch": PerItem(_TOPIC, _A.DESCRIBE),
    "DeleteRecords": PerItem(_TOPIC, _A.DELETE),
    "InitProducerId": PerItem(_CLUSTER, _A.IDEMPOTENT_WRITE),
    "FindCoordinator": PerItem(_GROUP, _A.DESCRIBE),
    "DescribeLogDirs": OnCluster(_A.DESCRIBE),
    "ConsumerSession": PerItem(_GROUP, _A.READ, "and READ on each topic"),
    **_ADMIN,
}

_CONTROLLER: Final[dict[str, Access]] = {
    **_ADMIN,
    "RegisterBroker": OnCluster(_A.CLUSTER_ACTION, as_node=True),
    "BrokerHeartbeat": OnCluster(_A.CLUSTER_ACTION, as_node=True),
    "BrokerLiveness": OnCluster(_A.CLUSTER_ACTION, as_node=True),
    "AlterPartition": OnCluster(_A.CLUSTER_ACTION, as_node=True),
    "AllocateProducerIds": OnCluster(_A.CLUSTER_ACTION, as_node=True),
    "RegisterCoordinator": OnCluster(_A.CLUSTER_ACTION),
    "CoordinatorHeartbeat": OnCluster(_A.CLUSTER_ACTION),
    "UnregisterCoordinator": OnCluster(_A.CLUSTER_ACTION),
}
"""The Controller service: the admin calls (a broker forwards them with the caller's
principal), and the brokers' and coordinators' own business. Its UnregisterBroker is an
operator's (ALTER on the cluster), as Kafka's KIP-856 has it."""

_COORDINATOR: Final[dict[str, Access]] = {
    "JoinGroup": PerItem(_GROUP, _A.READ),
    "SyncGroup": PerItem(_GROUP, _A.READ),
    "Heartbeat": PerItem(_GROUP, _A.READ),
    "LeaveGroup": PerItem(_GROUP, _A.READ),
    "OffsetCommit": PerItem(_GROUP, _A.READ, "and READ on each topic"),
    "OffsetFetch": PerItem(_GROUP, _A.DESCRIBE, "and DESCRIBE on each topic"),
    "ListGroups": PerItem(_GROUP, _A.DESCRIBE, "shows only the groups the caller may describe"),
    "DescribeGroups": PerItem(_GROUP, _A.DESCRIBE),
    "DeleteGroups": PerItem(_GROUP, _A.DELETE),
    "OffsetDelete": PerItem(_GROUP, _A.DELETE, "and READ on each topic"),
}

_REPLICA_FETCH: Final[dict[str, Access]] = {
    "ReplicaFetch": OnCluster(_A.CLUSTER_ACTION, as_node=True),
    "GetReplicaLogInfo": OnCluster(_A.CLUSTER_ACTION),
}
"""Followers' fetches (``ReplicaFetchService``, on every broker's listeners), and the
active controller's questions of unclean recovery."""

_BROKER_METADATA: Final[dict[str, Access]] = {
    "UpdateMetadata": OnCluster(_A.CLUSTER_ACTION),
}
"""The etcd mode's push of metadata to brokers and coordinators (``BrokerMetadata``), by
the active controller, and by a KRaft controller migrating from etcd: Kafka's
UpdateMetadata and LeaderAndIsr, which need CLUSTER_ACTION."""

_RAFT: Final[dict[str, Access]] = {
    "Vote": OnCluster(_A.CLUSTER_ACTION),
    "BeginQuorumEpoch": OnCluster(_A.CLUSTER_ACTION),
    "EndQuorumEpoch": OnCluster(_A.CLUSTER_ACTION),
    "Fetch": OnCluster(_A.CLUSTER_ACTION),
    "FetchStream": OnCluster(_A.CLUSTER_ACTION),
    "FetchSnapshot": OnCluster(_A.CLUSTER_ACTION),
    # An operator's (Kafka's DESCRIBE), and the services' own: a broker or coordinator
    # process asks it at its start to find the voters, with CLUSTER_ACTION alone.
    "DescribeQuorum": OnCluster(_A.DESCRIBE, or_operation=_A.CLUSTER_ACTION),
    # KIP-853: an operator adds and removes voters; a voter updates its own endpoint.
    "AddRaftVoter": OnCluster(_A.ALTER),
    "RemoveRaftVoter": OnCluster(_A.ALTER),
    "UpdateRaftVoter": OnCluster(_A.CLUSTER_ACTION),
}


FORWARDABLE: Final[frozenset[str]] = frozenset(
    [f"/highwater.internal.v1.Controller/{name}" for name in _ADMIN]
    + [f"/highwater.v1.GroupCoordinator/{name}" for name in _COORDINATOR]
)
"""The methods a broker calls in its caller's name (KIP-590's forwardable APIs): the admin
calls it forwards to the controller and the group calls its Kafka listener sends on to
the coordinator. Only these may carry a forwarded principal: on any other (a broker's
registration, heartbeat or ISR change, a fetch) it would let a principal allowed to
forward speak as another, for another's node."""


def _methods(service: str, table: dict[str, Access]) -> dict[str, Access]:
    return {f"/{service}/{name}": access for name, access in table.items()}


RPC_ACCESS: Final[dict[str, Access]] = {
    **_methods("highwater.v1.Broker", _BROKER),
    **_methods("highwater.internal.v1.Controller", _CONTROLLER),
    **_methods("highwater.v1.GroupCoordinator", _COORDINATOR),
    **_methods("highwater.internal.v1.Raft", _RAFT),
    **_methods("highwater.internal.v1.ReplicaFetchService", _REPLICA_FETCH),
    **_methods("highwater.internal.v1.BrokerMetadata", _BROKER_METADATA),
    "/highwater.v1.Authentication/Authenticate": PUBLIC,
}

_PUBLIC_SERVICES: Final = (
    "/grpc.health.v1.Health/",
    "/grpc.reflection.v1alpha.ServerReflection/",
    "/grpc.reflection.v1.ServerReflection/",
)


def access_of(method: str) -> Access | None:
    """What ``method`` (``/package.Service/Method``) needs; ``None``: not in the table."""
    access = RPC_ACCESS.get(method)
    if access is None and method.startswith(_PUBLIC_SERVICES):
        return PUBLIC
    return access
