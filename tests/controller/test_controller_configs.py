"""Dynamic configs: incremental alteration of topics and brokers, and description."""

from __future__ import annotations

import pytest
from controller_helpers import NONE, Harness
from highwater.config.definition import ConfigDef, ConfigKey, ConfigType, at_least
from highwater.config.server import BROKER_DYNAMIC_CONFIG_DEF
from highwater.controller import ControllerConfig, ControllerResult
from highwater.controller.config_control import ConfigurationControl
from highwater.controller_api.messages import (
    AlterableConfig,
    AlterConfigOp,
    AlterConfigsRequest,
    AlterConfigsResource,
    AlterConfigsResponse,
    ConfigSource,
    CreatableTopic,
    CreatableTopicResult,
    CreateTopicsRequest,
    DescribeConfigsRequest,
    DescribeConfigsResource,
)
from highwater.errors import InvalidConfigError
from highwater.metadata import ConfigRecord, ConfigResource, ConfigResourceType
from highwater.metadata.delta import MetadataDelta
from highwater.v1.common_pb2 import ErrorCode

TOPIC = ConfigResourceType.TOPIC
BROKER = ConfigResourceType.BROKER


@pytest.fixture
def h() -> Harness:
    harness = Harness()
    harness.start_brokers([1, 2])
    harness.create_topic("t", 1, 2, {"retention.ms": "1000"})
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
        ("log.retention.ms", "5", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG)
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


# --- Cluster defaults: the controllers' file (static) and the default broker resource ----

STATIC = ConfigResourceType.STATIC_CLUSTER_DEFAULT


def _server_harness(**defaults: str) -> Harness:
    config = ControllerConfig(
        broker_config_definition=BROKER_DYNAMIC_CONFIG_DEF, cluster_defaults=defaults
    )
    harness = Harness(config)
    harness.start_brokers([1, 2, 3])
    return harness


def test_the_active_controller_writes_its_static_defaults_once() -> None:
    h = _server_harness(**{"num.partitions": "4", "min.insync.replicas": "2"})
    first = h.controller.tick(h.clock.now_ms)
    assert [r for r in first.records if isinstance(r, ConfigRecord)] == [
        ConfigRecord(STATIC, "", "min.insync.replicas", "2"),
        ConfigRecord(STATIC, "", "num.partitions", "4"),
    ]
    h.commit(first)
    assert not [r for r in h.controller.tick(h.clock.now_ms).records if isinstance(r, ConfigRecord)]
    # Another controller with another file makes the metadata follow its own.
    other = ControllerConfig(cluster_defaults={"num.partitions": "6"})
    h.controller.configs = ConfigurationControl(other)
    again = h.controller.tick(h.clock.now_ms)
    assert [r for r in again.records if isinstance(r, ConfigRecord)] == [
        ConfigRecord(STATIC, "", "min.insync.replicas", None),
        ConfigRecord(STATIC, "", "num.partitions", "6"),
    ]


def _create(h: Harness, name: str, **configs: str) -> CreatableTopicResult:
    return h.commit(
        h.controller.create_topics(CreateTopicsRequest((CreatableTopic(name, configs=configs),)))
    ).topics[0]


def test_topics_created_without_settings_take_the_cluster_defaults() -> None:
    h = _server_harness(**{"num.partitions": "4", "default.replication.factor": "3"})
    h.commit(h.controller.tick(h.clock.now_ms))
    created = _create(h, "t")
    assert (created.error, created.num_partitions, created.replication_factor) == (NONE, 4, 3)
    # A dynamic default beats the static one.
    h.commit(alter(h, AlterableConfig("num.partitions", value="2"), resource=(BROKER, "")))
    assert _create(h, "u").num_partitions == 2


def test_min_insync_replicas_above_the_replication_factor_is_refused() -> None:
    h = _server_harness(**{"min.insync.replicas": "2"})
    h.commit(h.controller.tick(h.clock.now_ms))
    refused = _create(h, "t")  # default.replication.factor is 1
    assert refused.error == ErrorCode.INVALID_CONFIG
    assert "min.insync.replicas (the cluster default)" in (refused.error_message or "")
    own = h.commit(
        h.controller.create_topics(
            CreateTopicsRequest((CreatableTopic("u", 1, 3, configs={"min.insync.replicas": "4"}),))
        )
    ).topics[0]
    assert own.error == ErrorCode.INVALID_CONFIG and "min.insync.replicas" in own.error_message
    fine = h.commit(
        h.controller.create_topics(CreateTopicsRequest((CreatableTopic("v", 1, 3),)))
    ).topics[0]
    assert fine.error == NONE
    above = alter(h, AlterableConfig("min.insync.replicas", value="4"), resource=(TOPIC, "v"))
    assert above.response.resources[0].error == ErrorCode.INVALID_CONFIG
    assert "replication factor 3" in above.response.resources[0].error_message


def test_cluster_wide_keys_are_refused_per_broker() -> None:
    h = _server_harness()
    result = alter(h, AlterableConfig("num.partitions", value="3"), resource=(BROKER, "1"))
    assert result.response.resources[0].error == ErrorCode.INVALID_REQUEST
    assert "--entity-default" in result.response.resources[0].error_message


