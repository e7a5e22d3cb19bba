"""``highwater configs`` option parsing: kafka-configs' ``--add-config`` syntax and the
entity checks that need no cluster (the commands themselves run against real processes in
tests/integration/test_server_config_processes.py)."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner
from highwater.cli.configs import configs, parse_add_config


def test_add_config_pairs_and_bracketed_lists() -> None:
    assert parse_add_config("retention.ms=1000") == {"retention.ms": "1000"}
    assert parse_add_config("a=1,cleanup.policy=[compact,delete],b=x=y") == {
        "a": "1",
        "cleanup.policy": "compact,delete",
        "b": "x=y",
    }
    assert parse_add_config("k=[a]") == {"k": "a"}


@pytest.mark.parametrize("text", ["noequals", "=1", "k=[a,b", "k=[a]x"])
def test_malformed_add_config_is_refused(text: str) -> None:
    with pytest.raises(click.BadParameter):
        parse_add_config(text)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--entity-type", "topics", "--describe"], "needs --entity-name"),
        (["--entity-type", "topics", "--entity-default", "--describe"], "no --entity-default"),
        (["--entity-type", "brokers", "--describe"], "--entity-name ID or --entity-default"),
        (["--entity-type", "brokers", "--entity-name", "b1", "--describe"], "its id"),
        (["--entity-type", "topics", "--entity-name", "t"], "exactly one of"),
        (["--entity-type", "topics", "--entity-name", "t", "--alter"], "--add-config"),
        (["--entity-type", "topics", "--entity-name", "t", "--describe", "--add-config", "a=1"],
         "go with --alter"),
        (["--entity-type", "users", "--entity-name", "u", "--describe", "--all"], "not quotas"),
        (["--entity-type", "users", "--entity-type", "clients", "--entity-name", "u",
          "--entity-default", "--alter", "--add-config", "producer_byte_rate=1"],
         "--user N --client-defaults"),
        (["--entity-type", "users", "--entity-type", "users", "--describe"], "once"),
        (["--entity-type", "clients", "--alter", "--add-config", "producer_byte_rate=1"],
         "names one entity"),
        (["--entity-type", "clients", "--entity-default", "--alter", "--add-config",
          "producer_byte_rate=fast"], "producer_byte_rate"),
        (["--entity-type", "topics", "--entity-type", "users", "--describe"], "one --entity-type"),
    ],
)  # fmt: skip
def test_bad_invocations_fail_before_connecting(args: list[str], message: str) -> None:
    # Port 1 is closed: a command that got as far as connecting would fail differently.
    result = CliRunner().invoke(configs, ["--bootstrap-server", "127.0.0.1:1", *args])
    assert result.exit_code != 0
    assert message in result.output
