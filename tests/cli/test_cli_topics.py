"""``highwater topics`` on a real EmbeddedServer: create, list, describe, alter, delete, errors.

The server runs in a background thread with its own event loop (one per test module);
each test invokes the click group with ``CliRunner``, which runs the command's own
``asyncio.run`` on the test's thread, exactly as the installed command would.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from click.testing import CliRunner, Result
from embedded_servers import ServerThread, free_port
from highwater.cli.topics import format_partition, topics
from highwater.client.admin import PartitionInfo
from highwater.embedded import EMBEDDED_NODE_ID

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    """One embedded server for the module; tests use topic names of their own."""
    thread = ServerThread(tmp_path_factory.mktemp("topics-cli"))
    thread.start()
    try:
        yield thread
    finally:
        thread.stop()


def run(server: ServerThread, *args: str) -> Result:
    """``highwater topics ARGS... --bootstrap-server <the server>``."""
    return CliRunner().invoke(
        topics, [*args, "--bootstrap-server", server.address, "--timeout", "10"]
    )


def ok(server: ServerThread, *args: str) -> str:
    """Run a command that must succeed; its stdout."""
    result = run(server, *args)
    assert result.exit_code == 0, (result.output, result.exception)
    return result.output


def fails(server: ServerThread, *args: str) -> str:
    """Run a command that must fail cleanly: exit code 1, one ``Error:`` line, no traceback."""
    result = run(server, *args)
    assert result.exit_code == 1, (result.output, result.exception)
    assert isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    return lines[0]


def test_create_list_describe_delete(server: ServerThread) -> None:
    out = ok(server, "create", "--topic", "cli-orders", "--partitions", "3")
    assert out == "Created topic cli-orders.\n"
    assert "cli-orders" in ok(server, "list").splitlines()

    described = ok(server, "describe", "--topic", "cli-orders").splitlines()
    assert len(described) == 4
    header = described[0].split("\t")
    assert header[0] == "Topic: cli-orders"
    assert re.fullmatch(r"TopicId: [A-Za-z0-9_-]{22}", header[1])
    assert header[2:] == ["PartitionCount: 3", "ReplicationFactor: 1", "Configs: "]
    node = EMBEDDED_NODE_ID
    for p, line in enumerate(described[1:]):
        assert line == (
            f"\tTopic: cli-orders\tPartition: {p}\tLeader: {node}\tReplicas: {node}\tIsr: {node}"
        )

    assert ok(server, "delete", "--topic", "cli-orders") == "Deleted topic cli-orders.\n"
    assert "cli-orders" not in ok(server, "list").splitlines()
    assert "does not exist" in fails(server, "describe", "--topic", "cli-orders")


def test_describe_without_a_topic_describes_every_topic(server: ServerThread) -> None:
    ok(server, "create", "--topic", "cli-all-a", "--partitions", "1")
    ok(server, "create", "--topic", "cli-all-b", "--partitions", "2", "--replication-factor", "1")
    out = ok(server, "describe")
    headers = [line for line in out.splitlines() if line.startswith("Topic: ")]
    names = [h.split("\t")[0].removeprefix("Topic: ") for h in headers]
    assert names == sorted(names)
    assert {"cli-all-a", "cli-all-b"} <= set(names)
    assert "\tTopic: cli-all-b\tPartition: 1\t" in out
    listed = ok(server, "list").splitlines()
    assert listed == sorted(listed)


def test_create_with_configs_shows_them_in_describe(server: ServerThread) -> None:
    ok(
        server,
        "create",
        "--topic",
        "cli-configured",
        "--partitions",
        "1",
        "--config",
        "retention.ms=60000",
        "--config",
        "cleanup.policy=compact",
    )
    header = ok(server, "describe", "--topic", "cli-configured").splitlines()[0]
    assert header.endswith("\tConfigs: cleanup.policy=compact,retention.ms=60000")


def test_alter_partitions(server: ServerThread) -> None:
    ok(server, "create", "--topic", "cli-grow", "--partitions", "1")
    out = ok(server, "alter", "--topic", "cli-grow", "--partitions", "3")
    assert out == "Increased the partition count of topic cli-grow to 3.\n"
    described = ok(server, "describe", "--topic", "cli-grow").splitlines()
    assert "\tPartitionCount: 3\t" in described[0]
    assert [line.split("\t")[2] for line in described[1:]] == [
        "Partition: 0",
        "Partition: 1",
        "Partition: 2",
    ]
    message = fails(server, "alter", "--topic", "cli-grow", "--partitions", "2")
    assert "3 partition(s)" in message and "not be an increase" in message
    assert "does not exist" in fails(server, "alter", "--topic", "cli-nope", "--partitions", "2")
    message = fails(server, "alter", "--topic", "__consumer_offsets", "--partitions", "99")
    assert "partitions of __consumer_offsets cannot be changed" in message


def test_alter_configs_sets_and_deletes_overrides(server: ServerThread) -> None:
    ok(server, "create", "--topic", "cli-conf", "--config", "retention.ms=1000")
    out = ok(
        server,
        "alter",
        "--topic",
        "cli-conf",
        "--config",
        "segment.bytes=1048576",
        "--config",
        "cleanup.policy=compact",
    )
    assert out == "Updated config of topic cli-conf.\n"
    header = ok(server, "describe", "--topic", "cli-conf").splitlines()[0]
    assert header.endswith(
        "\tConfigs: cleanup.policy=compact,retention.ms=1000,segment.bytes=1048576"
    )

    ok(server, "alter", "--topic", "cli-conf", "--delete-config", "retention.ms")
    header = ok(server, "describe", "--topic", "cli-conf").splitlines()[0]
    assert header.endswith("\tConfigs: cleanup.policy=compact,segment.bytes=1048576")

    # Set and delete in one go, together with more partitions.
    ok(
        server,
        "alter",
        "--topic",
        "cli-conf",
        "--config",
        "retention.ms=5000",
        "--delete-config",
        "segment.bytes",
        "--partitions",
        "2",
    )
    header = ok(server, "describe", "--topic", "cli-conf").splitlines()[0]
    assert "\tPartitionCount: 2\t" in header
    assert header.endswith("\tConfigs: cleanup.policy=compact,retention.ms=5000")


def test_invalid_topic_name(server: ServerThread) -> None:
    message = fails(server, "create", "--topic", "no spaces allowed")
    assert "Topic name 'no spaces allowed' is illegal" in message
    assert "illegal" in fails(server, "create", "--topic", "..")


def test_unknown_and_invalid_configs(server: ServerThread) -> None:
    message = fails(server, "create", "--topic", "cli-badconf", "--config", "retention.mss=1")
    assert "Unknown configuration 'retention.mss'" in message
    message = fails(server, "create", "--topic", "cli-badconf", "--config", "retention.ms=soon")
    assert "Invalid value 'soon' for configuration retention.ms" in message
    assert "cli-badconf" not in ok(server, "list").splitlines()

    ok(server, "create", "--topic", "cli-strict")
    message = fails(server, "alter", "--topic", "cli-strict", "--config", "no.such.key=1")
    assert "Unknown configuration 'no.such.key'" in message
    message = fails(server, "alter", "--topic", "cli-nope", "--config", "retention.ms=1")
    assert "cli-nope" in message

    result = run(server, "create", "--topic", "cli-badconf", "--config", "retention.ms")
    assert result.exit_code == 2  # a usage error: click says which option is malformed
    assert "is not KEY=VALUE" in result.output


def test_replication_factor_above_the_brokers(server: ServerThread) -> None:
    message = fails(server, "create", "--topic", "cli-wide", "--replication-factor", "3")
    assert "replication factor of 3" in message
    assert "only 1 broker(s)" in message
    assert "cli-wide" not in ok(server, "list").splitlines()


def test_deleting_an_unknown_topic(server: ServerThread) -> None:
    assert fails(server, "delete", "--topic", "cli-ghost") == (
        "Error: Topic 'cli-ghost' does not exist."
    )
    assert ok(server, "delete", "--topic", "cli-ghost", "--if-exists") == ""


def test_creating_an_existing_topic(server: ServerThread) -> None:
    ok(server, "create", "--topic", "cli-twice")
    assert "already exists" in fails(server, "create", "--topic", "cli-twice")
    assert ok(server, "create", "--topic", "cli-twice", "--if-not-exists") == ""


def test_usage_errors(server: ServerThread) -> None:
    result = run(server, "alter", "--topic", "cli-any")
    assert result.exit_code == 2
    assert "give --partitions, --config or --delete-config" in result.output
    result = CliRunner().invoke(topics, ["list"])
    assert result.exit_code == 2
    assert "--bootstrap-server" in result.output
    result = CliRunner().invoke(topics, ["list", "--bootstrap-server", "nowhere"])
    assert result.exit_code == 2
    assert "HOST:PORT" in result.output


def test_an_unreachable_server_is_a_one_line_error() -> None:
    result = CliRunner().invoke(
        topics, ["list", "--bootstrap-server", f"127.0.0.1:{free_port()}", "--timeout", "0.5"]
    )
    assert result.exit_code == 1
    assert result.output.startswith("Error: Metadata: no bootstrap broker answered")
    assert len(result.output.strip().splitlines()) == 1


def test_admin_calls_can_name_the_controllers_apart(server: ServerThread) -> None:
    out = ok(server, "create", "--topic", "cli-via-controllers", "--controllers", server.address)
    assert out == "Created topic cli-via-controllers.\n"
    assert "cli-via-controllers" in ok(server, "list").splitlines()


def test_a_partition_line_shows_its_eligible_leader_replicas() -> None:
    partition = PartitionInfo(
        0,
        2,
        3,
        (1, 2, 3),
        (2,),
        offline_replicas=(1,),
        eligible_leader_replicas=(1,),
        last_known_elr=(3,),
    )
    assert format_partition("t", partition) == (
        "\tTopic: t\tPartition: 0\tLeader: 2\tReplicas: 1,2,3\tIsr: 2"
        "\tElr: 1\tLastKnownElr: 3\tOffline: 1"
    )
    plain = PartitionInfo(0, 2, 3, (1, 2, 3), (2, 3))
    assert format_partition("t", plain).endswith("\tIsr: 2,3")


def test_a_partition_whose_last_isr_member_moved_to_the_elr() -> None:
    """KIP-966: the ISR is empty, nobody leads; the ELR holds the former members, the last
    known ELR those that lost the guarantee (an unclean shutdown)."""
    partition = PartitionInfo(
        0, None, 4, (1, 2, 3), (), eligible_leader_replicas=(2, 1), last_known_elr=(3,)
    )
    assert format_partition("t", partition) == (
        "\tTopic: t\tPartition: 0\tLeader: none\tReplicas: 1,2,3\tIsr: \tElr: 2,1\tLastKnownElr: 3"
    )
    waiting = PartitionInfo(0, None, 4, (1, 2, 3), (), last_known_elr=(3, 1))
    assert format_partition("t", waiting).endswith("\tIsr: \tElr: \tLastKnownElr: 3,1")


def test_an_alter_refused_in_part_changes_nothing(server: ServerThread) -> None:
    ok(server, "create", "--topic", "cli-atomic", "--partitions", "3")
    # A partition count that is no increase: the config given with it is not applied.
    message = fails(
        server,
        "alter",
        "--topic",
        "cli-atomic",
        "--partitions",
        "2",
        "--config",
        "retention.ms=5",
    )
    assert "not be an increase" in message
    header = ok(server, "describe", "--topic", "cli-atomic").splitlines()[0]
    assert "\tPartitionCount: 3\t" in header and header.endswith("\tConfigs: ")
    # A bad config: the partitions given with it are not added.
    message = fails(
        server,
        "alter",
        "--topic",
        "cli-atomic",
        "--partitions",
        "5",
        "--config",
        "retention.ms=soon",
    )
    assert "retention.ms" in message
    header = ok(server, "describe", "--topic", "cli-atomic").splitlines()[0]
    assert "\tPartitionCount: 3\t" in header and header.endswith("\tConfigs: ")


def test_if_exists_makes_a_missing_topic_a_no_op(server: ServerThread) -> None:
    assert ok(server, "alter", "--topic", "cli-absent", "--partitions", "3", "--if-exists") == ""
    assert (
        ok(server, "alter", "--topic", "cli-absent", "--config", "retention.ms=1", "--if-exists")
        == ""
    )
    assert ok(server, "describe", "--topic", "cli-absent", "--if-exists") == ""
    assert (
        ok(server, "describe", "--topic", "cli-absent", "--if-exists", "--format", "json").strip()
        == "[]"
    )
    assert "cli-absent" not in ok(server, "list").splitlines()
    # An existing topic is altered and described as without the flag.
    ok(server, "create", "--topic", "cli-present")
    out = ok(server, "alter", "--topic", "cli-present", "--partitions", "2", "--if-exists")
    assert out == "Increased the partition count of topic cli-present to 2.\n"
    described = ok(server, "describe", "--topic", "cli-present", "--if-exists")
    assert "\tPartitionCount: 2\t" in described.splitlines()[0]
    # Other failures are still failures.
    assert "not be an increase" in fails(
        server, "alter", "--topic", "cli-present", "--partitions", "1", "--if-exists"
    )
