"""Topic-level configuration (``LogConfig``): Kafka's topic settings, names, types and defaults.

These are the per-topic settings the storage engine (segment rolling, indexes, retention,
compaction, flushing) and the brokers (``min.insync.replicas``, unclean election,
timestamps, compression) read. A topic's effective config is the defaults with the
topic's overrides applied; the metadata log stores only the overrides
(:meth:`LogConfig.overrides`), in their Kafka string forms.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Final

from highwater.config.definition import (
    UNLIMITED,
    ConfigDef,
    ConfigKey,
    ConfigType,
    ConfigValue,
    RawValue,
    at_least,
    between,
    list_of,
    one_of,
)
from highwater.config.limits import BATCH_MAX_BYTES

CLEANUP_POLICY_DELETE: Final = "delete"
CLEANUP_POLICY_COMPACT: Final = "compact"

TIMESTAMP_TYPE_CREATE_TIME: Final = "CreateTime"
TIMESTAMP_TYPE_LOG_APPEND_TIME: Final = "LogAppendTime"

COMPRESSION_TYPES: Final = ("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer")

# Kafka's LegacyRecord.RECORD_OVERHEAD_V0: the smallest segment.bytes it accepts.
_MIN_SEGMENT_BYTES: Final = 14

_LONG = ConfigType.LONG
_INT = ConfigType.INT

LOG_CONFIG_DEF: Final = ConfigDef(
    [
        ConfigKey(
            "segment.bytes",
            _INT,
            1073741824,
            at_least(_MIN_SEGMENT_BYTES),
            "The size in bytes at which the active segment is rolled and a new one started.",
        ),
        ConfigKey(
            "segment.ms",
            _LONG,
            604800000,
            at_least(1),
            "Roll the active segment after this many milliseconds even if it is not full, "
            "so retention and compaction can act on old data.",
        ),
        ConfigKey(
            "segment.jitter.ms",
            _LONG,
            0,
            at_least(0),
            "The largest random amount subtracted from segment.ms, so that partitions "
            "created together do not all roll at the same moment.",
        ),
        ConfigKey(
            "segment.index.bytes",
            _INT,
            10485760,
            at_least(4),
            "The size in bytes preallocated for a segment's offset index (and time index); "
            "a full index rolls the segment.",
        ),
        ConfigKey(
            "index.interval.bytes",
            _INT,
            4096,
            at_least(0),
            "How many bytes of batches to append between two offset index entries; "
            "smaller means a denser index and shorter scans on fetch.",
        ),
        ConfigKey(
            "retention.ms",
            _LONG,
            604800000,
            at_least(-1),
            "How long to keep a segment before deleting it, with the delete cleanup "
            "policy; -1 keeps data forever.",
        ),
        ConfigKey(
            "retention.bytes",
            _LONG,
            -1,
            None,
            "The largest size a partition may grow to before whole old segments are "
            "deleted, with the delete cleanup policy; -1 means no size limit.",
        ),
        ConfigKey(
            "cleanup.policy",
            ConfigType.LIST,
            CLEANUP_POLICY_DELETE,
            list_of(CLEANUP_POLICY_COMPACT, CLEANUP_POLICY_DELETE),
            "What happens to old segments: 'delete' removes them by time or size, "
            "'compact' keeps the latest record per key; both may be given.",
        ),
        ConfigKey(
            "delete.retention.ms",
            _LONG,
            86400000,
            at_least(0),
            "How long a compacted topic keeps delete tombstones, so that a consumer "
            "reading from the start sees the deletion.",
        ),
        ConfigKey(
            "min.compaction.lag.ms",
            _LONG,
            0,
            at_least(0),
            "The minimum time a record stays uncompacted in the log.",
        ),
        ConfigKey(
            "max.compaction.lag.ms",
            _LONG,
            UNLIMITED,
            at_least(1),
            "The maximum time a record may stay uncompacted: the log becomes eligible for "
            "compaction after it whatever its dirty ratio.",
        ),
        ConfigKey(
            "min.cleanable.dirty.ratio",
            ConfigType.DOUBLE,
            0.5,
            between(0, 1),
            "The share of the log that must be uncompacted (dirty) before the cleaner compacts it.",
        ),
        ConfigKey(
            "file.delete.delay.ms",
            _LONG,
            60000,
            at_least(0),
            "How long a segment renamed .deleted stays on disk before it is removed.",
        ),
        ConfigKey(
            "flush.messages",
            _LONG,
            UNLIMITED,
            at_least(1),
            "Force an fsync of the log after this many messages; the default leaves "
            "durability to replication and the operating system.",
        ),
        ConfigKey(
            "flush.ms",
            _LONG,
            UNLIMITED,
            at_least(0),
            "Force an fsync of the log when this many milliseconds passed since the last one; "
            "the default leaves durability to replication and the operating system.",
        ),
        ConfigKey(
            "max.message.bytes",
            _INT,
            1048588,
            between(0, BATCH_MAX_BYTES),
            "The largest record batch, after compression, the topic accepts; at most 63 MiB, "
            "so that a batch is replicated and fetched in one gRPC message.",
        ),
        ConfigKey(
            "message.timestamp.type",
            ConfigType.STRING,
            TIMESTAMP_TYPE_CREATE_TIME,
            one_of(TIMESTAMP_TYPE_CREATE_TIME, TIMESTAMP_TYPE_LOG_APPEND_TIME),
            "Whether record timestamps are the producer's (CreateTime) or the broker's "
            "append time (LogAppendTime).",
        ),
        ConfigKey(
            "message.timestamp.before.max.ms",
            _LONG,
            UNLIMITED,
            at_least(0),
            "With CreateTime, how far a record timestamp may lie before the broker's clock.",
        ),
        ConfigKey(
            "message.timestamp.after.max.ms",
            _LONG,
            3600000,
            at_least(0),
            "With CreateTime, how far a record timestamp may lie after the broker's clock.",
        ),
        ConfigKey(
            "min.insync.replicas",
            _INT,
            1,
            at_least(1),
            "The fewest in-sync replicas, leader included, that must have a batch before an "
            "acks=all produce succeeds; with fewer the produce fails with "
            "NOT_ENOUGH_REPLICAS.",
        ),
        ConfigKey(
            "unclean.leader.election.enable",
            ConfigType.BOOLEAN,
            False,
            None,
            "Whether a replica outside the ISR may become leader when no ISR member is "
            "alive; this can lose acknowledged records.",
        ),
        ConfigKey(
            "compression.type",
            ConfigType.STRING,
            "producer",
            one_of(*COMPRESSION_TYPES),
            "The compression of stored batches: 'producer' keeps what the producer sent, "
            "the others recompress to that codec.",
        ),
        ConfigKey(
            "preallocate",
            ConfigType.BOOLEAN,
            False,
            None,
            "Whether to preallocate the file of a new segment.",
        ),
    ]
)


@dataclass(frozen=True, slots=True)
class LogConfig:
    """The effective configuration of one topic's logs; ``LogConfig()`` is Kafka's defaults.

    Construct from user input with :meth:`from_properties`; constructing directly also
    validates every field. Attribute names are the Kafka names with ``_`` for ``.``.
    """

    segment_bytes: int = 1073741824
    segment_ms: int = 604800000
    segment_jitter_ms: int = 0
    segment_index_bytes: int = 10485760
    index_interval_bytes: int = 4096
    retention_ms: int = 604800000
    retention_bytes: int = -1
    cleanup_policy: tuple[str, ...] = (CLEANUP_POLICY_DELETE,)
    delete_retention_ms: int = 86400000
    min_compaction_lag_ms: int = 0
    max_compaction_lag_ms: int = UNLIMITED
    min_cleanable_dirty_ratio: float = 0.5
    file_delete_delay_ms: int = 60000
    flush_messages: int = UNLIMITED
    flush_ms: int = UNLIMITED
    max_message_bytes: int = 1048588
    message_timestamp_type: str = TIMESTAMP_TYPE_CREATE_TIME
    message_timestamp_before_max_ms: int = UNLIMITED
    message_timestamp_after_max_ms: int = 3600000
    min_insync_replicas: int = 1
    unclean_leader_election_enable: bool = False
    compression_type: str = "producer"
    preallocate: bool = False

    DEFINITION: ClassVar[ConfigDef] = LOG_CONFIG_DEF

    def __post_init__(self) -> None:
        # Validate (and normalize, e.g. a list given for cleanup_policy) every field, so a
        # LogConfig built directly is as trustworthy as one from from_properties().
        for key in self.DEFINITION:
            value = getattr(self, key.attr_name)
            parsed = key.parse(value)
            if parsed != value or type(parsed) is not type(value):
                object.__setattr__(self, key.attr_name, parsed)

    @classmethod
    def from_properties(cls, props: Mapping[str, RawValue | ConfigValue]) -> LogConfig:
        """Build from Kafka-named properties, defaults for the rest.

        Raises :class:`~highwater.errors.InvalidConfigError` for an unknown key or a bad value.
        """
        parsed = cls.DEFINITION.parse(props)
        return cls(**{cls.DEFINITION[name].attr_name: value for name, value in parsed.items()})

    def with_overrides(self, props: Mapping[str, RawValue | ConfigValue]) -> LogConfig:
        """This config with ``props`` (Kafka names) applied on top."""
        parsed = self.DEFINITION.parse(props, with_defaults=False)
        changes = {self.DEFINITION[name].attr_name: value for name, value in parsed.items()}
        return dataclasses.replace(self, **changes)

    def get(self, name: str) -> Any:
        """The value of the setting named ``name`` (a Kafka name such as ``retention.ms``)."""
        return getattr(self, self.DEFINITION.key(name).attr_name)

    def to_properties(self) -> dict[str, str]:
        """Every setting in its Kafka string form, keyed by Kafka name, in definition order."""
        return {key.name: key.to_string(getattr(self, key.attr_name)) for key in self.DEFINITION}

    def overrides(self) -> dict[str, str]:
        """Only the settings that differ from the defaults, in Kafka string form."""
        return {
            key.name: key.to_string(value)
            for key in self.DEFINITION
            if (value := getattr(self, key.attr_name)) != key.default
        }

    @property
    def compact(self) -> bool:
        """Whether ``cleanup.policy`` includes ``compact``."""
        return CLEANUP_POLICY_COMPACT in self.cleanup_policy

    @property
    def delete(self) -> bool:
        """Whether ``cleanup.policy`` includes ``delete``."""
        return CLEANUP_POLICY_DELETE in self.cleanup_policy


def _check_fields_match_definition() -> None:
    """Fail at import if the dataclass fields drift from the definition (names or defaults)."""
    fields = {f.name: f.default for f in dataclasses.fields(LogConfig)}
    keys = {key.attr_name: key.default for key in LOG_CONFIG_DEF}
    if fields != keys:
        raise RuntimeError(f"LogConfig fields {fields} do not match its definition {keys}")


_check_fields_match_definition()
