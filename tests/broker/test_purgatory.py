"""The purgatory: acks=all produces woken by the high watermark of their own partition,
long polls by notifies, and every wait ended by its timeout."""

from __future__ import annotations

import asyncio

from highwater.broker.purgatory import Purgatory


async def _parked(purgatory: Purgatory, key: tuple[str, int], end: int) -> asyncio.Task[None]:
    task = asyncio.create_task(purgatory.wait_replicated(key, end, 30))
    await asyncio.sleep(0)
    return task


def test_a_high_watermark_wakes_only_the_produces_its_partition_now_covers() -> None:
    async def scenario() -> None:
        purgatory = Purgatory()
        first = await _parked(purgatory, ("t", 0), 10)
        second = await _parked(purgatory, ("t", 0), 20)
        other = await _parked(purgatory, ("t", 1), 5)
        purgatory.high_watermark_moved(("t", 0), 15)
        await asyncio.sleep(0)
        assert first.done() and not second.done() and not other.done()
        purgatory.high_watermark_moved(("t", 0), 20)
        await asyncio.sleep(0)
        assert second.done() and not other.done()
        purgatory.notify(appended=False)  # any other change: every produce looks again
        await asyncio.sleep(0)
        assert other.done()

    asyncio.run(scenario())


def test_a_moved_high_watermark_wakes_consumers_long_polls_but_not_followers() -> None:
    async def scenario() -> None:
        purgatory = Purgatory()
        consumer = asyncio.create_task(purgatory.wait(30))
        follower = asyncio.create_task(purgatory.wait(30, appended=True))
        await asyncio.sleep(0)
        purgatory.high_watermark_moved(("t", 0), 1)
        await asyncio.sleep(0)
        assert consumer.done() and not follower.done()
        purgatory.notify(committed=False)
        await asyncio.sleep(0)
        assert follower.done()

    asyncio.run(scenario())


def test_waits_end_at_their_own_deadlines_with_one_timer() -> None:
    async def scenario() -> None:
        purgatory = Purgatory()
        loop = asyncio.get_running_loop()
        started = loop.time()
        ended: dict[str, float] = {}

        async def timed(name: str, wait: asyncio.Future[None] | asyncio.Task[None]) -> None:
            await wait
            ended[name] = loop.time() - started

        await asyncio.gather(
            timed(
                "late produce", asyncio.ensure_future(purgatory.wait_replicated(("t", 0), 9, 0.2))
            ),
            timed("poll", asyncio.ensure_future(purgatory.wait(0.05))),
            timed("follower", asyncio.ensure_future(purgatory.wait(0.1, appended=True))),
        )
        assert 0.05 <= ended["poll"] < ended["follower"] < ended["late produce"]
        assert ended["late produce"] >= 0.2
        # A timed-out long poll left nothing behind for the next notify to wake.
        assert not purgatory._committed and not purgatory._appended

    asyncio.run(scenario())


def test_a_cancelled_long_poll_leaves_its_list() -> None:
    async def scenario() -> None:
        purgatory = Purgatory()
        poll = asyncio.create_task(purgatory.wait(30))
        await asyncio.sleep(0)
        poll.cancel()
        await asyncio.gather(poll, return_exceptions=True)
        assert not purgatory._committed

    asyncio.run(scenario())
