"""The Kafka protocol's codec glue: which APIs and versions the listener serves, request
headers in, response frames out.

Messages are encoded and decoded by kafka-python's ``kafka.protocol``, whose classes are
generated at import from Kafka's own message schemas (``clients/src/main/resources/common/
message/*.json``), flexible versions (compact strings and arrays, tagged fields) included.
This module only knows the header layouts (KIP-482): request header v1 (api key, version,
correlation id, nullable client id) or v2 (the same and tagged fields) when the request's
version is flexible; response header v0 (correlation id) or v1 (and tagged fields), except
that ApiVersions answers always take header v0 so that a client that does not know the
broker's versions yet can read it (KIP-511).

A Fetch answer is mostly its records, which the broker read from its log as they are on
the wire: :func:`encode_spliced_response` encodes the answer with a placeholder in each
``records`` field and hands back the frame as pieces, the records themselves among them as
read, so they are never copied in this process (the socket writes the pieces as one
``writev``).
"""

from __future__ import annotations

import io
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from kafka.protocol.admin import (
    AlterConfigsRequest,
    AlterPartitionReassignmentsRequest,
    CreateAclsRequest,
    CreatePartitionsRequest,
    CreateTopicsRequest,
    DeleteAclsRequest,
    DeleteGroupsRequest,
    DeleteRecordsRequest,
    DeleteTopicsRequest,
    DescribeAclsRequest,
    DescribeClusterRequest,
    DescribeConfigsRequest,
    DescribeGroupsRequest,
    DescribeLogDirsRequest,
    ElectLeadersRequest,
    IncrementalAlterConfigsRequest,
    ListGroupsRequest,
    ListPartitionReassignmentsRequest,
)
from kafka.protocol.api_header import RequestHeader
from kafka.protocol.api_message import ApiMessage
from kafka.protocol.consumer import (
    FetchRequest,
    HeartbeatRequest,
    JoinGroupRequest,
    LeaveGroupRequest,
    ListOffsetsRequest,
    OffsetCommitRequest,
    OffsetDeleteRequest,
    OffsetFetchRequest,
    OffsetForLeaderEpochRequest,
    SyncGroupRequest,
)
from kafka.protocol.metadata import ApiVersionsRequest, FindCoordinatorRequest, MetadataRequest
from kafka.protocol.producer import InitProducerIdRequest, ProduceRequest
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslHandshakeRequest

__all__ = [
    "API_VERSIONS_KEY",
    "PRODUCE_KEY",
    "SASL_AUTHENTICATE_KEY",
    "SASL_HANDSHAKE_KEY",
    "SUPPORTED",
    "ApiRange",
    "DescribeTopicPartitionsRequest",
    "DescribeTopicPartitionsResponse",
    "Frame",
    "KafkaRequest",
    "RequestDecodeError",
    "Spliced",
    "UnsupportedVersionError",
    "decode_request",
    "encode_response",
    "encode_spliced_response",
    "is_flexible",
    "peek_header",
    "placeholders",
]

PRODUCE_KEY: Final = 0
API_VERSIONS_KEY: Final = 18
SASL_HANDSHAKE_KEY: Final = 17
SASL_AUTHENTICATE_KEY: Final = 36


@dataclass(frozen=True, slots=True)
class ApiRange:
    """An API the listener serves: its request class and the versions it takes."""

    request: Any
    min_version: int
    max_version: int

    @property
    def api_key(self) -> int:
        return int(self.request.API_KEY)

    @property
    def name(self) -> str:
        return str(self.request.name)

    @property
    def response(self) -> Any:
        return self.request.__module__ and _response_class(self.request)


def _response_class(request: Any) -> Any:
    module = __import__(request.__module__, fromlist=["_"])
    return getattr(module, request.__name__.removesuffix("Request") + "Response")


class DescribeTopicPartitionsRequest(ApiMessage):
    """KIP-966's paged topic description (API 75). kafka-python bundles its schema but no
    module names it; like every ``kafka.protocol`` message, the class is built from the
    schema its name picks."""


class DescribeTopicPartitionsResponse(ApiMessage):
    """The answer to :class:`DescribeTopicPartitionsRequest`."""


