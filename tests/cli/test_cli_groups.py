"""``highwater groups`` and ``highwater consume --group`` on a real EmbeddedServer: listing,
describing with lag, resetting offsets, deleting, resuming from committed offsets, and clean
errors for bad input.

The server runs in a background thread with its own event loop (one per module); commands run
with ``CliRunner`` on the test's thread, group members are blocking ``Consumer`` objects polled
from worker threads.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from embedded_servers import ServerThread as EmbeddedServerThread
from highwater.cli.clients import consume
from highwater.cli.groups import groups, parse_duration
from highwater.client.admin import AdminClient, GroupNotEmptyError, NewTopic
from highwater.client.consumer import Consumer
from highwater.client.producer import Producer

pytestmark = pytest.mark.timeout(60)

OFFSETS_HEADER = [
    "GROUP",
    "TOPIC",
    "PARTITION",
    "CURRENT-OFFSET",
    "LOG-END-OFFSET",
    "LAG",
    "CONSUMER-ID",
    "HOST",
    "CLIENT-ID",
]


class ServerThread(EmbeddedServerThread):
    """The shared embedded server thread, with this module's helpers."""

    def create_topic(self, name: str, partitions: int) -> None:
        """Create a topic and wait until every partition has a leader."""

        async def create() -> None:
            async with AdminClient(self.address, request_timeout_s=10) as admin:
                (await admin.create_topics([NewTopic(name, partitions, 1)]))[name].raise_for_error()
                deadline = time.monotonic() + 15
                while time.monotonic() < deadline:
                    found = await admin.list_topics()
                    if name in {t.name for t in found}:
                        described = (await admin.describe_topics([name]))[name]
                        if all(p.leader is not None for p in described.partitions):
                            return
                    await asyncio.sleep(0.02)
            raise AssertionError(f"{name} got no leaders")

        asyncio.run(create())

    def produce(self, topic: str, per_partition: dict[int, int]) -> list[str]:
        """Write ``per_partition[p]`` records to each partition ``p``; their values."""
        values = []
        with Producer({"bootstrap.servers": self.address, "linger.ms": 0}) as producer:
            for partition, count in per_partition.items():
                for i in range(count):
                    values.append(f"p{partition}-{i}")
                    producer.produce(topic, values[-1], partition=partition)
            assert producer.flush(10) == 0
        return values


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    """One embedded server for the module; tests use topic and group names of their own."""
    thread = ServerThread(tmp_path_factory.mktemp("groups-cli"))
    thread.start()
    try:
        yield thread
    finally:
        thread.stop()


def run_groups(server: ServerThread, *args: str) -> Result:
    """``highwater groups ARGS... --bootstrap-server <server>``."""
    return CliRunner().invoke(groups, [*args, "--bootstrap-server", server.address])


def run_consume(server: ServerThread, *args: str) -> Result:
    return CliRunner().invoke(consume, [*args, "--bootstrap-server", server.address])


def table(output: str) -> list[list[str]]:
    """The rows of a printed table (header first), split on blanks."""
    return [line.split() for line in output.splitlines() if line.strip()]


def member(server: ServerThread, group: str, client_id: str) -> Consumer:
    """A blocking group member that notices rebalances quickly."""
    return Consumer(
        {
            "bootstrap.servers": server.address,
            "group.id": group,
            "client.id": client_id,
            "auto.offset.reset": "earliest",
            "fetch.max.wait.ms": 100,
            "heartbeat.interval.ms": 100,
            "session.timeout.ms": 6000,
        }
    )


def consume_together(consumers: list[Consumer], done: Callable[[list[str]], bool]) -> list[str]:
    """Poll each consumer from a thread of its own until ``done(values so far)`` holds."""
    values: list[str] = []
    lock = threading.Lock()
    stop = threading.Event()

    def run(consumer: Consumer) -> None:
        while not stop.is_set():
            message = consumer.poll(0.1)
            if message is not None:
                assert message.error() is None, message.error()
                value = message.value()
                assert value is not None
                with lock:
                    values.append(value.decode())

    with ThreadPoolExecutor(len(consumers)) as pool:
        futures = [pool.submit(run, c) for c in consumers]
        deadline = time.monotonic() + 30
        try:
            while True:
                with lock:
                    if done(list(values)):
                        break
                for future in futures:
                    if future.done():
                        future.result()
                assert time.monotonic() < deadline, f"only {len(values)} records consumed"
                time.sleep(0.02)
        finally:
            stop.set()
        for future in futures:
            future.result()
    return values


