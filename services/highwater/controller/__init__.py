"""The quorum controller: pure decisions that turn requests into metadata records.

:class:`QuorumController` validates each request against the current
:class:`~highwater.metadata.image.MetadataImage` and returns a :class:`ControllerResult`
(records to append atomically, the response to send once they commit); the I/O layer
appends through a :class:`MetadataStore` (Raft over ``__cluster_metadata``, or another
store with the same contract) and answers.
"""

from highwater.controller.cluster_control import ClusterControl
from highwater.controller.config import PRODUCER_ID_BLOCK_SIZE, ControllerConfig
from highwater.controller.config_control import ConfigurationControl
from highwater.controller.coordinators import assign_coordinators
from highwater.controller.heartbeats import BrokerHeartbeatManager, BrokerSession
from highwater.controller.partition_change import Election, PartitionChangeBuilder
from highwater.controller.quorum_controller import QuorumController
from highwater.controller.replication_control import ReplicationControl
from highwater.controller.results import ControllerApiError, ControllerResult
from highwater.controller.store import InMemoryMetadataStore, MetadataStore, NotControllerError

__all__ = [
    "PRODUCER_ID_BLOCK_SIZE",
    "BrokerHeartbeatManager",
    "BrokerSession",
    "ClusterControl",
    "ConfigurationControl",
    "ControllerApiError",
    "ControllerConfig",
    "ControllerResult",
    "Election",
    "InMemoryMetadataStore",
    "MetadataStore",
    "NotControllerError",
    "PartitionChangeBuilder",
    "QuorumController",
    "ReplicationControl",
    "assign_coordinators",
]
