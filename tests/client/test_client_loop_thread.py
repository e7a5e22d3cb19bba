"""The blocking clients' background event loop: it runs coroutines, and stopping it leaves no
task pending (no "Task was destroyed but it is pending!"), also after a real ProduceStream.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Iterator

import pytest
from embedded_servers import ServerThread
from highwater.client.admin import AdminClient, NewTopic
from highwater.client.consumer import OFFSET_BEGINNING, Consumer, TopicPartition
from highwater.client.loop_thread import LoopThread
from highwater.client.producer import Message, Producer

pytestmark = pytest.mark.timeout(60)

DESTROYED = "Task was destroyed but it is pending"


def destroyed_task_reports(caplog: pytest.LogCaptureFixture) -> list[str]:
    """What asyncio logged about pending tasks it had to destroy (after collecting them)."""
    gc.collect()
    return [r.getMessage() for r in caplog.records if DESTROYED in r.getMessage()]


def test_run_returns_the_coroutine_result_and_raises_its_error() -> None:
    loop_thread = LoopThread("test-loop")
    try:

        async def answer() -> tuple[int, bool]:
            return 42, asyncio.get_running_loop() is loop_thread.loop

        assert loop_thread.run(answer()) == (42, True)

        async def fail() -> None:
            raise ValueError("no")

        with pytest.raises(ValueError, match="no"):
            loop_thread.run(fail())
    finally:
        loop_thread.stop()
    assert loop_thread.loop.is_closed()
    loop_thread.stop()  # a second stop does nothing


def test_stop_cancels_and_awaits_pending_tasks(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="asyncio")
    loop_thread = LoopThread("test-loop")
    cleaned_up: list[str] = []

    async def forever() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            cleaned_up.append("forever")

    async def spawn_on_cancel() -> None:
        # A task that, when cancelled, schedules another (as a gRPC call's status does).
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            asyncio.get_running_loop().create_task(forever())
            raise

    async def start() -> list[asyncio.Task[None]]:
        return [asyncio.create_task(forever()), asyncio.create_task(spawn_on_cancel())]

    tasks = loop_thread.run(start())
    loop_thread.stop()
    assert all(t.cancelled() for t in tasks)
    assert cleaned_up == ["forever", "forever"]
    assert destroyed_task_reports(caplog) == []


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    thread = ServerThread(tmp_path_factory.mktemp("loop-thread"))
    thread.start()

    async def create() -> None:
        async with AdminClient(thread.address, request_timeout_s=10) as admin:
            (await admin.create_topics([NewTopic("lt", 1, 1)]))["lt"].raise_for_error()

    asyncio.run(create())
    try:
        yield thread
    finally:
        thread.stop()


def test_closing_blocking_clients_leaves_no_task_pending(
    server: ServerThread, caplog: pytest.LogCaptureFixture
) -> None:
    """A produce stream's and a fetch stream's calls are cancelled at close: gRPC's status
    tasks for them must be run (or cancelled) before the loop closes, not destroyed."""
    caplog.set_level(logging.ERROR, logger="asyncio")
    delivered: list[Message] = []
    for round_ in range(5):
        producer = Producer({"bootstrap.servers": server.address, "linger.ms": 0})
        for i in range(10):
            producer.produce(
                "lt", f"{round_}-{i}", on_delivery=lambda err, msg: delivered.append(msg)
            )
        assert producer.close(10) == 0
    assert len(delivered) == 50
    assert all(m.error() is None for m in delivered)

    consumer = Consumer({"bootstrap.servers": server.address})
    consumer.assign([TopicPartition("lt", 0, OFFSET_BEGINNING)])
    consumed = consumer.consume(50, timeout=10)
    consumer.close()
    assert [m.value() for m in consumed] == [m.value() for m in delivered]
    assert destroyed_task_reports(caplog) == []