def test_consume_with_a_group_resumes_after_its_committed_offsets(server: ServerThread) -> None:
    server.create_topic("resume", 2)
    produced = server.produce("resume", {0: 5, 1: 5})

    first = run_consume(
        server, "--topic", "resume", "--group", "readers", "--from-beginning", "--max-messages", "6"
    )
    assert first.exit_code == 0, first.output
    assert "Processed a total of 6 messages" in first.stderr
    second = run_consume(
        server,
        "--topic",
        "resume",
        "--group",
        "readers",
        "--from-beginning",
        "--timeout-ms",
        "1500",
    )
    assert second.exit_code == 0, second.output
    lines = first.stdout.splitlines() + second.stdout.splitlines()
    assert sorted(lines) == sorted(produced)  # the second run printed only the other 4
    assert len(second.stdout.splitlines()) == 4
    third = run_consume(server, "--topic", "resume", "--group", "readers", "--timeout-ms", "500")
    assert (third.exit_code, third.stdout) == (0, "")

    described = run_groups(server, "describe", "--group", "readers")
    assert described.exit_code == 0, described.output
    assert "Consumer group 'readers' has no active members." in described.stderr
    rows = table(described.stdout)
    assert rows[0] == OFFSETS_HEADER
    assert rows[1:] == [
        ["readers", "resume", "0", "5", "5", "0", "-", "-", "-"],
        ["readers", "resume", "1", "5", "5", "0", "-", "-", "-"],
    ]

    empty = run_groups(server, "list", "--state", "empty")
    assert empty.exit_code == 0, empty.output
    assert ["readers", "Empty"] in table(empty.stdout)
    stable = run_groups(server, "list", "--state", "Stable")
    assert stable.exit_code == 0, stable.output
    assert "readers" not in stable.stdout
    listed = run_groups(server, "list")
    assert "readers" in listed.stdout.splitlines()


