"""A controller's data directory keeps the node id it was made for (``meta.properties``)
and refuses to start under another one, before its ``quorum-state`` (the vote) is read."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
from click.testing import CliRunner
from highwater.cli.main import main
from highwater.errors import KafkaStorageError
from highwater.raft.driver import MetadataLogLayout, RaftServer, RaftServerSettings
from highwater.raft.messages import OffsetAndEpoch
from highwater.raft.meta_properties import check_node_id, read_meta_properties
from highwater.raft.state_machine import SnapshotReader
from highwater.records import RecordBatch
from highwater.rpc.endpoints import free_loopback_ports
from raft_timing import FAST

pytestmark = pytest.mark.timeout(60)


class NullStateMachine:
    def apply(self, batches: Sequence[RecordBatch], high_watermark: int) -> None:
        pass

    def load_snapshot(self, reader: SnapshotReader) -> None:
        pass

    def snapshot(self, snapshot_id: OffsetAndEpoch) -> bytes:
        return b""


def controller(node_id: int, voters: dict[int, str], data_dir: Path) -> RaftServer:
    return RaftServer(
        node_id=node_id,
        listen=voters[node_id],
        voters=voters,
        data_dir=data_dir,
        state_machine=NullStateMachine(),
        settings=RaftServerSettings(raft=FAST),
    )


async def test_a_data_directory_refuses_another_node_id(tmp_path: Path) -> None:
    ports = free_loopback_ports(2)
    voters = {0: f"127.0.0.1:{ports[0]}", 1: f"127.0.0.1:{ports[1]}"}
    first = controller(0, voters, tmp_path)
    await first.start()
    await first.stop()
    assert read_meta_properties(tmp_path) == {"version": "1", "node.id": "0"}
    state_path = MetadataLogLayout(tmp_path).quorum_state_path
    state = state_path.read_bytes()

    with pytest.raises(KafkaStorageError, match=r"Stored node id 0 doesn't match .* node id 1"):
        await controller(1, voters, tmp_path).start()
    assert state_path.read_bytes() == state
    assert read_meta_properties(tmp_path)["node.id"] == "0"

    again = controller(0, voters, tmp_path)  # the lock was let go: node 0 still starts
    await again.start()
    await again.stop()


async def test_a_directory_without_the_file_is_adopted(tmp_path: Path) -> None:
    port = free_loopback_ports(1)[0]
    voters = {3: f"127.0.0.1:{port}"}
    server = controller(3, voters, tmp_path)
    await server.start()
    await server.stop()
    (tmp_path / "meta.properties").unlink()  # as written before the file existed
    server = controller(3, voters, tmp_path)
    await server.start()
    await server.stop()
    assert read_meta_properties(tmp_path) == {"version": "1", "node.id": "3"}


def test_other_keys_are_kept(tmp_path: Path) -> None:
    (tmp_path / "meta.properties").write_text("version=1\ncluster.id=abc\n")
    check_node_id(tmp_path, 5)
    assert read_meta_properties(tmp_path) == {"version": "1", "node.id": "5", "cluster.id": "abc"}
    check_node_id(tmp_path, 5)
    with pytest.raises(KafkaStorageError, match="Stored node id 5"):
        check_node_id(tmp_path, 6)


def test_the_controller_command_reports_it_in_one_line(tmp_path: Path) -> None:
    check_node_id(tmp_path, 0)  # a directory node 0 made
    ports = free_loopback_ports(2)
    result = CliRunner().invoke(
        main,
        [
            "controller",
            "--node-id",
            "1",
            "--voters",
            f"0@127.0.0.1:{ports[0]},1@127.0.0.1:{ports[1]}",
            "--listen",
            f"127.0.0.1:{ports[1]}",
            "--data-dir",
            str(tmp_path),
        ],
    )
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: Stored node id 0 doesn't match")