def test_described_sources_follow_kafkas_precedence() -> None:
    h = _server_harness(**{"log.retention.hours": "1", "num.partitions": "4"})
    h.commit(h.controller.tick(h.clock.now_ms))
    h.commit(alter(h, AlterableConfig("num.partitions", value="5"), resource=(BROKER, "")))
    _create(h, "t", **{"segment.bytes": "1000"})

    def described(
        resource_type: ConfigResourceType, name: str
    ) -> dict[str, tuple[str | None, int]]:
        result = h.controller.describe_configs(
            DescribeConfigsRequest((DescribeConfigsResource(resource_type, name),))
        ).response.results[0]
        return {c.name: (c.value, c.source) for c in result.configs}

    broker = described(BROKER, "1")
    assert broker["num.partitions"] == ("5", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG)
    assert broker["log.retention.hours"] == ("1", ConfigSource.STATIC_BROKER_CONFIG)
    assert broker["default.replication.factor"] == ("1", ConfigSource.DEFAULT_CONFIG)
    topic = described(TOPIC, "t")
    assert topic["retention.ms"] == ("3600000", ConfigSource.STATIC_BROKER_CONFIG)
    assert topic["segment.bytes"] == ("1000", ConfigSource.DYNAMIC_TOPIC_CONFIG)
    assert topic["cleanup.policy"] == ("delete", ConfigSource.DEFAULT_CONFIG)
    assert h.image.log_config("t").retention_ms == 3_600_000


def test_decided_on_a_delta_it_reads_and_leaves_as_it_was(h: Harness) -> None:
    # The controller store hands a staged group's delta: read, never replayed into.
    delta = MetadataDelta(h.store.latest_image())
    delta.replay(ConfigRecord(TOPIC, "t", "cleanup.policy", "compact"))
    request = AlterConfigsRequest(
        (
            AlterConfigsResource(
                TOPIC,
                "t",
                (AlterableConfig("cleanup.policy", AlterConfigOp.APPEND, "delete"),),
            ),
        )
    )
    records = delta.record_count
    result = ConfigurationControl(h.config).alter_configs(delta, request)
    assert [r.error for r in result.response.resources] == [NONE]
    assert result.records == [ConfigRecord(TOPIC, "t", "cleanup.policy", "compact,delete")]
    assert delta.record_count == records
    assert delta.config(ConfigResource(TOPIC, "t")) == {
        "retention.ms": "1000",
        "cleanup.policy": "compact",
    }


def test_a_resource_given_twice_is_refused_at_both_entries(h: Harness) -> None:
    """Kafka's ``ConfigAdminManager.preprocess``: neither change is applied."""
    resource = (
        AlterConfigsResource(TOPIC, "t", (AlterableConfig("retention.ms", value="5"),)),
        AlterConfigsResource(TOPIC, "t", (AlterableConfig("retention.bytes", value="5"),)),
        AlterConfigsResource(TOPIC, "nope", (AlterableConfig("retention.ms", value="5"),)),
    )
    result = h.controller.alter_configs(AlterConfigsRequest(resource))
    assert result.records == []
    assert [(r.resource_name, r.error, r.error_message) for r in result.response.resources] == [
        ("t", ErrorCode.INVALID_REQUEST, "Each resource must appear at most once."),
        ("t", ErrorCode.INVALID_REQUEST, "Each resource must appear at most once."),
        ("nope", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "No topic 'nope'"),
    ]


def test_deleting_a_config_no_definition_has_is_nothing_to_do(h: Harness) -> None:
    """Kafka accepts removing an override of an unknown name; a SET of one is refused."""
    gone = alter(h, AlterableConfig("no.such.key", AlterConfigOp.DELETE))
    assert gone.response.resources[0].error == NONE and gone.records == []
    with_others = alter(
        h,
        AlterableConfig("no.such.key", AlterConfigOp.DELETE),
        AlterableConfig("retention.ms", AlterConfigOp.DELETE),
    )
    assert with_others.response.resources[0].error == NONE
    assert with_others.records == [ConfigRecord(TOPIC, "t", "retention.ms", None)]
    refused = alter(h, AlterableConfig("no.such.key", value="1"))
    assert refused.response.resources[0].error == ErrorCode.INVALID_CONFIG


def test_a_topic_resource_with_an_impossible_name_is_an_invalid_topic(h: Harness) -> None:
    """Kafka's ``Topic.validate`` before the lookup: INVALID_TOPIC_EXCEPTION, not
    UNKNOWN_TOPIC_OR_PARTITION, to describe or alter it."""
    described = h.controller.describe_configs(
        DescribeConfigsRequest((DescribeConfigsResource(TOPIC, "bad name!"),))
    )
    assert described.response.results[0].error == ErrorCode.INVALID_TOPIC_EXCEPTION
    altered = alter(h, AlterableConfig("retention.ms", value="1"), resource=(TOPIC, "a" * 250))
    assert altered.response.resources[0].error == ErrorCode.INVALID_TOPIC_EXCEPTION
