"""Metadata records: every record type survives encode/decode; bad bytes are refused."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from highwater.errors import CorruptRecordError
from highwater.internal.v1 import metadata_pb2 as pb
from highwater.metadata.records import (
    BrokerEndpoint,
    BrokerRegistrationChangeRecord,
    ConfigRecord,
    ConfigResourceType,
    CoordinatorAssignmentRecord,
    FenceBrokerRecord,
    MetadataRecord,
    NoOpRecord,
    PartitionChangeRecord,
    PartitionRecord,
    ProducerIdsRecord,
    RegisterBrokerRecord,
    RegisterCoordinatorRecord,
    RemoveTopicRecord,
    TopicRecord,
    UnfenceBrokerRecord,
    UnregisterBrokerRecord,
    UnregisterCoordinatorRecord,
    _decode_partition_change,
    decode_record,
    encode_record,
    from_proto,
    to_proto,
)
from hypothesis import given

ids = st.integers(min_value=-1, max_value=2**31 - 1)
epochs = st.integers(min_value=-1, max_value=2**63 - 1)
names = st.text(min_size=0, max_size=20)
id_lists = st.lists(st.integers(min_value=0, max_value=1000), max_size=6).map(tuple)
optional_id_lists = st.none() | id_lists
endpoints = st.lists(
    st.builds(
        BrokerEndpoint,
        names,
        names,
        st.integers(min_value=0, max_value=65535),
        st.sampled_from(["PLAINTEXT", "SSL", "SASL_SSL"]),
    ),
    max_size=3,
).map(tuple)
racks = st.none() | names
resource_types = st.sampled_from(list(ConfigResourceType))

records: st.SearchStrategy[MetadataRecord] = st.one_of(
    st.builds(
        RegisterBrokerRecord,
        ids,
        names,
        epochs,
        endpoints,
        racks,
        st.booleans(),
        st.booleans(),
        unclean_shutdown=st.booleans(),
    ),
    st.builds(FenceBrokerRecord, ids, epochs),
    st.builds(UnfenceBrokerRecord, ids, epochs),
    st.builds(
        BrokerRegistrationChangeRecord,
        ids,
        epochs,
        st.none() | st.booleans(),
        st.none() | st.booleans(),
    ),
    st.builds(UnregisterBrokerRecord, ids, epochs),
    st.builds(TopicRecord, names, names),
    st.builds(
        PartitionRecord,
        names,
        ids,
        id_lists,
        id_lists,
        ids,
        st.integers(0, 2**31 - 1),
        st.integers(0, 2**31 - 1),
        id_lists,
        id_lists,
    ),
    st.builds(
        PartitionChangeRecord,
        names,
        ids,
        optional_id_lists,
        st.none() | ids,
        optional_id_lists,
        optional_id_lists,
        optional_id_lists,
    ),
    st.builds(ConfigRecord, resource_types, names, names, st.none() | names),
    st.builds(ProducerIdsRecord, ids, epochs, st.integers(0, 2**63 - 1)),
    st.builds(RemoveTopicRecord, names),
    st.builds(RegisterCoordinatorRecord, ids, names, epochs, endpoints, racks),
    st.builds(UnregisterCoordinatorRecord, ids, epochs),
    st.builds(CoordinatorAssignmentRecord, ids, ids, st.integers(0, 2**31 - 1)),
    st.just(NoOpRecord()),
)


@given(records)
def test_every_record_round_trips(record: MetadataRecord) -> None:
    data = encode_record(record)
    assert decode_record(data) == record
    assert from_proto(to_proto(record)) == record
    assert encode_record(decode_record(data)) == data  # deterministic bytes


def test_a_registration_after_an_unclean_shutdown_says_so_and_old_ones_read_as_clean() -> None:
    owed = RegisterBrokerRecord(4, "inc-4", 17, rack="r1", unclean_shutdown=True)
    assert decode_record(encode_record(owed)) == owed
    # A registration as logs written before the field hold it (bytes of that version).
    before_the_field = bytes.fromhex(
        "0a2f08041205696e632d341811221c0a09504c41494e544558541201681884472209504c41494e"
        "544558542a0272313001"
    )
    old = decode_record(before_the_field)
    assert isinstance(old, RegisterBrokerRecord) and old.broker_epoch == 17
    assert not old.unclean_shutdown
    # A clean registration is written as before the field: false is not on the wire.
    assert encode_record(old) == before_the_field


def test_absent_and_empty_lists_differ_in_a_change_record() -> None:
    unchanged = PartitionChangeRecord("t", 0, leader=3)
    emptied = PartitionChangeRecord("t", 0, isr=(), leader=3)
    assert decode_record(encode_record(unchanged)) == unchanged
    assert decode_record(encode_record(emptied)) == emptied
    assert unchanged.isr is None and emptied.isr == ()


def test_a_config_record_without_value_is_a_delete() -> None:
    record = ConfigRecord(ConfigResourceType.TOPIC, "orders", "retention.ms", None)
    assert decode_record(encode_record(record)) == record
    kept = ConfigRecord(ConfigResourceType.TOPIC, "orders", "retention.ms", "")
    assert decode_record(encode_record(kept)) == kept


def test_garbage_is_a_corrupt_record() -> None:
    with pytest.raises(CorruptRecordError, match="does not parse"):
        decode_record(b"\xff\xff\xff")


def test_a_wrapper_without_a_record_is_corrupt() -> None:
    with pytest.raises(CorruptRecordError, match="no record"):
        decode_record(b"")


def test_an_unknown_resource_type_is_corrupt() -> None:
    wrapper = pb.MetadataRecord()
    wrapper.config.resource_type = 7  # type: ignore[assignment]
    wrapper.config.name = "retention.ms"
    with pytest.raises(CorruptRecordError, match="resource type"):
        decode_record(wrapper.SerializeToString())


def test_endpoint_without_security_protocol_defaults_to_plaintext() -> None:
    wrapper = pb.MetadataRecord()
    wrapper.register_broker.broker_id = 1
    wrapper.register_broker.listeners.add(name="PLAINTEXT", host="h", port=1)
    record = decode_record(wrapper.SerializeToString())
    assert isinstance(record, RegisterBrokerRecord)
    assert record.listeners[0].security_protocol == "PLAINTEXT"
    assert record.listeners[0].address == "h:1"


int32s = st.integers(min_value=-(2**31), max_value=2**31 - 1)
wide_id_lists = st.none() | st.lists(int32s, max_size=5).map(tuple)
partition_changes = st.builds(
    PartitionChangeRecord,
    names,
    int32s,
    st.none() | id_lists,
    st.none() | int32s,
    wide_id_lists,
    optional_id_lists,
    optional_id_lists,
    optional_id_lists,
    wide_id_lists,
)


@given(partition_changes)
def test_a_change_record_is_written_and_read_as_protobuf_does(
    record: PartitionChangeRecord,
) -> None:
    """PartitionChangeRecord's own writer and reader agree with protobuf byte for byte."""
    data = encode_record(record)
    assert data == to_proto(record).SerializeToString(deterministic=True)
    assert decode_record(data) == record
    assert from_proto(pb.MetadataRecord.FromString(data)) == record
    # Read by the record's own reader, not handed to protobuf's.
    assert _decode_partition_change(data) == record


