"""Tests of LogConfig, the topic-level settings: Kafka's names, defaults and validation."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from highwater.config.definition import (
    INT_MAX,
    INT_MIN,
    LONG_MAX,
    LONG_MIN,
    ConfigKey,
    ConfigType,
    Range,
    ValidList,
    ValidString,
)
from highwater.config.limits import BATCH_MAX_BYTES
from highwater.config.topic import LogConfig
from highwater.errors import InvalidConfigError
from highwater.rpc.channels import MAX_MESSAGE_BYTES
from hypothesis import given
from hypothesis import strategies as st

# Kafka's topic-level defaults, in the string form ``kafka-configs --describe --all`` shows.
KAFKA_DEFAULTS = {
    "segment.bytes": "1073741824",
    "segment.ms": "604800000",
    "segment.jitter.ms": "0",
    "segment.index.bytes": "10485760",
    "index.interval.bytes": "4096",
    "retention.ms": "604800000",
    "retention.bytes": "-1",
    "cleanup.policy": "delete",
    "delete.retention.ms": "86400000",
    "min.compaction.lag.ms": "0",
    "max.compaction.lag.ms": "9223372036854775807",
    "min.cleanable.dirty.ratio": "0.5",
    "file.delete.delay.ms": "60000",
    "flush.messages": "9223372036854775807",
    "flush.ms": "9223372036854775807",
    "max.message.bytes": "1048588",
    "message.timestamp.type": "CreateTime",
    "message.timestamp.before.max.ms": "9223372036854775807",
    "message.timestamp.after.max.ms": "3600000",
    "min.insync.replicas": "1",
    "unclean.leader.election.enable": "false",
    "compression.type": "producer",
    "preallocate": "false",
}

# Values Kafka refuses, per key.
INVALID_VALUES: list[tuple[str, object]] = [
    ("segment.bytes", "13"),
    ("segment.bytes", "0"),
    ("segment.bytes", "2147483648"),
    ("segment.bytes", "1GB"),
    ("segment.ms", "0"),
    ("segment.jitter.ms", "-1"),
    ("segment.index.bytes", "3"),
    ("index.interval.bytes", "-1"),
    ("retention.ms", "-2"),
    ("retention.ms", "forever"),
    ("retention.bytes", "9223372036854775808"),
    ("cleanup.policy", ""),
    ("cleanup.policy", "truncate"),
    ("cleanup.policy", "delete,,compact"),
    ("cleanup.policy", "Delete"),
    ("delete.retention.ms", "-1"),
    ("min.compaction.lag.ms", "-1"),
    ("max.compaction.lag.ms", "0"),
    ("min.cleanable.dirty.ratio", "1.01"),
    ("min.cleanable.dirty.ratio", "-0.1"),
    ("min.cleanable.dirty.ratio", "half"),
    ("min.cleanable.dirty.ratio", "NaN"),
    ("file.delete.delay.ms", "-1"),
    ("flush.messages", "0"),
    ("flush.ms", "-1"),
    ("max.message.bytes", "-1"),
    ("max.message.bytes", str(BATCH_MAX_BYTES + 1)),  # no gRPC message would carry it
    ("message.timestamp.type", "createtime"),
    ("message.timestamp.type", "Both"),
    ("message.timestamp.before.max.ms", "-1"),
    ("message.timestamp.after.max.ms", "-1"),
    ("min.insync.replicas", "0"),
    ("min.insync.replicas", "two"),
    ("unclean.leader.election.enable", "yes"),
    ("unclean.leader.election.enable", 1),
    ("compression.type", "brotli"),
    ("compression.type", "none"),
    ("preallocate", "on"),
]


def test_defaults_are_kafkas() -> None:
    assert LogConfig().to_properties() == KAFKA_DEFAULTS
    assert list(LogConfig().to_properties()) == list(KAFKA_DEFAULTS)


def test_empty_properties_give_the_defaults() -> None:
    assert LogConfig.from_properties({}) == LogConfig()
    assert LogConfig().overrides() == {}


def test_definition_covers_every_field() -> None:
    attrs = [f.name for f in dataclasses.fields(LogConfig)]
    assert attrs == [key.attr_name for key in LogConfig.DEFINITION]
    assert LogConfig.DEFINITION.names() == tuple(KAFKA_DEFAULTS)


def test_the_largest_batch_a_topic_may_take_fits_one_grpc_message() -> None:
    assert LogConfig.from_properties(
        {"max.message.bytes": str(BATCH_MAX_BYTES)}
    ).max_message_bytes == (BATCH_MAX_BYTES)
    assert BATCH_MAX_BYTES == MAX_MESSAGE_BYTES - (1 << 20)


def test_typed_defaults() -> None:
    config = LogConfig()
    assert config.segment_bytes == 1073741824
    assert config.cleanup_policy == ("delete",)
    assert config.min_cleanable_dirty_ratio == 0.5
    assert config.unclean_leader_election_enable is False
    assert config.max_compaction_lag_ms == 2**63 - 1
    assert config.delete
    assert not config.compact


def test_string_parsing() -> None:
    config = LogConfig.from_properties(
        {
            "segment.bytes": "1048576",
            "retention.ms": "-1",
            "retention.bytes": " 1073741824 ",
            "cleanup.policy": "compact, delete",
            "min.cleanable.dirty.ratio": "0.1",
            "message.timestamp.type": "LogAppendTime",
            "min.insync.replicas": "2",
            "unclean.leader.election.enable": "TRUE",
            "compression.type": "zstd",
            "preallocate": "true",
            "flush.messages": "9223372036854775807",
        }
    )
    assert config.segment_bytes == 1048576
    assert config.retention_ms == -1
    assert config.retention_bytes == 1073741824
    assert config.cleanup_policy == ("compact", "delete")
    assert config.compact
    assert config.delete
    assert config.min_cleanable_dirty_ratio == 0.1
    assert config.message_timestamp_type == "LogAppendTime"
    assert config.min_insync_replicas == 2
    assert config.unclean_leader_election_enable is True
    assert config.compression_type == "zstd"
    assert config.preallocate is True
    assert config.flush_messages == LONG_MAX


def test_typed_values_are_accepted() -> None:
    config = LogConfig.from_properties(
        {
            "segment.ms": 1000,
            "cleanup.policy": ["compact"],
            "preallocate": True,
            "min.cleanable.dirty.ratio": 1,
        }
    )
    assert config.segment_ms == 1000
    assert config.cleanup_policy == ("compact",)
    assert config.compact
    assert not config.delete
    assert config.min_cleanable_dirty_ratio == 1.0
    assert isinstance(config.min_cleanable_dirty_ratio, float)


@pytest.mark.parametrize(("name", "value"), INVALID_VALUES)
def test_invalid_values_name_key_value_and_allowed(name: str, value: object) -> None:
    with pytest.raises(InvalidConfigError) as info:
        LogConfig.from_properties({name: value})  # type: ignore[dict-item]
    message = str(info.value)
    assert name in message
    assert repr(value)[:50] in message
    assert "allowed: " in message


@pytest.mark.parametrize(("name", "value"), INVALID_VALUES)
def test_invalid_overrides_are_rejected_too(name: str, value: object) -> None:
    with pytest.raises(InvalidConfigError, match=name.replace(".", r"\.")):
        LogConfig().with_overrides({name: value})  # type: ignore[dict-item]


@pytest.mark.parametrize(
    "name", ["segment.size", "retention.hours", "log.retention.ms", "Segment.bytes", ""]
)
def test_unknown_keys_are_rejected(name: str) -> None:
    with pytest.raises(InvalidConfigError) as info:
        LogConfig.from_properties({name: "1"})
    assert repr(name) in str(info.value)


def test_unknown_key_suggests_the_known_one() -> None:
    with pytest.raises(InvalidConfigError, match=r"did you mean retention\.ms\?"):
        LogConfig.from_properties({"retention.msec": "1"})


def test_direct_construction_validates_and_normalizes() -> None:
    with pytest.raises(InvalidConfigError, match=r"segment\.bytes"):
        LogConfig(segment_bytes=5)
    with pytest.raises(InvalidConfigError, match=r"cleanup\.policy"):
        LogConfig(cleanup_policy=("shred",))
    config = LogConfig(cleanup_policy=["compact"], min_cleanable_dirty_ratio=1)  # type: ignore[arg-type]
    assert config.cleanup_policy == ("compact",)
    assert isinstance(config.min_cleanable_dirty_ratio, float)
    assert hash(config) == hash(
        LogConfig.from_properties({"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "1.0"})
    )


def test_frozen_with_slots() -> None:
    config = LogConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.segment_bytes = 100  # type: ignore[misc]
    assert not hasattr(config, "__dict__")


def test_with_overrides_and_overrides() -> None:
    base = LogConfig.from_properties({"cleanup.policy": "compact"})
    derived = base.with_overrides({"retention.ms": "-1", "min.insync.replicas": 2})
    assert derived.compact
    assert derived.retention_ms == -1
    assert derived.min_insync_replicas == 2
    assert base.retention_ms == 604800000  # unchanged
    assert derived.overrides() == {
        "retention.ms": "-1",
        "cleanup.policy": "compact",
        "min.insync.replicas": "2",
    }
    # Setting a value back to its default removes it from the overrides.
    assert derived.with_overrides({"retention.ms": "604800000"}).overrides() == {
        "cleanup.policy": "compact",
        "min.insync.replicas": "2",
    }
    assert LogConfig.from_properties(derived.overrides()) == derived


def test_get_by_kafka_name() -> None:
    config = LogConfig.from_properties({"retention.bytes": "100"})
    assert config.get("retention.bytes") == 100
    assert config.get("cleanup.policy") == ("delete",)
    with pytest.raises(InvalidConfigError, match=r"retention\.byte"):
        config.get("retention.byte")


def test_describe_lists_every_key_with_docs() -> None:
    lines = LogConfig.DEFINITION.describe()
    assert [line.name for line in lines] == list(KAFKA_DEFAULTS)
    by_name = {line.name: line for line in lines}
    for name, default in KAFKA_DEFAULTS.items():
        assert by_name[name].default == default
        assert by_name[name].documentation
    assert by_name["segment.bytes"].type == "int"
    assert by_name["segment.bytes"].valid_values == "[14,...]"
    assert by_name["retention.ms"].type == "long"
    assert by_name["retention.ms"].valid_values == "[-1,...]"
    assert by_name["min.cleanable.dirty.ratio"].valid_values == "[0,...,1]"
    assert by_name["cleanup.policy"].type == "list"
    assert by_name["cleanup.policy"].valid_values == "[compact, delete]"
    assert by_name["message.timestamp.type"].valid_values == "[CreateTime, LogAppendTime]"
    assert set(by_name["compression.type"].valid_values.strip("[]").split(", ")) == {
        "producer",
        "uncompressed",
        "gzip",
        "snappy",
        "lz4",
        "zstd",
    }


# --- Properties ------------------------------------------------------------------------


def valid_values(key: ConfigKey) -> st.SearchStrategy[Any]:
    """Every value ``key`` accepts, derived from its type and validator."""
    validator = key.validator
    if key.type is ConfigType.BOOLEAN:
        return st.booleans()
    if isinstance(validator, ValidString):
        return st.sampled_from(validator.choices)
    if isinstance(validator, ValidList):
        return st.lists(st.sampled_from(validator.choices), min_size=1).map(tuple)
    if key.type is ConfigType.DOUBLE:
        assert isinstance(validator, Range)
        return st.floats(validator.min, validator.max, allow_nan=False)
    assert key.type in (ConfigType.INT, ConfigType.LONG)
    low, high = (INT_MIN, INT_MAX) if key.type is ConfigType.INT else (LONG_MIN, LONG_MAX)
    if isinstance(validator, Range):
        low = int(validator.min) if validator.min is not None else low
        high = int(validator.max) if validator.max is not None else high
    return st.integers(low, high)


def configs() -> st.SearchStrategy[LogConfig]:
    return st.fixed_dictionaries(
        {},
        optional={key.attr_name: valid_values(key) for key in LogConfig.DEFINITION},
    ).map(lambda fields: LogConfig(**fields))


@given(configs())
def test_round_trip_through_properties(config: LogConfig) -> None:
    props = config.to_properties()
    assert all(isinstance(v, str) for v in props.values())
    assert LogConfig.from_properties(props) == config
    assert LogConfig.from_properties(config.overrides()) == config
    assert LogConfig().with_overrides(config.overrides()) == config


@given(configs(), configs())
def test_overrides_apply_on_top(base: LogConfig, other: LogConfig) -> None:
    merged = base.with_overrides(other.overrides())
    for key in LogConfig.DEFINITION:
        expected = other if key.name in other.overrides() else base
        assert getattr(merged, key.attr_name) == getattr(expected, key.attr_name)


@given(st.dictionaries(st.sampled_from(list(KAFKA_DEFAULTS)), st.text(max_size=12), max_size=4))
def test_arbitrary_text_is_accepted_or_invalid_config(props: dict[str, str]) -> None:
    try:
        config = LogConfig.from_properties(props)
    except InvalidConfigError:
        return
    assert LogConfig.from_properties(config.to_properties()) == config
