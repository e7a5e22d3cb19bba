"""``highwater produce`` and ``highwater consume`` on a real EmbeddedServer: stdin to records,
records to stdout, keys and separators, offsets, stop conditions and clean errors.

The server runs in a background thread with its own event loop (one per module); each test
invokes a command with ``CliRunner`` on the test's thread, as the installed command runs.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import grpc.aio
import pytest
from click.testing import CliRunner, Result
from embedded_servers import ServerThread as EmbeddedServerThread
from embedded_servers import free_port
from highwater.cli.clients import consume, produce
from highwater.client.admin import AdminClient, NewTopic
from highwater.v1 import broker_pb2 as pb
from highwater.v1 import broker_pb2_grpc

pytestmark = pytest.mark.timeout(60)


class ServerThread(EmbeddedServerThread):
    """The shared embedded server thread, with this module's helpers."""

    def create_topic(self, name: str, partitions: int = 1) -> None:
        """Create a topic and wait until Metadata names a leader for each partition."""

        async def create() -> None:
            async with AdminClient(self.address, request_timeout_s=10) as admin:
                result = await admin.create_topics([NewTopic(name, partitions, 1)])
                result[name].raise_for_error()
            async with grpc.aio.insecure_channel(self.address) as channel:
                stub = broker_pb2_grpc.BrokerStub(channel)
                for _ in range(500):
                    reply = await stub.Metadata(pb.MetadataRequest(topics=[name]))
                    found = reply.topics[0].partitions
                    if len(found) == partitions and all(p.leader_id >= 0 for p in found):
                        return
                    await asyncio.sleep(0.01)
            raise AssertionError(f"{name} got no leaders")

        asyncio.run(create())


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    """One embedded server for the module; tests use topic names of their own."""
    thread = ServerThread(tmp_path_factory.mktemp("clients-cli"))
    thread.start()
    try:
        yield thread
    finally:
        thread.stop()


def run_produce(server: ServerThread, lines: str, *args: str) -> Result:
    """``highwater produce ARGS... --bootstrap-server <server>`` with ``lines`` on stdin."""
    return CliRunner().invoke(produce, [*args, "--bootstrap-server", server.address], input=lines)


def run_consume(server: ServerThread, *args: str) -> Result:
    """``highwater consume ARGS... --bootstrap-server <server>``."""
    return CliRunner().invoke(consume, [*args, "--bootstrap-server", server.address])


def ok(result: Result) -> Result:
    """A result that must have succeeded."""
    assert result.exit_code == 0, (result.output, result.exception)
    return result


def one_error(result: Result) -> str:
    """The one ``Error:`` line of a command that failed cleanly with exit code 1."""
    assert result.exit_code == 1, (result.output, result.exception)
    assert isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1, result.stderr
    return errors[0]


def test_produce_lines_then_consume_from_beginning(server: ServerThread) -> None:
    server.create_topic("cli-lines")
    produced = ok(
        run_produce(server, "first\nsecond line\n\nfourth\r\nlast", "--topic", "cli-lines")
    )
    assert produced.stdout == ""
    assert produced.stderr == "5 records sent, 0 failed.\n"

    consumed = ok(
        run_consume(server, "--topic", "cli-lines", "--from-beginning", "--max-messages", "5")
    )
    assert consumed.stdout == "first\nsecond line\n\nfourth\nlast\n"
    assert consumed.stderr == "Processed a total of 5 messages\n"

    two = ok(run_consume(server, "--topic", "cli-lines", "--from-beginning", "--max-messages", "2"))
    assert two.stdout == "first\nsecond line\n"


