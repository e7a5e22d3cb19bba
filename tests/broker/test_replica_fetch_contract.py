"""The follower-only fetch fields live on the internal ReplicaFetchService, not in the public
FetchRequest: its field numbers and names are reserved (no client can set them, and no
later field can take them), an older client's bytes that still carry them parse as a
consumer's fetch, and the internal call is checked as the inter-service calls are.
"""

from __future__ import annotations

import pytest
from google.protobuf import descriptor_pb2
from google.protobuf.message import Message
from highwater.internal.v1 import replication_pb2 as rpb
from highwater.security.acl import AclOperation, ResourceType
from highwater.security.rpc_access import OnCluster, PerItem, access_of
from highwater.v1 import broker_pb2 as pb

FOLLOWER_ONLY = {
    pb.FetchRequest: {1: "replica_id", 2: "replica_epoch"},
    pb.FetchPartition: {4: "last_fetched_epoch", 5: "log_start_offset"},
}


def reserved(message: type[Message]) -> tuple[set[int], set[str]]:
    proto = descriptor_pb2.DescriptorProto()
    message.DESCRIPTOR.CopyToProto(proto)
    numbers = {n for r in proto.reserved_range for n in range(r.start, r.end)}
    return numbers, set(proto.reserved_name)


@pytest.mark.parametrize("message", list(FOLLOWER_ONLY))
def test_the_public_fetch_reserves_the_follower_fields(message: type[Message]) -> None:
    numbers, names = reserved(message)
    fields = FOLLOWER_ONLY[message]
    assert set(fields) <= numbers
    assert set(fields.values()) <= names
    assert not set(fields.values()) & set(message.DESCRIPTOR.fields_by_name)
    assert not set(fields) & set(message.DESCRIPTOR.fields_by_number)
    for name in fields.values():
        with pytest.raises(ValueError):
            message(**{name: 1})


def test_the_internal_request_carries_them() -> None:
    request = rpb.ReplicaFetchRequest.DESCRIPTOR.fields_by_name
    partition = rpb.ReplicaFetchPartition.DESCRIPTOR.fields_by_name
    assert {"replica_id", "replica_epoch"} <= set(request)
    assert {"last_fetched_epoch", "log_start_offset", "current_leader_epoch"} <= set(partition)


def test_an_older_followers_bytes_parse_as_a_consumers_fetch() -> None:
    """Fields 1 and 2 (replica id 3, epoch 9), then a topic: an older broker's fetch."""
    topic = pb.FetchTopic(topic="t", partitions=[pb.FetchPartition(partition=0, fetch_offset=5)])
    body = topic.SerializeToString()
    assert len(body) < 128  # its length is one varint byte
    wire = b"\x08\x03\x10\x09" + b"\x32" + bytes([len(body)]) + body
    request = pb.FetchRequest.FromString(wire)
    assert request.topics[0].partitions[0].fetch_offset == 5
    assert request.ListFields() == [(pb.FetchRequest.DESCRIPTOR.fields_by_name["topics"], [topic])]


def test_the_replica_fetch_needs_cluster_action_as_its_node() -> None:
    access = access_of("/highwater.internal.v1.ReplicaFetchService/ReplicaFetch")
    assert access == OnCluster(AclOperation.CLUSTER_ACTION, as_node=True)
    for method in ("Fetch", "FetchStream"):
        assert access_of(f"/highwater.v1.Broker/{method}") == PerItem(
            ResourceType.TOPIC, AclOperation.READ
        )
