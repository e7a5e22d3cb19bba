"""Cluster metadata: the records of ``__cluster_metadata``, the image they build, snapshots.

Brokers and controllers share this code: each replays committed records
(:mod:`highwater.metadata.records`) into a :class:`MetadataDelta`
(:mod:`highwater.metadata.delta`) and applies it for the next immutable
:class:`MetadataImage` (:mod:`highwater.metadata.image`), versioned by log offset and
built of persistent collections that share what did not change
(:mod:`highwater.metadata.persistent`); a snapshot (:mod:`highwater.metadata.snapshot`)
is the list of records that recreates an image.
"""

from highwater.metadata.consumer_offsets import (
    CONSUMER_OFFSETS_TOPIC,
    java_string_hash,
    kafka_abs,
    partition_for_group,
)
from highwater.metadata.delta import (
    MetadataDelta,
    MetadataLoader,
    MetadataReplayError,
    replay,
)
from highwater.metadata.image import (
    BrokerIndex,
    BrokerRegistration,
    ClusterImage,
    ConfigResource,
    ConfigurationsImage,
    CoordinatorAssignment,
    CoordinatorRegistration,
    CoordinatorsImage,
    IndexKind,
    MetadataImage,
    PartitionRegistration,
    ProducerIdsImage,
    TopicIdPartition,
    TopicImage,
    TopicsImage,
    build_broker_index,
    derive_broker_index,
)
from highwater.metadata.persistent import PartitionMap, PartitionSet
from highwater.metadata.records import (
    NO_LEADER,
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
    PartitionsRecord,
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
)
from highwater.metadata.snapshot import (
    load_snapshot,
    load_snapshot_values,
    snapshot_records,
    snapshot_values,
)

__all__ = [
    "CONSUMER_OFFSETS_TOPIC",
    "NO_LEADER",
    "BrokerEndpoint",
    "BrokerIndex",
    "BrokerRegistration",
    "BrokerRegistrationChangeRecord",
    "ClusterImage",
    "ConfigRecord",
    "ConfigResource",
    "ConfigResourceType",
    "ConfigurationsImage",
    "CoordinatorAssignment",
    "CoordinatorAssignmentRecord",
    "CoordinatorRegistration",
    "CoordinatorsImage",
    "FenceBrokerRecord",
    "IndexKind",
    "MetadataDelta",
    "MetadataImage",
    "MetadataLoader",
    "MetadataRecord",
    "MetadataReplayError",
    "NoOpRecord",
    "PartitionChangeRecord",
    "PartitionMap",
    "PartitionRecord",
    "PartitionRegistration",
    "PartitionSet",
    "PartitionsRecord",
    "ProducerIdsImage",
    "ProducerIdsRecord",
    "RegisterBrokerRecord",
    "RegisterCoordinatorRecord",
    "RemoveTopicRecord",
    "TopicIdPartition",
    "TopicImage",
    "TopicRecord",
    "TopicsImage",
    "UnfenceBrokerRecord",
    "UnregisterBrokerRecord",
    "UnregisterCoordinatorRecord",
    "build_broker_index",
    "decode_record",
    "derive_broker_index",
    "encode_record",
    "java_string_hash",
    "kafka_abs",
    "load_snapshot",
    "load_snapshot_values",
    "partition_for_group",
    "replay",
    "snapshot_records",
    "snapshot_values",
]
