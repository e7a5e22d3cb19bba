"""A broker's liveness stream keeps its session: each message the broker writes on it is
contact, noted on arrival by the active controller (``ControllerServer.broker_liveness``),
so a broker whose heartbeats' answers wait behind slow commits is not fenced; a broker
that writes nothing (paused, its connection open) is still fenced when its session
expires. One controller voter over loopback gRPC, with a session of 600 ms."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from highwater.controller import ControllerConfig
from highwater.controller.service import ControllerServer, ControllerSettings
from highwater.controller_api import messages as m
from highwater.controller_api.client import ControllerClient
from highwater.errors import UnexpectedAppendOffsetError
from highwater.internal.v1 import controller_pb2 as pb
from highwater.metadata.records import FenceBrokerRecord, encode_record
from highwater.raft.driver import RaftServerSettings
from highwater.rpc.endpoints import free_loopback_ports
from highwater.v1.common_pb2 import ErrorCode
from raft_timing import FAST

pytestmark = pytest.mark.timeout(60)

SESSION_MS = 600
PING_S = 0.1


def _fenced(server: ControllerServer, broker_id: int) -> bool:
    broker = server.store.latest_image().broker(broker_id)
    assert broker is not None
    return broker.fenced


@asynccontextmanager
async def _broker_with_a_stream(
    tmp_path: Path, session_ms: int, heartbeat_interval_ms: int = 2000
) -> AsyncIterator[tuple[ControllerServer, int, Any]]:
    """One controller voter with that session timeout (and heartbeat interval), broker 1
    registered and unfenced, and its liveness stream open and answered: (server, broker
    epoch, the stream's call)."""
    address = f"127.0.0.1:{free_loopback_ports(1)[0]}"
    server = ControllerServer(
        node_id=1,
        listen=address,
        voters={1: address},
        data_dir=tmp_path / "controller",
        settings=ControllerSettings(
            raft=RaftServerSettings(raft=FAST),
            controller=ControllerConfig(
                broker_session_timeout_ms=session_ms,
                broker_heartbeat_interval_ms=heartbeat_interval_ms,
            ),
            seed=7,
        ),
    )
    await server.start()
    try:
        await server.wait_active()
        async with ControllerClient([address]) as client:
            registered = await client.register_broker(m.RegisterBrokerRequest(1, "i-1"))
            epoch = registered.broker_epoch
            beat = await client.broker_heartbeat(m.BrokerHeartbeatRequest(1, epoch, epoch))
            assert not beat.is_fenced
            _, call = client.open_broker_liveness()
            await call.write(pb.BrokerLivenessRequest(broker_id=1, broker_epoch=epoch))
            assert (await call.read()).error == ErrorCode.NONE
            yield server, epoch, call
    finally:
        await server.stop()


async def test_stream_messages_keep_a_session_without_heartbeats_and_silence_fences(
    tmp_path: Path,
) -> None:
    async with _broker_with_a_stream(tmp_path, SESSION_MS) as (server, epoch, call):
        # Three sessions with no heartbeat at all, only the stream's messages.
        started = time.monotonic()
        while time.monotonic() - started < 3 * SESSION_MS / 1000:
            await call.write(pb.BrokerLivenessRequest(broker_id=1, broker_epoch=epoch))
            await asyncio.sleep(PING_S)
            assert not _fenced(server, 1)
        # Paused: the connection stays open, nothing is written. Fenced by its session.
        paused = time.monotonic()
        async with asyncio.timeout(10):
            while not _fenced(server, 1):
                await asyncio.sleep(0.02)
        assert time.monotonic() - paused >= SESSION_MS / 1000 - PING_S
        call.cancel()


async def test_a_broken_stream_whose_fence_raft_refused_is_fenced_by_the_next_activation(
    tmp_path: Path,
) -> None:
    """The batch holding a broken stream's fence is refused by Raft (its log no longer ends
    where the store staged it: what a voters record did before the store allowed for it).
    The store drops that batch and the controller claims its epoch again; the broker epoch
    is fenced by that activation, not left to its session timeout (10 s here)."""
    session_ms = 10_000
    async with _broker_with_a_stream(tmp_path, session_ms) as (server, epoch, call):
        fence = encode_record(FenceBrokerRecord(1, epoch))
        raft = server.store._raft
        append = raft.append
        refused: list[int] = []

        def refuse_the_fence_once(values: Any, **kwargs: Any) -> Any:
            if fence in values and not refused:
                refused.append(kwargs["base_offset"])
                raise UnexpectedAppendOffsetError(
                    f"the log does not end at {kwargs['base_offset']}"
                )
            return append(values, **kwargs)

        raft.append = refuse_the_fence_once  # type: ignore[method-assign]
        broken = time.monotonic()
        call.cancel()  # the broker's process is gone: its connection closes
        async with asyncio.timeout(session_ms / 2000):
            while not _fenced(server, 1):
                await asyncio.sleep(0.02)
        assert refused, "the fence's batch was never refused: the test proves nothing"
        assert time.monotonic() - broken < session_ms / 2000
        fenced = server.committed_image().broker(1)
        assert fenced is not None and fenced.fenced and fenced.broker_epoch == epoch


async def test_only_the_end_of_a_brokers_latest_stream_fences_it(tmp_path: Path) -> None:
    """A broker that lost its stream's connection (its keepalive closed it while a partition
    cut the link) opens another; the controller sees the first one end later, once the link
    is back, or never (nothing is written to it). The first one's end is not the broker's:
    it stays unfenced. The end of its latest stream is, even while an older one is still
    open here: fenced at once."""
    session_ms = 10_000
    async with (
        _broker_with_a_stream(tmp_path, session_ms) as (server, epoch, first),
        ControllerClient([server.raft.voters[1]]) as client,
    ):

        async def another_stream() -> Any:
            _, call = client.open_broker_liveness()
            await call.write(pb.BrokerLivenessRequest(broker_id=1, broker_epoch=epoch))
            assert (await call.read()).error == ErrorCode.NONE
            return call

        second = await another_stream()
        first.cancel()
        # A broken stream's fence commits within a few hundred ms here (the test
        # above); give it ten times that to show up wrongly.
        waited = time.monotonic()
        while time.monotonic() - waited < 3:
            assert not _fenced(server, 1)
            await asyncio.sleep(0.05)
        third = await another_stream()  # the second is left open, as a cut one may be
        third.cancel()
        ended = time.monotonic()
        async with asyncio.timeout(session_ms / 2000):
            while not _fenced(server, 1):
                await asyncio.sleep(0.02)
        assert time.monotonic() - ended < session_ms / 2000
        second.cancel()


async def test_a_stream_ending_after_its_broker_went_silent_leaves_it_to_its_session(
    tmp_path: Path,
) -> None:
    """A partition cut the stream: the broker's pings stopped arriving, its keepalive
    closed its side, and the end reaches the controller when the link is back, before the
    broker's new stream (or never). Fencing then would fence a live broker that the link
    gave back: a stream that ends more than two heartbeat intervals after the broker's
    last message on it is left to the session timeout."""
    session_ms, interval_ms = 6_000, 300
    async with _broker_with_a_stream(tmp_path, session_ms, interval_ms) as (server, _, call):
        opened = time.monotonic()
        await asyncio.sleep(3 * interval_ms / 1000)  # no ping: the link is cut
        call.cancel()  # the end arrives with the heal
        while time.monotonic() - opened < session_ms / 1000 - 1:
            assert not _fenced(server, 1)
            await asyncio.sleep(0.05)
        async with asyncio.timeout(5):  # the session, running since the last contact
            while not _fenced(server, 1):
                await asyncio.sleep(0.02)
