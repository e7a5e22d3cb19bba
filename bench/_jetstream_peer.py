"""NATS JetStream on loopback and its workloads: the peer of the broker suite.

:func:`jetstream_servers` runs Debian's ``nats-server`` with JetStream on file storage: one
server (R1) or a three-server cluster (R3, routes on loopback). The workloads drive it with
nats-py from this process, each bounded by timeouts so that a lost acknowledgement or a
stalled consumer fails the run instead of hanging it:

- publishing: ``publish_async`` (the publish goes out at once, its PubAck resolves a
  future later) with at most ``window`` acknowledgements outstanding — nats-py's own
  semaphore (``publish_async_max_pending``) bounds them and ``wait_stall`` bounds the wait
  for a slot; the end waits for every acknowledgement with a deadline;
- consuming: an ordered push consumer (ephemeral, no acknowledgements: a Kafka consumer
  acknowledges no record either; flow-controlled by the server) from the stream's start,
  counting in its callback, with a deadline. A pull consumer's ``fetch(batch=n)`` works too
  when it never asks for more than remains (a fetch otherwise waits out its timeout), but
  nats-py then waits for each message with ``asyncio.wait_for``: about 3 times slower here;
- end-to-end latency: paced ``publish_async`` calls carrying their send time, received by
  an ordered push consumer (deliver policy "new") in the same process.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import struct
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from bench._etcd_peer import free_port

if TYPE_CHECKING:
    from nats.aio.client import Client as NatsClient
    from nats.aio.msg import Msg
    from nats.js.api import PubAck

STREAM = "BENCH"
SUBJECT = "bench"
STOP_TIMEOUT_S = 15.0
SEND_TIME = struct.Struct(">q")


def jetstream_available() -> str:
    """Empty if the peer can run; otherwise why not."""
    if shutil.which("nats-server") is None:
        return "nats-server is not installed (make bench-deps)"
    try:
        import nats  # noqa: F401
    except ImportError:
        return "nats-py is not installed (pip install -e '.[dev]')"
    return ""


def nats_server_version() -> str:
    try:
        done = subprocess.run(
            ["nats-server", "--version"], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return "nats-server"
    return done.stdout.strip() or "nats-server"


@contextlib.contextmanager
def jetstream_servers(root: Path, count: int) -> Iterator[list[str]]:
    """``count`` JetStream servers (clustered when more than one); yields their client URLs.

    Every server is stopped when the block ends: SIGTERM, then SIGKILL by its PID.
    """
    client_ports = [free_port() for _ in range(count)]
    route_ports = [free_port() for _ in range(count)]
    routes = ",".join(f"nats-route://127.0.0.1:{port}" for port in route_ports)
    processes: list[subprocess.Popen[bytes]] = []
    try:
        for index in range(count):
            store = root / f"nats-{index}"
            store.mkdir(parents=True, exist_ok=True)
            args = [
                "nats-server",
                "--jetstream",
                "--store_dir",
                str(store),
                "--addr",
                "127.0.0.1",
                "--port",
                str(client_ports[index]),
                "--server_name",
                f"bench-{index}",
            ]
            if count > 1:
                args += [
                    "--cluster_name",
                    "bench",
                    "--cluster",
                    f"nats://127.0.0.1:{route_ports[index]}",
                    "--routes",
                    routes,
                ]
            with open(root / f"nats-{index}.log", "ab") as log:
                processes.append(
                    subprocess.Popen(
                        args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
                    )
                )
        yield [f"nats://127.0.0.1:{port}" for port in client_ports]
    finally:
        for process in processes:
            if process.poll() is None:
                os.kill(process.pid, signal.SIGTERM)
        for process in processes:
            try:
                process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.kill(process.pid, signal.SIGKILL)
                process.wait(10)


async def _ignore_error(_error: Exception) -> None:
    """nats-py's error callback: refused connections while the servers start are expected."""


async def connect_with_stream(
    servers: list[str], replicas: int, *, timeout_s: float = 60.0, window: int = 2000
) -> NatsClient:
    """A connection once JetStream answers and the stream (file storage, ``replicas``) exists.

    A cluster elects its meta leader first; until then connecting or creating the stream
    fails, and both are retried until ``timeout_s``.
    """
    import nats
    from nats.js.api import StorageType, StreamConfig

    deadline = time.monotonic() + timeout_s
    last: BaseException | None = None
    while time.monotonic() < deadline:
        client: NatsClient | None = None
        try:
            client = await nats.connect(
                servers=servers,
                connect_timeout=2,
                allow_reconnect=False,
                error_cb=_ignore_error,
            )
            js = client.jetstream(timeout=5, publish_async_max_pending=window)
            await asyncio.wait_for(
                js.add_stream(
                    StreamConfig(
                        name=STREAM,
                        subjects=[SUBJECT],
                        storage=StorageType.FILE,
                        num_replicas=replicas,
                    )
                ),
                10,
            )
            return client
        except Exception as error:  # the servers are starting, the cluster is electing
            last = error
            if client is not None:
                with contextlib.suppress(Exception):
                    await client.close()
            await asyncio.sleep(0.25)
    raise RuntimeError(f"JetStream R{replicas} did not become available: {last!r}")