# The versions served: from the oldest a client of the last few years sends (Produce v3 is
# the first with RecordBatch v2) to the last one whose fields the broker can fill without
# topic ids in place of names (Produce v13, Fetch v13, OffsetCommit v10...). SaslHandshake
# v0 is served (librdkafka 2.0 asks for it among the versions before it authenticates):
# after it, the SASL tokens come as bare frames (KIP-43).
SUPPORTED: Final[dict[int, ApiRange]] = {
    r.api_key: r
    for r in (
        ApiRange(ProduceRequest, 3, 9),
        ApiRange(FetchRequest, 4, 12),
        ApiRange(ListOffsetsRequest, 1, 7),
        ApiRange(MetadataRequest, 1, 12),
        ApiRange(OffsetCommitRequest, 2, 8),
        ApiRange(OffsetFetchRequest, 1, 7),
        ApiRange(FindCoordinatorRequest, 0, 4),
        ApiRange(JoinGroupRequest, 0, 9),
        ApiRange(HeartbeatRequest, 0, 4),
        ApiRange(LeaveGroupRequest, 0, 5),
        ApiRange(SyncGroupRequest, 0, 5),
        ApiRange(DescribeGroupsRequest, 0, 5),
        ApiRange(ListGroupsRequest, 0, 4),
        ApiRange(ApiVersionsRequest, 0, 3),
        ApiRange(CreateTopicsRequest, 2, 7),
        ApiRange(DeleteTopicsRequest, 1, 6),
        ApiRange(DeleteRecordsRequest, 0, 2),
        ApiRange(InitProducerIdRequest, 0, 4),
        ApiRange(OffsetForLeaderEpochRequest, 2, 4),
        ApiRange(DescribeConfigsRequest, 1, 4),
        ApiRange(AlterConfigsRequest, 0, 2),
        ApiRange(CreatePartitionsRequest, 0, 3),
        ApiRange(DeleteGroupsRequest, 0, 2),
        ApiRange(ElectLeadersRequest, 0, 2),
        ApiRange(IncrementalAlterConfigsRequest, 0, 1),
        ApiRange(AlterPartitionReassignmentsRequest, 0, 0),
        ApiRange(ListPartitionReassignmentsRequest, 0, 0),
        ApiRange(DescribeClusterRequest, 0, 1),
        ApiRange(DescribeTopicPartitionsRequest, 0, 0),
        ApiRange(DescribeLogDirsRequest, 1, 4),
        ApiRange(OffsetDeleteRequest, 0, 0),
        ApiRange(SaslHandshakeRequest, 0, 1),
        ApiRange(SaslAuthenticateRequest, 0, 2),
        ApiRange(DescribeAclsRequest, 1, 3),
        ApiRange(CreateAclsRequest, 1, 3),
        ApiRange(DeleteAclsRequest, 1, 3),
    )
}

_HEADER: Final = struct.Struct(">hhi")  # api key, api version, correlation id
_SIZE: Final = struct.Struct(">i")
_CLIENT_ID_LENGTH: Final = struct.Struct(">h")
_PLACEHOLDER_BYTES: Final = 16

Frame = bytes | bytearray | list[bytes | bytearray | memoryview]
"""A response frame, whole or as pieces written one after the other."""


class RequestDecodeError(Exception):
    """A request that cannot be read (truncated, garbage): the connection is closed."""


class UnsupportedVersionError(Exception):
    """A request of an API or version the listener does not serve."""

    def __init__(self, api_key: int, api_version: int, correlation_id: int) -> None:
        super().__init__(f"API {api_key} version {api_version} is not supported")
        self.api_key = api_key
        self.api_version = api_version
        self.correlation_id = correlation_id


@dataclass(frozen=True, slots=True)
class KafkaRequest:
    """One decoded request: its header fields and its body (a ``kafka.protocol`` message)."""

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body: Any


@dataclass(frozen=True, slots=True)
class Spliced:
    """An answer whose bytes fields hold placeholders, and the bytes that go in their
    place when it is encoded (:func:`encode_spliced_response`)."""

    response: Any
    spliced: Mapping[bytes, bytes]


def peek_header(frame: bytes | bytearray | memoryview) -> tuple[int, int, int]:
    """``(api_key, api_version, correlation_id)``, the fixed start of every request header."""
    if len(frame) < _HEADER.size:
        raise RequestDecodeError(f"a request of {len(frame)} bytes has no header")
    key, version, correlation_id = _HEADER.unpack_from(frame)
    return int(key), int(version), int(correlation_id)


def is_flexible(message: Any, version: int) -> bool:
    return bool(message.flexible_version_q(version))


def decode_request(frame: bytes | bytearray | memoryview) -> KafkaRequest:
    """The request in ``frame`` (a frame's bytes without its size).

    The header is read from a copy of the frame's start only (its client id and a little
    more for tagged fields: the whole frame if those run over), the body from a view of
    the rest: a 1 MB produce request is not copied to read its header.

    :raises UnsupportedVersionError: an API or version not in :data:`SUPPORTED`.
    :raises RequestDecodeError: bytes that are not a request of that version.
    """
    key, version, correlation_id = peek_header(frame)
    api = SUPPORTED.get(key)
    if api is None or not api.min_version <= version <= api.max_version:
        raise UnsupportedVersionError(key, version, correlation_id)
    flexible = is_flexible(api.request, version)
    try:
        data = io.BytesIO(frame[: _header_bound(frame)])
        try:
            header = RequestHeader.decode(data, flexible=flexible)
        except Exception:  # tagged fields past the bound: the whole frame
            data = io.BytesIO(frame)
            header = RequestHeader.decode(data, flexible=flexible)
        body, end = _decode_body(api.request, memoryview(frame)[data.tell() :], version)
    except Exception as e:  # the codec raises whatever its reader met (struct, index, value)
        raise RequestDecodeError(f"{api.name} v{version}: {type(e).__name__}: {e}") from e
    if end > len(frame) - data.tell():
        # A string's, an array's or a bytes field's length ran past the end, and nothing
        # read after it noticed (the codec's reader slices without a check): Kafka's
        # reader fails there (a buffer underflow), and so does this one.
        raise RequestDecodeError(f"{api.name} v{version}: a length runs past the end")
    return KafkaRequest(key, version, correlation_id, header.client_id, body)


