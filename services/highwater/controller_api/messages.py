"""The quorum controller's requests and responses as plain values: what its pure core handles.

They mirror ``protos/highwater/internal/v1/controller.proto`` field for field; the gRPC edge
converts, and fills in the active controller's id and address on NOT_CONTROLLER, which
the core does not know. Error codes are ``ErrorCode`` values from ``common.proto``
(ints, as in :mod:`highwater.raft.messages`); per-item errors sit in the per-item results.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final

from highwater.metadata.records import BrokerEndpoint, ConfigResourceType
from highwater.security import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
)
from highwater.v1.common_pb2 import ErrorCode

NONE: Final = ErrorCode.NONE

INVALID_UPDATE_VERSION: Final = ErrorCode.INVALID_UPDATE_VERSION
"""Kafka's INVALID_UPDATE_VERSION: an AlterPartition based on an old partition epoch."""


class ElectionType(enum.IntEnum):
    """Kafka's ``ElectionType``."""

    PREFERRED = 0
    UNCLEAN = 1


class AlterConfigOp(enum.IntEnum):
    """Kafka's ``AlterConfigOp.OpType``."""

    SET = 0
    DELETE = 1
    APPEND = 2
    SUBTRACT = 3


class ConfigSource(enum.IntEnum):
    """Kafka's ``DescribeConfigsResponse.ConfigSource``."""

    UNKNOWN = 0
    DYNAMIC_TOPIC_CONFIG = 1
    DYNAMIC_BROKER_CONFIG = 2
    DYNAMIC_DEFAULT_BROKER_CONFIG = 3
    STATIC_BROKER_CONFIG = 4
    DEFAULT_CONFIG = 5


def _no_configs() -> Mapping[str, str | None]:
    return MappingProxyType({})


# --- Broker lifecycle ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RegisterBrokerRequest:
    broker_id: int
    incarnation_id: str
    listeners: tuple[BrokerEndpoint, ...] = ()
    rack: str | None = None
    cluster_id: str = ""
    previous_broker_epoch: int = -1
    """The epoch of the broker's last clean shutdown, -1 if it did not shut down cleanly."""
    log_dirs: tuple[str, ...] = ()
    """The ids of the broker's online log directories (KIP-858)."""


@dataclass(frozen=True, slots=True)
class RegisterBrokerResponse:
    error: int = NONE
    error_message: str = ""
    broker_epoch: int = -1


@dataclass(frozen=True, slots=True)
class BrokerHeartbeatRequest:
    broker_id: int
    broker_epoch: int
    current_metadata_offset: int
    """The offset of the last metadata record the broker has applied (-1: none)."""
    want_fence: bool = False
    want_shutdown: bool = False
    offline_log_dirs: tuple[str, ...] = ()
    """The ids of the broker's failed log directories (KIP-858)."""
    offline_replicas: tuple[OfflineReplica, ...] = ()
    """The replicas the broker cannot serve (on a failed directory, or possibly so): their
    leadership moves away and the broker leaves their ISRs."""


@dataclass(frozen=True, slots=True)
class OfflineReplica:
    topic_id: str
    partition_id: int


@dataclass(frozen=True, slots=True)
class BrokerHeartbeatResponse:
    error: int = NONE
    error_message: str = ""
    is_caught_up: bool = False
    is_fenced: bool = True
    should_shut_down: bool = False


@dataclass(frozen=True, slots=True)
class UnregisterBrokerRequest:
    broker_id: int


@dataclass(frozen=True, slots=True)
class UnregisterBrokerResponse:
    error: int = NONE
    error_message: str = ""


# --- Partition leadership --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AlterPartitionItem:
    topic_id: str
    partition_id: int
    leader_epoch: int
    partition_epoch: int
    new_isr: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class AlterPartitionRequest:
    broker_id: int
    broker_epoch: int
    partitions: tuple[AlterPartitionItem, ...]


@dataclass(frozen=True, slots=True)
class AlterPartitionResult:
    """One partition's outcome; on success, its state after the change."""

    topic_id: str
    partition_id: int
    error: int = NONE
    error_message: str = ""
    leader: int = -1
    leader_epoch: int = -1
    isr: tuple[int, ...] = ()
    partition_epoch: int = -1


