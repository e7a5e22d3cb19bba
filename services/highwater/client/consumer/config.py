"""The consumer's settings: Kafka's names, checked and typed once (:class:`ConsumerConfig`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from highwater.client.cluster import (
    parse_bootstrap_servers,
)
from highwater.client.security_config import SECURITY_CONFIG_KEYS, security_from_config
from highwater.config.definition import INT_MAX, ConfigDef, ConfigKey, ConfigType, at_least, one_of
from highwater.errors import (
    InvalidConfigError,
)
from highwater.group.assignors import assignor_for
from highwater.rpc.client_auth import ClientSecurity

__all__ = ["CONSUMER_CONFIG_DEF", "ConsumerConfig"]

CONSUMER_CONFIG_DEF: Final = ConfigDef(
    [
        ConfigKey(
            "bootstrap.servers",
            ConfigType.LIST,
            doc="HOST:PORT pairs of brokers to fetch the cluster's metadata from.",
        ),
        ConfigKey(
            "client.id",
            ConfigType.STRING,
            "",
            doc="A name for this consumer in logs; brokers count its quotas under it.",
        ),
        ConfigKey(
            "auto.offset.reset",
            ConfigType.STRING,
            "latest",
            one_of("latest", "earliest", "none"),
            "Where a partition without a valid position starts: the latest or earliest "
            "offset, or none (an error message).",
        ),
        ConfigKey(
            "fetch.min.bytes",
            ConfigType.INT,
            1,
            at_least(0),
            "The least data a Fetch answer waits for (up to fetch.max.wait.ms).",
        ),
        ConfigKey(
            "fetch.max.wait.ms",
            ConfigType.INT,
            500,
            at_least(0),
            "How long the broker may hold a Fetch waiting for fetch.min.bytes.",
        ),
        ConfigKey(
            "fetch.max.bytes",
            ConfigType.INT,
            52428800,
            at_least(0),
            "The most data one Fetch answer carries (at least one batch is returned).",
        ),
        ConfigKey(
            "max.partition.fetch.bytes",
            ConfigType.INT,
            1048576,
            at_least(0),
            "The most data one partition contributes to a Fetch answer (at least one batch).",
        ),
        ConfigKey(
            "check.crcs",
            ConfigType.BOOLEAN,
            True,
            doc="Verify the CRC-32C of every fetched batch.",
        ),
        ConfigKey(
            "request.timeout.ms",
            ConfigType.INT,
            30000,
            at_least(0),
            "How long a request (beyond a Fetch's long poll) waits for its answer.",
        ),
        ConfigKey(
            "retry.backoff.ms",
            ConfigType.LONG,
            100,
            at_least(0),
            "The wait before a partition is fetched again after a retriable error.",
        ),
        ConfigKey(
            "group.id",
            ConfigType.STRING,
            "",
            doc="The consumer group: needed by subscribe() and to commit offsets.",
        ),
        ConfigKey(
            "group.instance.id",
            ConfigType.STRING,
            "",
            doc="Static membership: a restarted member with this id gets its partitions back "
            "without a rebalance (empty: a dynamic member).",
        ),
        ConfigKey(
            "session.timeout.ms",
            ConfigType.INT,
            45000,
            at_least(1),
            "How long the coordinator waits for a heartbeat before removing the member.",
        ),
        ConfigKey(
            "heartbeat.interval.ms",
            ConfigType.INT,
            3000,
            at_least(1),
            "How often the member heartbeats to the coordinator; below session.timeout.ms "
            "(with a group.id).",
        ),
        ConfigKey(
            "max.poll.interval.ms",
            ConfigType.INT,
            300000,
            at_least(1),
            "The longest time between polls before the member leaves the group; also how "
            "long a rebalance waits for the member to rejoin.",
        ),
        ConfigKey(
            "partition.assignment.strategy",
            ConfigType.LIST,
            ("range", "cooperative-sticky"),
            doc="The assignors the member offers, most preferred first: range, roundrobin, "
            "sticky, cooperative-sticky.",
        ),
        ConfigKey(
            "enable.auto.commit",
            ConfigType.BOOLEAN,
            True,
            doc="Commit the positions every auto.commit.interval.ms, before partitions are "
            "revoked, and on close.",
        ),
        ConfigKey(
            "auto.commit.interval.ms",
            ConfigType.INT,
            5000,
            at_least(0),
            "How often positions are committed when enable.auto.commit is on.",
        ),
        ConfigKey(
            "metadata.max.age.ms",
            ConfigType.INT,
            300000,
            at_least(0),
            "How often a group member checks the subscribed topics' partitions for changes.",
        ),
        *SECURITY_CONFIG_KEYS,
    ]
)


def assignor_names(names: Sequence[str]) -> tuple[str, ...]:
    """Check ``partition.assignment.strategy`` names the built-in assignors."""
    if not names:
        raise InvalidConfigError("partition.assignment.strategy must name at least one assignor")
    for name in names:
        try:
            assignor_for(name)
        except ValueError as e:
            raise InvalidConfigError(
                f"Invalid value {name!r} for configuration partition.assignment.strategy: {e}"
            ) from None
    return tuple(names)


@dataclass(frozen=True, slots=True)
class ConsumerConfig:
    """A validated consumer configuration, typed (durations in milliseconds)."""

    bootstrap_servers: tuple[str, ...]
    client_id: str
    auto_offset_reset: str
    fetch_min_bytes: int
    fetch_max_wait_ms: int
    fetch_max_bytes: int
    max_partition_fetch_bytes: int
    check_crcs: bool
    request_timeout_ms: int
    retry_backoff_ms: int
    group_id: str = ""
    group_instance_id: str | None = None
    session_timeout_ms: int = 45000
    heartbeat_interval_ms: int = 3000
    max_poll_interval_ms: int = 300000
    partition_assignment_strategy: tuple[str, ...] = ("range", "cooperative-sticky")
    enable_auto_commit: bool = True
    auto_commit_interval_ms: int = 5000
    metadata_max_age_ms: int = 300000
    security: ClientSecurity | None = None
    """The channels' TLS and SASL (``None``: the process's)."""

    @classmethod
    def parse(cls, config: Mapping[str, Any]) -> ConsumerConfig:
        """Validate Kafka-named settings; :class:`InvalidConfigError` names the bad key.

        With a ``group.id``, ``heartbeat.interval.ms`` must be below ``session.timeout.ms``,
        as Kafka's ``Heartbeat`` requires: a member that heartbeats less often than its
        session lasts is removed from the group between two heartbeats."""
        values = CONSUMER_CONFIG_DEF.parse(dict(config))
        if values["group.id"] and values["heartbeat.interval.ms"] >= values["session.timeout.ms"]:
            raise InvalidConfigError(
                f"Invalid value {values['heartbeat.interval.ms']} for configuration "
                "heartbeat.interval.ms: it must be lower than session.timeout.ms "
                f"({values['session.timeout.ms']})"
            )
        try:
            servers = parse_bootstrap_servers(values["bootstrap.servers"])
        except ValueError as e:
            raise InvalidConfigError(
                f"Invalid value {config['bootstrap.servers']!r} for configuration "
                f"bootstrap.servers: {e}"
            ) from None
        return cls(
            bootstrap_servers=servers,
            client_id=values["client.id"],
            auto_offset_reset=values["auto.offset.reset"],
            fetch_min_bytes=values["fetch.min.bytes"],
            fetch_max_wait_ms=values["fetch.max.wait.ms"],
            fetch_max_bytes=min(values["fetch.max.bytes"], INT_MAX),
            max_partition_fetch_bytes=values["max.partition.fetch.bytes"],
            check_crcs=values["check.crcs"],
            request_timeout_ms=values["request.timeout.ms"],
            retry_backoff_ms=values["retry.backoff.ms"],
            group_id=values["group.id"],
            group_instance_id=values["group.instance.id"] or None,
            session_timeout_ms=values["session.timeout.ms"],
            heartbeat_interval_ms=values["heartbeat.interval.ms"],
            max_poll_interval_ms=values["max.poll.interval.ms"],
            partition_assignment_strategy=assignor_names(values["partition.assignment.strategy"]),
            enable_auto_commit=values["enable.auto.commit"],
            auto_commit_interval_ms=values["auto.commit.interval.ms"],
            metadata_max_age_ms=values["metadata.max.age.ms"],
            security=security_from_config(config),
        )
