"""Server configuration: Java-properties files, overrides, Kafka's key names and precedence."""

from __future__ import annotations

from pathlib import Path

import pytest
from highwater.config.server import (
    CLUSTER_DEFAULT_KEYS,
    SERVER_CONFIG_DEF,
    load_server_config,
    read_properties,
    topic_defaults,
)
from highwater.config.topic import LOG_CONFIG_DEF
from highwater.controller.config import CONTROLLER_CONFIG_DEF
from highwater.errors import InvalidConfigError


def test_properties_are_read_as_java_reads_them(tmp_path: Path) -> None:
    path = tmp_path / "server.properties"
    path.write_text(
        "# a comment\n"
        "! another\n"
        "\n"
        "num.partitions=4\n"
        "  default.replication.factor : 3\n"
        "broker.rack us-east-1a\n"
        "log.cleanup.policy = compact,\\\n"
        "    delete\n"
        "weird\\=key=a\\tb\\u0041\n"
        "num.partitions=5\n"
    )
    assert read_properties(path) == {
        "num.partitions": "5",
        "default.replication.factor": "3",
        "broker.rack": "us-east-1a",
        "log.cleanup.policy": "compact,delete",
        "weird=key": "a\tbA",
    }


def test_overrides_beat_the_file_which_beats_the_defaults(tmp_path: Path) -> None:
    path = tmp_path / "server.properties"
    path.write_text("num.partitions=4\nmin.insync.replicas=2\n")
    config = load_server_config(path, ["min.insync.replicas=3", "log.retention.ms=60000"])
    assert config.get("num.partitions") == 4
    assert config.get("min.insync.replicas") == 3
    assert config.get("default.replication.factor") == 1
    assert config.get("log.retention.minutes") is None
    assert config.cluster_defaults() == {
        "num.partitions": "4",
        "min.insync.replicas": "3",
        "log.retention.ms": "60000",
    }
    assert config.with_values({"broker.rack": "r1"}).get("broker.rack") == "r1"


@pytest.mark.parametrize(
    ("text", "overrides", "named"),
    [
        ("num.partiton=4\n", [], r"'num\.partiton' \(did you mean num\.partitions\?\)"),
        ("num.partitions=four\n", [], r"'four' for configuration num\.partitions"),
        ("", ["default.replication.factor=0"], "default.replication.factor"),
        ("", ["no-equals-sign"], "no-equals-sign"),
        ("auto.create.topics.enable=true\n", [], "auto.create.topics.enable"),
        ("log.dirs=/d1,/d2,/d1\n", [], r"log\.dirs: '/d1' is listed twice"),
        ("", ["log.dirs=/d1,,/d2"], r"log\.dirs.*empty element"),
        ("", ["broker.heartbeat.interval.ms=0"], "broker.heartbeat.interval.ms"),
        ("message.max.bytes=66060289\n", [], r"'66060289' for configuration message\.max\.bytes"),
        (
            "broker.session.timeout.ms=1500\n",
            [],
            r"broker\.heartbeat\.interval\.ms \(2000\) must be less than "
            r"broker\.session\.timeout\.ms \(1500\)",
        ),
        (
            "",
            ["broker.heartbeat.interval.ms=9000"],
            r"broker\.heartbeat\.interval\.ms \(9000\) must be less than",
        ),
        (
            "coordinator.session.timeout.ms=2000\n",
            [],
            r"coordinator\.heartbeat\.interval\.ms \(2000\) must be less than "
            r"coordinator\.session\.timeout\.ms \(2000\)",
        ),
    ],
)
def test_unknown_keys_and_bad_values_are_refused_naming_the_key(
    tmp_path: Path, text: str, overrides: list[str], named: str
) -> None:
    path = tmp_path / "server.properties"
    path.write_text(text)
    with pytest.raises(InvalidConfigError, match=named):
        load_server_config(path, overrides)


def test_log_dirs_is_a_list_of_directories(tmp_path: Path) -> None:
    path = tmp_path / "server.properties"
    path.write_text("log.dirs = /disks/a , /disks/b\n")
    assert load_server_config(path).get("log.dirs") == ("/disks/a", "/disks/b")
    assert not load_server_config(None).is_given("log.dirs")


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(InvalidConfigError, match=r"nope\.properties"):
        load_server_config(tmp_path / "nope.properties")


def test_cluster_defaults_become_topic_settings() -> None:
    assert topic_defaults({"log.retention.hours": "1", "min.insync.replicas": "2"}) == {
        "retention.ms": "3600000",
        "min.insync.replicas": "2",
    }
    assert topic_defaults(
        {"log.retention.hours": "1", "log.retention.minutes": "2", "log.roll.hours": "1"}
    ) == {"retention.ms": "120000", "segment.ms": "3600000"}
    assert topic_defaults({"log.retention.ms": "-1", "num.partitions": "3"}) == {
        "retention.ms": "-1"
    }
    # Every topic setting derived is one the topic definition knows.
    every = {
        name: SERVER_CONFIG_DEF[name].describe().default or "1" for name in CLUSTER_DEFAULT_KEYS
    }
    assert set(topic_defaults(every)) <= set(LOG_CONFIG_DEF.names())


def test_the_controller_reads_the_same_keys() -> None:
    for key in CONTROLLER_CONFIG_DEF:
        assert SERVER_CONFIG_DEF[key.name] is key
