"""The Spark source's and sink's options: parsed, validated and typed before a query starts.

Spark hands a data source its options with lower-cased names; the names below are written as
users write them (``subscribePattern``) and compared without case. An unknown option, a
missing or contradictory one, or a malformed value raises :class:`HighwaterOptionError`
naming the option. Client settings pass through with a ``highwater.`` prefix
(``highwater.fetch.max.bytes``, ``highwater.compression.type``) and are checked against the
client library's own configuration definitions.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from highwater.errors import InvalidConfigError

from pyspark_highwater.offsets import (
    EARLIEST,
    LATEST,
    OffsetJsonError,
    PartitionOffsets,
    TopicPartitionKey,
    parse_offsets_json,
    parse_timestamps_json,
)

__all__ = [
    "CLIENT_PREFIX",
    "READ_OPTIONS",
    "WRITE_OPTIONS",
    "HighwaterOptionError",
    "OffsetBound",
    "ReadOptions",
    "Subscription",
    "WriteOptions",
    "parse_read_options",
    "parse_write_options",
]

CLIENT_PREFIX: Final = "highwater."

#: Every option the source knows, as written in the documentation.
READ_OPTIONS: Final = (
    "bootstrap.servers",
    "subscribe",
    "subscribePattern",
    "assign",
    "startingOffsets",
    "endingOffsets",
    "startingTimestamp",
    "endingTimestamp",
    "startingOffsetsByTimestamp",
    "endingOffsetsByTimestamp",
    "startingOffsetsByTimestampStrategy",
    "maxOffsetsPerTrigger",
    "minOffsetsPerTrigger",
    "maxTriggerDelay",
    "minPartitions",
    "maxRecordsPerPartition",
    "failOnDataLoss",
    "includeHeaders",
    "pollTimeoutMs",
)
WRITE_OPTIONS: Final = ("bootstrap.servers", "topic")

#: What a start by time does with a partition that has no record at or after the time
#: (``startingOffsetsByTimestampStrategy``): fail the query (spark-sql-kafka's default), or
#: start the partition at its latest offset.
TIMESTAMP_STRATEGIES: Final = ("error", "latest")

#: ``maxTriggerDelay`` unless given: spark-sql-kafka's 15 minutes.
DEFAULT_MAX_TRIGGER_DELAY_MS: Final = 15 * 60_000

#: The units of a duration option, in milliseconds (Spark's time strings; none: ms).
_DURATION_UNITS: Final = {
    "us": 0.001,
    "ms": 1,
    "s": 1000,
    "m": 60_000,
    "min": 60_000,
    "h": 3_600_000,
    "d": 86_400_000,
}

#: The prefix of spark-sql-kafka's client settings (``kafka.bootstrap.servers``).
_SPARK_KAFKA_PREFIX: Final = "kafka."

#: Options Spark itself passes along to every source or sink; accepted and ignored.
_SPARK_OPTIONS: Final = frozenset({"path", "checkpointlocation", "queryname"})

#: Consumer settings the source owns: a ``highwater.`` prefix may not override them.
_OWNED_CONSUMER_KEYS: Final = frozenset(
    {
        "bootstrap.servers",
        "auto.offset.reset",
        "enable.auto.commit",
        "group.id",
        "group.instance.id",
        "session.timeout.ms",
        "heartbeat.interval.ms",
        "max.poll.interval.ms",
        "partition.assignment.strategy",
        "auto.commit.interval.ms",
    }
)


class HighwaterOptionError(ValueError):
    """An option of the Highwater source or sink is unknown, missing or malformed."""


@dataclass(frozen=True, slots=True)
class Subscription:
    """Which partitions a query reads: named topics, topics matching a pattern, or an
    explicit list of partitions."""

    kind: Literal["subscribe", "subscribePattern", "assign"]
    topics: tuple[str, ...] = ()
    pattern: str = ""
    partitions: tuple[TopicPartitionKey, ...] = ()

    def matches(self, topic: str) -> bool:
        """Whether ``topic`` is read (for ``assign``: one of its partitions is)."""
        if self.kind == "subscribe":
            return topic in self.topics
        if self.kind == "subscribePattern":
            return re.fullmatch(self.pattern, topic) is not None
        return any(t == topic for t, _ in self.partitions)

    def describe(self) -> str:
        """The subscription as the user gave it, for messages."""
        if self.kind == "subscribe":
            return f"subscribe={','.join(self.topics)}"
        if self.kind == "subscribePattern":
            return f"subscribePattern={self.pattern}"
        return "assign=" + ",".join(f"{t}-{p}" for t, p in self.partitions)


@dataclass(frozen=True, slots=True)
class OffsetBound:
    """Where reading starts or ends: ``earliest``, ``latest``, per-partition ``offsets``
    (which may hold -2 / -1 for earliest / latest), the first record at or after a
    ``timestamp`` (ms) in every partition, or at or after per-partition ``timestamps``."""

    kind: Literal["earliest", "latest", "offsets", "timestamp", "timestamps"]
    offsets: PartitionOffsets = field(default_factory=dict)
    timestamp: int = -1
    timestamps: PartitionOffsets = field(default_factory=dict)
    option: str = field(default="", compare=False)
    """The option the bound was given as (``startingTimestamp``, ...), for messages."""

    def describe(self) -> str:
        """The bound as the user gave it, for messages."""
        if self.kind == "timestamp":
            return f"timestamp {self.timestamp}"
        if self.kind == "offsets":
            return "per-partition offsets"
        if self.kind == "timestamps":
            return "per-partition timestamps"
        return self.kind

    @property
    def named(self) -> PartitionOffsets:
        """The partitions a per-partition bound names, with their offsets or times."""
        return self.timestamps if self.kind == "timestamps" else self.offsets


@dataclass(frozen=True, slots=True)
class ReadOptions:
    """The source's validated options."""

    bootstrap_servers: str
    subscription: Subscription
    starting: OffsetBound | None
    """None: not given (batch: earliest, streaming: latest)."""
    starting_by_timestamp_strategy: Literal["error", "latest"]
    """A start by time in a partition with no record at or after the time: fail the query,
    or start the partition at its latest offset. An end by time there is the latest offset
    whatever this says, as in spark-sql-kafka."""
    ending: OffsetBound | None
    max_offsets_per_trigger: int | None
    min_offsets_per_trigger: int | None
    """A micro-batch waits until this many records wait, or ``max_trigger_delay_ms`` passed
    since the last one ran."""
    max_trigger_delay_ms: int
    min_partitions: int | None
    max_records_per_partition: int | None
    fail_on_data_loss: bool
    include_headers: bool
    poll_timeout_ms: int
    client_config: dict[str, Any]

    def consumer_config(self) -> dict[str, Any]:
        """The settings of the consumers the source reads with (no group: offsets stay in
        Spark's checkpoint)."""
        return {
            **self.client_config,
            "bootstrap.servers": self.bootstrap_servers,
            "auto.offset.reset": "none",
            "enable.auto.commit": False,
        }

    def batch_bounds(self) -> tuple[OffsetBound, OffsetBound]:
        """Start and end of a batch query (earliest to latest unless given), checked as
        spark-sql-kafka checks them."""
        start = self.starting or OffsetBound("earliest")
        end = self.ending or OffsetBound("latest")
        if start.kind == "latest":
            raise HighwaterOptionError(
                "startingOffsets=latest is not allowed in a batch query (it would read nothing)"
            )
        if end.kind == "earliest":
            raise HighwaterOptionError(
                "endingOffsets=earliest is not allowed in a batch query (it would read nothing)"
            )
        if start.kind == "offsets" and LATEST in start.offsets.values():
            raise HighwaterOptionError(
                "startingOffsets: -1 (latest) is not allowed in a batch query"
            )
        if end.kind == "offsets" and EARLIEST in end.offsets.values():
            raise HighwaterOptionError(
                "endingOffsets: -2 (earliest) is not allowed in a batch query"
            )
        if start.kind == "timestamps" and end.kind == "timestamps":
            _check_times_in_order(start, end)
        return start, end

    def stream_start(self) -> OffsetBound:
        """Where a new streaming query starts (latest unless given); a streaming query
        has no end, so ``endingOffsets`` is refused."""
        if self.ending is not None:
            raise HighwaterOptionError(
                f"{self.ending.option or 'endingOffsets'} applies to batch queries only (as "
                "endingOffsets, endingOffsetsByTimestamp and endingTimestamp do); a streaming "
                "query reads on until it is stopped (use Trigger.AvailableNow to stop at the "
                "offsets available when it starts)"
            )
        return self.starting or OffsetBound("latest")