def partition_change_bytes(body: bytes) -> bytes:
    """A MetadataRecord carrying a PartitionChangeRecord of ``body`` (under 128 bytes)."""
    return b"\x42" + bytes((len(body),)) + body


def test_a_change_record_in_another_valid_form_is_read_by_protobuf() -> None:
    # Ids not packed, fields out of order, a field twice (protobuf merges the lists):
    # none is the form written here, all are valid protobuf.
    unpacked = partition_change_bytes(b"\x0a\x01t\x10\x07\x1a\x04\x08\x01\x08\x02")
    assert decode_record(unpacked) == PartitionChangeRecord("t", 7, isr=(1, 2))
    reordered = partition_change_bytes(b"\x10\x07\x0a\x01t\x20\x03")
    assert decode_record(reordered) == PartitionChangeRecord("t", 7, leader=3)
    twice = partition_change_bytes(b"\x0a\x01t\x1a\x03\x0a\x01\x01\x1a\x03\x0a\x01\x02")
    assert decode_record(twice) == PartitionChangeRecord("t", 0, isr=(1, 2))


@pytest.mark.parametrize(
    "data",
    [
        b"\x42",  # no length
        b"\x42\x05\x0a\x01t",  # shorter than its length
        b"\x42\x03\x0a\x05t",  # a string past the end
        b"\x42\x03\x0a\x01\xff",  # not UTF-8
        b"\x42\x02\x1a\x05",  # an id list past the end
    ],
)
def test_a_malformed_change_record_is_corrupt(data: bytes) -> None:
    with pytest.raises(CorruptRecordError):
        decode_record(data)
