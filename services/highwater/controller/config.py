"""Quorum-controller settings (``ControllerConfig``): Kafka's names, types and defaults.

The settings the active controller's decisions depend on: broker and coordinator
session timeouts, topic-creation defaults, unclean-election and leader-rebalance policy,
producer-id block size, the shape of ``__consumer_offsets``. Built from Kafka-named properties with
:meth:`ControllerConfig.from_properties`, validated by one :class:`ConfigDef`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar, Final

from highwater.config.definition import (
    ConfigDef,
    ConfigKey,
    ConfigType,
    ConfigValue,
    RawValue,
    at_least,
    between,
)

PRODUCER_ID_BLOCK_SIZE: Final = 1000
"""Producer ids per AllocateProducerIds block (Kafka's ``PRODUCER_ID_BLOCK_SIZE``)."""

CONTROLLER_CONFIG_DEF: Final = ConfigDef(
    [
        ConfigKey(
            "broker.session.timeout.ms",
            ConfigType.INT,
            9000,
            at_least(1),
            "How long a broker may go without a heartbeat before the controller fences it "
            "and moves its leaderships away.",
        ),
        ConfigKey(
            "broker.heartbeat.interval.ms",
            ConfigType.INT,
            2000,
            at_least(1),
            "How often brokers are expected to heartbeat.",
        ),
        ConfigKey(
            "num.partitions",
            ConfigType.INT,
            1,
            at_least(1),
            "The partitions of a topic created without a partition count.",
        ),
        ConfigKey(
            "default.replication.factor",
            ConfigType.INT,
            1,
            at_least(1),
            "The replication factor of a topic created without one.",
        ),
        ConfigKey(
            "unclean.leader.election.enable",
            ConfigType.BOOLEAN,
            False,
            None,
            "The cluster default of the topic setting: whether a replica outside the ISR may "
            "become leader when no ISR member is alive, at the risk of losing records.",
        ),
        ConfigKey(
            "auto.leader.rebalance.enable",
            ConfigType.BOOLEAN,
            True,
            None,
            "Whether the controller moves leadership back to preferred leaders when a "
            "broker's leader imbalance passes leader.imbalance.per.broker.percentage.",
        ),
        ConfigKey(
            "leader.imbalance.per.broker.percentage",
            ConfigType.INT,
            10,
            between(0, 100),
            "The share of a broker's preferred-leader partitions it may not lead before the "
            "controller triggers preferred leader elections.",
        ),
        ConfigKey(
            "leader.imbalance.check.interval.seconds",
            ConfigType.LONG,
            300,
            at_least(1),
            "How often the controller checks leader imbalance.",
        ),
        ConfigKey(
            "offsets.topic.num.partitions",
            ConfigType.INT,
            50,
            at_least(1),
            "The partitions of __consumer_offsets, each owned by one group coordinator.",
        ),
        ConfigKey(
            "offsets.topic.replication.factor",
            ConfigType.INT,
            3,
            at_least(1),
            "The replication factor of __consumer_offsets, capped at the number of active "
            "brokers when the controller creates it.",
        ),
        ConfigKey(
            "offsets.topic.segment.bytes",
            ConfigType.INT,
            100 * 1024 * 1024,
            at_least(1),
            "The segment size of __consumer_offsets: small, so that compaction and log "
            "loading stay fast.",
        ),
        ConfigKey(
            "coordinator.session.timeout.ms",
            ConfigType.INT,
            9000,
            at_least(1),
            "How long a group coordinator may go without a heartbeat before the controller "
            "unregisters it and gives its __consumer_offsets partitions to the others.",
        ),
        ConfigKey(
            "coordinator.heartbeat.interval.ms",
            ConfigType.INT,
            2000,
            at_least(1),
            "How often group coordinators are expected to heartbeat.",
        ),
    ]
)


@dataclass(frozen=True, slots=True)
class ControllerConfig:
    """The quorum controller's settings; ``ControllerConfig()`` is Kafka's defaults.

    ``cluster_id``, when set, is checked against registrations (INCONSISTENT_CLUSTER_ID).
    ``broker_config_definition`` validates dynamic broker configs; without one, the
    controller refuses to alter them.
    """

    broker_session_timeout_ms: int = 9000
    broker_heartbeat_interval_ms: int = 2000
    num_partitions: int = 1
    default_replication_factor: int = 1
    unclean_leader_election_enable: bool = False
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