@dataclass(frozen=True, slots=True)
class AlterPartitionResponse:
    error: int = NONE
    error_message: str = ""
    partitions: tuple[AlterPartitionResult, ...] = ()


@dataclass(frozen=True, slots=True)
class TopicPartitions:
    topic: str
    partitions: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ElectLeadersRequest:
    election_type: ElectionType
    topic_partitions: tuple[TopicPartitions, ...] = ()
    all_partitions: bool = False


@dataclass(frozen=True, slots=True)
class PartitionResult:
    topic: str
    partition_id: int
    error: int = NONE
    error_message: str = ""


@dataclass(frozen=True, slots=True)
class ElectLeadersResponse:
    error: int = NONE
    error_message: str = ""
    partitions: tuple[PartitionResult, ...] = ()


# --- Partition reassignment -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PartitionReassignment:
    """Move a partition to ``replicas`` (preferred leader first), or ``cancel`` the move in
    progress."""

    topic: str
    partition_id: int
    replicas: tuple[int, ...] = ()
    cancel: bool = False


@dataclass(frozen=True, slots=True)
class AlterPartitionReassignmentsRequest:
    partitions: tuple[PartitionReassignment, ...]


@dataclass(frozen=True, slots=True)
class AlterPartitionReassignmentsResponse:
    error: int = NONE
    error_message: str = ""
    partitions: tuple[PartitionResult, ...] = ()


@dataclass(frozen=True, slots=True)
class ListPartitionReassignmentsRequest:
    topic_partitions: tuple[TopicPartitions, ...] = ()
    """Empty: every partition."""


@dataclass(frozen=True, slots=True)
class OngoingReassignment:
    topic: str
    partition_id: int
    replicas: tuple[int, ...]
    adding_replicas: tuple[int, ...]
    removing_replicas: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ListPartitionReassignmentsResponse:
    error: int = NONE
    error_message: str = ""
    reassignments: tuple[OngoingReassignment, ...] = ()


# --- Topics ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CreatableTopic:
    """A topic to create: a partition count and replication factor (-1: the defaults), or
    an explicit assignment (the replicas of partitions 0..n-1, preferred leader first)."""

    name: str
    num_partitions: int = -1
    replication_factor: int = -1
    assignments: tuple[tuple[int, ...], ...] = ()
    configs: Mapping[str, str | None] = field(default_factory=_no_configs)


@dataclass(frozen=True, slots=True)
class CreateTopicsRequest:
    topics: tuple[CreatableTopic, ...]
    validate_only: bool = False


@dataclass(frozen=True, slots=True)
class CreatableTopicResult:
    name: str
    topic_id: str = ""
    error: int = NONE
    error_message: str = ""
    num_partitions: int = -1
    replication_factor: int = -1


@dataclass(frozen=True, slots=True)
class CreateTopicsResponse:
    error: int = NONE
    error_message: str = ""
    topics: tuple[CreatableTopicResult, ...] = ()


@dataclass(frozen=True, slots=True)
class DeleteTopicsRequest:
    names: tuple[str, ...] = ()
    topic_ids: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class DeletableTopicResult:
    name: str
    topic_id: str
    error: int = NONE
    error_message: str = ""


@dataclass(frozen=True, slots=True)
class DeleteTopicsResponse:
    error: int = NONE
    error_message: str = ""
    topics: tuple[DeletableTopicResult, ...] = ()


@dataclass(frozen=True, slots=True)
class CreatePartitionsTopic:
    """Grow a topic to ``count`` partitions; ``assignments`` are the new partitions' replicas."""

    name: str
    count: int
    assignments: tuple[tuple[int, ...], ...] = ()


@dataclass(frozen=True, slots=True)
class CreatePartitionsRequest:
    topics: tuple[CreatePartitionsTopic, ...]
    validate_only: bool = False


@dataclass(frozen=True, slots=True)
class CreatePartitionsTopicResult:
    name: str
    error: int = NONE
    error_message: str = ""