def test_active_members_are_described_and_block_reset_and_delete(server: ServerThread) -> None:
    server.create_topic("shared", 4)
    produced = server.produce("shared", {0: 5, 1: 5, 2: 5, 3: 5})
    consumers = [member(server, "workers", "w1"), member(server, "workers", "w2")]
    try:
        for consumer in consumers:
            consumer.subscribe(["shared"])
        consumed = consume_together(
            consumers,
            lambda got: len(got) >= 20 and all(len(c.assignment()) == 2 for c in consumers),
        )
        assert sorted(consumed) == sorted(produced)
        for consumer in consumers:
            consumer.commit(asynchronous=False)
        server.produce("shared", {0: 4})

        described = run_groups(server, "describe", "--group", "workers")
        assert described.exit_code == 0, described.output
        rows = table(described.stdout)
        assert rows[0] == OFFSETS_HEADER
        assert [r[:6] for r in rows[1:]] == [
            ["workers", "shared", "0", "5", "9", "4"],
            ["workers", "shared", "1", "5", "5", "0"],
            ["workers", "shared", "2", "5", "5", "0"],
            ["workers", "shared", "3", "5", "5", "0"],
        ]
        assert sorted(r[8] for r in rows[1:]) == ["w1", "w1", "w2", "w2"]
        assert {r[7] for r in rows[1:]} == {"/127.0.0.1"}
        assert len({r[6] for r in rows[1:]}) == 2

        members = run_groups(server, "describe", "--group", "workers", "--members", "--verbose")
        assert members.exit_code == 0, members.output
        member_rows = table(members.stdout)
        assert member_rows[0] == [
            "GROUP",
            "CONSUMER-ID",
            "HOST",
            "CLIENT-ID",
            "#PARTITIONS",
            "ASSIGNMENT",
        ]
        assert sorted((r[3], r[4]) for r in member_rows[1:]) == [("w1", "2"), ("w2", "2")]
        state = run_groups(server, "describe", "--group", "workers", "--state")
        assert state.exit_code == 0, state.output
        state_row = state.stdout.splitlines()[1].split()
        assert state_row[0] == "workers" and state_row[-3:] == ["range", "Stable", "2"]

        for mode in ("--dry-run", "--execute"):
            refused = run_groups(
                server,
                "reset-offsets",
                "--group",
                "workers",
                "--topic",
                "shared",
                "--to-earliest",
                mode,
            )
            assert refused.exit_code == 1
            assert "can only be reset if the group 'workers' is inactive" in refused.stderr
            assert "Stable" in refused.stderr
        not_deleted = run_groups(server, "delete", "--group", "workers")
        assert not_deleted.exit_code == 1
        assert "Cannot delete group 'workers': it has active members." in not_deleted.stderr
    finally:
        for consumer in consumers:
            consumer.close()

    dry = run_groups(
        server, "reset-offsets", "--group", "workers", "--topic", "shared", "--to-earliest"
    )
    assert dry.exit_code == 0, dry.output
    assert "--execute option is missing" in dry.stderr
    assert table(dry.stdout) == [["GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"]] + [
        ["workers", "shared", str(p), "0"] for p in range(4)
    ]
    unchanged = table(run_groups(server, "describe", "--group", "workers").stdout)
    assert [r[3] for r in unchanged[1:]] == ["5", "5", "5", "5"]

    executed = run_groups(
        server,
        "reset-offsets",
        "--group",
        "workers",
        "--topic",
        "shared:0,2",
        "--shift-by",
        "-2",
        "--execute",
    )
    assert executed.exit_code == 0, executed.output
    assert table(executed.stdout)[1:] == [
        ["workers", "shared", "0", "3"],
        ["workers", "shared", "2", "3"],
    ]
    clamped = run_groups(
        server,
        "reset-offsets",
        "--group",
        "workers",
        "--topic",
        "shared:1",
        "--to-offset",
        "999",
        "--execute",
    )
    assert table(clamped.stdout)[1:] == [["workers", "shared", "1", "5"]]
    future = run_groups(
        server,
        "reset-offsets",
        "--group",
        "workers",
        "--topic",
        "shared:3",
        "--to-datetime",
        "2999-01-01T00:00:00+00:00",
        "--execute",
    )
    assert table(future.stdout)[1:] == [["workers", "shared", "3", "5"]]
    past = run_groups(
        server,
        "reset-offsets",
        "--group",
        "workers",
        "--topic",
        "shared:3",
        "--to-datetime",
        "2000-01-01T00:00:00",
        "--execute",
    )
    assert table(past.stdout)[1:] == [["workers", "shared", "3", "0"]]
    after = table(run_groups(server, "describe", "--group", "workers").stdout)
    assert [(r[2], r[3], r[5]) for r in after[1:]] == [
        ("0", "3", "6"),
        ("1", "5", "0"),
        ("2", "3", "2"),
        ("3", "0", "5"),
    ]

    deleted = run_groups(server, "delete", "--group", "workers")
    assert deleted.exit_code == 0, deleted.output
    assert "Deletion of requested consumer groups ('workers') was successful." in deleted.stdout
    gone = run_groups(server, "describe", "--group", "workers")
    assert gone.exit_code == 1
    assert "Consumer group 'workers' does not exist." in gone.stderr


def test_bad_input_is_a_clear_error(server: ServerThread) -> None:
    unknown = run_groups(server, "describe", "--group", "ghost")
    assert unknown.exit_code == 1
    assert unknown.stderr.strip() == "Error: Consumer group 'ghost' does not exist."
    not_found = run_groups(server, "delete", "--group", "ghost")
    assert not_found.exit_code == 1
    assert "Cannot delete group 'ghost': it does not exist." in not_found.stderr

    for spec in ("shared:", "shared:x", ":1", "shared:1,-2"):
        bad = run_groups(server, "reset-offsets", "--group", "g", "--topic", spec, "--to-latest")
        assert bad.exit_code == 2, (spec, bad.output)
        assert "Invalid value for '--topic'" in bad.stderr
    no_scenario = run_groups(server, "reset-offsets", "--group", "g", "--topic", "t")
    assert no_scenario.exit_code == 2
    assert "exactly one of" in no_scenario.stderr
    two = run_groups(
        server, "reset-offsets", "--group", "g", "--topic", "t", "--to-earliest", "--to-latest"
    )
    assert two.exit_code == 2
    bad_time = run_groups(
        server, "reset-offsets", "--group", "g", "--topic", "t", "--to-datetime", "yesterday"
    )
    assert bad_time.exit_code == 2
    bad_state = run_groups(server, "list", "--state", "Sleeping")
    assert bad_state.exit_code == 2
    unknown_topic = run_groups(
        server, "reset-offsets", "--group", "g", "--topic", "missing", "--to-latest"
    )
    assert unknown_topic.exit_code == 1
    assert "Topic 'missing' does not exist." in unknown_topic.stderr

    with_partition = run_consume(server, "--topic", "t", "--group", "g", "--partition", "0")
    assert with_partition.exit_code == 2
    assert "--partition does not go with --group" in with_partition.stderr