@dataclass(frozen=True, slots=True)
class WriteOptions:
    """The sink's validated options."""

    bootstrap_servers: str
    topic: str | None
    client_config: dict[str, Any]

    def producer_config(self) -> dict[str, Any]:
        """The settings of the producers the sink writes with (idempotent by default)."""
        return {**self.client_config, "bootstrap.servers": self.bootstrap_servers}


def _lowered(options: Mapping[str, str]) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in options.items()}


def _check_known(options: Mapping[str, str], known: tuple[str, ...], what: str) -> dict[str, str]:
    """The options that are neither Spark's own nor prefixed; unknown ones raise."""
    names = {name.lower(): name for name in known}
    for key in options:
        if key in names or key in _SPARK_OPTIONS or key.startswith(CLIENT_PREFIX):
            continue
        # the same name with dots moved or left out, or under a prefix
        # (spark-sql-kafka's kafkaConsumer.pollTimeoutMs)
        close = [
            names[n]
            for n in names
            if n.replace(".", "") == key.replace(".", "") or n == key.rsplit(".", 1)[-1]
        ]
        if key.startswith(_SPARK_KAFKA_PREFIX):
            # spark-sql-kafka's kafka.<setting>: ours is highwater.<setting>, and
            # bootstrap.servers has no prefix
            setting = key[len(_SPARK_KAFKA_PREFIX) :]
            close = [names.get(setting, CLIENT_PREFIX + setting)]
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise HighwaterOptionError(
            f"unknown option {key!r} for the Highwater {what}{hint}; known options: "
            + ", ".join(known)
            + f", and client settings as {CLIENT_PREFIX}<setting>"
        )
    return {k: v for k, v in options.items() if k in names}