@dataclass(frozen=True, slots=True)
class CreatePartitionsResponse:
    error: int = NONE
    error_message: str = ""
    topics: tuple[CreatePartitionsTopicResult, ...] = ()


# --- Configs ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AlterableConfig:
    name: str
    op: AlterConfigOp = AlterConfigOp.SET
    value: str | None = None


@dataclass(frozen=True, slots=True)
class AlterConfigsResource:
    resource_type: ConfigResourceType
    resource_name: str
    configs: tuple[AlterableConfig, ...]


@dataclass(frozen=True, slots=True)
class AlterConfigsRequest:
    resources: tuple[AlterConfigsResource, ...]
    validate_only: bool = False


@dataclass(frozen=True, slots=True)
class AlterConfigsResourceResult:
    resource_type: ConfigResourceType
    resource_name: str
    error: int = NONE
    error_message: str = ""


@dataclass(frozen=True, slots=True)
class AlterConfigsResponse:
    error: int = NONE
    error_message: str = ""
    resources: tuple[AlterConfigsResourceResult, ...] = ()


@dataclass(frozen=True, slots=True)
class DescribeConfigsResource:
    resource_type: ConfigResourceType
    resource_name: str
    config_names: tuple[str, ...] = ()
    """The keys to describe; empty: every key."""


@dataclass(frozen=True, slots=True)
class DescribeConfigsRequest:
    resources: tuple[DescribeConfigsResource, ...]


@dataclass(frozen=True, slots=True)
class DescribedConfig:
    name: str
    value: str | None
    source: ConfigSource
    read_only: bool = False
    sensitive: bool = False
    type: str = ""
    documentation: str = ""


@dataclass(frozen=True, slots=True)
class DescribeConfigsResult:
    resource_type: ConfigResourceType
    resource_name: str
    error: int = NONE
    error_message: str = ""
    configs: tuple[DescribedConfig, ...] = ()


@dataclass(frozen=True, slots=True)
class DescribeConfigsResponse:
    error: int = NONE
    error_message: str = ""
    results: tuple[DescribeConfigsResult, ...] = ()


# --- ACLs ------------------------------------------------------------------------------
#
# Kafka's codes, as ints (highwater.security.acl names them): the controller validates
# them, and a filter's unset field (None) matches anything.

ACL_FILTER_ANY: Final = 1
"""Kafka's ANY in a filter field: matches every value, as an unset field does."""
ACL_PATTERN_MATCH: Final = 2
"""Kafka's PatternType.MATCH: every pattern that covers the filter's resource name."""


@dataclass(frozen=True, slots=True)
class AclEntry:
    resource_type: int
    resource_name: str
    pattern_type: int
    principal: str
    host: str
    operation: int
    permission_type: int

    @classmethod
    def of(cls, acl: AclBinding) -> AclEntry:
        """The entry of an ACL."""
        return cls(
            int(acl.resource_type),
            acl.resource_name,
            int(acl.pattern_type),
            acl.principal,
            acl.host,
            int(acl.operation),
            int(acl.permission),
        )

    def binding(self) -> AclBinding:
        """The ACL this entry names; ``ValueError`` saying what is wrong with it."""
        try:
            resource_type = ResourceType(self.resource_type)
            pattern_type = PatternType(self.pattern_type)
            operation = AclOperation(self.operation)
            permission = AclPermissionType(self.permission_type)
        except ValueError as e:
            raise ValueError(f"not an ACL: {e}") from None
        return AclBinding(
            resource_type,
            self.resource_name,
            pattern_type,
            self.principal,
            self.host,
            operation,
            permission,
        )


@dataclass(frozen=True, slots=True)
class CreateAclsRequest:
    creations: tuple[AclEntry, ...] = ()


@dataclass(frozen=True, slots=True)
class AclResult:
    error: int = NONE
    error_message: str = ""


@dataclass(frozen=True, slots=True)
class CreateAclsResponse:
    error: int = NONE
    error_message: str = ""
    results: tuple[AclResult, ...] = ()


@dataclass(frozen=True, slots=True)
class AclFilter:
    resource_type: int | None = None
    resource_name: str | None = None
    pattern_type: int | None = None
    principal: str | None = None
    host: str | None = None
    operation: int | None = None
    permission_type: int | None = None


