"""``highwater partitions reassign`` on a real EmbeddedServer (one broker): generating,
executing, verifying and cancelling plans, and bad plans and arguments as clean errors.
Moves between brokers are in tests/integration/test_partition_reassignment_processes.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from embedded_servers import ServerThread
from highwater.cli.main import main
from highwater.embedded import EMBEDDED_NODE_ID

pytestmark = pytest.mark.timeout(60)

B = EMBEDDED_NODE_ID


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    thread = ServerThread(tmp_path_factory.mktemp("partitions-cli"))
    thread.start()
    try:
        result = CliRunner().invoke(
            main,
            ["topics", "create", "--bootstrap-server", thread.address, "--topic", "events",
             "--partitions", "2"],
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        yield thread
    finally:
        thread.stop()


def reassign(server: ServerThread, *args: str) -> Result:
    return CliRunner().invoke(
        main,
        ["partitions", "reassign", "--bootstrap-server", server.address, "--timeout", "10", *args],
    )


def plan_file(tmp_path: Path, entries: list[dict[str, object]] | str) -> str:
    path = tmp_path / "plan.json"
    text = (
        entries if isinstance(entries, str) else json.dumps({"version": 1, "partitions": entries})
    )
    path.write_text(text)
    return str(path)


def test_generate_prints_the_current_and_a_proposed_plan(server: ServerThread) -> None:
    result = reassign(server, "--generate", "--topics", "events", "--broker-list", str(B))
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == "Current partition replica assignment"
    assert lines[3] == "Proposed partition reassignment configuration"
    expected = [{"topic": "events", "partition": p, "replicas": [B]} for p in (0, 1)]
    assert json.loads(lines[1])["partitions"] == expected
    assert json.loads(lines[4]) == {"version": 1, "partitions": expected}


def test_execute_verify_and_cancel_a_plan(server: ServerThread, tmp_path: Path) -> None:
    plan = plan_file(tmp_path, [{"topic": "events", "partition": 0, "replicas": [B]}])
    executed = reassign(server, "--execute", "--plan", plan)
    assert executed.exit_code == 0, executed.output
    assert "Successfully started partition reassignment(s) for 1 partition(s)." in executed.output
    verified = reassign(server, "--verify", "--plan", plan)
    assert verified.exit_code == 0, verified.output
    assert verified.output == "Reassignment of partition events-0 is completed.\n"
    cancelled = reassign(server, "--cancel", "--plan", plan)
    assert cancelled.exit_code == 0
    assert "events-0 is not being reassigned" in cancelled.output


def test_a_plan_to_brokers_that_do_not_exist_is_refused_per_partition(
    server: ServerThread, tmp_path: Path
) -> None:
    plan = plan_file(tmp_path, [{"topic": "events", "partition": 1, "replicas": [B, 999]}])
    executed = reassign(server, "--execute", "--plan", plan)
    assert executed.exit_code == 1
    assert "Error: events-1: Brokers [999] of the target replicas" in executed.output
    verified = reassign(server, "--verify", "--plan", plan)
    assert verified.exit_code == 1
    assert f"did not happen: its replicas are [{B}]" in verified.output


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ("not json", "the plan is not JSON"),
        ("{}", 'needs a "partitions" list'),
        ([{"topic": "events", "partition": -1, "replicas": [B]}], '"partition" must be'),
        ([{"topic": "events", "partition": 0, "replicas": []}], '"replicas" must be'),
        ([{"topic": "events", "partition": 0, "replicas": [B, B]}], "repeat"),
        (
            [{"topic": "events", "partition": 0, "replicas": [B]}] * 2,
            "in the plan twice",
        ),
    ],
)
def test_bad_plan_files_are_one_error_line(
    server: ServerThread, tmp_path: Path, entries: list[dict[str, object]] | str, message: str
) -> None:
    result = reassign(server, "--execute", "--plan", plan_file(tmp_path, entries))
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.output.startswith("Error: ") and message in result.output


def test_unknown_partitions_and_missing_arguments_are_clean_errors(
    server: ServerThread, tmp_path: Path
) -> None:
    plan = plan_file(tmp_path, [{"topic": "events", "partition": 7, "replicas": [B]}])
    result = reassign(server, "--execute", "--plan", plan)
    assert result.exit_code == 1 and "no such partitions: events-7" in result.output
    unknown = reassign(server, "--generate", "--topics", "nope", "--broker-list", str(B))
    assert unknown.exit_code == 1 and "does not exist" in unknown.output
    assert reassign(server).exit_code == 2
    assert "needs --plan" in reassign(server, "--verify").output
    assert "needs --topics and --broker-list" in reassign(server, "--generate").output
    dead = reassign(server, "--generate", "--topics", "events", "--broker-list", "12345")
    assert dead.exit_code == 1 and "brokers [12345] are not live" in dead.output


def test_brokers_check_removal_list_and_unregister(server: ServerThread) -> None:
    def brokers(*args: str) -> Result:
        return CliRunner().invoke(
            main, ["brokers", *args, "--bootstrap-server", server.address, "--timeout", "10"]
        )

    # The one broker holds every partition: removing it (or every id from it up) is refused.
    held = brokers("check-removal", "--ids-from", str(B))
    assert held.exit_code == 1
    assert f"broker {B} still holds replicas of" in held.output
    assert "__consumer_offsets-0" in held.output and "reassign them first" in held.output
    assert brokers("check-removal", "--ids-from", str(B + 1)).exit_code == 0
    assert brokers("check-removal", "--ids", "12345").exit_code == 0
    listed = brokers("list")
    assert listed.exit_code == 0
    [header, row] = listed.output.splitlines()
    assert header.split() == ["ID", "ADDRESS", "RACK", "REPLICAS"]
    assert row.split()[0] == str(B) and int(row.split()[3]) >= 2
    refused = brokers("unregister", "--id", str(B))
    assert refused.exit_code == 1 and "still holds replicas" in refused.output
    assert brokers("check-removal").exit_code == 2