def test_keys_separators_offsets_and_options(server: ServerThread) -> None:
    server.create_topic("cli-keys")
    lines = "user1:alice\nuser2:bob:smith\n"
    ok(
        run_produce(
            server,
            lines,
            "--topic",
            "cli-keys",
            "--key-separator",
            ":",
            "--acks",
            "1",
            "--compression-type",
            "gzip",
            "--property",
            "linger.ms=1",
        )
    )
    keyed = ok(
        run_consume(
            server,
            "--topic",
            "cli-keys",
            "--from-beginning",
            "--max-messages",
            "2",
            "--print-key",
        )
    )
    assert keyed.stdout == "user1\talice\nuser2\tbob:smith\n"

    offsets = ok(
        run_consume(
            server,
            "--topic",
            "cli-keys",
            "--partition",
            "0",
            "--offset",
            "1",
            "--max-messages",
            "1",
            "--print-key",
            "--print-offset",
            "--key-separator",
            " | ",
        )
    )
    assert offsets.stdout == "Offset:1 | user2 | bob:smith\n"

    unkeyed = ok(run_produce(server, "plain\n", "--topic", "cli-keys"))
    assert unkeyed.stderr.startswith("1 records sent")
    nulls = ok(
        run_consume(
            server, "--topic", "cli-keys", "--partition", "0", "--offset", "2",
            "--max-messages", "1", "--print-key",
        )
    )  # fmt: skip
    assert nulls.stdout == "null\tplain\n"


def test_consume_stops_after_timeout_and_starts_at_latest(server: ServerThread) -> None:
    server.create_topic("cli-idle", 3)
    ok(run_produce(server, "a\nb\nc\nd\n", "--topic", "cli-idle"))
    everything = ok(
        run_consume(
            server, "--topic", "cli-idle", "--from-beginning", "--max-messages", "10",
            "--timeout-ms", "700",
        )
    )  # fmt: skip
    assert sorted(everything.stdout.splitlines()) == ["a", "b", "c", "d"]
    assert everything.stderr == "Processed a total of 4 messages\n"

    latest = ok(run_consume(server, "--topic", "cli-idle", "--timeout-ms", "300"))
    assert latest.stdout == ""
    assert latest.stderr == "Processed a total of 0 messages\n"


def test_unknown_topic_is_a_clean_error(server: ServerThread) -> None:
    error = one_error(run_consume(server, "--topic", "cli-nope", "--from-beginning"))
    assert error == "Error: Topic 'cli-nope' does not exist."
    error = one_error(run_produce(server, "x\n", "--topic", "cli-nope"))
    assert error == "Error: Topic 'cli-nope' does not exist."

    server.create_topic("cli-one")
    error = one_error(run_consume(server, "--topic", "cli-one", "--partition", "5"))
    assert error == "Error: Topic 'cli-one' has no partition 5 (it has 1)."


def test_produce_reports_failed_lines_and_bad_settings(server: ServerThread) -> None:
    server.create_topic("cli-bad")
    result = run_produce(
        server, "k:v\nno-separator\n", "--topic", "cli-bad", "--key-separator", ":"
    )
    assert result.exit_code == 1, result.output
    assert result.stderr.splitlines() == [
        "1 records sent, 1 failed.",
        "Error: no key separator ':' on line 2",
    ]

    error = one_error(run_produce(server, "x\n", "--topic", "cli-bad", "--property", "nope=1"))
    assert "nope" in error

    usage = run_produce(server, "x\n", "--topic", "cli-bad", "--property", "novalue")
    assert usage.exit_code == 2 and "KEY=VALUE" in usage.stderr


def test_consume_usage_errors(server: ServerThread) -> None:
    result = run_consume(server, "--topic", "t", "--offset", "3")
    assert result.exit_code == 2 and "--offset needs --partition" in result.stderr
    result = run_consume(
        server, "--topic", "t", "--partition", "0", "--offset", "3", "--from-beginning"
    )
    assert result.exit_code == 2 and "exclude each other" in result.stderr
    unreachable = CliRunner().invoke(
        consume, ["--topic", "t", "--bootstrap-server", f"127.0.0.1:{free_port()}"]
    )
    assert unreachable.exit_code == 1 and "Error: " in unreachable.stderr