@dataclass(frozen=True, slots=True)
class DescribeAclsRequest:
    filter: AclFilter = AclFilter()


@dataclass(frozen=True, slots=True)
class DescribeAclsResponse:
    error: int = NONE
    error_message: str = ""
    acls: tuple[AclEntry, ...] = ()


@dataclass(frozen=True, slots=True)
class DeleteAclsRequest:
    filters: tuple[AclFilter, ...] = ()


@dataclass(frozen=True, slots=True)
class DeleteAclsFilterResult:
    error: int = NONE
    error_message: str = ""
    deleted: tuple[AclEntry, ...] = ()


@dataclass(frozen=True, slots=True)
class DeleteAclsResponse:
    error: int = NONE
    error_message: str = ""
    results: tuple[DeleteAclsFilterResult, ...] = ()


# --- SCRAM credentials -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ScramCredentialDeletion:
    name: str
    mechanism: int


@dataclass(frozen=True, slots=True)
class ScramCredentialUpsertion:
    name: str
    mechanism: int
    iterations: int
    salt: bytes
    salted_password: bytes = field(repr=False)
    """Left out of the repr: it logs in as well as the password does."""


@dataclass(frozen=True, slots=True)
class AlterUserScramCredentialsRequest:
    deletions: tuple[ScramCredentialDeletion, ...] = ()
    upsertions: tuple[ScramCredentialUpsertion, ...] = ()


@dataclass(frozen=True, slots=True)
class AlterUserScramCredentialsResult:
    user: str
    error: int = NONE
    error_message: str = ""


@dataclass(frozen=True, slots=True)
class AlterUserScramCredentialsResponse:
    error: int = NONE
    error_message: str = ""
    results: tuple[AlterUserScramCredentialsResult, ...] = ()


@dataclass(frozen=True, slots=True)
class DescribeUserScramCredentialsRequest:
    users: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ScramCredentialInfo:
    mechanism: int
    iterations: int


@dataclass(frozen=True, slots=True)
class DescribedUserScramCredentials:
    user: str
    error: int = NONE
    error_message: str = ""
    credentials: tuple[ScramCredentialInfo, ...] = ()


@dataclass(frozen=True, slots=True)
class DescribeUserScramCredentialsResponse:
    error: int = NONE
    error_message: str = ""
    results: tuple[DescribedUserScramCredentials, ...] = ()


# --- Client quotas ---------------------------------------------------------------------
#
# An entity is its components: entity type ("user", "client-id") and name, None for the
# type's default (highwater.metadata.client_quotas.ClientQuotaEntity.of reads them).

CLIENT_QUOTA_MATCH_EXACT: Final = 0
CLIENT_QUOTA_MATCH_DEFAULT: Final = 1
CLIENT_QUOTA_MATCH_SPECIFIED: Final = 2


@dataclass(frozen=True, slots=True)
class ClientQuotaEntityComponent:
    entity_type: str
    entity_name: str | None = None


@dataclass(frozen=True, slots=True)
class ClientQuotaOp:
    key: str
    value: float = 0.0
    remove: bool = False


@dataclass(frozen=True, slots=True)
class ClientQuotaAlteration:
    entity: tuple[ClientQuotaEntityComponent, ...] = ()
    ops: tuple[ClientQuotaOp, ...] = ()


@dataclass(frozen=True, slots=True)
class AlterClientQuotasRequest:
    entries: tuple[ClientQuotaAlteration, ...] = ()
    validate_only: bool = False


@dataclass(frozen=True, slots=True)
class AlterClientQuotasResult:
    error: int = NONE
    error_message: str = ""
    entity: tuple[ClientQuotaEntityComponent, ...] = ()


@dataclass(frozen=True, slots=True)
class AlterClientQuotasResponse:
    error: int = NONE
    error_message: str = ""
    results: tuple[AlterClientQuotasResult, ...] = ()


@dataclass(frozen=True, slots=True)
class ClientQuotaFilterComponent:
    entity_type: str
    match_type: int = CLIENT_QUOTA_MATCH_EXACT
    match: str = ""


