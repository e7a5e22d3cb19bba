"""Client quotas over a real ``highwater server`` process: set with ``highwater quotas`` and
``highwater configs`` as an operator types them, a producer throttled to its
``producer_byte_rate`` and a consumer to its ``consumer_byte_rate`` (each within 20% over
whole cycles of the quota windows), a changed quota governing the next seconds without a
restart, and the broker's throttle metric.

A client that always has data gets its quota in bursts (docs/security.md): with two
one-second windows, a window's worth at once, then held, a cycle of about two windows.
Over a span that starts at a burst and holds whole cycles it gets its quota, but a span
that starts elsewhere in the cycle may miss a burst, a quarter of four seconds' worth. So
every measurement starts where the broker's measured rate starts afresh: a client id's
first request, or one after the client sent nothing for all the windows (its samples are
dropped). Where the measurement starts then does not depend on how fast the machine
answers the calls before it.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from highwater.cli.main import main
from highwater.client.admin import AdminClient, NewTopic
from highwater.client.consumer import AsyncConsumer, TopicPartition
from highwater.client.errors import AdminError
from highwater.client.message import Message
from highwater.client.producer import AsyncProducer, DeliveryHandle
from highwater.metadata.client_quotas import DEFAULT_ENTITY, ClientQuotaEntity
from highwater.rpc.endpoints import free_loopback_ports
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.timeout(120)

TOPIC = "throttled"
PRODUCER_RATE = 64 * 1024
CONSUMER_RATE = 64 * 1024
WINDOWS_S = 2.0  # quota.window.num x quota.window.size.seconds: one cycle of the windows
MEASURED_S = 2 * WINDOWS_S
VALUE = bytes(1024)
MEASURED_RECORDS = int(CONSUMER_RATE * MEASURED_S) // len(VALUE)


def highwater(*args: str) -> Result:
    """``highwater ARGS...`` run in this process (the command an operator types, without a
    Python start-up per command); its exit code and output."""
    return CliRunner().invoke(main, list(args))


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """``highwater server`` with two one-second quota windows: its address, once it
    answers with the topic created, and its metrics URL."""
    root = tmp_path_factory.mktemp("quotas")
    port, metrics_port = free_loopback_ports(2)
    address = f"127.0.0.1:{port}"
    with open(root / "server.log", "wb") as log:
        process = subprocess.Popen(
            [
                sys.executable, "-m", "highwater", "server", "--listen", address,
                "--data-dir", str(root / "data"), "--override", "quota.window.num=2",
                "--metrics-listen", f"127.0.0.1:{metrics_port}",
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
        )  # fmt: skip
        try:
            asyncio.run(create_topic(address, root / "server.log"))
            yield address, f"http://127.0.0.1:{metrics_port}/metrics"
        finally:
            process.terminate()
            process.wait(30)


@pytest.fixture(scope="module")
def server(served: tuple[str, str]) -> str:
    return served[0]


@pytest.fixture(scope="module")
def metrics_url(served: tuple[str, str]) -> str:
    return served[1]


@pytest.fixture(scope="module")
def client_quotas(server: str) -> None:
    """The quotas the throttling tests measure, which the first test sets with the CLI: set
    here as well, so that each of those tests also runs first, or alone."""

    async def set_quotas() -> None:
        async with AdminClient(server) as admin:
            errors = await admin.alter_client_quotas(
                [
                    (
                        ClientQuotaEntity(None, "quota-producer"),
                        {"producer_byte_rate": PRODUCER_RATE},
                    ),
                    (
                        ClientQuotaEntity(None, "quota-consumer"),
                        {"consumer_byte_rate": CONSUMER_RATE, "request_percentage": 500},
                    ),
                ]
            )
        assert errors == [None, None]

    asyncio.run(set_quotas())


async def create_topic(address: str, log: Path) -> None:
    """Create the topic once the server answers."""
    deadline = time.monotonic() + 60
    async with AdminClient(address, request_timeout_s=5) as admin:
        while True:
            try:
                (result,) = (await admin.create_topics([NewTopic(TOPIC, 1)])).values()
                if result.error is None:
                    return
            except AdminError:
                pass
            assert time.monotonic() < deadline, log.read_text()
            await asyncio.sleep(0.3)


def quotas(server: str, *args: str) -> Result:
    return highwater("quotas", args[0], "--bootstrap-server", server, *args[1:])


def test_quotas_are_altered_and_described_as_kafka_configs_does(server: str) -> None:
    done = quotas(
        server, "alter", "--entity-type", "clients", "--entity-name", "quota-producer",
        "--add-config", f"producer_byte_rate={PRODUCER_RATE}",
    )  # fmt: skip
    assert done.exit_code == 0, done.output
    assert done.output.strip() == "Completed updating config for client-id 'quota-producer'."
    done = highwater(
        "configs", "--bootstrap-server", server, "--entity-type", "clients",
        "--entity-name", "quota-consumer", "--alter",
        "--add-config", f"consumer_byte_rate={CONSUMER_RATE},request_percentage=500",
    )  # fmt: skip
    assert done.exit_code == 0, done.output
    described = quotas(server, "describe", "--entity-type", "clients")
    assert described.output.splitlines() == [
        "Quota configs for client-id 'quota-consumer' are consumer_byte_rate=65536.0, "
        "request_percentage=500.0",
        f"Quota configs for client-id 'quota-producer' are producer_byte_rate={PRODUCER_RATE}.0",
    ]


async def test_the_admin_client_sets_describes_and_removes_a_default_quota(server: str) -> None:
    default_user = ClientQuotaEntity(DEFAULT_ENTITY, None)
    async with AdminClient(server) as admin:
        assert await admin.alter_client_quotas(
            [(default_user, {"producer_byte_rate": 1 << 20})]
        ) == [None]
        described = await admin.describe_client_quotas()
        assert described[default_user] == {"producer_byte_rate": float(1 << 20)}
        assert await admin.alter_client_quotas([(default_user, {"producer_byte_rate": None})]) == [
            None
        ]
        assert default_user not in await admin.describe_client_quotas()


def throttle_metric(metrics_url: str, quota_type: str, client_id: str) -> dict[str, float]:
    """The broker's ``highwater.broker.quota.throttle_time`` histogram for one quota type
    and client id, from its Prometheus endpoint: its ``count`` and ``sum`` (ms)."""
    with urllib.request.urlopen(metrics_url, timeout=10) as answer:
        text = answer.read().decode()
    found = {"count": 0.0, "sum": 0.0}
    for family in text_string_to_metric_families(text):
        if not family.name.startswith("highwater_broker_quota_throttle_time"):
            continue
        for sample in family.samples:
            labels = sample.labels
            if (
                labels.get("highwater_quota_type") == quota_type
                and labels.get("highwater_quota_client_id") == client_id
            ):
                for kind in found:
                    if sample.name.endswith(f"_{kind}"):
                        found[kind] += sample.value
    return found


async def produce_for(producer: AsyncProducer, seconds: float) -> float:
    """Keep the producer busy for ``seconds`` from its first send; the value bytes per
    second written in that time."""
    loop = asyncio.get_running_loop()
    written = 0
    start = loop.time()
    end = start + seconds

    def delivered(error: BaseException | None, message: Message) -> None:
        nonlocal written
        if error is None and loop.time() < end:
            written += len(VALUE)

    pending: list[DeliveryHandle] = []
    while loop.time() < end:
        pending.append(producer.produce(TOPIC, VALUE, partition=0, on_delivery=delivered))
        if len(pending) >= 64:
            await asyncio.wait([pending.pop(0)])
    return written / seconds


@pytest.mark.usefixtures("client_quotas")
async def test_a_producer_is_throttled_to_its_rate_and_a_new_rate_applies_without_a_restart(
    server: str, metrics_url: str
) -> None:
    config = {
        "bootstrap.servers": server,
        "client.id": "quota-producer",
        "batch.size": 4096,
        "linger.ms": 1,
    }
    async with AsyncProducer(config) as producer, AdminClient(server) as admin:
        await producer.send(TOPIC, b"warm-up", partition=0)
        rate = await produce_for(producer, MEASURED_S)
        assert rate == pytest.approx(PRODUCER_RATE, rel=0.2)
        doubled = 2 * PRODUCER_RATE
        (error,) = await admin.alter_client_quotas(
            [(ClientQuotaEntity(None, "quota-producer"), {"producer_byte_rate": doubled})]
        )
        assert error is None
        # Nothing sent for all the windows: the broker drops the samples of the old rate
        # (its image follows the change well within this), so the doubled rate is measured
        # from a fresh start over one whole cycle, as the first was over two.
        await producer.flush()
        await asyncio.sleep(WINDOWS_S)
        rate = await produce_for(producer, WINDOWS_S)
        assert rate == pytest.approx(doubled, rel=0.2)
    # The broker's throttle metric, per quota type and entity.
    held = throttle_metric(metrics_url, "produce", "quota-producer")
    assert held["count"] > 0 and held["sum"] > 0


@pytest.mark.usefixtures("client_quotas")
async def test_a_consumer_is_throttled_to_its_rate(server: str, metrics_url: str) -> None:
    # Enough records to read for the whole measurement, written by a client no quota governs.
    async with AsyncProducer({"bootstrap.servers": server, "client.id": "filler"}) as filler:
        await asyncio.gather(
            *(filler.produce(TOPIC, VALUE, partition=0) for _ in range(2 * MEASURED_RECORDS))
        )
    config = {
        "bootstrap.servers": server,
        "client.id": "quota-consumer",
        "max.partition.fetch.bytes": 4096,
        "auto.offset.reset": "earliest",
    }
    consumer = AsyncConsumer(config)
    try:
        consumer.assign([TopicPartition(TOPIC, 0, 0)])
        loop = asyncio.get_running_loop()
        assert await consumer.poll(10) is not None
        read = 0
        end = loop.time() + MEASURED_S
        while loop.time() < end:
            message = await consumer.poll(end - loop.time())
            if message is not None and message.error() is None and loop.time() < end:
                read += len(message.value() or b"")
        assert read / MEASURED_S == pytest.approx(CONSUMER_RATE, rel=0.2)
        assert throttle_metric(metrics_url, "fetch", "quota-consumer")["sum"] > 0
    finally:
        await consumer.close()
