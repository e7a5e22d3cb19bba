"""Dynamic configs: incremental alteration of topics and brokers, and description."""

from __future__ import annotations

import pytest
from controller_helpers import NONE, Harness
from highwater.config.definition import ConfigDef, ConfigKey, ConfigType, at_least
from highwater.controller import ControllerConfig, ControllerResult
from highwater.controller_api.messages import (
    AlterableConfig,
    AlterConfigOp,
    AlterConfigsRequest,
    AlterConfigsResource,
    AlterConfigsResponse,
    ConfigSource,
    DescribeConfigsRequest,
    DescribeConfigsResource,
)
from highwater.errors import InvalidConfigError
from highwater.metadata import ConfigRecord, ConfigResourceType
from highwater.v1.common_pb2 import ErrorCode

TOPIC = ConfigResourceType.TOPIC
BROKER = ConfigResourceType.BROKER


@pytest.fixture
def h() -> Harness:
    harness = Harness()
    harness.start_brokers([1])
    harness.create_topic("t", 1, 1, {"retention.ms": "1000"})
    return harness


def alter(
    h: Harness,
    *changes: AlterableConfig,
    resource: tuple[ConfigResourceType, str] = (TOPIC, "t"),
    validate_only: bool = False,
) -> ControllerResult[AlterConfigsResponse]:
    return h.controller.alter_configs(
        AlterConfigsRequest((AlterConfigsResource(*resource, changes),), validate_only)
    )


def test_set_and_delete(h: Harness) -> None:
    result = alter(
        h,
        AlterableConfig("retention.ms", AlterConfigOp.DELETE),
        AlterableConfig("min.insync.replicas", AlterConfigOp.SET, " 2 "),
        AlterableConfig("unclean.leader.election.enable", AlterConfigOp.SET, "TRUE"),
    )
    assert result.response.resources[0].error == NONE
    assert result.records == [
        ConfigRecord(TOPIC, "t", "min.insync.replicas", "2"),
        ConfigRecord(TOPIC, "t", "retention.ms", None),
        ConfigRecord(TOPIC, "t", "unclean.leader.election.enable", "true"),
    ]
    h.commit(result)
    assert h.image.topic_config("t") == {
        "min.insync.replicas": "2",
        "unclean.leader.election.enable": "true",
    }
    assert h.image.log_config("t").min_insync_replicas == 2


def test_setting_the_same_value_writes_nothing(h: Harness) -> None:
    assert alter(h, AlterableConfig("retention.ms", value="1000")).records == []


def test_append_and_subtract_lists(h: Harness) -> None:
    h.commit(alter(h, AlterableConfig("cleanup.policy", AlterConfigOp.APPEND, "compact")))
    assert h.image.topic_config("t")["cleanup.policy"] == "delete,compact"
    h.commit(alter(h, AlterableConfig("cleanup.policy", AlterConfigOp.SUBTRACT, "delete")))
    assert h.image.topic_config("t")["cleanup.policy"] == "compact"
    emptied = alter(h, AlterableConfig("cleanup.policy", AlterConfigOp.SUBTRACT, "compact"))
    assert emptied.response.resources[0].error == ErrorCode.INVALID_CONFIG  # must not be empty
    not_a_list = alter(h, AlterableConfig("retention.ms", AlterConfigOp.APPEND, "5"))
    assert not_a_list.response.resources[0].error == ErrorCode.INVALID_CONFIG


@pytest.mark.parametrize(
    ("change", "resource", "code", "message"),
    [
        (
            AlterableConfig("retention.msx", value="1"),
            (TOPIC, "t"),
            ErrorCode.INVALID_CONFIG,
            "retention.msx",
        ),
        (
            AlterableConfig("retention.ms", value="x"),
            (TOPIC, "t"),
            ErrorCode.INVALID_CONFIG,
            "retention.ms",
        ),
        (AlterableConfig("retention.ms"), (TOPIC, "t"), ErrorCode.INVALID_REQUEST, "needs a value"),
        (
            AlterableConfig("retention.ms", value="1"),
            (TOPIC, "nope"),
            ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
            "nope",
        ),
        (AlterableConfig("x", value="1"), (BROKER, ""), ErrorCode.INVALID_REQUEST, "not supported"),
    ],
)
def test_bad_changes_are_refused(
    h: Harness,
    change: AlterableConfig,
    resource: tuple[ConfigResourceType, str],
    code: int,
    message: str,
) -> None:
    result = alter(h, change, resource=resource)
    assert result.records == []
    assert result.response.resources[0].error == code
    assert message in result.response.resources[0].error_message


