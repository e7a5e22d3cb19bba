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
        RegisterBrokerRecord, ids, names, epochs, endpoints, racks, st.booleans(), st.booleans()
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
