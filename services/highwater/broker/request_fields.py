"""What the broker reads each optional request field as when a caller leaves it unset.

proto3 gives every unset scalar its zero value, and a zero is often a real value here: an
epoch of 0, broker id 0, acks=0. So the broker's contract never gives a zero a special
meaning: a field whose meaning depends on being given is declared ``optional``, and this
module is the one place that says what an absent one means. A client generated from the
protos in any language that sets only what it needs (docs/grpc.md lists that per request)
gets a consumer's answer with Kafka's defaults:

- ``ProduceRequest.acks`` unset is ``-1`` (all, Kafka's producer default since 3.0);
  ``timeout_ms`` unset is 30 s (``request.timeout.ms``).
- A ``FetchRequest`` is always a consumer's: it has no field that names a replica (its
  numbers 1, 2, 4 and 5 are reserved). Followers fetch over the internal
  ``ReplicaFetchService`` (``highwater.internal.v1``), whose requests always name the
  follower, its broker epoch and each partition's last fetched epoch.
- ``FetchRequest.max_bytes`` unset is 1 MiB and ``partition_max_bytes`` 1 MiB (Kafka's
  ``max.partition.fetch.bytes``), so that an answer fits the 4 MiB default receive limit
  of grpc-js, grpc-go and grpc-java; any larger request is held to ``fetch.max.bytes``.
- Leader epochs unset are ``-1``: unknown, not checked.
- ``InitProducerIdRequest.producer_id`` / ``producer_epoch`` unset are a new producer.
"""

from __future__ import annotations

from typing import Final

from highwater.broker.fetch_sessions import FetchPartitionState
from highwater.internal.v1 import replication_pb2 as rpb
from highwater.v1 import broker_pb2 as pb

__all__ = [
    "ACKS_ALL",
    "DEFAULT_FETCH_MAX_BYTES",
    "DEFAULT_PARTITION_FETCH_MAX_BYTES",
    "DEFAULT_PRODUCE_TIMEOUT_MS",
    "NO_EPOCH",
    "current_leader_epoch",
    "fetch_max_bytes",
    "partition_fetch_max_bytes",
    "produce_acks",
    "produce_timeout_ms",
]

ACKS_ALL: Final = -1
NO_EPOCH: Final = -1
DEFAULT_PRODUCE_TIMEOUT_MS: Final = 30_000
"""Kafka's ``request.timeout.ms``."""
DEFAULT_FETCH_MAX_BYTES: Final = 1024 * 1024
"""An unset ``FetchRequest.max_bytes``: one whole answer stays well under 4 MiB."""
DEFAULT_PARTITION_FETCH_MAX_BYTES: Final = 1024 * 1024
"""An unset ``FetchPartition.partition_max_bytes``: Kafka's ``max.partition.fetch.bytes``."""


def produce_acks(request: pb.ProduceRequest) -> int:
    return request.acks if request.HasField("acks") else ACKS_ALL


def produce_timeout_ms(request: pb.ProduceRequest) -> int:
    return request.timeout_ms if request.HasField("timeout_ms") else DEFAULT_PRODUCE_TIMEOUT_MS


def fetch_max_bytes(request: pb.FetchRequest | rpb.ReplicaFetchRequest, limit: int) -> int:
    """The whole answer's budget: the request's ``max_bytes`` (or the default: unset in a
    consumer's, 0 in a follower's), held to ``limit`` (``fetch.max.bytes``) so that no
    answer outgrows the largest gRPC message."""
    if isinstance(request, pb.FetchRequest):
        given = request.HasField("max_bytes")
    else:
        given = request.max_bytes > 0
    wanted = request.max_bytes if given else DEFAULT_FETCH_MAX_BYTES
    return max(1, min(wanted, limit))


def partition_fetch_max_bytes(
    item: pb.FetchPartition | rpb.ReplicaFetchPartition | FetchPartitionState,
) -> int:
    if isinstance(item, pb.FetchPartition):
        given = item.HasField("partition_max_bytes")
    else:
        given = item.partition_max_bytes > 0
    return max(1, item.partition_max_bytes) if given else DEFAULT_PARTITION_FETCH_MAX_BYTES


def current_leader_epoch(
    item: pb.FetchPartition | pb.ListOffsetsPartition | pb.OffsetForLeaderPartition,
) -> int:
    return item.current_leader_epoch if item.HasField("current_leader_epoch") else NO_EPOCH
