"""The producer's settings: Kafka's names, checked and typed once (:class:`ProducerConfig`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from highwater.client.cluster import (
    parse_bootstrap_servers,
)
from highwater.client.producer.sender import PRODUCE_REQUEST_MAX_BYTES
from highwater.client.security_config import SECURITY_CONFIG_KEYS, security_from_config
from highwater.config.definition import (
    INT_MAX,
    ConfigDef,
    ConfigKey,
    ConfigType,
    at_least,
    between,
    one_of,
)
from highwater.errors import InvalidConfigError
from highwater.records import Compression
from highwater.rpc.client_auth import ClientSecurity

__all__ = ["PRODUCER_CONFIG_DEF", "ProducerConfig"]

PRODUCER_CONFIG_DEF: Final = ConfigDef(
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
            doc="A name for this producer in logs; brokers count its quotas under it.",
        ),
        ConfigKey(
            "acks",
            ConfigType.STRING,
            "all",
            one_of("all", "-1", "0", "1"),
            "How many replicas must have a batch before it counts as written: 0 (no answer), "
            "1 (the leader) or all (-1: every in-sync replica).",
        ),
        ConfigKey(
            "linger.ms",
            ConfigType.LONG,
            5,
            at_least(0),
            "How long a batch waits for more records before it is sent.",
        ),
        ConfigKey(
            "batch.size",
            ConfigType.INT,
            16384,
            at_least(1),
            "The most bytes of records (before compression) one batch holds; a single larger "
            "record is sent alone.",
        ),
        ConfigKey(
            "max.request.size",
            ConfigType.INT,
            1048576,
            between(1, PRODUCE_REQUEST_MAX_BYTES),
            "The most bytes of batches one Produce request carries, and the largest batch: "
            "a record larger than it as a batch of its own fails at produce() with "
            "RecordTooLargeError; batches hold at most min(batch.size, max.request.size). At "
            "most the brokers' gRPC message limit less 1 MiB.",
        ),
        ConfigKey(
            "compression.type",
            ConfigType.STRING,
            "none",
            one_of("none", "gzip", "snappy", "lz4", "zstd"),
            "The codec batches are compressed with.",
        ),
        ConfigKey(
            "enable.idempotence",
            ConfigType.BOOLEAN,
            True,
            doc="Stamp batches with a producer id and sequence numbers, so retries never "
            "duplicate or reorder records. Needs acks=all, retries > 0 and at most 5 "
            "in-flight requests.",
        ),
        ConfigKey(
            "max.in.flight.requests.per.connection",
            ConfigType.INT,
            5,
            at_least(1),
            "The most unanswered batches per partition.",
        ),
        ConfigKey(
            "retries",
            ConfigType.INT,
            INT_MAX,
            at_least(0),
            "How many times a batch that failed with a retriable error is sent again "
            "(delivery.timeout.ms bounds the time it may take).",
        ),
        ConfigKey(
            "delivery.timeout.ms",
            ConfigType.INT,
            120000,
            at_least(0),
            "The most time between produce() and the record's delivery report, retries "
            "included; at least linger.ms + request.timeout.ms.",
        ),
        ConfigKey(
            "request.timeout.ms",
            ConfigType.INT,
            30000,
            at_least(0),
            "How long a request waits for its answer before it counts as failed.",
        ),
        ConfigKey(
            "retry.backoff.ms",
            ConfigType.LONG,
            100,
            at_least(0),
            "The wait before a failed batch is sent again.",
        ),
        ConfigKey(
            "topic.metadata.propagation.max.ms",
            ConfigType.INT,
            30000,
            at_least(0),
            "How long a record for a topic the metadata does not name waits for it to "
            "appear (a topic just created may not have reached every broker) before it "
            "fails with UNKNOWN_TOPIC_OR_PARTITION; at most delivery.timeout.ms.",
        ),
        ConfigKey(
            "partitioner.ignore.keys",
            ConfigType.BOOLEAN,
            False,
            doc="Place keyed records with the sticky partitioner, as if they had no key.",
        ),
        ConfigKey(
            "compression.level",
            ConfigType.INT,
            -1,
            between(-1, 22),
            "The codec's level; -1: the codec's default.",
        ),
        *SECURITY_CONFIG_KEYS,
    ]
)


@dataclass(frozen=True, slots=True)
class ProducerConfig:
    """A validated producer configuration, typed (durations in milliseconds)."""

    bootstrap_servers: tuple[str, ...]
    client_id: str
    acks: int
    linger_ms: int
    batch_size: int
    max_request_size: int
    compression: Compression
    compression_level: int | None
    enable_idempotence: bool
    max_in_flight: int
    retries: int
    delivery_timeout_ms: int
    request_timeout_ms: int
    retry_backoff_ms: int
    ignore_keys: bool
    topic_metadata_propagation_max_ms: int = 30000
    """How long a record waits for its topic to appear in the metadata (librdkafka's
    setting; delivery.timeout.ms bounds it)."""
    security: ClientSecurity | None = None
    """The channels' TLS and SASL (``None``: the process's)."""

    @classmethod
    def parse(cls, config: Mapping[str, Any]) -> ProducerConfig:
        """Validate Kafka-named settings; :class:`InvalidConfigError` names the bad key.

        As in Kafka: idempotence set explicitly conflicts with ``acks`` other than all,
        ``retries=0`` or more than 5 in-flight requests (an error); left at its default,
        it is quietly turned off by such settings. ``delivery.timeout.ms`` below
        ``linger.ms + request.timeout.ms`` is an error when set, raised to it otherwise.
        """
        raw = dict(config)
        acks = raw.get("acks")
        if isinstance(acks, int) and not isinstance(acks, bool):
            raw["acks"] = str(acks)
        values = PRODUCER_CONFIG_DEF.parse(raw)
        try:
            servers = parse_bootstrap_servers(values["bootstrap.servers"])
        except ValueError as e:
            raise InvalidConfigError(
                f"Invalid value {raw['bootstrap.servers']!r} for configuration "
                f"bootstrap.servers: {e}"
            ) from None
        acks_value = -1 if values["acks"] == "all" else int(values["acks"])
        idempotent: bool = values["enable.idempotence"]
        explicit_idempotence = "enable.idempotence" in raw and idempotent
        conflicts = []
        if acks_value != -1:
            conflicts.append(f"acks={values['acks']} (must be all)")
        if values["retries"] == 0:
            conflicts.append("retries=0 (must be > 0)")
        if values["max.in.flight.requests.per.connection"] > 5:
            conflicts.append("max.in.flight.requests.per.connection > 5")
        if conflicts and explicit_idempotence:
            raise InvalidConfigError(
                "Invalid configuration enable.idempotence=true: it conflicts with "
                + ", ".join(conflicts)
            )
        if conflicts:
            idempotent = False
        delivery_timeout: int = values["delivery.timeout.ms"]
        floor = values["linger.ms"] + values["request.timeout.ms"]
        if delivery_timeout < floor:
            if "delivery.timeout.ms" in raw:
                raise InvalidConfigError(
                    f"Invalid value {delivery_timeout} for configuration delivery.timeout.ms: "
                    f"it must be at least linger.ms + request.timeout.ms = {floor}"
                )
            delivery_timeout = floor
        level: int = values["compression.level"]
        return cls(
            bootstrap_servers=servers,
            client_id=values["client.id"],
            acks=acks_value,
            linger_ms=values["linger.ms"],
            batch_size=values["batch.size"],
            max_request_size=values["max.request.size"],
            compression=Compression.parse(values["compression.type"]),
            compression_level=None if level < 0 else level,
            enable_idempotence=idempotent,
            max_in_flight=values["max.in.flight.requests.per.connection"],
            retries=values["retries"],
            delivery_timeout_ms=delivery_timeout,
            request_timeout_ms=values["request.timeout.ms"],
            retry_backoff_ms=values["retry.backoff.ms"],
            ignore_keys=values["partitioner.ignore.keys"],
            topic_metadata_propagation_max_ms=values["topic.metadata.propagation.max.ms"],
            security=security_from_config(raw),
        )
