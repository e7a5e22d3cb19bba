"""The controller worker's job queue: jobs in arrival order, and a wait that ends at the
next job or at the commit of the batch in flight, whichever comes first."""

from __future__ import annotations

import asyncio

from highwater.controller.service import _JobQueue, _Tick


async def test_jobs_come_out_in_arrival_order() -> None:
    jobs = _JobQueue()
    first, second = _Tick(), _Tick()
    jobs.put_nowait(first)
    jobs.put_nowait(second)
    assert await jobs.get() is first
    assert jobs.get_nowait() is second
    assert jobs.empty()


async def test_a_waiting_get_takes_the_next_job() -> None:
    jobs = _JobQueue()
    getter = asyncio.ensure_future(jobs.get())
    await asyncio.sleep(0)
    assert not getter.done()
    job = _Tick()
    jobs.put_nowait(job)
    assert await asyncio.wait_for(getter, 1) is job


async def test_get_before_takes_a_job_arriving_while_the_batch_is_in_flight() -> None:
    jobs = _JobQueue()
    committed: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    getter = asyncio.ensure_future(jobs.get_before(committed))
    await asyncio.sleep(0)
    job = _Tick()
    jobs.put_nowait(job)
    assert await asyncio.wait_for(getter, 1) is job
    assert not committed.done()


async def test_get_before_ends_when_the_batch_commits_first() -> None:
    jobs = _JobQueue()
    committed: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    getter = asyncio.ensure_future(jobs.get_before(committed))
    await asyncio.sleep(0)
    committed.set_result(7)
    assert await asyncio.wait_for(getter, 1) is None
    # A job queued before the commit is still taken first.
    job = _Tick()
    jobs.put_nowait(job)
    assert await jobs.get_before(committed) is job
    assert await jobs.get_before(committed) is None
