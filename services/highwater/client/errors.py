"""The client's errors: one class per Kafka error code, the one table from code to class.

Two families, as the client's two halves fail: :class:`ClusterError` for what the
cluster's metadata and brokers answer to producers and consumers (no broker reachable, no
leader, an unknown topic), :class:`AdminError` for what an admin operation, or one topic
or partition of it, answers. A code both can meet is one class in both families
(:class:`UnknownTopicOrPartitionError`, :class:`CoordinatorNotAvailableError`), so
``except ClusterError`` and ``except AdminError`` each catch it. :func:`error_for_code`
gives the typed error for a code, a plain :class:`AdminError` carrying it when no class
names it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from highwater import errors as hw_errors
from highwater.errors import HighwaterError
from highwater.v1.common_pb2 import ErrorCode

__all__ = [
    "AdminError",
    "AuthenticationError",
    "AuthorizationError",
    "BrokerNotAvailableError",
    "BrokerUnavailableError",
    "ClusterAuthorizationFailedError",
    "ClusterError",
    "ControllerNotAvailableError",
    "CoordinatorLoadInProgressError",
    "CoordinatorNotAvailableError",
    "ElectionNotNeededError",
    "EligibleLeadersNotAvailableError",
    "GroupAuthorizationFailedError",
    "GroupIdNotFoundError",
    "GroupNotEmptyError",
    "InvalidConfigurationError",
    "InvalidGroupIdError",
    "InvalidPartitionsError",
    "InvalidReplicaAssignmentError",
    "InvalidReplicationFactorError",
    "InvalidRequestError",
    "InvalidTopicNameError",
    "LeaderNotAvailableError",
    "NoReassignmentInProgressError",
    "NotCoordinatorError",
    "PreferredLeaderNotAvailableError",
    "SaslAuthenticationError",
    "TopicAuthorizationFailedError",
    "TopicExistsError",
    "UnknownMemberIdError",
    "UnknownTopicOrPartitionError",
    "error_for_code",
]


# --- the cluster's metadata and brokers --------------------------------------------------


class ClusterError(HighwaterError):
    """Base of the errors the client raises about the cluster's metadata and brokers."""


class BrokerNotAvailableError(ClusterError):
    """No broker (bootstrap or known) answered a request."""

    code = ErrorCode.BROKER_NOT_AVAILABLE


class LeaderNotAvailableError(ClusterError):
    """The partition exists but has no leader the client can reach right now."""

    code = ErrorCode.LEADER_NOT_AVAILABLE


# --- admin operations ----------------------------------------------------------------------


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


class InvalidRequestError(AdminError, hw_errors.InvalidRequestError):
    """INVALID_REQUEST: a request the controller refuses as malformed (the admin client's
    side of :class:`highwater.errors.InvalidRequestError`)."""

    code = ErrorCode.INVALID_REQUEST


class ElectionNotNeededError(AdminError):
    """ELECTION_NOT_NEEDED: the partition already has the leader the election would pick."""

    code = ErrorCode.ELECTION_NOT_NEEDED


class NoReassignmentInProgressError(AdminError):
    """NO_REASSIGNMENT_IN_PROGRESS: a cancellation for a partition that is not being moved."""

    code = ErrorCode.NO_REASSIGNMENT_IN_PROGRESS


class PreferredLeaderNotAvailableError(AdminError):
    """PREFERRED_LEADER_NOT_AVAILABLE: the preferred replica cannot lead now."""

    code = ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE


class EligibleLeadersNotAvailableError(AdminError):
    """ELIGIBLE_LEADERS_NOT_AVAILABLE: no live replica may be elected."""

    code = ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE


class ControllerNotAvailableError(AdminError):
    """No active controller answered within the request timeout (an election, or none up)."""

    code = ErrorCode.NOT_CONTROLLER


class BrokerUnavailableError(AdminError):
    """No bootstrap broker answered the Metadata RPC before the deadline."""

    code = ErrorCode.NETWORK_EXCEPTION


class GroupIdNotFoundError(AdminError):
    """GROUP_ID_NOT_FOUND: the coordinator has no such group."""

    code = ErrorCode.GROUP_ID_NOT_FOUND


class GroupNotEmptyError(AdminError):
    """NON_EMPTY_GROUP: the group has active members, so it cannot be deleted (nor can its
    offsets be altered: then ``code`` is the coordinator's UNKNOWN_MEMBER_ID)."""

    code = ErrorCode.NON_EMPTY_GROUP


class InvalidGroupIdError(AdminError):
    """INVALID_GROUP_ID: an empty group id."""

    code = ErrorCode.INVALID_GROUP_ID


class UnknownMemberIdError(AdminError):
    """UNKNOWN_MEMBER_ID: the coordinator does not know the member."""

    code = ErrorCode.UNKNOWN_MEMBER_ID


class NotCoordinatorError(AdminError):
    """NOT_COORDINATOR: the coordinator asked does not serve the group (retried)."""

    code = ErrorCode.NOT_COORDINATOR


class CoordinatorLoadInProgressError(AdminError):
    """COORDINATOR_LOAD_IN_PROGRESS: the coordinator is still loading the group (retried)."""

    code = ErrorCode.COORDINATOR_LOAD_IN_PROGRESS


# --- both: the cluster's metadata and the admin operations --------------------------------


class UnknownTopicOrPartitionError(ClusterError, AdminError):
    """UNKNOWN_TOPIC_OR_PARTITION: the cluster has no such topic, or the topic no such
    partition (from Metadata, a produce, a fetch, or an admin operation alike)."""

    code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


class CoordinatorNotAvailableError(ClusterError, AdminError):
    """COORDINATOR_NOT_AVAILABLE: no group coordinator serves the group right now (it is
    being assigned or loaded); retried."""

    code = ErrorCode.COORDINATOR_NOT_AVAILABLE


# --- security: authentication and the ACLs ----------------------------------------------

AuthenticationError = hw_errors.AuthenticationError
SaslAuthenticationError = hw_errors.SaslAuthenticationError
AuthorizationError = hw_errors.AuthorizationError


class TopicAuthorizationFailedError(
    ClusterError, AdminError, hw_errors.TopicAuthorizationFailedError
):
    """TOPIC_AUTHORIZATION_FAILED: the ACLs do not let this client act on the topic."""

    code = ErrorCode.TOPIC_AUTHORIZATION_FAILED


class GroupAuthorizationFailedError(
    ClusterError, AdminError, hw_errors.GroupAuthorizationFailedError
):
    """GROUP_AUTHORIZATION_FAILED: the ACLs do not let this client use the group."""

    code = ErrorCode.GROUP_AUTHORIZATION_FAILED


class ClusterAuthorizationFailedError(
    ClusterError, AdminError, hw_errors.ClusterAuthorizationFailedError
):
    """CLUSTER_AUTHORIZATION_FAILED: the ACLs do not let this client do that on the cluster."""

    code = ErrorCode.CLUSTER_AUTHORIZATION_FAILED


# --- the table ---------------------------------------------------------------------------

_ERRORS_BY_CODE: Final[Mapping[int, type[AdminError]]] = {
    cls.code: cls
    for cls in (
        NoReassignmentInProgressError,
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
        GroupIdNotFoundError,
        GroupNotEmptyError,
        InvalidGroupIdError,
        UnknownMemberIdError,
        NotCoordinatorError,
        CoordinatorNotAvailableError,
        CoordinatorLoadInProgressError,
        TopicAuthorizationFailedError,
        GroupAuthorizationFailedError,
        ClusterAuthorizationFailedError,
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
