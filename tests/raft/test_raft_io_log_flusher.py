"""The metadata log's flusher thread: flushes run there in order, their time and errors
come back to the loop, and a write handed to it is acknowledged only once flushed."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from highwater.raft.driver import RaftServer, RaftServerSettings
from highwater.raft.log_flusher import LogFlusher
from highwater.raft.messages import FetchRequest, OffsetAndEpoch
from highwater.raft.node import RaftNode
from highwater.raft.state_machine import SnapshotReader
from highwater.records import RecordBatch
from highwater.rpc.endpoints import free_loopback_ports
from raft_timing import FAST

pytestmark = pytest.mark.timeout(60)


async def test_flushes_run_in_the_thread_in_order_and_errors_come_back() -> None:
    flusher = LogFlusher("test-flusher")
    ran: list[tuple[str, int]] = []

    def flush(name: str) -> None:
        ran.append((name, threading.get_ident()))

    def broken() -> None:
        raise OSError(5, "Input/output error")

    try:
        first, second = flusher.flush(lambda: flush("a")), flusher.flush(lambda: flush("b"))
        assert await first >= 0 and await second >= 0
        with pytest.raises(OSError, match="Input/output error"):
            await flusher.flush(broken)
        assert await flusher.flush(lambda: flush("c")) >= 0  # the thread goes on
    finally:
        flusher.close()
    assert [name for name, _ in ran] == ["a", "b", "c"]
    assert {thread for _, thread in ran} != {threading.get_ident()}
    assert len({thread for _, thread in ran}) == 1
    with pytest.raises(RuntimeError, match="closed"):
        flusher.flush(lambda: None)


async def test_a_hand_off_returns_once_the_thread_started_the_flush() -> None:
    # A generous bound: the hand-off returns as soon as the thread starts, not after it.
    flusher = LogFlusher("test-flusher", start_wait_s=10)
    began, release = threading.Event(), threading.Event()

    def flush() -> None:
        began.set()
        assert release.wait(10)

    try:
        done = flusher.flush(flush, wait_started=True)
        assert began.is_set(), "the flush runs in the thread before the loop goes on"
        assert not done.done()
        release.set()
        assert await done >= 0
    finally:
        release.set()
        flusher.close()


async def test_a_hand_off_waits_at_most_start_wait_s_for_a_busy_thread() -> None:
    flusher = LogFlusher("test-flusher", start_wait_s=0.05)
    release = threading.Event()
    try:
        first = flusher.flush(lambda: release.wait(10))
        started = time.perf_counter()
        # Queued behind the first: not started.
        second = flusher.flush(lambda: None, wait_started=True)
        waited = time.perf_counter() - started
        assert 0.04 <= waited < 5
        release.set()
        assert await first >= 0 and await second >= 0
    finally:
        release.set()
        flusher.close()


class _Values:
    def __init__(self) -> None:
        self.values: list[bytes] = []

    def apply(self, batches: Sequence[RecordBatch], high_watermark: int) -> None:
        for batch in batches:
            self.values.extend(r.value or b"" for r in batch.records())

    def load_snapshot(self, reader: SnapshotReader) -> None:
        raise AssertionError("no snapshot here")

    def snapshot(self, snapshot_id: OffsetAndEpoch) -> bytes:
        return b""


async def test_a_write_flushed_in_the_thread_commits_only_once_flushed(tmp_path: Path) -> None:
    (port,) = free_loopback_ports(1)
    machine = _Values()
    server = RaftServer(
        node_id=1,
        listen=f"127.0.0.1:{port}",
        voters={1: f"127.0.0.1:{port}"},
        data_dir=tmp_path,
        state_machine=machine,
        settings=RaftServerSettings(raft=FAST),
    )
    await server.start()
    try:
        await server.propose([b"first"])
        raft_log = server._log
        assert raft_log is not None
        # A disk that was slow: the next flushes go to the flusher's thread, where this
        # one waits until released.
        server._last_fsync_s = 1.0
        release = threading.Event()
        real_flush = raft_log.flush

        def gated_flush() -> int:
            assert release.wait(10)
            return real_flush()

        raft_log.flush = gated_flush  # type: ignore[method-assign]
        proposal = asyncio.ensure_future(server.propose([b"second"]))
        await asyncio.sleep(0.3)
        assert not proposal.done(), "a single voter commits only what it flushed"
        assert raft_log.flushed_offset < raft_log.end_offset
        release.set()
        offset = await asyncio.wait_for(proposal, 10)
        assert raft_log.flushed_offset > offset
        assert machine.values == [b"first", b"second"]
    finally:
        release.set()
        await server.stop()


def _two_voters(tmp_path: Path, settings: RaftServerSettings) -> dict[int, RaftServer]:
    ports = free_loopback_ports(2)
    voters = {i + 1: f"127.0.0.1:{port}" for i, port in enumerate(ports)}
    return {
        node_id: RaftServer(
            node_id=node_id,
            listen=address,
            voters=voters,
            data_dir=tmp_path / f"n{node_id}",
            state_machine=_Values(),
            settings=settings,
        )
        for node_id, address in voters.items()
    }


async def _leader_and_follower(servers: dict[int, RaftServer]) -> tuple[RaftServer, RaftServer]:
    async with asyncio.timeout(20):
        while not any(server.is_leader for server in servers.values()):
            await asyncio.sleep(0.02)
    leader = next(server for server in servers.values() if server.is_leader)
    follower = next(server for server in servers.values() if not server.is_leader)
    return leader, follower


async def test_a_followers_flush_in_the_thread_gates_the_commit(tmp_path: Path) -> None:
    """Two voters, so a commit needs the follower's flush. Its flushes go to the thread
    (a slow disk, ``follower_flushes_on_loop`` off), started from the fetch answer's
    callback (``_flush_early``): the entry is in the follower's log, but the leader
    acknowledges it only once the follower's flush returned in the thread and its next
    fetch reported it."""
    servers = _two_voters(tmp_path, RaftServerSettings(raft=FAST, follower_flushes_on_loop=False))
    release = threading.Event()
    for server in servers.values():
        await server.start()
    try:
        leader, follower = await _leader_and_follower(servers)
        await leader.propose([b"first"])
        raft_log = follower._log
        assert raft_log is not None
        follower._last_fsync_s = 1.0  # a slow disk: the next flushes go to the thread
        real_flush = raft_log.flush

        def gated_flush() -> int:
            assert release.wait(10)
            return real_flush()

        raft_log.flush = gated_flush  # type: ignore[method-assign]
        handed_early: list[bool] = []
        flush_early = follower._flush_early

        def watched_flush_early(node: RaftNode) -> None:
            was_idle = follower._flushing is None
            flush_early(node)
            handed_early.append(was_idle and follower._flushing is not None)

        follower._flush_early = watched_flush_early  # type: ignore[method-assign]
        proposal = asyncio.ensure_future(leader.propose([b"second"]))
        async with asyncio.timeout(10):
            while raft_log.end_offset <= raft_log.flushed_offset:
                await asyncio.sleep(0.01)  # the entry reached the follower's log
        await asyncio.sleep(0.3)
        assert follower._flushing is not None, "its flush is under way in the thread"
        assert any(handed_early), "handed over from the fetch answer's callback"
        assert not proposal.done(), "acknowledged before a majority flushed it"
        release.set()
        offset = await asyncio.wait_for(proposal, 10)
        assert raft_log.flushed_offset > offset
    finally:
        release.set()
        for server in servers.values():
            await server.stop()


async def test_a_follower_flushes_on_its_loop_before_its_next_fetch(tmp_path: Path) -> None:
    """With ``follower_flushes_on_loop`` (the default) a voter that follows fsyncs a fetch
    answer's entries on its loop, from the answer's callback, even after a slow fsync
    (which sends a leader's or an observer's flushes to the thread): no hand-off to the
    flusher thread. Every fetch it sends names an offset it has flushed, so the leader
    counts (and acknowledges) only what the follower's disk holds."""
    servers = _two_voters(tmp_path, RaftServerSettings(raft=FAST))
    for server in servers.values():
        await server.start()
    try:
        leader, follower = await _leader_and_follower(servers)
        await leader.propose([b"first"])
        raft_log = follower._log
        assert raft_log is not None
        follower._last_fsync_s = 1.0  # a slow disk
        loop_thread = threading.get_ident()
        flushes: list[tuple[int, int]] = []
        real_flush = raft_log.flush

        def watched_flush() -> int:
            flushes.append((threading.get_ident(), raft_log.end_offset))
            return real_flush()

        raft_log.flush = watched_flush  # type: ignore[method-assign]
        fetched_past_flushed: list[tuple[int, int]] = []
        dispatch = follower._dispatch

        def watched_dispatch(message: Any) -> None:
            if isinstance(message, FetchRequest) and message.fetch_offset > raft_log.flushed_offset:
                fetched_past_flushed.append((message.fetch_offset, raft_log.flushed_offset))
            dispatch(message)

        follower._dispatch = watched_dispatch  # type: ignore[method-assign]
        handed: list[RaftNode] = []
        hand_flush_to_thread = follower._hand_flush_to_thread

        def watched_hand_off(node: RaftNode) -> None:
            handed.append(node)
            hand_flush_to_thread(node)

        follower._hand_flush_to_thread = watched_hand_off  # type: ignore[method-assign]
        offsets = [await asyncio.wait_for(leader.propose([b"w%d" % i]), 10) for i in range(5)]
        assert raft_log.flushed_offset > offsets[-1]
        assert flushes, "the follower flushed the entries"
        assert {thread for thread, _ in flushes} == {loop_thread}, "on the loop, not the thread"
        assert not handed, "nothing was handed to the flusher thread"
        assert not fetched_past_flushed, "a fetch reported an offset not flushed yet"
    finally:
        for server in servers.values():
            await server.stop()
