"""Bad input on the Kafka listener, over raw sockets: each bad connection is closed (or, for
an ApiVersions request of an unknown version, answered as KIP-511 says), logged once, and
nothing else is affected; a good connection pipelines requests and gets its answers in order.
"""

from __future__ import annotations

import contextlib
import re
import socket
import struct
from pathlib import Path

import pytest
from highwater.broker.kafka_protocol.codec import SUPPORTED
from kafka.protocol.metadata import (
    ApiVersionsRequest,
    ApiVersionsResponse,
    MetadataRequest,
    MetadataResponse,
)
from kafka_servers import KafkaServer, connect, read_frame, request_frame

pytestmark = pytest.mark.timeout(60)

CLOSED_LINE = re.compile(r"Kafka connection from \('127\.0\.0\.1', (\d+)\) closed: (.*)")


def assert_closed(sock: socket.socket) -> None:
    """The server closed the connection without answering."""
    with contextlib.suppress(ConnectionResetError):
        assert sock.recv(1) == b""


def closed_ports(log: Path) -> dict[int, str]:
    return {
        int(m.group(1)): m.group(2) for m in CLOSED_LINE.finditer(log.read_text(errors="replace"))
    }


def header(api_key: int, version: int, correlation_id: int) -> bytes:
    client_id = b"raw"
    return struct.pack(">hhih", api_key, version, correlation_id, len(client_id)) + client_id


BAD_REQUESTS = {
    "garbage": bytes(range(7, 40)),
    "unknown api key": header(999, 0, 1),
    "unsupported version": header(0, 2, 1) + b"\x00" * 16,  # Produce v2: before RecordBatch v2
    "truncated body": header(3, 12, 1)[:-1],
    "garbage body": header(3, 12, 1) + b"\x00\xff\xff\xff\xff\x07" * 5,
    "a length past the end": header(3, 1, 1) + struct.pack(">ih", 1, 10) + b"abc",
    "shorter than a header": b"\x00\x03",
    "empty frame": b"",
}


@pytest.mark.parametrize("name", list(BAD_REQUESTS))
def test_a_bad_request_closes_its_connection_and_is_logged_once(
    server: KafkaServer, name: str
) -> None:
    frame = BAD_REQUESTS[name]
    with connect(server) as bad, connect(server) as good:
        port = bad.getsockname()[1]
        bad.sendall(struct.pack(">i", len(frame)) + frame)
        assert_closed(bad)
        # The other connection is served as before.
        good.sendall(request_frame(MetadataRequest(topics=None), 12, 5))
        answer = read_frame(good)
        assert struct.unpack(">i", answer[:4]) == (5,)
    assert re.search(
        rf"Kafka connection from \('127\.0\.0\.1', {port}\) closed", server.log.read_text()
    )
    assert len(re.findall(rf"'127\.0\.0\.1', {port}\) closed", server.log.read_text())) == 1


@pytest.mark.parametrize("size", [200 * 1024 * 1024, -1])
def test_a_frame_over_socket_request_max_bytes_is_refused_before_it_is_read(
    server: KafkaServer, size: int
) -> None:
    with connect(server) as sock:
        port = sock.getsockname()[1]
        sock.sendall(struct.pack(">i", size) + b"\x00" * 64)
        assert_closed(sock)
    assert "socket.request.max.bytes is 104857600" in closed_ports(server.log)[port]


def test_a_connection_that_ends_inside_a_request_is_closed(server: KafkaServer) -> None:
    with connect(server) as sock:
        port = sock.getsockname()[1]
        sock.sendall(struct.pack(">i", 100) + b"\x00" * 10)
        sock.shutdown(socket.SHUT_WR)
        assert_closed(sock)
    assert closed_ports(server.log)[port] == "the connection ended inside a request"