def _client_settings(
    options: Mapping[str, str], allowed: tuple[str, ...], owned: frozenset[str], what: str
) -> dict[str, Any]:
    settings: dict[str, Any] = {}
    for key, value in options.items():
        if not key.startswith(CLIENT_PREFIX):
            continue
        name = key[len(CLIENT_PREFIX) :]
        if name not in allowed or name in owned:
            raise HighwaterOptionError(
                f"option {key!r}: {name!r} is not a {what} setting the Highwater "
                f"{'source' if what == 'consumer' else 'sink'} passes on"
            )
        settings[name] = value
    return settings


def _positive_int(options: Mapping[str, str], name: str) -> int | None:
    raw = options.get(name.lower())
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise HighwaterOptionError(f"{name} must be a whole number, not {raw!r}") from None
    if value <= 0:
        raise HighwaterOptionError(f"{name} must be > 0, not {value}")
    return value


def _duration_ms(options: Mapping[str, str], name: str, default: int) -> int:
    """A duration as Spark writes them: ``15m``, ``30s``, ``500ms``, ``2h``; a bare number is
    milliseconds."""
    raw = options.get(name.lower())
    if raw is None:
        return default
    found = re.fullmatch(r"\s*(\d+)\s*([a-z]*)\s*", raw.lower())
    if found is None or found.group(2) not in ("", *_DURATION_UNITS):
        raise HighwaterOptionError(
            f"{name} must be a duration such as 500ms, 30s, 15m or 1h, not {raw!r}"
        )
    return int(int(found.group(1)) * _DURATION_UNITS.get(found.group(2), 1))