def test_a_bad_key_refuses_the_whole_resource(h: Harness) -> None:
    result = alter(
        h,
        AlterableConfig("retention.ms", value="5"),
        AlterableConfig("segment.bytes", value="1"),  # below the minimum of 14
    )
    assert result.records == []
    assert "segment.bytes" in result.response.resources[0].error_message
    twice = alter(
        h, AlterableConfig("retention.ms", value="5"), AlterableConfig("retention.ms", value="6")
    )
    assert twice.response.resources[0].error == ErrorCode.INVALID_REQUEST


def test_validate_only(h: Harness) -> None:
    result = alter(h, AlterableConfig("retention.ms", value="5"), validate_only=True)
    assert result.records == [] and result.response.resources[0].error == NONE


def test_broker_configs_with_a_definition() -> None:
    definition = ConfigDef([ConfigKey("log.retention.ms", ConfigType.LONG, 100, at_least(-1))])
    h = Harness(ControllerConfig(broker_config_definition=definition))
    result = alter(h, AlterableConfig("log.retention.ms", value="5"), resource=(BROKER, ""))
    assert result.records == [ConfigRecord(BROKER, "", "log.retention.ms", "5")]
    h.commit(result)
    assert h.image.broker_config("") == {"log.retention.ms": "5"}
    bad = alter(h, AlterableConfig("log.retention.ms", value="5"), resource=(BROKER, "one"))
    assert bad.response.resources[0].error == ErrorCode.INVALID_REQUEST
    described = h.controller.describe_configs(
        DescribeConfigsRequest((DescribeConfigsResource(BROKER, ""),))
    ).response.results[0]
    assert [(c.name, c.value, c.source) for c in described.configs] == [
        ("log.retention.ms", "5", ConfigSource.DYNAMIC_BROKER_CONFIG)
    ]


def test_describe_a_topic(h: Harness) -> None:
    result = h.controller.describe_configs(
        DescribeConfigsRequest(
            (
                DescribeConfigsResource(TOPIC, "t"),
                DescribeConfigsResource(TOPIC, "t", ("retention.ms", "segment.bytes")),
                DescribeConfigsResource(TOPIC, "missing"),
            )
        )
    )
    assert result.records == []
    full, some, missing = result.response.results
    assert len(full.configs) == len(list(h.image.log_config("t").DEFINITION))
    by_name = {c.name: c for c in some.configs}
    assert by_name["retention.ms"].value == "1000"
    assert by_name["retention.ms"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG
    assert by_name["segment.bytes"].value == "1073741824"
    assert by_name["segment.bytes"].source == ConfigSource.DEFAULT_CONFIG
    assert by_name["segment.bytes"].type == "int"
    assert missing.error == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


def test_the_cluster_default_of_unclean_election_shows_as_static() -> None:
    h = Harness(ControllerConfig(unclean_leader_election_enable=True))
    h.start_brokers([1])
    h.create_topic("t")
    described = h.controller.describe_configs(
        DescribeConfigsRequest(
            (DescribeConfigsResource(TOPIC, "t", ("unclean.leader.election.enable",)),)
        )
    ).response.results[0]
    assert [(c.value, c.source) for c in described.configs] == [
        ("true", ConfigSource.STATIC_BROKER_CONFIG)
    ]


def test_controller_config_from_properties() -> None:
    config = ControllerConfig.from_properties(
        {"broker.session.timeout.ms": "18000", "leader.imbalance.per.broker.percentage": 20}
    )
    assert config.broker_session_timeout_ms == 18000
    assert config.leader_imbalance_per_broker_percentage == 20
    assert config.leader_imbalance_check_interval_ms == 300_000
    with pytest.raises(InvalidConfigError, match=r"leader\.imbalance\.per\.broker\.percentage"):
        ControllerConfig.from_properties({"leader.imbalance.per.broker.percentage": "101"})
    with pytest.raises(InvalidConfigError, match=r"broker\.session\.timeout\.ms"):
        ControllerConfig(broker_session_timeout_ms=0)
