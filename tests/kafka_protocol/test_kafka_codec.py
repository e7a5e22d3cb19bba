"""The Kafka codec's spliced answers: a Fetch answer encoded with placeholders and its records
spliced in as pieces is, byte for byte, the answer encoded with the records in it, at a
version with INT32 lengths and at a flexible one (UNSIGNED_VARINT lengths of one, two and
three bytes); a placeholder the answer does not hold is an error, not a wrong frame."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from highwater.broker.kafka_protocol.codec import (
    RequestDecodeError,
    decode_request,
    encode_response,
    encode_spliced_response,
    placeholders,
)
from kafka.protocol.consumer import FetchResponse

FETCH_KEY = 1


def fetch_response(records: list[bytes]) -> Any:
    R = FetchResponse
    return R(
        throttle_time_ms=0,
        error_code=0,
        session_id=7,
        responses=[
            R.FetchableTopicResponse(
                topic="spliced",
                partitions=[
                    R.FetchableTopicResponse.PartitionData(
                        partition_index=index,
                        error_code=0,
                        high_watermark=100 + index,
                        last_stable_offset=100 + index,
                        log_start_offset=0,
                        aborted_transactions=[],
                        preferred_read_replica=-1,
                        records=data,
                    )
                    for index, data in enumerate(records)
                ],
            )
        ],
    )


@pytest.mark.parametrize("version", [4, 11, 12])
def test_a_spliced_fetch_answer_is_the_answer_with_its_records_in_it(version: int) -> None:
    # 1-byte, 2-byte and 3-byte varint lengths in a flexible version; an empty partition.
    records = [bytes([i % 251]) * size for i, size in enumerate((100, 300, 70_000, 0))]
    standing_in = placeholders(3)
    spliced = dict(zip(standing_in, records[:3], strict=True))
    with_placeholders = fetch_response([*standing_in, b""])

    pieces = encode_spliced_response(FETCH_KEY, version, 42, with_placeholders, spliced)

    whole = encode_response(FETCH_KEY, version, 42, fetch_response(records))
    assert b"".join(pieces) == bytes(whole)
    assert any(piece is records[2] for piece in pieces), "the records are not copied"


def test_a_placeholder_missing_from_the_answer_is_an_error() -> None:
    first, second = placeholders(2)
    response = fetch_response([first])
    with pytest.raises(ValueError, match="not in the answer"):
        encode_spliced_response(FETCH_KEY, 12, 1, response, {first: b"a", second: b"b"})


def test_a_placeholder_outside_a_bytes_field_is_an_error() -> None:
    placeholder = b"placeholder-\x00\x00\x00\x00"  # 16 bytes, as placeholders() makes
    R = FetchResponse
    response = R(
        throttle_time_ms=0,
        error_code=0,
        session_id=0,
        # In a topic name (an INT16 length before it), not in a records field.
        responses=[R.FetchableTopicResponse(topic=placeholder.decode(), partitions=[])],
    )
    with pytest.raises(ValueError, match="not a bytes field"):
        encode_spliced_response(FETCH_KEY, 11, 1, response, {placeholder: b"records"})


def _metadata_v1(name_length: int) -> bytes:
    """A Metadata v1 request for one topic, ``abc``, whose name's length says
    ``name_length``."""
    client_id = b"raw"
    header = struct.pack(">hhih", 3, 1, 7, len(client_id)) + client_id
    return header + struct.pack(">ih", 1, name_length) + b"abc"


def _metadata_v12(name_length: int) -> bytes:
    """The same at v12 (flexible): a compact string, the tagged fields after it."""
    client_id = b"raw"
    header = struct.pack(">hhih", 3, 12, 7, len(client_id)) + client_id + b"\x00"
    topic = bytes(16) + bytes([name_length + 1]) + b"abc" + b"\x00"  # topic id, name, tags
    return header + bytes([2]) + topic + b"\x00\x00" + b"\x00"  # 1 topic, two flags, tags


def test_a_length_that_runs_past_the_end_of_the_request_is_refused() -> None:
    """The last field's length is the one nothing after it would catch: without a check,
    the name would be cut to what is there and the request served."""
    assert decode_request(_metadata_v1(3)).body.topics[0].name == "abc"
    with pytest.raises(RequestDecodeError, match="past the end"):
        decode_request(_metadata_v1(10))


def test_a_compact_string_that_runs_past_the_end_of_the_request_is_refused() -> None:
    assert decode_request(_metadata_v12(3)).body.topics[0].name == "abc"
    with pytest.raises(RequestDecodeError):
        decode_request(_metadata_v12(60))