def _boolean(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = options.get(name.lower())
    if raw is None:
        return default
    lowered = raw.strip().lower()
    if lowered not in ("true", "false"):
        raise HighwaterOptionError(f"{name} must be true or false, not {raw!r}")
    return lowered == "true"


def _bootstrap(options: Mapping[str, str]) -> str:
    servers = options.get("bootstrap.servers", "").strip()
    if not servers:
        raise HighwaterOptionError(
            "option bootstrap.servers is required: HOST:PORT of one or more brokers"
        )
    return servers


def _subscription(options: Mapping[str, str]) -> Subscription:
    given = [
        name for name in ("subscribe", "subscribePattern", "assign") if name.lower() in options
    ]
    if len(given) != 1:
        raise HighwaterOptionError(
            "exactly one of subscribe, subscribePattern and assign must be given"
            + (f", not {' and '.join(given)}" if given else "")
        )
    kind = given[0]
    raw = options[kind.lower()].strip()
    if kind == "subscribe":
        topics = tuple(dict.fromkeys(t.strip() for t in raw.split(",") if t.strip()))
        if not topics:
            raise HighwaterOptionError("subscribe: give one or more topic names, comma-separated")
        return Subscription("subscribe", topics=topics)
    if kind == "subscribePattern":
        if not raw:
            raise HighwaterOptionError("subscribePattern: the pattern is empty")
        try:
            re.compile(raw)
        except re.error as e:
            raise HighwaterOptionError(f"subscribePattern: invalid pattern {raw!r}: {e}") from None
        return Subscription("subscribePattern", pattern=raw)
    return Subscription("assign", partitions=_assign_partitions(raw))


def _assign_partitions(raw: str) -> tuple[TopicPartitionKey, ...]:
    """``{"topic": [0, 1]}`` (spark-sql-kafka's form)."""
    try:
        document = json.loads(raw)
    except json.JSONDecodeError as e:
        raise HighwaterOptionError(
            f'assign: not valid JSON ({e.msg} at character {e.pos}); expected {{"topic": [0, 1]}}'
        ) from None
    if not isinstance(document, dict) or not document:
        raise HighwaterOptionError('assign: expected a JSON object like {"topic": [0, 1]}')
    partitions: list[TopicPartitionKey] = []
    for topic, listed in document.items():
        if not isinstance(listed, list) or not listed:
            raise HighwaterOptionError(
                f"assign: topic {topic!r} must map to a non-empty list of partitions"
            )
        for partition in listed:
            if isinstance(partition, bool) or not isinstance(partition, int) or partition < 0:
                raise HighwaterOptionError(
                    f"assign: partition {partition!r} of topic {topic!r} is not a number >= 0"
                )
            partitions.append((topic, partition))
    return tuple(sorted(set(partitions)))


def _check_times_in_order(start: OffsetBound, end: OffsetBound) -> None:
    """Per-partition start and end times name the same partitions, and no start is after
    its end (spark-sql-kafka checks both before it asks the cluster)."""
    for tp in sorted(start.timestamps.keys() ^ end.timestamps.keys()):
        has = "a start and no end" if tp in start.timestamps else "an end and no start"
        raise HighwaterOptionError(
            f"{start.option} and {end.option} must name the same partitions: "
            f"{tp[0]}-{tp[1]} has {has}"
        )
    for tp, began in sorted(start.timestamps.items()):
        if began > end.timestamps[tp]:
            raise HighwaterOptionError(
                f"{start.option}: {tp[0]}-{tp[1]} starts at timestamp {began}, after its end "
                f"at timestamp {end.timestamps[tp]} ({end.option})"
            )


def _bound(
    options: Mapping[str, str], offsets_name: str, by_timestamp_name: str, timestamp_name: str
) -> OffsetBound | None:
    """The bound the options give, by spark-sql-kafka's precedence: ``timestamp_name``
    (one time for every partition) over ``by_timestamp_name`` (per-partition times) over
    ``offsets_name``; the options below the one used are ignored, as Spark ignores them."""
    raw = options.get(offsets_name.lower())
    raw_by_ts = options.get(by_timestamp_name.lower())
    raw_ts = options.get(timestamp_name.lower())
    if raw_ts is not None:
        try:
            timestamp = int(raw_ts)
        except ValueError:
            raise HighwaterOptionError(
                f"{timestamp_name} must be milliseconds since the epoch, not {raw_ts!r}"
            ) from None
        if timestamp < 0:
            raise HighwaterOptionError(f"{timestamp_name} must be >= 0, not {timestamp}")
        return OffsetBound("timestamp", timestamp=timestamp, option=timestamp_name)
    if raw_by_ts is not None:
        try:
            timestamps = parse_timestamps_json(raw_by_ts.strip(), by_timestamp_name)
        except OffsetJsonError as e:
            raise HighwaterOptionError(str(e)) from None
        return OffsetBound("timestamps", timestamps=timestamps, option=by_timestamp_name)
    if raw is None:
        return None
    text = raw.strip()
    if text.lower() in ("earliest", "latest"):
        return OffsetBound(
            "earliest" if text.lower() == "earliest" else "latest", option=offsets_name
        )
    try:
        return OffsetBound(
            "offsets", offsets=parse_offsets_json(text, offsets_name), option=offsets_name
        )
    except OffsetJsonError as e:
        raise HighwaterOptionError(str(e)) from None


def _timestamp_strategy(options: Mapping[str, str]) -> Literal["error", "latest"]:
    raw = options.get("startingoffsetsbytimestampstrategy")
    if raw is None:
        return "error"
    lowered = raw.strip().lower()
    if lowered == "latest":
        return "latest"
    if lowered == "error":
        return "error"
    raise HighwaterOptionError(
        f"startingOffsetsByTimestampStrategy must be {' or '.join(TIMESTAMP_STRATEGIES)}, "
        f"not {raw!r}"
    )


def parse_read_options(
    options: Mapping[str, str], *, check_client_settings: bool = True
) -> ReadOptions:
    """Validate the source's options (see :data:`READ_OPTIONS`).

    ``check_client_settings=False`` passes the ``highwater.<setting>`` options on unchecked,
    for options already checked when the DataFrame was defined: checking them imports the
    consumer, most of what a Python process that only plans a read would import.
    """
    lowered = _lowered(options)
    known = _check_known(lowered, READ_OPTIONS, "source")
    subscription = _subscription(known)
    starting = _bound(known, "startingOffsets", "startingOffsetsByTimestamp", "startingTimestamp")
    ending = _bound(known, "endingOffsets", "endingOffsetsByTimestamp", "endingTimestamp")
    for bound in (starting, ending):
        if bound is not None and bound.kind in ("offsets", "timestamps"):
            _check_bound_partitions(bound.named, subscription, bound.option)
    bootstrap = _bootstrap(known)
    if check_client_settings:
        from highwater.client.consumer import CONSUMER_CONFIG_DEF, ConsumerConfig

        settings = _client_settings(
            lowered, CONSUMER_CONFIG_DEF.names(), _OWNED_CONSUMER_KEYS, "consumer"
        )
        try:
            ConsumerConfig.parse({**settings, "bootstrap.servers": bootstrap})
        except InvalidConfigError as e:
            raise HighwaterOptionError(str(e)) from None
    else:
        settings = {
            key[len(CLIENT_PREFIX) :]: value
            for key, value in lowered.items()
            if key.startswith(CLIENT_PREFIX)
        }
    poll_timeout = _positive_int(known, "pollTimeoutMs")
    max_per_trigger = _positive_int(known, "maxOffsetsPerTrigger")
    min_per_trigger = _positive_int(known, "minOffsetsPerTrigger")
    if (
        max_per_trigger is not None
        and min_per_trigger is not None
        and min_per_trigger > max_per_trigger
    ):
        raise HighwaterOptionError(
            f"minOffsetsPerTrigger ({min_per_trigger}) is above maxOffsetsPerTrigger "
            f"({max_per_trigger})"
        )
    return ReadOptions(
        bootstrap_servers=bootstrap,
        subscription=subscription,
        starting=starting,
        starting_by_timestamp_strategy=_timestamp_strategy(known),
        ending=ending,
        max_offsets_per_trigger=max_per_trigger,
        min_offsets_per_trigger=min_per_trigger,
        max_trigger_delay_ms=_duration_ms(known, "maxTriggerDelay", DEFAULT_MAX_TRIGGER_DELAY_MS),
        min_partitions=_positive_int(known, "minPartitions"),
        max_records_per_partition=_positive_int(known, "maxRecordsPerPartition"),
        fail_on_data_loss=_boolean(known, "failOnDataLoss", True),
        include_headers=_boolean(known, "includeHeaders", False),
        poll_timeout_ms=poll_timeout if poll_timeout is not None else 30000,
        client_config=settings,
    )


def _check_bound_partitions(
    offsets: PartitionOffsets, subscription: Subscription, option: str
) -> None:
    """Per-partition offsets or times may only name partitions the subscription reads."""
    for topic, partition in offsets:
        if subscription.kind == "assign":
            inside = (topic, partition) in subscription.partitions
        else:
            inside = subscription.matches(topic)
        if not inside:
            raise HighwaterOptionError(
                f"{option} names {topic}-{partition}, which {subscription.describe()} does not read"
            )


def parse_write_options(options: Mapping[str, str]) -> WriteOptions:
    """Validate the sink's options (see :data:`WRITE_OPTIONS`)."""
    from highwater.client.producer import PRODUCER_CONFIG_DEF, ProducerConfig

    lowered = _lowered(options)
    known = _check_known(lowered, WRITE_OPTIONS, "sink")
    settings = _client_settings(
        lowered, PRODUCER_CONFIG_DEF.names(), frozenset({"bootstrap.servers"}), "producer"
    )
    bootstrap = _bootstrap(known)
    try:
        ProducerConfig.parse({**settings, "bootstrap.servers": bootstrap})
    except InvalidConfigError as e:
        raise HighwaterOptionError(str(e)) from None
    topic = known.get("topic")
    if topic is not None and not topic.strip():
        raise HighwaterOptionError("topic: the topic name is empty")
    return WriteOptions(
        bootstrap_servers=bootstrap,
        topic=topic.strip() if topic is not None else None,
        client_config=settings,
    )
