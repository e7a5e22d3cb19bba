"""Whether an in-process broker has taken a partition's leadership, for tests that wait.

The metadata names a new partition's leader before that broker has made the partition's
log (it does so off its event loop, then takes the role), so "the metadata says broker 1
leads" and "broker 1 serves it" are two moments; tests that produce straight away wait
for the second.
"""

from __future__ import annotations

from highwater.broker.service import BrokerServer
from highwater.storage.topic_partition import TopicPartition


def leads(broker: BrokerServer, topic: str, partition: int) -> bool:
    """Whether ``broker`` serves ``topic``-``partition`` as its leader now."""
    replica = broker.partitions.replica(TopicPartition(topic, partition))
    return replica is not None and not replica.log.offline and replica.is_leader
