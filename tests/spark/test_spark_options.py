"""The Spark source's and sink's options: validation and clear errors before a query starts."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from pyspark_highwater.options import (
    HighwaterOptionError,
    OffsetBound,
    Subscription,
    parse_read_options,
    parse_write_options,
)

BOOTSTRAP = {"bootstrap.servers": "127.0.0.1:9092"}


def read(**options: str) -> dict[str, str]:
    return {**BOOTSTRAP, **options}


def test_defaults_read_from_earliest_in_batch_and_latest_in_streams() -> None:
    options = parse_read_options(read(subscribe="a, b"))
    assert options.subscription == Subscription("subscribe", topics=("a", "b"))
    assert options.batch_bounds() == (OffsetBound("earliest"), OffsetBound("latest"))
    assert options.stream_start() == OffsetBound("latest")
    assert options.fail_on_data_loss and not options.include_headers
    assert options.consumer_config()["auto.offset.reset"] == "none"
    assert "group.id" not in options.consumer_config()


def test_option_names_are_case_insensitive_as_spark_passes_them_lowered() -> None:
    options = parse_read_options(
        {"bootstrap.servers": "h:1", "subscribepattern": "ord.*", "maxoffsetspertrigger": "50"}
    )
    assert options.subscription.matches("orders") and not options.subscription.matches("xorders")
    assert options.max_offsets_per_trigger == 50


def test_min_offsets_per_trigger_waits_at_most_max_trigger_delay() -> None:
    options = parse_read_options(read(subscribe="a", minOffsetsPerTrigger="100"))
    assert options.min_offsets_per_trigger == 100
    assert options.max_trigger_delay_ms == 15 * 60_000  # spark-sql-kafka's default, 15m
    for given, ms in (("250", 250), ("250ms", 250), ("30s", 30_000), ("2 min", 120_000)):
        delayed = parse_read_options(
            read(subscribe="a", minOffsetsPerTrigger="1", maxTriggerDelay=given)
        )
        assert delayed.max_trigger_delay_ms == ms
    assert parse_read_options(read(subscribe="a")).min_offsets_per_trigger is None


def test_assign_takes_spark_sql_kafka_json() -> None:
    options = parse_read_options(read(assign='{"a": [1, 0], "b": [2]}'))
    assert options.subscription.partitions == (("a", 0), ("a", 1), ("b", 2))


def test_per_partition_offsets_and_timestamps_parse() -> None:
    options = parse_read_options(
        read(subscribe="a", startingOffsets='{"a": {"0": 5}}', endingTimestamp="1700000000000")
    )
    assert options.starting == OffsetBound("offsets", offsets={("a", 0): 5})
    assert options.ending == OffsetBound("timestamp", timestamp=1700000000000)


def test_timestamps_win_over_offsets_as_spark_sql_kafka_s_precedence() -> None:
    """startingTimestamp over startingOffsetsByTimestamp over startingOffsets, and the same
    for the ends: the others are ignored, not refused."""
    every = read(
        subscribe="a",
        startingTimestamp="100",
        startingOffsetsByTimestamp='{"a": {"0": 200}}',
        startingOffsets="earliest",
        endingTimestamp="900",
        endingOffsetsByTimestamp='{"a": {"0": 800}}',
        endingOffsets="latest",
    )
    options = parse_read_options(every)
    assert options.starting == OffsetBound("timestamp", timestamp=100)
    assert options.ending == OffsetBound("timestamp", timestamp=900)
    del every["startingTimestamp"], every["endingTimestamp"]
    options = parse_read_options(every)
    assert options.starting == OffsetBound("timestamps", timestamps={("a", 0): 200})
    assert options.ending == OffsetBound("timestamps", timestamps={("a", 0): 800})
    assert options.starting.option == "startingOffsetsByTimestamp"
    assert options.batch_bounds() == (options.starting, options.ending)
    del every["startingOffsetsByTimestamp"], every["endingOffsetsByTimestamp"]
    options = parse_read_options(every)
    assert options.starting == OffsetBound("earliest")
    assert options.ending == OffsetBound("latest")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            read(
                subscribe="a",
                startingOffsetsByTimestamp='{"a": {"0": 5, "1": 5}}',
                endingOffsetsByTimestamp='{"a": {"0": 9}}',
            ),
            "startingOffsetsByTimestamp and endingOffsetsByTimestamp must name the same "
            "partitions: a-1 has a start and no end",
        ),
        (
            read(
                subscribe="a",
                startingOffsetsByTimestamp='{"a": {"0": 5, "1": 10}}',
                endingOffsetsByTimestamp='{"a": {"0": 9, "1": 9}}',
            ),
            "a-1 starts at timestamp 10, after its end at timestamp 9",
        ),
    ],
)
def test_batch_bounds_by_partition_times_must_match(options: dict[str, str], message: str) -> None:
    with pytest.raises(HighwaterOptionError) as raised:
        parse_read_options(options).batch_bounds()
    assert message in str(raised.value)


def test_a_start_time_without_a_record_fails_by_default_as_spark_sql_kafka() -> None:
    assert parse_read_options(read(subscribe="a")).starting_by_timestamp_strategy == "error"
    for given, parsed in (("error", "error"), ("LATEST", "latest"), (" Latest ", "latest")):
        options = parse_read_options(read(subscribe="a", startingOffsetsByTimestampStrategy=given))
        assert options.starting_by_timestamp_strategy == parsed
    with pytest.raises(HighwaterOptionError, match="startingOffsetsByTimestampStrategy must be"):
        parse_read_options(read(subscribe="a", startingOffsetsByTimestampStrategy="earliest"))


def test_client_settings_pass_through_with_the_prefix() -> None:
    options = parse_read_options(read(subscribe="a", **{"highwater.fetch.max.bytes": "1024"}))
    assert options.consumer_config()["fetch.max.bytes"] == "1024"
    sink = parse_write_options({**BOOTSTRAP, "topic": "out", "highwater.linger.ms": "20"})
    assert sink.producer_config() == {"bootstrap.servers": "127.0.0.1:9092", "linger.ms": "20"}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (read(subscribe="a", startingOfsets="earliest"), "unknown option 'startingofsets'"),
        (read(subscribe="a", maxoffsetpertrigger="1"), "unknown option"),
        ({"subscribe": "a"}, "bootstrap.servers is required"),
        (read(), "exactly one of subscribe, subscribePattern and assign"),
        (read(subscribe="a", assign='{"a": [0]}'), "not subscribe and assign"),
        (read(subscribe=" , "), "give one or more topic names"),
        (read(subscribePattern="(unclosed"), "invalid pattern"),
        (read(assign='{"a": 0}'), "non-empty list of partitions"),
        (read(assign="{oops"), "assign: not valid JSON"),
        (read(subscribe="a", startingOffsets='{"a": {"0": "x"}}'), "must be an integer"),
        (read(subscribe="a", startingOffsets="{"), "startingOffsets: not valid JSON"),
        (read(subscribe="a", startingOffsets='{"b": {"0": 1}}'), "names b-0, which subscribe=a"),
        (read(subscribe="a", startingTimestamp="yesterday"), "milliseconds since the epoch"),
        (read(subscribe="a", startingOffsetsByTimestamp="{"), "not valid JSON"),
        (
            read(subscribe="a", startingOffsetsByTimestamp='{"a": {"0": "x"}}'),
            "startingOffsetsByTimestamp: the timestamp of a-0 must be an integer",
        ),
        (
            read(subscribe="a", endingOffsetsByTimestamp='{"a": {"0": -1}}'),
            "endingOffsetsByTimestamp: a-0 has timestamp -1; expected milliseconds",
        ),
        (
            read(subscribe="a", startingOffsetsByTimestamp='{"b": {"0": 1}}'),
            "startingOffsetsByTimestamp names b-0, which subscribe=a does not read",
        ),
        (
            read(assign='{"a": [0]}', endingOffsetsByTimestamp='{"a": {"1": 1}}'),
            "endingOffsetsByTimestamp names a-1, which assign=a-0 does not read",
        ),
        (read(subscribe="a", endingTimestamp="-5"), "endingTimestamp must be >= 0"),
        (read(subscribe="a", maxOffsetsPerTrigger="0"), "must be > 0"),
        (read(subscribe="a", minPartitions="many"), "whole number"),
        (read(subscribe="a", minOffsetsPerTrigger="-1"), "minOffsetsPerTrigger must be > 0"),
        (
            read(subscribe="a", minOffsetsPerTrigger="10", maxOffsetsPerTrigger="5"),
            "minOffsetsPerTrigger (10) is above maxOffsetsPerTrigger (5)",
        ),
        (
            read(subscribe="a", minOffsetsPerTrigger="1", maxTriggerDelay="soon"),
            "maxTriggerDelay must be a duration",
        ),
        (read(subscribe="a", failOnDataLoss="yes"), "true or false"),
        (read(subscribe="a", **{"highwater.group.id": "g"}), "not a consumer setting"),
        (read(subscribe="a", **{"highwater.fetch.max.bytes": "-5"}), "fetch.max.bytes"),
    ],
)
def test_bad_read_options_fail_with_a_clear_message(options: dict[str, str], message: str) -> None:
    with pytest.raises(HighwaterOptionError) as raised:
        parse_read_options(options)
    assert message in str(raised.value)


def test_an_option_close_to_a_known_one_is_suggested() -> None:
    with pytest.raises(HighwaterOptionError, match=r"did you mean bootstrap\.servers"):
        parse_read_options({"bootstrapservers": "h:1", "subscribe": "a"})


def test_spark_sql_kafka_s_prefixed_options_point_to_highwater_s() -> None:
    # spark-sql-kafka writes kafka.bootstrap.servers and kafka.<consumer setting>
    with pytest.raises(HighwaterOptionError, match=r"did you mean bootstrap\.servers\?"):
        parse_read_options({"kafka.bootstrap.servers": "h:1", "subscribe": "a"})
    with pytest.raises(HighwaterOptionError, match=r"did you mean highwater\.fetch\.max\.bytes\?"):
        parse_read_options(read(subscribe="a", **{"kafka.fetch.max.bytes": "1024"}))
    with pytest.raises(HighwaterOptionError, match=r"did you mean highwater\.linger\.ms\?"):
        parse_write_options({**BOOTSTRAP, "topic": "t", "kafka.linger.ms": "5"})
    with pytest.raises(HighwaterOptionError, match=r"did you mean pollTimeoutMs\?"):
        parse_read_options(read(subscribe="a", **{"kafkaConsumer.pollTimeoutMs": "500"}))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (read(subscribe="a", startingOffsets="latest"), "startingOffsets=latest is not allowed"),
        (read(subscribe="a", endingOffsets="earliest"), "endingOffsets=earliest is not allowed"),
        (read(subscribe="a", startingOffsets='{"a": {"0": -1}}'), "-1 (latest) is not allowed"),
        (read(subscribe="a", endingOffsets='{"a": {"0": -2}}'), "-2 (earliest) is not allowed"),
    ],
)
def test_batch_bounds_that_would_read_nothing_are_refused(
    options: dict[str, str], message: str
) -> None:
    with pytest.raises(HighwaterOptionError) as raised:
        parse_read_options(options).batch_bounds()
    assert message in str(raised.value)


def test_a_stream_has_no_end() -> None:
    for ending in (
        {"endingOffsets": "latest"},
        {"endingTimestamp": "5"},
        {"endingOffsetsByTimestamp": '{"a": {"0": 5}}'},
    ):
        name = next(iter(ending))
        with pytest.raises(HighwaterOptionError, match=f"{name} applies to batch queries only"):
            parse_read_options(read(subscribe="a", **ending)).stream_start()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"topic": "a"}, "bootstrap.servers is required"),
        ({**BOOTSTRAP, "topic": "a", "subscribe": "b"}, "unknown option 'subscribe'"),
        ({**BOOTSTRAP, "topic": " "}, "the topic name is empty"),
        ({**BOOTSTRAP, "highwater.acks": "most"}, "acks"),
        ({**BOOTSTRAP, "highwater.fetch.max.bytes": "1"}, "not a producer setting"),
    ],
)
def test_bad_write_options_fail_with_a_clear_message(options: dict[str, str], message: str) -> None:
    with pytest.raises(HighwaterOptionError) as raised:
        parse_write_options(options)
    assert message in str(raised.value)


def test_spark_s_own_options_are_accepted() -> None:
    parse_write_options({**BOOTSTRAP, "topic": "a", "checkpointLocation": "/tmp/x", "path": "p"})


def test_client_settings_already_checked_pass_on_unchecked() -> None:
    settings = {"highwater.fetch.max.bytes": "-5", "highwater.Check.CRCs": "false"}
    with pytest.raises(HighwaterOptionError, match=r"fetch\.max\.bytes"):
        parse_read_options(read(subscribe="a", **settings))
    options = parse_read_options(read(subscribe="a", **settings), check_client_settings=False)
    assert options.consumer_config()["fetch.max.bytes"] == "-5"
    assert options.consumer_config()["check.crcs"] == "false"
    with pytest.raises(HighwaterOptionError, match="startingofsets"):
        parse_read_options(
            read(subscribe="a", startingOfsets="earliest"), check_client_settings=False
        )


def test_planning_a_stream_imports_no_client() -> None:
    """Spark plans a query in Python processes that import the source afresh: only the one
    that checks the options at load() and the ones that ask the cluster import the client."""
    code = (
        "import sys, pyspark_highwater\n"
        "from pyspark_highwater.records import source_schema\n"
        "source = pyspark_highwater.DefaultSource({'bootstrap.servers': '127.0.0.1:1', "
        "'subscribe': 't', 'highwater.fetch.max.bytes': '1024'})\n"
        "source.streamReader(source_schema(False))\n"
        "print(sorted(m for m in sys.modules if m.startswith('highwater.client')))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]"
