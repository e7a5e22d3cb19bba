"""``highwater configs`` against a real EmbeddedServer: what ``--delete-config`` may delete,
and which brokers can be described."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from click.testing import CliRunner, Result
from embedded_servers import ServerThread
from highwater.cli.configs import configs
from highwater.cli.topics import topics
from highwater.embedded import EMBEDDED_NODE_ID

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    """One embedded server for the module; tests use topic names of their own."""
    thread = ServerThread(tmp_path_factory.mktemp("configs-cli"))
    thread.start()
    try:
        yield thread
    finally:
        thread.stop()


def run(server: ServerThread, *args: str) -> Result:
    """``highwater configs ARGS... --bootstrap-server <the server>``."""
    return CliRunner().invoke(
        configs, [*args, "--bootstrap-server", server.address, "--timeout", "10"]
    )


def ok(result: Result) -> str:
    assert result.exit_code == 0, (result.output, result.exception)
    return result.output


def one_error(result: Result) -> str:
    """The one ``Error:`` line of a command that failed cleanly with exit code 1."""
    assert result.exit_code == 1, (result.output, result.exception)
    assert isinstance(result.exception, SystemExit), result.exception
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    return lines[0]


def topic_configs(server: ServerThread, topic: str) -> str:
    return ok(run(server, "--entity-type", "topics", "--entity-name", topic, "--describe"))


def test_deleting_a_config_that_is_not_set_fails_and_changes_nothing(
    server: ServerThread,
) -> None:
    create = ["create", "--topic", "cfg-orders", "--config", "segment.ms=60000"]
    created = CliRunner().invoke(topics, [*create, "--bootstrap-server", server.address])
    assert created.exit_code == 0, created.output
    topic = ["--entity-type", "topics", "--entity-name", "cfg-orders", "--alter"]
    for key in ("retention.ms", "retention.mss"):
        message = one_error(run(server, *topic, "--delete-config", key))
        assert message == f"Error: Invalid config(s): {key}: not an override of topic cfg-orders"
    # One key that is set and one that is not: refused whole, the set one stays.
    message = one_error(run(server, *topic, "--delete-config", "segment.ms,retention.ms"))
    assert message.startswith("Error: Invalid config(s): retention.ms:")
    message = one_error(
        run(server, *topic, "--add-config", "retention.ms=5", "--delete-config", "cleanup.policy")
    )
    assert "Invalid config(s): cleanup.policy" in message
    assert "segment.ms=60000" in topic_configs(server, "cfg-orders")
    assert "retention.ms" not in topic_configs(server, "cfg-orders")
    # A key that is set is deleted as before.
    out = ok(run(server, *topic, "--delete-config", "segment.ms"))
    assert out == "Completed updating config for topic cfg-orders.\n"
    assert "segment.ms" not in topic_configs(server, "cfg-orders")


def test_deleting_a_broker_config_that_is_not_set_fails(server: ServerThread) -> None:
    default = ["--entity-type", "brokers", "--entity-default", "--alter"]
    message = one_error(run(server, *default, "--delete-config", "num.partitions"))
    assert message == (
        "Error: Invalid config(s): num.partitions: not an override of the default broker "
        "resource (the whole cluster)"
    )
    broker = ["--entity-type", "brokers", "--entity-name", str(EMBEDDED_NODE_ID), "--alter"]
    message = one_error(run(server, *broker, "--delete-config", "no.such.key"))
    assert message == (
        f"Error: Invalid config(s): no.such.key: not an override of broker {EMBEDDED_NODE_ID}"
    )


def test_describing_a_broker_that_is_not_in_the_cluster_fails(server: ServerThread) -> None:
    message = one_error(
        run(server, "--entity-type", "brokers", "--entity-name", "42", "--describe", "--all")
    )
    assert (
        message == f"Error: broker 42 is not in the cluster (its live brokers: {EMBEDDED_NODE_ID})"
    )
    described = run(
        server, "--entity-type", "brokers", "--entity-name", str(EMBEDDED_NODE_ID), "--describe"
    )
    assert ok(described).startswith(f"Dynamic configs for broker {EMBEDDED_NODE_ID} are:")
