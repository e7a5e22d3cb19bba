"""The walk of a batch's records a leader's append makes, compiled against the reference.

``check_records`` is the rule by which an append refuses records that are not what their
batch's header says (``INVALID_RECORD``). The compiled walk returns None where the
reference raises; on everything else both return the same timestamp range. Random record
bytes, valid records mutated (a byte set, bytes cut or inserted, the count or the last
offset delta off by one) and plain random bytes go through both; neither crashes nor
reads past the buffer it is given (the records end where the caller says).
"""

from __future__ import annotations

import pytest
from highwater.errors import CorruptRecordError
from highwater.records.implementation import codec
from highwater.records.record import NO_TIMESTAMPS, encode_record, pure_check_records
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

BASE_TS = 1_700_000_000_000

header = st.tuples(
    st.sampled_from(["h", "", "é", "\U0001f600"]), st.one_of(st.none(), st.binary(max_size=5))
)


@st.composite
def valid_records(draw: st.DrawFn) -> tuple[bytes, int, int]:
    count = draw(st.integers(1, 6))
    deltas = sorted(draw(st.sets(st.integers(0, 200), min_size=count, max_size=count)))
    body = b"".join(
        encode_record(
            delta,
            draw(st.sampled_from([0, 1, -1, 300, -(BASE_TS + 1), 1 << 40])),
            draw(st.one_of(st.none(), st.binary(max_size=70))),
            draw(st.one_of(st.none(), st.binary(max_size=200))),
            tuple(draw(st.lists(header, max_size=2))),
        )
        for delta in deltas
    )
    return body, count, deltas[-1] + draw(st.sampled_from([0, 0, 1]))


@st.composite
def mutated(draw: st.DrawFn) -> tuple[bytes, int, int]:
    body, count, last = draw(valid_records())
    data = bytearray(body)
    kind = draw(st.sampled_from(["none", "set", "cut", "insert", "count", "last"]))
    if kind == "set":
        data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    elif kind == "cut":
        at = draw(st.integers(0, len(data) - 1))
        del data[at : at + draw(st.integers(1, 4))]
    elif kind == "insert":
        data[draw(st.integers(0, len(data))) : 0] = draw(st.binary(min_size=1, max_size=4))
    elif kind == "count":
        count += draw(st.sampled_from([-1, 1]))
    elif kind == "last":
        last -= 1
    return bytes(data), count, last


def outcome(body: bytes, count: int, last: int, base: int) -> object:
    """Both walks over ``body`` placed between other bytes (which neither may read)."""
    buf = b"\x80" * 3 + body + b"\x80" * 3
    try:
        expected: object = pure_check_records(buf, 3, 3 + len(body), count, last, base)
    except CorruptRecordError:
        expected = None
    if codec is not None:
        assert codec.check_records(buf, 3, 3 + len(body), count, last, base) == expected
    return expected


@given(case=st.one_of(valid_records(), mutated()), base=st.sampled_from([BASE_TS, -1, 0]))
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_the_compiled_walk_takes_what_the_reference_takes(
    case: tuple[bytes, int, int], base: int
) -> None:
    outcome(*case, base)


@given(body=st.binary(max_size=64), count=st.integers(0, 5), last=st.integers(0, 5))
@settings(max_examples=300, deadline=None)
def test_random_bytes_are_refused_alike(body: bytes, count: int, last: int) -> None:
    outcome(body, count, last, BASE_TS)


@given(case=valid_records())
@settings(max_examples=100, deadline=None)
def test_valid_records_are_taken_with_their_timestamp_range(case: tuple[bytes, int, int]) -> None:
    body, count, last = case
    found = outcome(body, count, last, BASE_TS)
    assert found is not None
    assert found == NO_TIMESTAMPS or found[0] <= found[1]  # type: ignore[index]


@pytest.mark.parametrize(
    "body",
    [
        encode_record(0, 0, None, b"v")[:-1] + b"\x02",  # a header count with no header
        encode_record(0, 1 << 62, None, None) + encode_record(1, 1 << 62, None, None),
    ],
)
def test_edges_agree(body: bytes) -> None:
    outcome(body, 1, 1, 1 << 62)
    outcome(body, 2, 1, 1 << 62)