@dataclass(frozen=True, slots=True)
class DescribeClientQuotasRequest:
    components: tuple[ClientQuotaFilterComponent, ...] = ()
    strict: bool = False


@dataclass(frozen=True, slots=True)
class DescribedClientQuota:
    entity: tuple[ClientQuotaEntityComponent, ...] = ()
    values: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True, slots=True)
class DescribeClientQuotasResponse:
    error: int = NONE
    error_message: str = ""
    entries: tuple[DescribedClientQuota, ...] = ()


# --- Producer ids and coordinators -----------------------------------------------------


@dataclass(frozen=True, slots=True)
class AllocateProducerIdsRequest:
    broker_id: int
    broker_epoch: int


@dataclass(frozen=True, slots=True)
class AllocateProducerIdsResponse:
    error: int = NONE
    error_message: str = ""
    producer_id_start: int = -1
    producer_id_len: int = 0


@dataclass(frozen=True, slots=True)
class RegisterCoordinatorRequest:
    coordinator_id: int
    incarnation_id: str
    listeners: tuple[BrokerEndpoint, ...] = ()
    rack: str | None = None
    cluster_id: str = ""


@dataclass(frozen=True, slots=True)
class RegisterCoordinatorResponse:
    error: int = NONE
    error_message: str = ""
    registration_epoch: int = -1


@dataclass(frozen=True, slots=True)
class CoordinatorHeartbeatRequest:
    coordinator_id: int
    registration_epoch: int
    want_shutdown: bool = False
    metadata_offset: int = -1
    """The last metadata offset the coordinator has applied and acted on (-1: none)."""


@dataclass(frozen=True, slots=True)
class CoordinatorHeartbeatResponse:
    """BROKER_ID_NOT_REGISTERED or STALE_BROKER_EPOCH: the registration is gone, register
    again (``is_fenced``); ``should_shut_down``: a coordinator that asked may stop."""

    error: int = NONE
    error_message: str = ""
    is_fenced: bool = True
    should_shut_down: bool = False


@dataclass(frozen=True, slots=True)
class UnregisterCoordinatorRequest:
    coordinator_id: int
    registration_epoch: int | None = None
    """Only this registration (None: whichever is registered)."""


@dataclass(frozen=True, slots=True)
class UnregisterCoordinatorResponse:
    error: int = NONE
    error_message: str = ""


# --- Unclean recovery (KIP-966's GetReplicaLogInfo) -------------------------------------


@dataclass(frozen=True, slots=True)
class ReplicaLogInfoRequest:
    """The controller asks ``broker_id`` (of ``broker_epoch``) for its logs of partitions
    that wait for unclean recovery: ``(topic_id, partition_id)`` pairs."""

    broker_id: int
    broker_epoch: int
    partitions: tuple[tuple[str, int], ...]


@dataclass(frozen=True, slots=True)
class ReplicaLogInfo:
    """One replica's log: its last batch's leader epoch and its log end offset; or
    ``error`` (UNKNOWN_TOPIC_OR_PARTITION: no such replica here, or it is offline)."""

    topic_id: str
    partition_id: int
    last_leader_epoch: int = -1
    log_end_offset: int = 0
    error: int = NONE


@dataclass(frozen=True, slots=True)
class ReplicaLogInfoResponse:
    """The broker's answer; ``broker_epoch`` is its current registration's (an answer of
    another incarnation than the one asked is ignored)."""

    broker_id: int
    broker_epoch: int
    partitions: tuple[ReplicaLogInfo, ...] = ()


# --- Periodic work ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TickResult:
    """What :meth:`QuorumController.tick` decided, for logs and tests."""

    fenced_brokers: tuple[int, ...] = ()
    preferred_elections: int = 0
    unclean_elections: int = 0
    leader_moves: int = 0
    """Partition changes finishing moves off brokers taken out of service earlier."""
    expired_coordinators: tuple[int, ...] = ()
    """Coordinators whose session expired: unregistered, their partitions moved."""
    created_offsets_topic: bool = False
    unclean_recoveries: int = 0
    """Leaders elected by unclean recovery (the longest log among the candidates)."""
