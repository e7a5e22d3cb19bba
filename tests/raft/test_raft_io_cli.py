"""``highwater controller`` and ``highwater quorum describe``: output, and clear errors."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from click.testing import CliRunner
from embedded_servers import free_port
from highwater.cli.main import main
from highwater.cli.quorum import replication_rows, status_lines
from highwater.internal.v1 import raft_pb2

pytestmark = pytest.mark.timeout(60)


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


# --- bad input ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("voters", "message"),
    [
        ("1@localhost", "is not HOST:PORT"),
        ("one@localhost:9093", "is not ID@HOST:PORT"),
        ("1@localhost:9093,1@localhost:9094", "appears twice"),
        ("1@localhost:70000", "out of range"),
    ],
)
def test_controller_rejects_malformed_voters(tmp_path: Path, voters: str, message: str) -> None:
    code, output = run(
        "controller",
        "--node-id",
        "1",
        "--listen",
        "127.0.0.1:0",
        "--voters",
        voters,
        "--data-dir",
        str(tmp_path),
    )
    assert code == 2
    assert "--voters" in output and message in output


def test_controller_must_be_a_voter(tmp_path: Path) -> None:
    code, output = run(
        "controller",
        "--node-id",
        "4",
        "--listen",
        "127.0.0.1:9093",
        "--voters",
        "1@127.0.0.1:9093",
        "--data-dir",
        str(tmp_path),
    )
    assert code == 2
    assert "node 4 is not among the voters [1]" in output


def test_observer_must_not_be_a_voter(tmp_path: Path) -> None:
    code, output = run(
        "observer", "--node-id", "1", "--voters", "1@127.0.0.1:9093", "--data-dir", str(tmp_path)
    )
    assert code == 2
    assert "node 1 is a voter: an observer needs an id of its own" in output


@pytest.mark.parametrize("command", ["controller", "observer"])
@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--metadata-log-max-record-bytes-between-snapshots", "0", "is not in the range x>=1"),
        ("--cluster-id", " ", "must not be empty"),
    ],
)
def test_replica_commands_reject_bad_settings(
    tmp_path: Path, command: str, option: str, value: str, message: str
) -> None:
    code, output = run(
        command,
        "--node-id",
        "1" if command == "controller" else "7",
        "--listen",
        "127.0.0.1:0",
        "--voters",
        "1@127.0.0.1:9093",
        "--data-dir",
        str(tmp_path),
        option,
        value,
    )
    assert code == 2
    assert option in output and message in output
    assert not (tmp_path / "__cluster_metadata-0").exists()  # nothing was started


def test_controller_rejects_a_bad_listen_address(tmp_path: Path) -> None:
    code, output = run(
        "controller",
        "--node-id",
        "1",
        "--listen",
        "nowhere",
        "--voters",
        "1@127.0.0.1:9093",
        "--data-dir",
        str(tmp_path),
    )
    assert code == 2
    assert "--listen" in output and "is not HOST:PORT" in output


def test_controller_reports_a_corrupt_quorum_state(tmp_path: Path) -> None:
    raft_dir = tmp_path / "__cluster_metadata-0"
    raft_dir.mkdir()
    (raft_dir / "quorum-state").write_text("not json")
    port = free_port()
    code, output = run(
        "controller",
        "--node-id",
        "1",
        "--listen",
        f"127.0.0.1:{port}",
        "--voters",
        f"1@127.0.0.1:{port}",
        "--data-dir",
        str(tmp_path),
    )
    assert code == 1
    assert "quorum state file" in output and "quorum-state" in output


def test_describe_needs_a_mode_and_good_addresses() -> None:
    code, output = run("quorum", "describe", "--controllers", "127.0.0.1:1")
    assert code == 2 and "--status or --replication" in output
    code, output = run("quorum", "describe", "--controllers", "localhost", "--status")
    assert code == 2 and "is not HOST:PORT" in output


def test_describe_reports_unreachable_controllers() -> None:
    ports = [free_port(), free_port()]
    controllers = ",".join(f"127.0.0.1:{p}" for p in ports)
    code, output = run(
        "quorum", "describe", "--controllers", controllers, "--status", "--timeout", "1"
    )
    assert code == 1
    assert "no controller could be reached" in output
    assert all(f"127.0.0.1:{p}" in output for p in ports)


# --- output -------------------------------------------------------------------------------


def _response() -> raft_pb2.DescribeQuorumResponse:
    return raft_pb2.DescribeQuorumResponse(
        cluster_id="abc",
        leader_id=2,
        leader_epoch=7,
        high_watermark=95,
        current_voters=[
            raft_pb2.ReplicaState(
                replica_id=3,
                log_end_offset=90,
                last_fetch_timestamp=1000,
                last_caught_up_timestamp=400,
            ),
            raft_pb2.ReplicaState(
                replica_id=2,
                log_end_offset=100,
                last_fetch_timestamp=1000,
                last_caught_up_timestamp=1000,
            ),
            raft_pb2.ReplicaState(
                replica_id=1,
                log_end_offset=100,
                last_fetch_timestamp=990,
                last_caught_up_timestamp=990,
            ),
        ],
        observers=[
            raft_pb2.ReplicaState(
                replica_id=100,
                log_end_offset=-1,
                last_fetch_timestamp=-1,
                last_caught_up_timestamp=-1,
            )
        ],
    )


def test_status_fields() -> None:
    assert dict(status_lines(_response())) == {
        "ClusterId": "abc",
        "LeaderId": "2",
        "LeaderEpoch": "7",
        "HighWatermark": "95",
        "MaxFollowerLag": "10",
        "MaxFollowerLagTimeMs": "600",
        "CurrentVoters": "[1,2,3]",
        "CurrentObservers": "[100]",
    }


def test_replication_rows() -> None:
    assert replication_rows(_response()) == [
        ("2", "100", "0", "1000", "1000", "Leader"),
        ("1", "100", "0", "990", "990", "Follower"),
        ("3", "90", "10", "1000", "400", "Follower"),
        ("100", "-1", "100", "-1", "-1", "Observer"),
    ]


def test_a_leader_that_removed_itself_is_the_leader_row() -> None:
    """While its removal is pending the leader is listed among the observers: it is still
    the first row, as the leader, and the lag is counted from it."""
    response = _response()
    leader = next(r for r in response.current_voters if r.replica_id == 2)
    response.observers.append(leader)
    response.current_voters.remove(leader)
    assert replication_rows(response) == [
        ("2", "100", "0", "1000", "1000", "Leader"),
        ("1", "100", "0", "990", "990", "Follower"),
        ("3", "90", "10", "1000", "400", "Follower"),
        ("100", "-1", "100", "-1", "-1", "Observer"),
    ]
    status = dict(status_lines(response))
    assert (status["MaxFollowerLag"], status["CurrentVoters"]) == ("10", "[1,3]")
    assert status["CurrentObservers"] == "[2,100]"


@contextmanager
def _controller(tmp_path: Path, quorum: Callable[[str], list[str]]) -> Iterator[str]:
    """A controller process of node 1 whose quorum flags ``quorum(address)`` gives; its
    address."""
    address = f"127.0.0.1:{free_port()}"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "highwater",
            "controller",
            "--node-id",
            "1",
            "--listen",
            address,
            *quorum(address),
            "--data-dir",
            str(tmp_path / "data"),
            "--cluster-id",
            "test-cluster",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        yield address
        process.send_signal(signal.SIGTERM)
        assert process.wait(20) == 0
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(10)
        if process.stderr is not None:
            process.stderr.close()


def _until_answering(address: str) -> None:
    """Wait until the controller at ``address`` answers ``quorum describe``."""
    deadline = time.monotonic() + 60  # a process's start-up on a loaded machine
    while run("quorum", "describe", "--controllers", address, "--status")[0] != 0:
        assert time.monotonic() < deadline, "the controller never answered"
        time.sleep(0.2)


@pytest.fixture
def single_controller(tmp_path: Path) -> Iterator[str]:
    """A static quorum of one (``--voters``)."""
    with _controller(tmp_path, lambda address: ["--voters", f"1@{address}"]) as address:
        yield address


def test_describe_a_running_controller(single_controller: str) -> None:
    deadline = time.monotonic() + 60  # a process's start-up on a loaded machine
    while True:
        code, output = run("quorum", "describe", "--controllers", single_controller, "--status")
        if code == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert code == 0, output
    fields = dict(line.split(":", 1) for line in output.splitlines())
    assert fields["ClusterId"].strip() == "test-cluster"
    assert fields["LeaderId"].strip() == "1"
    assert fields["CurrentVoters"].strip() == "[1]"
    assert list(fields) == [
        "ClusterId",
        "LeaderId",
        "LeaderEpoch",
        "HighWatermark",
        "MaxFollowerLag",
        "MaxFollowerLagTimeMs",
        "CurrentVoters",
        "CurrentObservers",
    ]
    code, output = run("quorum", "describe", "--controllers", single_controller, "--replication")
    assert code == 0, output
    header, row = output.splitlines()
    assert header.split() == [
        "NodeId",
        "LogEndOffset",
        "Lag",
        "LastFetchTimestamp",
        "LastCaughtUpTimestamp",
        "Status",
    ]
    assert row.split()[0] == "1" and row.split()[-1] == "Leader"


def test_voter_changes_asked_of_a_static_quorum_say_that_it_is_static(
    single_controller: str,
) -> None:
    """A ``--voters`` quorum's voters are fixed: both commands say so and what to do
    instead, rather than send the operator after an observer that cannot exist."""
    _until_answering(single_controller)
    code, output = run(
        "quorum", "add-controller", "--controllers", single_controller, "--node-id", "2"
    )
    assert code == 1
    assert "static" in output and "--initial-controllers" in output, output
    code, output = run(
        "quorum", "remove-controller", "--controllers", single_controller, "--node-id", "1"
    )
    assert code == 1
    assert "UNSUPPORTED_VERSION" in output and "--initial-controllers" in output, output
    code, output = run(
        "quorum", "check-removal", "--controllers", single_controller, "--ids-from", "1"
    )
    assert code == 1
    assert "voters [1] would go, and a static quorum's voters cannot change" in output, output


def test_describe_follows_a_follower_to_the_leader(tmp_path: Path) -> None:
    """Any one voter's address is enough: a follower names the leader and its address."""
    addresses = [f"127.0.0.1:{free_port()}" for _ in range(3)]
    voters = ",".join(f"{i + 1}@{a}" for i, a in enumerate(addresses))
    processes = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "highwater",
                "controller",
                "--node-id",
                str(i + 1),
                "--listen",
                address,
                "--voters",
                voters,
                "--data-dir",
                str(tmp_path / f"c{i + 1}"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for i, address in enumerate(addresses)
    ]
    try:
        deadline = time.monotonic() + 60  # three processes' start-up on a loaded machine
        leader = ""
        while time.monotonic() < deadline:
            code, output = run(
                "quorum", "describe", "--controllers", ",".join(addresses), "--status"
            )
            if code == 0:
                leader = dict(line.split(":", 1) for line in output.splitlines())["LeaderId"]
                if leader.strip():  # a voter answers before the first election too
                    break
            time.sleep(0.2)
        assert leader.strip() in {"1", "2", "3"}
        follower = next(a for i, a in enumerate(addresses) if str(i + 1) != leader.strip())
        # Two voters elect a leader while the third may still be starting: ask until the
        # follower listens.
        deadline = time.monotonic() + 60
        while True:
            code, output = run("quorum", "describe", "--controllers", follower, "--replication")
            if code == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert code == 0, output
        rows = [line.split() for line in output.splitlines()[1:]]
        assert {row[0] for row in rows} == {"1", "2", "3"}
        assert [row[-1] for row in rows if row[0] == leader.strip()] == ["Leader"]
    finally:
        for process in processes:
            process.kill()
            process.wait(10)


def test_remove_controller_names_the_voter_by_the_directory_id_the_leader_lists(
    tmp_path: Path,
) -> None:
    """A RemoveRaftVoter without a directory id names no voter (KIP-853); the command
    sends the one DescribeQuorum lists, so the leader reaches its own checks (here: the
    last voter stays), and an id that is no voter is named as such."""
    directory = uuid.uuid4()

    def dynamic(address: str) -> list[str]:
        return ["--initial-controllers", f"1@{address}:{directory}"]

    with _controller(tmp_path, dynamic) as address:
        _until_answering(address)
        code, output = run(
            "quorum", "remove-controller", "--controllers", address, "--node-id", "1"
        )
        assert code == 1
        assert "last voter" in output and "without a directory id" not in output, output
        code, output = run(
            "quorum", "remove-controller", "--controllers", address, "--node-id", "7"
        )
        assert code == 1
        assert "no voter 7" in output, output
