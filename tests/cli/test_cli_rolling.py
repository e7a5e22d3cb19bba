"""``highwater rolling ready`` and ``pre-stop`` against a real EmbeddedServer: the exit codes
and messages a Kubernetes probe and preStop hook act on."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from click.testing import CliRunner, Result
from embedded_servers import ServerThread, free_port
from highwater.cli.main import main
from highwater.client.admin import AdminClient, AdminError, NewTopic
from highwater.embedded import EMBEDDED_NODE_ID

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    """An embedded server with one topic whose partitions all have a leader."""
    thread = ServerThread(tmp_path_factory.mktemp("rolling-cli"))
    thread.start()

    async def create() -> None:
        async with AdminClient(thread.address, request_timeout_s=10) as admin:
            (await admin.create_topics([NewTopic("orders", 2, 1)]))["orders"].raise_for_error()
            for _ in range(500):
                try:
                    described = await admin.describe_topics(["orders"])
                except AdminError:
                    described = {}
                if described and all(p.leader is not None for p in described["orders"].partitions):
                    return
                await asyncio.sleep(0.01)
            raise AssertionError("orders got no leaders")

    try:
        asyncio.run(create())
        yield thread
    finally:
        thread.stop()


def rolling(*args: str) -> Result:
    return CliRunner().invoke(main, ["rolling", *args])


def test_the_broker_of_a_healthy_server_is_ready_and_may_stop(server: ServerThread) -> None:
    node = str(EMBEDDED_NODE_ID)
    result = rolling("ready", "--node-id", node, "--bootstrap-server", server.address)
    assert result.exit_code == 0, result.output
    assert result.output == f"broker {node} ready: yes\n"
    result = rolling("pre-stop", "--node-id", node, "--bootstrap-server", server.address)
    assert result.exit_code == 0, result.output
    assert result.output == f"broker {node} may stop: yes\n"
    result = rolling(
        "pre-stop", "--no-wait", "--node-id", node, "--bootstrap-server", server.address
    )
    assert result.exit_code == 0, result.output
    # a zero wait (the dev overlay's) still looks once
    result = rolling(
        "pre-stop", "--timeout", "0", "--node-id", node, "--bootstrap-server", server.address
    )
    assert result.exit_code == 0, result.output


def test_a_broker_the_cluster_does_not_know_is_not_ready(server: ServerThread) -> None:
    result = rolling("ready", "--node-id", "77", "--bootstrap-server", server.address)
    assert result.exit_code == 1
    assert "broker 77 ready: broker 77 is not registered and unfenced" in result.output


def test_an_unreachable_cluster_refuses_both_gates_in_time() -> None:
    nowhere = f"127.0.0.1:{free_port()}"
    result = rolling("ready", "--node-id", "1", "--bootstrap-server", nowhere, "--timeout", "0.5")
    assert result.exit_code == 1
    assert "cannot describe the cluster" in result.output
    result = rolling(
        "pre-stop",
        "--node-id",
        "1",
        "--bootstrap-server",
        nowhere,
        "--timeout",
        "1",
        "--poll-interval",
        "0.2",
    )
    assert result.exit_code == 1
    assert "broker 1 may stop: cannot describe the cluster" in result.output


def test_a_bad_bootstrap_address_is_a_usage_error() -> None:
    result = rolling("ready", "--node-id", "1", "--bootstrap-server", "no-port")
    assert result.exit_code == 2
    assert "--bootstrap-server" in result.output
