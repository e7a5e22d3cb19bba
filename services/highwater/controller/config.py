"""Quorum-controller settings (``ControllerConfig``): Kafka's names, types and defaults.

The settings the active controller's decisions depend on: broker and coordinator
session timeouts, topic-creation defaults, unclean-election and leader-rebalance policy,
producer-id block size, the shape of ``__consumer_offsets``. Built from Kafka-named properties with
:meth:`ControllerConfig.from_properties`, validated by one :class:`ConfigDef`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar, Final

from highwater.config.definition import ConfigDef, ConfigValue, RawValue
from highwater.config.server import SERVER_CONFIG_DEF

PRODUCER_ID_BLOCK_SIZE: Final = 1000
"""Producer ids per AllocateProducerIds block (Kafka's ``PRODUCER_ID_BLOCK_SIZE``)."""

CONTROLLER_CONFIG_DEF: Final = ConfigDef(
    SERVER_CONFIG_DEF[name]
    for name in (
        "broker.session.timeout.ms",
        "broker.heartbeat.interval.ms",
        "num.partitions",
        "default.replication.factor",
        "unclean.leader.election.enable",
        "eligible.leader.replicas.enable",
        "unclean.recovery.strategy",
        "auto.leader.rebalance.enable",
        "leader.imbalance.per.broker.percentage",
        "leader.imbalance.check.interval.seconds",
        "offsets.topic.num.partitions",
        "offsets.topic.replication.factor",
        "offsets.topic.segment.bytes",
        "coordinator.session.timeout.ms",
        "coordinator.heartbeat.interval.ms",
    )
)
"""The controller's keys, as the server configuration defines them."""


@dataclass(frozen=True, slots=True)
class ControllerConfig:
    """The quorum controller's settings; ``ControllerConfig()`` is Kafka's defaults.

    ``cluster_id``, when set, is checked against registrations (INCONSISTENT_CLUSTER_ID).
    ``broker_config_definition`` validates dynamic broker configs; without one, the
    controller refuses to alter them. ``cluster_defaults`` are the cluster defaults of the
    controller's config file (:data:`~highwater.config.server.CLUSTER_DEFAULT_KEYS`, Kafka
    string forms): the active controller keeps the metadata's static defaults equal to
    them. ``leader_moves_per_batch`` bounds the partition changes one decision writes when
    it takes a broker out of service (fenced, shutting down): the rest
    follow in the next ticks' batches, so the first leaderships move as soon as a small
    batch commits, and no step of the controller's loop (deciding, appending, replaying
    the batch) nor of a standby's or a broker's (applying it) grows with the partitions a
    broker held: at 10,000 partitions on processes one batch of 10,000 blocked the active
    controller's loop for seconds under load, past the quorum's fetch timeout
    (docs/control-plane.md).
    """

    broker_session_timeout_ms: int = 9000
    broker_heartbeat_interval_ms: int = 2000
    num_partitions: int = 1
    default_replication_factor: int = 1
    unclean_leader_election_enable: bool = False
    eligible_leader_replicas_enable: bool = True
    unclean_recovery_strategy: str = "Balanced"
    auto_leader_rebalance_enable: bool = True
    leader_imbalance_per_broker_percentage: int = 10
    leader_imbalance_check_interval_seconds: int = 300
    offsets_topic_num_partitions: int = 50
    offsets_topic_replication_factor: int = 3
    offsets_topic_segment_bytes: int = 100 * 1024 * 1024
    coordinator_session_timeout_ms: int = 9000
    coordinator_heartbeat_interval_ms: int = 2000
    cluster_id: str = ""
    broker_config_definition: ConfigDef | None = None
    cluster_defaults: Mapping[str, str] = field(default_factory=dict)
    leader_moves_per_batch: int = 1_000

    DEFINITION: ClassVar[ConfigDef] = CONTROLLER_CONFIG_DEF

    def __post_init__(self) -> None:
        for key in self.DEFINITION:
            value = getattr(self, key.attr_name)
            parsed = key.parse(value)
            if parsed != value or type(parsed) is not type(value):
                object.__setattr__(self, key.attr_name, parsed)

    @classmethod
    def from_properties(
        cls,
        props: Mapping[str, RawValue | ConfigValue],
        *,
        cluster_id: str = "",
        broker_config_definition: ConfigDef | None = None,
    ) -> ControllerConfig:
        """Build from Kafka-named properties, defaults for the rest.

        Raises :class:`~highwater.errors.InvalidConfigError` for an unknown key or bad value.
        """
        parsed = cls.DEFINITION.parse(props)
        return cls(
            **{cls.DEFINITION[name].attr_name: value for name, value in parsed.items()},
            cluster_id=cluster_id,
            broker_config_definition=broker_config_definition,
        )

    @property
    def leader_imbalance_check_interval_ms(self) -> int:
        return self.leader_imbalance_check_interval_seconds * 1000