def test_all_groups_to_current_by_duration_export_and_json(
    server: ServerThread, tmp_path: Path
) -> None:
    server.create_topic("ledger", 2)
    server.produce("ledger", {0: 4, 1: 4})

    async def commit() -> None:
        async with AdminClient(server.address, request_timeout_s=10) as admin:
            await admin.alter_consumer_group_offsets("ledger-a", {("ledger", 0): 1})
            await admin.alter_consumer_group_offsets("ledger-b", {("ledger", 1): 3})

    asyncio.run(commit())
    current = run_groups(
        server, "reset-offsets", "--group", "ledger-a", "--topic", "ledger", "--to-current"
    )
    assert table(current.stdout)[1:] == [
        ["ledger-a", "ledger", "0", "1"],
        ["ledger-a", "ledger", "1", "4"],
    ]
    hour = run_groups(
        server, "reset-offsets", "--group", "ledger-a", "--topic", "ledger",
        "--by-duration", "PT1H", "--format", "json",
    )  # fmt: skip
    assert json.loads(hour.stdout) == [
        {"group": "ledger-a", "topic": "ledger", "partition": p, "new_offset": 0} for p in (0, 1)
    ]
    exported = run_groups(
        server, "reset-offsets", "--group", "ledger-a", "--group", "ledger-b", "--topic",
        "ledger:1", "--to-offset", "2", "--export",
    )  # fmt: skip
    assert exported.stdout == "ledger-a,ledger,1,2\nledger-b,ledger,1,2\n"
    plan = tmp_path / "offsets.csv"
    plan.write_text(exported.stdout)
    applied = run_groups(
        server, "reset-offsets", "--all-groups", "--from-file", str(plan), "--execute"
    )
    assert applied.exit_code == 0, applied.output
    one = run_groups(
        server,
        "reset-offsets",
        "--group",
        "ledger-b",
        "--topic",
        "ledger:0",
        "--to-latest",
        "--export",
    )
    assert one.stdout == "ledger,0,4\n"

    described = run_groups(
        server, "describe", "--group", "ledger-a", "--group", "ledger-b", "--format", "json"
    )
    rows = json.loads(described.stdout)
    assert [(r["group"], r["partition"], r["current_offset"], r["lag"]) for r in rows] == [
        ("ledger-a", 0, 1, 3), ("ledger-a", 1, 2, 2), ("ledger-b", 1, 2, 2),
    ]  # fmt: skip
    assert rows[0]["log_end_offset"] == 4 and rows[0]["consumer_id"] is None
    every = json.loads(run_groups(server, "describe", "--all-groups", "--format", "json").stdout)
    assert {"ledger-a", "ledger-b"} <= {r["group"] for r in every}
    listed = json.loads(run_groups(server, "list", "--format", "json").stdout)
    assert {"group": "ledger-a", "state": "Empty"} in listed

    gone = run_groups(server, "delete", "--all-groups")
    assert gone.exit_code == 0, gone.output
    assert "'ledger-a'" in gone.stdout and "'ledger-b'" in gone.stdout
    assert run_groups(server, "list").stdout == ""


