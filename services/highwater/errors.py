"""Typed errors with Kafka's names, each carrying the wire error code a reply would use."""

from __future__ import annotations

from highwater.v1.common_pb2 import ErrorCode


class HighwaterError(Exception):
    """Base of every error Highwater raises on purpose; ``code`` is what a reply carries."""

    code: int = ErrorCode.UNKNOWN_SERVER_ERROR

    @property
    def code_name(self) -> str:
        return ErrorCode.Name(self.code)  # type: ignore[arg-type]


# --- Requests --------------------------------------------------------------------------


class InvalidRequestError(HighwaterError):
    """A request no server can read: an unknown enum value, misnumbered replica
    assignments. Servicers answer it with gRPC ``INVALID_ARGUMENT``."""

    code = ErrorCode.INVALID_REQUEST


class UnknownPartitionError(HighwaterError, ValueError):
    """A record names a partition the topic does not have (negative or >= the partition count)."""

    code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


# --- Records and batches -------------------------------------------------------------


class CorruptRecordError(HighwaterError):
    """Bytes that do not form a valid record batch: bad CRC, bad sizes, truncated."""

    code = ErrorCode.CORRUPT_MESSAGE


class InvalidRecordError(HighwaterError):
    """A well-formed batch whose contents break a rule (a missing key on a compacted topic...)."""

    code = ErrorCode.INVALID_RECORD


class UnsupportedForMessageFormatError(HighwaterError):
    """A batch with a magic byte other than 2."""

    code = ErrorCode.UNSUPPORTED_FOR_MESSAGE_FORMAT


class RecordTooLargeError(HighwaterError):
    """A batch larger than ``max.message.bytes`` or than a segment can hold."""

    code = ErrorCode.MESSAGE_TOO_LARGE


class RecordListTooLargeError(HighwaterError):
    """An append (every batch of one produce to a partition) larger than ``segment.bytes``:
    no segment could hold it (Kafka's ``UnifiedLog.append``, ``RecordBatchTooLargeException``,
    ``RECORD_LIST_TOO_LARGE``). One batch over ``max.message.bytes`` is
    :class:`RecordTooLargeError` instead."""

    code = ErrorCode.RECORD_LIST_TOO_LARGE


class InvalidTimestampError(HighwaterError):
    """A record timestamp outside the window the topic accepts."""

    code = ErrorCode.INVALID_TIMESTAMP


# --- Offsets ---------------------------------------------------------------------------


class OffsetOutOfRangeError(HighwaterError):
    """A read or truncation at an offset outside [log start offset, log end offset]."""

    code = ErrorCode.OFFSET_OUT_OF_RANGE


class UnexpectedAppendOffsetError(HighwaterError):
    """A replicated append whose offsets do not continue the log (offsets that go backwards)."""

    code = ErrorCode.INVALID_RECORD


# --- Producer state --------------------------------------------------------------------


class OutOfOrderSequenceError(HighwaterError):
    code = ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER


class DuplicateSequenceError(HighwaterError):
    code = ErrorCode.DUPLICATE_SEQUENCE_NUMBER


class InvalidProducerEpochError(HighwaterError):
    code = ErrorCode.INVALID_PRODUCER_EPOCH


class UnknownProducerIdError(HighwaterError):
    code = ErrorCode.UNKNOWN_PRODUCER_ID


# --- Topics ----------------------------------------------------------------------------


class InvalidTopicError(HighwaterError):
    """A topic name Kafka would refuse: empty, ``.``/``..``, too long or with other characters."""

    code = ErrorCode.INVALID_TOPIC_EXCEPTION


# --- Configuration ---------------------------------------------------------------------


class InvalidConfigError(HighwaterError):
    """A configuration value that is unknown, of the wrong type or out of range."""

    code = ErrorCode.INVALID_CONFIG


# --- Storage ---------------------------------------------------------------------------


class KafkaStorageError(HighwaterError):
    """The data directory cannot be used as it is: the partition goes offline, nothing is lost."""

    code = ErrorCode.KAFKA_STORAGE_ERROR


class CorruptSegmentError(KafkaStorageError):
    """A segment that is corrupt below the recovery point or in the middle of the log."""

    def __init__(self, path: str, position: int, reason: str) -> None:
        super().__init__(f"{path}: corrupt at byte {position}: {reason}")
        self.path = path
        self.position = position
        self.reason = reason


class CorruptCheckpointError(KafkaStorageError):
    """A checkpoint file that does not parse."""


class StrayFileError(KafkaStorageError):
    """A file or directory in a data directory that Highwater did not write and cannot read."""


# --- Security ---------------------------------------------------------------------------


class AuthenticationError(HighwaterError):
    """The family of failures to authenticate: the caller could not prove who it is."""

    code = ErrorCode.SASL_AUTHENTICATION_FAILED


class AuthorizationError(HighwaterError):
    """The family of refusals by the ACLs: the caller may not do that."""

    code = ErrorCode.CLUSTER_AUTHORIZATION_FAILED


class TopicAuthorizationFailedError(AuthorizationError):
    """TOPIC_AUTHORIZATION_FAILED: no ACL lets the caller act on the topic."""

    code = ErrorCode.TOPIC_AUTHORIZATION_FAILED


class GroupAuthorizationFailedError(AuthorizationError):
    """GROUP_AUTHORIZATION_FAILED: no ACL lets the caller use the group."""

    code = ErrorCode.GROUP_AUTHORIZATION_FAILED


class ClusterAuthorizationFailedError(AuthorizationError):
    """CLUSTER_AUTHORIZATION_FAILED: no ACL lets the caller do that on the cluster."""

    code = ErrorCode.CLUSTER_AUTHORIZATION_FAILED


class SaslAuthenticationError(AuthenticationError):
    """Credentials that do not prove the principal: a wrong SCRAM password, an unknown
    user, a token that is expired, forged, or for another issuer or audience."""

    code = ErrorCode.SASL_AUTHENTICATION_FAILED


class UnsupportedSaslMechanismError(AuthenticationError):
    """A SASL mechanism the server does not offer."""

    code = ErrorCode.UNSUPPORTED_SASL_MECHANISM


class IllegalSaslStateError(HighwaterError):
    """A SASL message out of turn: the exchange is over, or has not started."""

    code = ErrorCode.ILLEGAL_SASL_STATE