def test_headers_keys_and_printing_properties(server: ServerThread) -> None:
    server.create_topic("cli-props")
    lines = "h1:v1,h2:v2|k1=one\n|k2=two\nh3:NULL|NULL=three\n"
    reader = ("parse.headers=true", "headers.delimiter=|", "parse.key=true", "key.separator==")
    args = [arg for prop in (*reader, "null.marker=NULL") for arg in ("--property", prop)]
    ok(run_produce(server, lines, "--topic", "cli-props", *args))

    every = [
        "print.timestamp=true", "print.partition=true", "print.offset=true",
        "print.headers=true", "print.key=true", "key.separator=;", "null.literal=<nil>",
    ]  # fmt: skip
    printed = ok(
        run_consume(
            server, "--topic", "cli-props", "--from-beginning", "--max-messages", "3",
            *(arg for prop in every for arg in ("--property", prop)),
        )
    ).stdout.splitlines()  # fmt: skip
    fields = [line.split(";") for line in printed]
    assert all(f[0].startswith("CreateTime:") and int(f[0].split(":")[1]) > 0 for f in fields)
    assert [f[1:] for f in fields] == [
        ["Partition:0", "Offset:0", "h1:v1,h2:v2", "k1", "one"],
        ["Partition:0", "Offset:1", "NO_HEADERS", "k2", "two"],
        ["Partition:0", "Offset:2", "h3:<nil>", "<nil>", "three"],
    ]
    quiet = ok(
        run_consume(
            server, "--topic", "cli-props", "--from-beginning", "--max-messages", "1",
            "--property", "print.value=false", "--property", "print.key=true",
        )
    )  # fmt: skip
    assert quiet.stdout == "k1\n"

    as_json = ok(
        run_consume(
            server, "--topic", "cli-props", "--from-beginning", "--max-messages", "3",
            "--formatter", "json",
        )
    )  # fmt: skip
    records = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert [(r["offset"], r["key"], r["value"]) for r in records] == [
        (0, "k1", "one"), (1, "k2", "two"), (2, None, "three"),
    ]  # fmt: skip
    assert records[0]["headers"] == [{"key": "h1", "value": "v1"}, {"key": "h2", "value": "v2"}]
    assert records[2]["headers"] == [{"key": "h3", "value": None}]
    assert records[0]["topic"] == "cli-props" and records[0]["partition"] == 0
    assert records[0]["timestamp_type"] == "CreateTime" and records[0]["timestamp"] > 0


def test_bad_properties(server: ServerThread) -> None:
    server.create_topic("cli-badprops")
    result = run_produce(
        server, "h1v1|x\nno-delimiter\n", "--topic", "cli-badprops",
        "--property", "parse.headers=true", "--property", "headers.delimiter=|",
    )  # fmt: skip
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [
        "0 records sent, 2 failed.",
        "Error: no header key separator ':' in 'h1v1' on line 1",
        "Error: no headers delimiter '|' on line 2",
    ]
    usage = run_produce(server, "x\n", "--topic", "cli-badprops", "--property", "parse.key=yes")
    assert usage.exit_code == 2 and "parse.key=yes: expected true or false" in usage.stderr
    usage = run_consume(server, "--topic", "cli-badprops", "--property", "print.stamp=true")
    assert usage.exit_code == 2 and "unknown property 'print.stamp'" in usage.stderr
    usage = run_consume(
        server, "--topic", "cli-badprops", "--formatter", "json", "--property", "print.key=true"
    )
    assert usage.exit_code == 2 and "--formatter json prints every field" in usage.stderr


def test_offset_takes_earliest_and_latest(server: ServerThread) -> None:
    server.create_topic("cli-named-offsets")
    ok(run_produce(server, "a\nb\nc\n", "--topic", "cli-named-offsets"))
    partition = ["--topic", "cli-named-offsets", "--partition", "0"]
    earliest = ok(run_consume(server, *partition, "--offset", "earliest", "--max-messages", "3"))
    assert earliest.stdout == "a\nb\nc\n"
    latest = ok(run_consume(server, *partition, "--offset", "LATEST", "--timeout-ms", "300"))
    assert latest.stdout == ""
    assert latest.stderr == "Processed a total of 0 messages\n"
    from_one = ok(run_consume(server, *partition, "--offset", "1", "--max-messages", "2"))
    assert from_one.stdout == "b\nc\n"
    bad = run_consume(server, *partition, "--offset", "soonest")
    assert bad.exit_code == 2
    assert "'soonest' is not a non-negative offset, earliest or latest" in bad.output
    bad = run_consume(server, *partition, "--offset", "-1")
    assert bad.exit_code == 2