@dataclass(frozen=True)
class Counted:
    """How many records a phase moved and how long it took."""

    records: int
    seconds: float

    @property
    def per_second(self) -> float:
        return self.records / self.seconds if self.seconds else 0.0


async def publish_throughput(
    client: NatsClient, payload: bytes, records: int, *, window: int, timeout_s: float
) -> Counted:
    """``records`` publishes of ``payload``, at most ``window`` unacknowledged; every
    acknowledgement checked."""
    js = client.jetstream(timeout=5, publish_async_max_pending=window)
    futures: list[asyncio.Future[PubAck]] = []
    started = time.perf_counter()
    # One deadline over the whole phase: a per-call wait_stall would make every publish
    # yield to the event loop (asyncio.wait_for wraps it in a task), and the flusher would
    # then write each message with a system call of its own.
    async with asyncio.timeout(timeout_s):
        for _ in range(records):
            futures.append(await js.publish_async(SUBJECT, payload))
            if len(futures) >= 4 * window:  # check and drop the settled ones as we go
                _raise_failed([f for f in futures if f.done()])
                futures = [f for f in futures if not f.done()]
        await js.publish_async_completed()
    elapsed = time.perf_counter() - started
    _raise_failed(futures)
    return Counted(records, elapsed)


def _raise_failed(futures: list[asyncio.Future[PubAck]]) -> None:
    for future in futures:
        if future.done() and future.exception() is not None:
            raise RuntimeError(f"a JetStream publish failed: {future.exception()!r}")


async def end_to_end_latencies(
    client: NatsClient,
    *,
    rate: float,
    duration_s: float,
    warmup_s: float,
    payload_size: int,
    window: int,
) -> list[float]:
    """Publish at ``rate`` records/s for ``duration_s`` (after ``warmup_s``); each record's
    milliseconds from the publish call to its arrival at an ordered push consumer."""
    from nats.js.api import DeliverPolicy

    js = client.jetstream(timeout=5, publish_async_max_pending=window)
    latencies: list[float] = []
    measuring_from = 0

    async def received(message: Msg) -> None:
        now = time.perf_counter_ns()
        sent = SEND_TIME.unpack_from(message.data)[0]
        if sent >= measuring_from:
            latencies.append((now - sent) / 1e6)

    subscription = await js.subscribe(
        SUBJECT, cb=received, ordered_consumer=True, deliver_policy=DeliverPolicy.NEW
    )
    padding = b"p" * (payload_size - SEND_TIME.size)
    futures: list[asyncio.Future[PubAck]] = []
    started = time.perf_counter()
    measuring_from = time.perf_counter_ns() + int(warmup_s * 1e9)
    total = int(rate * (warmup_s + duration_s))
    sent = measured = 0
    async with asyncio.timeout(warmup_s + duration_s + 30):
        while sent < total:
            due = min(total, int((time.perf_counter() - started) * rate) + 1)
            while sent < due:
                now = time.perf_counter_ns()
                futures.append(await js.publish_async(SUBJECT, SEND_TIME.pack(now) + padding))
                sent += 1
                measured += now >= measuring_from
            if len(futures) >= 4 * window:
                _raise_failed([f for f in futures if f.done()])
                futures = [f for f in futures if not f.done()]
            await asyncio.sleep(0.001)
        await js.publish_async_completed()
    _raise_failed(futures)
    deadline = time.monotonic() + 10
    while len(latencies) < measured and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    with contextlib.suppress(Exception):
        await subscription.unsubscribe()
    return latencies


async def consume_throughput(client: NatsClient, records: int, *, timeout_s: float) -> Counted:
    """Read ``records`` messages from the start of the stream with an ordered push consumer."""
    from nats.js.api import DeliverPolicy

    js = client.jetstream(timeout=5)
    seen = 0
    done = asyncio.Event()

    async def received(_message: Msg) -> None:
        nonlocal seen
        seen += 1
        if seen >= records:
            done.set()

    started = time.perf_counter()
    subscription = await js.subscribe(
        SUBJECT, cb=received, ordered_consumer=True, deliver_policy=DeliverPolicy.ALL
    )
    try:
        await asyncio.wait_for(done.wait(), timeout_s)
    except TimeoutError:
        raise TimeoutError(
            f"consumed {seen:,} of {records:,} records in {timeout_s:.0f} s"
        ) from None
    elapsed = time.perf_counter() - started
    with contextlib.suppress(Exception):
        await subscription.unsubscribe()
    return Counted(seen, elapsed)
