"""``highwater quotas`` option parsing: how kafka-configs' entity options pair up, and
``--add-config``/``--delete-config`` for quota keys (the commands run against a real server
in tests/integration/test_quotas_processes.py)."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner
from highwater.cli.quotas import (
    EntitySelection,
    format_quota_entity,
    parse_quota_changes,
    quotas,
    select_entities,
)
from highwater.metadata.client_quotas import DEFAULT_ENTITY, ClientQuotaEntity


@pytest.mark.parametrize(
    ("types", "names", "defaults", "kafka_options", "selected"),
    [
        (("users",), ("alice",), 0, {}, EntitySelection({"user": "alice"})),
        (("clients",), (), 1, {}, EntitySelection({"client-id": None})),
        (("users", "clients"), ("alice", "app"), 0, {},
         EntitySelection({"user": "alice", "client-id": "app"})),
        (("users", "clients"), (), 2, {}, EntitySelection({"user": None, "client-id": None})),
        (("users",), (), 0, {}, EntitySelection({}, ("user",))),
        (("users", "clients"), ("alice",), 0, {},
         EntitySelection({"user": "alice"}, ("client-id",))),
        ((), (), 0, {"user": "alice", "client_defaults": True},
         EntitySelection({"user": "alice", "client-id": None})),
        (("clients",), ("app",), 0, {"user_defaults": True},
         EntitySelection({"user": None, "client-id": "app"})),
    ],
)  # fmt: skip
def test_entity_options_pair_as_kafka_configs(
    types: tuple[str, ...],
    names: tuple[str, ...],
    defaults: int,
    kafka_options: dict[str, object],
    selected: EntitySelection,
) -> None:
    assert select_entities(types, names, defaults, **kafka_options) == selected  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("types", "names", "defaults", "kafka_options", "message"),
    [
        (("users",), ("a", "b"), 0, {}, "needs its --entity-type"),
        (("users",), (), 2, {}, "once for each"),
        (("users", "clients"), ("a",), 1, {}, "--client-defaults"),
        (("users",), ("a",), 0, {"user": "b"}, "once"),
        ((), (), 0, {"user": "a", "user_defaults": True}, "not both"),
    ],
)  # fmt: skip
def test_entity_options_that_do_not_pair_are_refused(
    types: tuple[str, ...],
    names: tuple[str, ...],
    defaults: int,
    kafka_options: dict[str, object],
    message: str,
) -> None:
    with pytest.raises(click.UsageError, match=message):
        select_entities(types, names, defaults, **kafka_options)  # type: ignore[arg-type]


def test_quota_changes_and_bad_numbers() -> None:
    assert parse_quota_changes(
        ("producer_byte_rate=1024, consumer_byte_rate=2e3",), ("request_percentage",)
    ) == {"producer_byte_rate": 1024.0, "consumer_byte_rate": 2000.0, "request_percentage": None}
    with pytest.raises(click.BadParameter, match="producer_byte_rate"):
        parse_quota_changes(("producer_byte_rate=fast",), ())
    with pytest.raises(click.BadParameter, match="KEY=VALUE"):
        parse_quota_changes(("producer_byte_rate",), ())
    with pytest.raises(click.UsageError, match="both added and deleted"):
        parse_quota_changes(("producer_byte_rate=1",), ("producer_byte_rate",))


def test_entities_are_named_as_kafka_configs_prints_them() -> None:
    assert format_quota_entity(ClientQuotaEntity("alice", "app")) == (
        "user-principal 'alice', client-id 'app'"
    )
    assert format_quota_entity(ClientQuotaEntity(DEFAULT_ENTITY, None)) == (
        "the default user-principal"
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["alter", "--entity-type", "users", "--add-config", "producer_byte_rate=1"],
         "names one entity"),
        (["alter", "--entity-type", "users", "--entity-name", "a"], "--add-config"),
        (["alter", "--entity-type", "users", "--entity-name", "<default>", "--add-config",
          "producer_byte_rate=1"], "reserved"),
    ],
)  # fmt: skip
def test_bad_invocations_fail_before_connecting(args: list[str], message: str) -> None:
    # Port 1 is closed: a command that got as far as connecting would fail differently.
    result = CliRunner().invoke(quotas, [args[0], "--bootstrap-server", "127.0.0.1:1", *args[1:]])
    assert result.exit_code != 0
    assert message in result.output