def _decode_body(request: Any, body: memoryview, version: int) -> tuple[Any, int]:
    """``request``'s body at ``version`` and where its reading ended: past the end of
    ``body`` if a length lied (``ApiMessage.decode`` with the end it does not return)."""
    flexible = is_flexible(request, version)
    decode_from = request._struct.compiled_decode_from(
        version, compact=flexible, tagged=flexible, data_class=request[None]
    )
    message, end = decode_from(body, 0)
    return message, int(end)


_TAGGED_FIELDS_BOUND: Final = 4096


def _header_bound(frame: bytes | bytearray | memoryview) -> int:
    """How many bytes of ``frame`` hold its header, at most: the fixed part, the client id
    (a nullable INT16-sized string in every header version), and room for tagged fields."""
    if len(frame) < _HEADER.size + 2:
        return len(frame)
    (client_id_length,) = _CLIENT_ID_LENGTH.unpack_from(frame, _HEADER.size)
    return _HEADER.size + 2 + max(client_id_length, 0) + _TAGGED_FIELDS_BOUND


def encode_response(
    api_key: int, api_version: int, correlation_id: int, response: ApiMessage
) -> bytearray:
    """A response frame: its size, its header, its body at ``api_version`` (the body is
    copied once, into the frame: a fetch answer's records are most of it)."""
    api = SUPPORTED[api_key]
    body = response.encode(version=api_version)
    header_flexible = api_key != API_VERSIONS_KEY and is_flexible(api.request, api_version)
    header = _SIZE.pack(correlation_id) + (b"\x00" if header_flexible else b"")
    frame = bytearray(_SIZE.pack(len(header) + len(body)) + header)
    frame += body
    return frame


def placeholders(count: int) -> list[bytes]:
    """``count`` distinct placeholders for :func:`encode_spliced_response`: random, so that
    no other byte string of an answer (names, numbers) is one by chance."""
    prefix = os.urandom(_PLACEHOLDER_BYTES - 4)
    return [prefix + _SIZE.pack(i) for i in range(count)]


def _bytes_length(size: int, flexible: bool) -> bytes:
    """The length before a (nullable) bytes field: INT32, or UNSIGNED_VARINT of size + 1
    when the version is flexible (a compact field, KIP-482)."""
    if not flexible:
        return _SIZE.pack(size)
    value, out = size + 1, bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def encode_spliced_response(
    api_key: int,
    api_version: int,
    correlation_id: int,
    response: ApiMessage,
    spliced: Mapping[bytes, bytes],
) -> list[bytes | bytearray | memoryview]:
    """The frame of ``response``, whose bytes fields hold placeholders (keys of
    ``spliced``, from :func:`placeholders`), as pieces with each placeholder replaced by its
    bytes (uncopied) and the lengths before them and the frame's size made to match.

    :raises ValueError: a placeholder is not in the encoded answer once, as a bytes field.
    """
    frame = encode_response(api_key, api_version, correlation_id, response)
    flexible = is_flexible(SUPPORTED[api_key].request, api_version)
    placeholder_length = _bytes_length(_PLACEHOLDER_BYTES, flexible)
    size = len(frame) - _SIZE.size
    cuts: list[tuple[int, int, bytes, bytes]] = []  # field start, field end, length, bytes
    if not spliced:
        return [frame]
    prefix = next(iter(spliced))[: _PLACEHOLDER_BYTES - 4]  # (one pass finds them all)
    at = frame.find(prefix, _SIZE.size)
    while at >= 0:
        placeholder = bytes(frame[at : at + _PLACEHOLDER_BYTES])
        start = at - len(placeholder_length)
        if placeholder not in spliced or frame[start:at] != placeholder_length:
            raise ValueError("a placeholder is not a bytes field of the answer")
        data = spliced[placeholder]
        length = _bytes_length(len(data), flexible)
        cuts.append((start, at + _PLACEHOLDER_BYTES, length, data))
        size += len(length) + len(data) - len(placeholder_length) - _PLACEHOLDER_BYTES
        at = frame.find(prefix, at + _PLACEHOLDER_BYTES)
    if len(cuts) != len(spliced):
        raise ValueError(f"{len(spliced) - len(cuts)} placeholders are not in the answer")
    _SIZE.pack_into(frame, 0, size)
    view = memoryview(frame)
    pieces: list[bytes | bytearray | memoryview] = []
    position = 0
    for start, end, length, data in cuts:
        pieces += (view[position:start], length, data)
        position = end
    pieces.append(view[position:])
    return pieces