def test_group_options_bad_input(server: ServerThread, tmp_path: Path) -> None:
    for duration in ("1h", "PT", "P1H", "PT-1S", "P"):
        bad = run_groups(
            server, "reset-offsets", "--group", "g", "--topic", "t", "--by-duration", duration
        )
        assert bad.exit_code == 2, (duration, bad.output)
        assert "is not a duration PnDTnHnMnS" in bad.stderr
    assert parse_duration("P1DT2H3M4.5S") == timedelta(days=1, hours=2, minutes=3, seconds=4.5)
    both = run_groups(server, "describe", "--group", "g", "--all-groups")
    assert both.exit_code == 2 and "give --group (repeatable) or --all-groups" in both.stderr
    neither = run_groups(server, "delete")
    assert neither.exit_code == 2 and "give --group (repeatable) or --all-groups" in neither.stderr
    plan = tmp_path / "bad.csv"
    plan.write_text("ledger,zero,1\n")
    bad_csv = run_groups(server, "reset-offsets", "--group", "g", "--from-file", str(plan))
    assert (
        bad_csv.exit_code == 1
        and "line 1: 'ledger,zero,1' is not topic,partition,offset" in bad_csv.stderr
    )
    plan.write_text("ledger,0,1\n")
    several = run_groups(server, "reset-offsets", "--all-groups", "--from-file", str(plan))
    assert several.exit_code == 2 and "is for one --group" in several.stderr
    export_json = run_groups(
        server,
        "reset-offsets",
        "--group",
        "g",
        "--topic",
        "t",
        "--to-latest",
        "--export",
        "--format",
        "json",
    )
    assert export_json.exit_code == 2


def test_delete_offsets_spares_subscribed_topics(server: ServerThread) -> None:
    server.create_topic("kept", 1)
    server.create_topic("dropped", 2)
    server.produce("kept", {0: 2})
    server.produce("dropped", {0: 2, 1: 2})
    consumer = member(server, "pruner", "pruner-1")
    try:
        consumer.subscribe(["kept"])
        consume_together([consumer], lambda values: len(values) >= 2)
        consumer.commit(asynchronous=False)

        async def commit_dropped() -> None:
            async with AdminClient(server.address, request_timeout_s=10) as admin:
                await admin.alter_consumer_group_offsets("pruner", {("dropped", 0): 1})

        with pytest.raises(GroupNotEmptyError, match="active members"):
            asyncio.run(commit_dropped())  # offsets of a live group are its members'
    finally:
        consumer.close()
    asyncio.run(commit_dropped())
    second = member(server, "pruner", "pruner-2")
    try:
        second.subscribe(["kept"])
        consume_together([second], lambda _values: bool(second.assignment()))
        refused = run_groups(
            server, "delete-offsets", "--group", "pruner", "--topic", "kept", "--topic", "dropped"
        )
        assert refused.exit_code == 1, refused.output
        assert refused.stdout.splitlines()[0] == (
            "Request failed for deleting offsets with topic dropped,kept group pruner"
        )
        rows = table(refused.stdout)[1:]
        assert rows[0] == ["TOPIC", "PARTITION", "STATUS"]
        assert rows[1:3] == [["dropped", "0", "Successful"], ["dropped", "1", "Successful"]]
        assert rows[3][:3] == ["kept", "0", "Error:"]
    finally:
        second.close()
    offsets = json.loads(
        run_groups(server, "describe", "--group", "pruner", "--format", "json").stdout
    )
    assert [(r["topic"], r["partition"]) for r in offsets] == [("kept", 0)]
    done = run_groups(
        server, "delete-offsets", "--group", "pruner", "--topic", "kept:0", "--format", "json"
    )
    assert done.exit_code == 0 and json.loads(done.stdout) == [
        {"topic": "kept", "partition": 0, "status": "Successful"}
    ]
    unknown = run_groups(server, "delete-offsets", "--group", "ghost", "--topic", "kept")
    assert unknown.exit_code == 1 and "Consumer group 'ghost' does not exist." in unknown.stderr
    no_topic = run_groups(server, "delete-offsets", "--group", "pruner", "--topic", "nowhere")
    assert no_topic.exit_code == 1 and "nowhere" in no_topic.stderr


def test_reset_offsets_warns_only_when_neither_dry_run_nor_execute_is_given(
    server: ServerThread,
) -> None:
    server.create_topic("dry-topic", 1)
    server.produce("dry-topic", {0: 3})
    consumed = run_consume(
        server, "--topic", "dry-topic", "--group", "dry", "--from-beginning", "--max-messages", "3"
    )
    assert consumed.exit_code == 0, consumed.output
    args = ("reset-offsets", "--group", "dry", "--topic", "dry-topic", "--to-earliest")
    dry = run_groups(server, *args, "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert dry.stderr == ""
    assert table(dry.stdout)[1:] == [["dry", "dry-topic", "0", "0"]]
    plain = run_groups(server, *args)
    assert plain.exit_code == 0, plain.output
    assert "--execute option is missing" in plain.stderr
    assert table(plain.stdout) == table(dry.stdout)
