"""``get-offsets``, ``delete-records``, ``leader-election``, ``topics describe``'s partition
filters and ``--format json``, and where the bootstrap address comes from, on one real
EmbeddedServer for the module (driven with ``CliRunner`` through ``highwater``'s group).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from embedded_servers import ServerThread
from highwater.cli.delete_records import parse_offset_json
from highwater.cli.get_offsets import parse_time
from highwater.cli.leader_election import parse_partitions_json
from highwater.cli.main import main
from highwater.cli.topics import partition_matches
from highwater.client.admin import PartitionInfo
from highwater.client.producer import Producer
from highwater.embedded import EMBEDDED_NODE_ID

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    """One server with ``offs`` (2 partitions; 3 records in partition 0, 1 in partition 1)."""
    thread = ServerThread(tmp_path_factory.mktemp("offsets-cli"))
    thread.start()
    try:
        result = CliRunner().invoke(
            main,
            ["topics", "create", "--bootstrap-server", thread.address, "--topic", "offs",
             "--partitions", "2"],
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        with Producer({"bootstrap.servers": thread.address, "linger.ms": 0}) as producer:
            for value, partition in (("a", 0), ("b", 0), ("c", 0), ("d", 1)):
                producer.produce(
                    "offs", value, partition=partition, timestamp=1_000 * (1 + ord(value))
                )
            producer.flush(10)
        yield thread
    finally:
        thread.stop()


def run(server: ServerThread, *args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner(env=env).invoke(
        main, [*args, "--bootstrap-server", server.address, "--timeout", "10"]
    )


def ok(server: ServerThread, *args: str) -> str:
    result = run(server, *args)
    assert result.exit_code == 0, (result.output, result.exception)
    return result.stdout


def error_of(result: Result, code: int = 1) -> str:
    """The stderr of a command that must fail cleanly with ``code``, without a traceback."""
    assert result.exit_code == code, (result.output, result.exception)
    assert isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    return result.stderr


# --- get-offsets --------------------------------------------------------------------


def test_get_offsets_latest_earliest_and_by_time(server: ServerThread) -> None:
    assert ok(server, "get-offsets", "--topic", "offs") == "offs:0:3\noffs:1:1\n"
    assert ok(server, "get-offsets", "--topic", "offs", "--time", "-2") == "offs:0:0\noffs:1:0\n"
    assert (
        ok(server, "get-offsets", "--topic", "of.*", "--partitions", "1", "--time", "earliest")
        == "offs:1:0\n"
    )
    # the first record at or after b's time is b (offset 1), and in partition 1 d (after b)
    by_time = ok(server, "get-offsets", "--topic", "offs", "--time", str(1_000 * (1 + ord("b"))))
    assert by_time == "offs:0:1\noffs:1:0\n"
    after_all = ok(server, "get-offsets", "--topic", "offs", "--time", str(1_000 * (1 + ord("e"))))
    assert after_all == "offs:0:\noffs:1:\n"
    as_json = json.loads(ok(server, "get-offsets", "--topic", "offs", "--format", "json"))
    assert as_json == [
        {"topic": "offs", "partition": 0, "offset": 3},
        {"topic": "offs", "partition": 1, "offset": 1},
    ]


def test_get_offsets_bad_input(server: ServerThread) -> None:
    message = error_of(run(server, "get-offsets", "--topic", "no-such-topic"))
    assert "Could not match any topic-partitions" in message
    assert "'soon' is not -1/latest" in error_of(run(server, "get-offsets", "--time", "soon"), 2)
    assert "not a comma-separated" in error_of(run(server, "get-offsets", "--partitions", "x"), 2)
    assert parse_time("-3") == -3 and parse_time("1700000000000") == 1_700_000_000_000
    with pytest.raises(ValueError, match="-4"):
        parse_time("-4")


# --- delete-records ---------------------------------------------------------------------


def test_delete_records_moves_the_low_watermark(server: ServerThread, tmp_path: Path) -> None:
    CliRunner().invoke(
        main, ["topics", "create", "--bootstrap-server", server.address, "--topic", "trim"]
    )
    with Producer({"bootstrap.servers": server.address, "linger.ms": 0}) as producer:
        for i in range(5):
            producer.produce("trim", str(i), partition=0)
        producer.flush(10)
    plan = tmp_path / "offsets.json"
    plan.write_text(
        json.dumps({"partitions": [{"topic": "trim", "partition": 0, "offset": 2}], "version": 1})
    )
    out = ok(server, "delete-records", "--offset-json-file", str(plan))
    assert out.splitlines() == [
        "Executing records delete operation",
        "Records delete operation completed:",
        "partition: trim-0\tlow_watermark: 2",
    ]
    assert ok(server, "get-offsets", "--topic", "trim", "--time", "earliest") == "trim:0:2\n"
    plan.write_text(json.dumps({"partitions": [{"topic": "trim", "partition": 0, "offset": -1}]}))
    as_json = json.loads(
        ok(server, "delete-records", "--offset-json-file", str(plan), "--format", "json")
    )
    assert as_json == [{"topic": "trim", "partition": 0, "low_watermark": 5, "error": None}]


def test_delete_records_bad_input(server: ServerThread, tmp_path: Path) -> None:
    plan = tmp_path / "bad.json"
    plan.write_text('{"partitions": [{"topic": "offs", "partition": 0}]')
    assert "not JSON" in error_of(run(server, "delete-records", "--offset-json-file", str(plan)))
    plan.write_text(json.dumps({"partitions": [{"topic": "offs", "partition": 0, "offset": 99}]}))
    result = run(server, "delete-records", "--offset-json-file", str(plan))
    assert "partition: offs-0\terror: " in result.stdout
    error_of(result)
    assert ok(server, "get-offsets", "--topic", "offs", "--time", "-2").startswith("offs:0:0\n")
    plan.write_text(json.dumps({"partitions": [{"topic": "ghost", "partition": 0, "offset": 1}]}))
    ghost = run(server, "delete-records", "--offset-json-file", str(plan))
    assert "partition: ghost-0\terror: Topic 'ghost' does not exist." in ghost.stdout
    error_of(ghost)
    missing = error_of(
        run(server, "delete-records", "--offset-json-file", str(tmp_path / "nope.json"))
    )
    assert "nope.json" in missing
    for document, message in (
        ({"partitions": {}}, "expected"),
        ({"partitions": [{"partition": 0, "offset": 1}]}, "no topic name"),
        ({"partitions": [{"topic": "t", "partition": -1, "offset": 1}]}, "partition number"),
        ({"partitions": [{"topic": "t", "partition": 0, "offset": -2}]}, "no offset"),
        ({"partitions": [{"topic": "t", "partition": 0, "offset": 1}] * 2}, "listed twice"),
        ({"partitions": [], "version": 1}, "no partitions"),
        ({"partitions": [{"topic": "t", "partition": 0, "offset": 1}], "version": 2}, "version"),
    ):
        with pytest.raises(ValueError, match=message):
            parse_offset_json(json.dumps(document))


# --- leader-election --------------------------------------------------------------------


def test_leader_election_reports_leaders_already_elected(
    server: ServerThread, tmp_path: Path
) -> None:
    out = ok(
        server,
        "leader-election",
        "--election-type",
        "PREFERRED",
        "--topic",
        "offs",
        "--partition",
        "0",
    )
    assert out == "Valid replica already elected for partitions offs-0\n"
    plan = tmp_path / "election.json"
    plan.write_text(
        json.dumps(
            {"partitions": [{"topic": "offs", "partition": 0}, {"topic": "offs", "partition": 1}]}
        )
    )
    as_json = json.loads(
        ok(
            server,
            "leader-election",
            "--election-type",
            "unclean",
            "--path-to-json-file",
            str(plan),
            "--format",
            "json",
        )
    )
    assert as_json["election_type"] == "UNCLEAN" and as_json["failed"] == []
    assert as_json["not_needed"] == [
        {"topic": "offs", "partition": 0},
        {"topic": "offs", "partition": 1},
    ]
    everything = ok(
        server, "leader-election", "--election-type", "PREFERRED", "--all-topic-partitions"
    )
    assert everything == "No partition needed a leader election (PREFERRED).\n"


def test_leader_election_bad_input(server: ServerThread, tmp_path: Path) -> None:
    unknown = error_of(
        run(
            server,
            "leader-election",
            "--election-type",
            "PREFERRED",
            "--topic",
            "ghost",
            "--partition",
            "0",
        )
    )
    assert "Error completing leader election (PREFERRED) for partition: ghost-0" in unknown
    usage = error_of(
        run(server, "leader-election", "--election-type", "PREFERRED", "--topic", "offs"), 2
    )
    assert "--topic and --partition go together" in usage
    usage = error_of(
        run(
            server,
            "leader-election",
            "--election-type",
            "PREFERRED",
            "--all-topic-partitions",
            "--topic",
            "offs",
            "--partition",
            "0",
        ),
        2,
    )
    assert "exactly one of" in usage
    plan = tmp_path / "bad.json"
    plan.write_text('{"partitions": [{"topic": "offs"}]}')
    bad = error_of(
        run(
            server,
            "leader-election",
            "--election-type",
            "PREFERRED",
            "--path-to-json-file",
            str(plan),
        )
    )
    assert "partitions[0] has no partition number" in bad
    with pytest.raises(ValueError, match="not JSON"):
        parse_partitions_json("{")


# --- topics describe filters and JSON ------------------------------------------------------


def test_topics_describe_filters_and_json(server: ServerThread) -> None:
    assert (
        ok(server, "topics", "describe", "--topic", "offs", "--under-replicated-partitions") == ""
    )
    assert ok(server, "topics", "describe", "--unavailable-partitions") == ""
    assert ok(server, "topics", "describe", "--under-min-isr-partitions") == ""
    both = run(server, "topics", "describe", "--unavailable-partitions", "--at-min-isr-partitions")
    assert "exclude each other" in error_of(both, 2)
    # RF 1 and min.insync.replicas 1: every partition is at its min ISR; 2 makes it under
    at_min = ok(server, "topics", "describe", "--topic", "offs", "--at-min-isr-partitions")
    node = EMBEDDED_NODE_ID
    assert at_min.splitlines() == [
        f"\tTopic: offs\tPartition: {p}\tLeader: {node}\tReplicas: {node}\tIsr: {node}"
        for p in (0, 1)
    ]
    (topic,) = json.loads(ok(server, "topics", "describe", "--topic", "offs", "--format", "json"))
    assert topic["name"] == "offs" and topic["configs"] == {} and topic["partition_count"] == 2
    assert topic["partitions"][1] == {
        "partition": 1, "leader": node, "leader_epoch": topic["partitions"][1]["leader_epoch"],
        "replicas": [node], "isr": [node], "offline_replicas": [],
        "eligible_leader_replicas": [], "last_known_elr": [],
    }  # fmt: skip


def test_partition_filters_follow_kafkas_rules() -> None:
    live = frozenset({1, 2, 3})
    healthy = PartitionInfo(0, 1, 0, (1, 2, 3), (1, 2, 3))
    shrunk = PartitionInfo(1, 1, 0, (1, 2, 3), (1,))
    at_two = PartitionInfo(2, 2, 0, (1, 2, 3), (2, 3))
    leaderless = PartitionInfo(3, None, 0, (1, 2, 3), ())
    dead_leader = PartitionInfo(4, 4, 0, (4, 2, 3), (4,))
    every = (healthy, shrunk, at_two, leaderless, dead_leader)

    def matching(which: str) -> list[int]:
        return [p.partition for p in every if partition_matches(which, p, live, 2)]

    assert matching("under-replicated") == [1, 2, 3, 4]
    assert matching("unavailable") == [3, 4]
    assert matching("under-min-isr") == [1, 3, 4]
    assert matching("at-min-isr") == [2]


def test_topics_list_json(server: ServerThread) -> None:
    listed = json.loads(ok(server, "topics", "list", "--format", "json"))
    assert {
        "name": "offs",
        "topic_id": listed[0]["topic_id"]
        if listed[0]["name"] == "offs"
        else next(t["topic_id"] for t in listed if t["name"] == "offs"),
        "is_internal": False,
    } in listed


# --- the bootstrap address ----------------------------------------------------------------


def test_bootstrap_from_env_then_profile_and_flag_first(
    server: ServerThread, tmp_path: Path
) -> None:
    runner = CliRunner()
    no_profile = {"HIGHWATER_PROFILE": None, "XDG_CONFIG_HOME": str(tmp_path / "none")}
    env = {**no_profile, "HIGHWATER_BOOTSTRAP_SERVERS": server.address}
    result = runner.invoke(main, ["topics", "list"], env=env)
    assert result.exit_code == 0 and "offs" in result.stdout.splitlines(), result.output

    profile = tmp_path / "profile.properties"
    profile.write_text(f"# my cluster\nbootstrap.servers={server.address}\n")
    result = runner.invoke(
        main, ["get-offsets", "--topic", "offs"], env={"HIGHWATER_PROFILE": str(profile)}
    )
    assert result.exit_code == 0 and result.stdout == "offs:0:3\noffs:1:1\n", result.output

    # the default profile path, under XDG_CONFIG_HOME
    (tmp_path / "xdg" / "highwater").mkdir(parents=True)
    (tmp_path / "xdg" / "highwater" / "profile.properties").write_text(profile.read_text())
    result = runner.invoke(
        main,
        ["topics", "list"],
        env={"HIGHWATER_PROFILE": None, "XDG_CONFIG_HOME": str(tmp_path / "xdg")},
    )
    assert result.exit_code == 0 and "offs" in result.stdout, result.output

    # the flag beats the environment, which beats the profile
    dead = "127.0.0.1:1"
    result = runner.invoke(
        main, ["topics", "list", "--bootstrap-server", server.address],
        env={"HIGHWATER_BOOTSTRAP_SERVERS": dead, "HIGHWATER_PROFILE": str(profile)},
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    result = runner.invoke(
        main, ["topics", "list", "--timeout", "0.5"],
        env={"HIGHWATER_BOOTSTRAP_SERVERS": dead, "HIGHWATER_PROFILE": str(profile)},
    )  # fmt: skip
    assert result.exit_code == 1 and "127.0.0.1:1" in result.stderr


def test_bootstrap_missing_or_malformed_is_a_usage_error(tmp_path: Path) -> None:
    runner = CliRunner()
    no_profile = {
        "HIGHWATER_PROFILE": None,
        "HIGHWATER_BOOTSTRAP_SERVERS": None,
        "XDG_CONFIG_HOME": str(tmp_path),
    }
    for command in (
        ["topics", "list"],
        ["groups", "list"],
        ["consume", "--topic", "t"],
        ["get-offsets"],
    ):
        result = runner.invoke(main, command, env=no_profile)
        assert result.exit_code == 2, (command, result.output)
        assert "no bootstrap server: give --bootstrap-server" in result.stderr
        assert "HIGHWATER_BOOTSTRAP_SERVERS" in result.stderr
    result = runner.invoke(
        main, ["topics", "list"], env={**no_profile, "HIGHWATER_BOOTSTRAP_SERVERS": "nowhere"}
    )
    assert result.exit_code == 2 and "$HIGHWATER_BOOTSTRAP_SERVERS" in result.stderr
    result = runner.invoke(
        main, ["topics", "list"], env={**no_profile, "HIGHWATER_PROFILE": str(tmp_path / "missing")}
    )
    assert result.exit_code == 2 and "missing" in result.stderr
    profile = tmp_path / "typo.properties"
    profile.write_text("bootstrap.servers=127.0.0.1:9092\nsecurity.protocl=SSL\n")
    result = runner.invoke(
        main, ["topics", "list"], env={**no_profile, "HIGHWATER_PROFILE": str(profile)}
    )
    assert result.exit_code == 2 and "security.protocl" in result.stderr
    # rolling keeps its own default (the broker on this host) when nothing names one
    started = time.monotonic()
    result = runner.invoke(
        main,
        [
            "rolling",
            "ready",
            "--node-id",
            "1",
            "--timeout",
            "0.2",
            "--bootstrap-server",
            "127.0.0.1:1",
        ],
        env=no_profile,
    )
    assert result.exit_code == 1 and time.monotonic() - started < 10


# --- --format json on the other describe and list commands ---------------------------------


def test_describe_and_list_commands_print_json(server: ServerThread) -> None:
    cluster = json.loads(ok(server, "cluster", "describe", "--format", "json"))
    assert cluster["metadata_mode"] == "kraft" and cluster["cluster_id"]
    assert [b["id"] for b in cluster["brokers"]] == [EMBEDDED_NODE_ID]

    brokers = json.loads(ok(server, "brokers", "list", "--format", "json"))
    assert brokers[0]["id"] == EMBEDDED_NODE_ID and brokers[0]["replicas"] >= 2
    text = ok(server, "brokers", "list").splitlines()
    assert text[0].split() == ["ID", "ADDRESS", "RACK", "REPLICAS"]
    assert text[1].split()[:3] == [str(EMBEDDED_NODE_ID), brokers[0]["address"], "-"]

    ok(server, "topics", "alter", "--topic", "offs", "--config", "retention.ms=86400000")
    configs = json.loads(
        ok(server, "configs", "--entity-type", "topics", "--entity-name", "offs", "--describe",
           "--format", "json")
    )  # fmt: skip
    assert configs == [
        {"name": "retention.ms", "value": "86400000", "source": "DYNAMIC_TOPIC_CONFIG",
         "sensitive": False, "read_only": False}
    ]  # fmt: skip

    ok(server, "acls", "add", "--allow-principal", "User:json", "--operation", "Read",
       "--topic", "offs")  # fmt: skip
    acls = json.loads(ok(server, "acls", "list", "--principal", "User:json", "--format", "json"))
    assert acls == [
        {"resource_type": "TOPIC", "resource_name": "offs", "pattern_type": "LITERAL",
         "principal": "User:json", "host": "*", "operation": "READ", "permission_type": "ALLOW"}
    ]  # fmt: skip
    ok(server, "users", "create", "--user", "jason", "--password", "pw")
    users = json.loads(ok(server, "users", "list", "--user", "jason", "--format", "json"))
    assert users == [{"user": "jason", "mechanism": "SCRAM-SHA-256", "iterations": 4096}]

    status = CliRunner().invoke(
        main,
        ["quorum", "describe", "--controllers", server.address, "--status", "--format", "json"],
    )
    assert status.exit_code == 0, status.output
    quorum = json.loads(status.stdout)
    assert quorum["CurrentVoters"] == [quorum["LeaderId"]] and quorum["HighWatermark"] > 0
    replication = CliRunner().invoke(
        main, ["quorum", "describe", "--controllers", server.address, "--replication",
               "--format", "json"]
    )  # fmt: skip
    (leader,) = [r for r in json.loads(replication.stdout) if r["status"] == "Leader"]
    assert leader["node_id"] == quorum["LeaderId"] and leader["lag"] == 0
