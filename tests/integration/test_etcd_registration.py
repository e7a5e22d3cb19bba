"""A broker's leased ``brokers/ids`` key over a real etcd: the ZOOKEEPER-1740 race. A key
left by the broker's previous session (its lease not yet expired) is never overwritten nor
deleted: the broker waits until etcd removes it with its lease, then creates its own; a key
whose lease stays alive is another live process using the id, refused naming the key."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence

import pytest
from etcd_processes import EtcdServer, etcd_member
from highwater.etcd_metadata.connection import (
    Compare,
    Delete,
    EtcdConnection,
    EtcdUnavailableError,
    Put,
    TxnResult,
)
from highwater.etcd_metadata.endpoints import parse_metadata_store
from highwater.etcd_metadata.keys import KeySpace
from highwater.etcd_metadata.registration import BrokerPresence, DuplicateBrokerError
from highwater.etcd_metadata.session import EtcdSession

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    with etcd_member(tmp_path_factory.mktemp("etcd")) as server:
        yield server


async def test_the_previous_sessions_key_is_waited_out_never_overwritten(
    etcd: EtcdServer,
) -> None:
    address = parse_metadata_store(f"etcd://{etcd.endpoint}/race")
    space = KeySpace(address.prefix)
    connection = EtcdConnection(address)
    session = EtcdSession(EtcdConnection(address), ttl_s=30)
    presence = BrokerPresence(connection, space, session, 4, b'{"new": true}', timeout_s=20)
    try:
        # The expired session's key: its lease (2 s) is no longer refreshed.
        old_lease = await connection.grant_lease(2)
        await connection.txn((), [Put(space.broker_id(4), b'{"old": true}', old_lease)])
        _, old = await connection.get(space.broker_id(4))
        assert old is not None
        await session.start()
        registering = asyncio.create_task(presence.register())
        await asyncio.sleep(1)
        _, held = await connection.get(space.broker_id(4))
        assert held == old  # untouched while its lease lives
        assert not registering.done()
        await asyncio.wait_for(registering, 15)
        _, now = await connection.get(space.broker_id(4))
        assert now is not None
        assert (now.value, now.lease) == (b'{"new": true}', session.lease_id)
        assert now.create_revision > old.mod_revision  # created anew, after the old one went
        assert presence.waited_for_old_key and presence.registrations == 1
    finally:
        await presence.stop()
        await session.stop()
        await connection.close()


async def test_a_key_held_by_a_live_lease_is_another_broker_named_in_the_error(
    etcd: EtcdServer,
) -> None:
    address = parse_metadata_store(f"etcd://{etcd.endpoint}/duplicate")
    space = KeySpace(address.prefix)
    connection = EtcdConnection(address)
    other, mine = (EtcdSession(EtcdConnection(address), ttl_s=30) for _ in range(2))
    presence = BrokerPresence(connection, space, mine, 5, b"{}", timeout_s=1)
    try:
        await other.start()
        await mine.start()
        assert other.lease_id is not None
        await connection.txn((), [Put(space.broker_id(5), b'{"other": true}', other.lease_id)])
        with pytest.raises(DuplicateBrokerError, match=f"etcd key {space.broker_id(5)} is held"):
            await presence.register()
        _, held = await connection.get(space.broker_id(5))
        assert held is not None and held.lease == other.lease_id
    finally:
        await presence.stop()
        await mine.stop()
        await other.stop()
        await connection.close()


class AnswerLostOnce(EtcdConnection):
    """The real connection whose first transaction etcd applies but whose answer is lost
    (the call timed out after etcd applied it)."""

    lost = False

    async def txn(
        self,
        compares: Sequence[Compare],
        success: Sequence[Put | Delete],
        failure: Sequence[Put | Delete] = (),
    ) -> TxnResult:
        result = await super().txn(compares, success, failure)
        if not self.lost:
            self.lost = True
            raise EtcdUnavailableError("the answer was lost")
        return result


async def test_a_registration_whose_answer_was_lost_is_still_renewed_with_the_session(
    etcd: EtcdServer,
) -> None:
    """The key was created but its answer lost: the retry finds it under its own lease and
    takes it as registered, so when the session expires and gets a new lease, the key is
    created again with it, as after any registration."""
    address = parse_metadata_store(f"etcd://{etcd.endpoint}/lost")
    space = KeySpace(address.prefix)
    connection = AnswerLostOnce(address)
    writer = EtcdConnection(address)
    session = EtcdSession(EtcdConnection(address), ttl_s=3)
    presence = BrokerPresence(connection, space, session, 6, b"{}", timeout_s=20)
    try:
        await session.start()
        first = session.lease_id
        assert first is not None
        await presence.register()
        _, held = await writer.get(space.broker_id(6))
        assert held is not None and held.lease == first and connection.lost
        await writer.revoke_lease(first)  # the session is over (the key goes with it)
        async with asyncio.timeout(20):
            while True:
                _, held = await writer.get(space.broker_id(6))
                if held is not None and held.lease != first:
                    break
                await asyncio.sleep(0.1)
        assert held.lease == session.lease_id
    finally:
        await presence.stop()
        await session.stop()
        await connection.close()
        await writer.close()
