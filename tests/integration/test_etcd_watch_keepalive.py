"""A watch on an etcd member that stops answering ends, over a real etcd.

A watch is one gRPC call open for as long as it lasts. Paused (SIGSTOP), a member's kernel
still acknowledges the connection's packets while nothing answers on it; without keepalive
pings the watch waited on it for as long as TCP's own keepalive allows (2 hours by
default), seeing no change. The channels to etcd ping every 10 s while a call is open and
close a connection whose ping goes unanswered for 3 s, so the watch ends (the watcher then
reads in full and watches again). etcd ends the connection of a client that pings more
often than its ``--grpc-keepalive-min-time`` (5 s by default): a healthy watch outlives two
pings and still delivers.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
from etcd_processes import EtcdServer, etcd_member
from highwater.etcd_metadata.connection import (
    EtcdConnection,
    EtcdUnavailableError,
    EtcdWatchBrokenError,
    Put,
)
from highwater.etcd_metadata.endpoints import parse_metadata_store
from highwater.etcd_metadata.keys import KeySpace

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    with etcd_member(tmp_path_factory.mktemp("etcd")) as server:
        yield server


async def test_a_watch_outlives_its_pings_and_ends_when_its_member_stops_answering(
    etcd: EtcdServer,
) -> None:
    address = parse_metadata_store(f"etcd://{etcd.endpoint}/watched")
    prefix = KeySpace(address.prefix).prefix
    connection = EtcdConnection(address)
    try:
        written = await connection.txn((), [Put(f"{prefix}a", b"1")])
        watch = connection.watch_prefix_changes(prefix, written.revision + 1)
        change = asyncio.ensure_future(anext(watch))
        # Open 21 s, two pings: etcd keeps the connection, and the watch delivers.
        await asyncio.sleep(21)
        assert not change.done()
        later = await connection.txn((), [Put(f"{prefix}b", b"2")])
        got = await asyncio.wait_for(change, 5)
        assert got.revision == later.revision
        assert [key for key, _, _ in got.changes] == [f"{prefix}b"]

        etcd.pause()
        try:
            paused = time.monotonic()
            with pytest.raises(EtcdWatchBrokenError):
                await asyncio.wait_for(anext(watch), 25)
            # At most a ping interval and the ping's timeout, with a margin for a slow
            # machine.
            assert time.monotonic() - paused < 17
        finally:
            etcd.resume()
        await watch.aclose()

        # Resumed: a new watch from where the last one delivered sees what followed. (A
        # unary call may fail once on a connection the pause had closed: callers retry.)
        renewed = connection.watch_prefix_changes(prefix, later.revision + 1)
        for _ in range(50):
            try:
                after = await connection.txn((), [Put(f"{prefix}c", b"3")])
                break
            except EtcdUnavailableError:
                await asyncio.sleep(0.1)
        got = await asyncio.wait_for(anext(renewed), 10)
        assert got.revision == after.revision
        await renewed.aclose()
    finally:
        await connection.close()