def test_api_versions_of_an_unknown_version_is_answered_as_v0_with_the_versions_served(
    server: KafkaServer,
) -> None:
    """KIP-511: a client newer than the broker sends its newest ApiVersions; the broker
    answers UNSUPPORTED_VERSION (35) in a v0 body, listing what it serves, and the client
    goes on over the same connection with a version from that list."""
    unknown = header(18, 99, 41) + b"\x00\x05hello\x00\x00"
    with connect(server) as sock:
        sock.sendall(struct.pack(">i", len(unknown)) + unknown)
        answer = read_frame(sock)
        assert struct.unpack(">i", answer[:4]) == (41,)
        refused = ApiVersionsResponse.decode(answer[4:], version=0)
        assert refused.error_code == 35
        served = {k.api_key: (k.min_version, k.max_version) for k in refused.api_keys}
        assert served == {key: (a.min_version, a.max_version) for key, a in SUPPORTED.items()}
        assert served[18] == (0, 3)

        request = ApiVersionsRequest(client_software_name="raw", client_software_version="1")
        sock.sendall(request_frame(request, 3, 42))
        answer = read_frame(sock)
        assert struct.unpack(">i", answer[:4]) == (42,)  # response header v0 even for v3
        accepted = ApiVersionsResponse.decode(answer[4:], version=3)
        assert accepted.error_code == 0
        assert accepted.throttle_time_ms == 0
        # The APIs not implemented are absent (no transactions); SASL's and the ACL
        # calls are served.
        keys = {k.api_key for k in accepted.api_keys}
        assert not {24, 25, 26, 28} & keys
        assert {17, 36, 29, 30, 31} <= keys


def test_pipelined_requests_are_answered_in_order_without_api_versions_first(
    server: KafkaServer,
) -> None:
    """Kafka clients may skip ApiVersions (it is optional, as in Kafka): a Metadata request
    first is served. Requests written back to back come back in their order."""
    frames = b"".join(
        [
            request_frame(MetadataRequest(topics=None), 12, 1),
            request_frame(ApiVersionsRequest(), 0, 2),
            request_frame(MetadataRequest(topics=[]), 9, 3),
            request_frame(MetadataRequest(topics=None), 1, 4),
        ]
    )
    with connect(server) as sock:
        sock.sendall(frames)
        answers = [read_frame(sock) for _ in range(4)]
    assert [struct.unpack(">i", a[:4])[0] for a in answers] == [1, 2, 3, 4]
    # Flexible versions have a tagged-fields byte after the correlation id (header v1).
    first = MetadataResponse.decode(answers[0][5:], version=12)
    assert first.throttle_time_ms == 0
    assert [b.node_id for b in first.brokers] == [1]
    assert f"{first.brokers[0].host}:{first.brokers[0].port}" == server.bootstrap
    assert MetadataResponse.decode(answers[2][5:], version=9).topics == []


def test_api_versions_v3_with_an_invalid_client_software_name_is_invalid_request(
    server: KafkaServer,
) -> None:
    """Kafka's ApiVersionsRequest.isValid (KIP-511): v3+ client software names and
    versions are letters, digits, '-' and '.', starting and ending with a letter or
    digit; else INVALID_REQUEST (42) with no versions, and the connection stays open."""
    with connect(server) as sock:
        bad = ApiVersionsRequest(client_software_name="bad name!", client_software_version="1")
        sock.sendall(request_frame(bad, 3, 51))
        # (kafka-python's reader takes any error answer for a v0 one: the bytes, then.)
        # v3: error 42, no api keys (a compact array), throttle 0, no tagged fields.
        assert read_frame(sock) == struct.pack(">ih", 51, 42) + b"\x01" + bytes(4) + b"\x00"
        good = ApiVersionsRequest(
            client_software_name="confluent-kafka-python",
            client_software_version="2.3.0-rdkafka-2.3.0",
        )
        sock.sendall(request_frame(good, 3, 52))
        assert ApiVersionsResponse.decode(read_frame(sock)[4:], version=3).error_code == 0
