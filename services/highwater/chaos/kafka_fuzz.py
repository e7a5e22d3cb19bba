"""The Kafka listener's fuzzer: malformed frames to every broker's Kafka listener, each on a
connection of its own, while the workload goes on over gRPC.

Each request is one of:

- ``garbage``: a frame of random bytes;
- ``random-header``: a request header of a random API key and version, then random bytes;
- ``truncated``: a header of an API the listener serves, its body cut short (random bytes
  of a random short length);
- ``oversize``: a frame size over ``socket.request.max.bytes`` (or negative), and a few bytes;
- ``well-formed``: an ApiVersions v0 request or a Metadata v1 request for no topics (both
  encoded by hand here: the chaos harness speaks Kafka's protocol only this far).

The outcome is recorded as a ``fuzz`` entry: ``ANSWERED`` (a frame came back), ``CLOSED``
(the broker closed the connection), ``TIMEOUT`` or ``UNREACHABLE`` (a fault at work). The
checker holds the broker to answering every well-formed request it gets (a ``CLOSED``
well-formed request is ``unhandled-bad-input``); that no broker exits is checked as for
every process.
"""

from __future__ import annotations

import asyncio
import random
import struct
from typing import Final

from highwater.chaos.history import HistoryWriter

__all__ = ["KAFKA_MODES", "KafkaFuzzer", "kafka_request"]

KAFKA_MODES: Final = ("garbage", "random-header", "truncated", "oversize", "well-formed")
# API keys and versions the listener serves (docs/kafka-protocol.md), for truncated bodies.
_SERVED: Final = ((0, 9), (1, 12), (2, 7), (3, 12), (8, 8), (9, 7), (10, 4), (11, 9), (19, 7))
_HEADER: Final = struct.Struct(">hhih")
_CLIENT_ID: Final = b"chaos-fuzz"


def _header(api_key: int, version: int, correlation_id: int) -> bytes:
    return _HEADER.pack(api_key, version, correlation_id, len(_CLIENT_ID)) + _CLIENT_ID


def kafka_request(mode: str, rng: random.Random, correlation_id: int) -> tuple[str, bytes]:
    """``(what, frame)``: the frame to send for ``mode`` and a name for the history."""
    if mode == "garbage":
        body = rng.randbytes(rng.randint(0, 64))
        return "garbage", struct.pack(">i", len(body)) + body
    if mode == "random-header":
        key, version = rng.randint(-5, 100), rng.randint(-2, 20)
        body = _header(key, version, correlation_id) + rng.randbytes(rng.randint(0, 32))
        return f"{key}v{version}", struct.pack(">i", len(body)) + body
    if mode == "truncated":
        key, version = rng.choice(_SERVED)
        body = _header(key, version, correlation_id) + rng.randbytes(rng.randint(0, 6))
        return f"{key}v{version}", struct.pack(">i", len(body)) + body
    if mode == "oversize":
        size = rng.choice((2**31 - 1, 200 * 1024 * 1024, -1, -(2**31)))
        return "oversize", struct.pack(">i", size) + rng.randbytes(8)
    if rng.random() < 0.5:
        body = _header(18, 0, correlation_id)  # ApiVersions v0: no body
        return "18v0", struct.pack(">i", len(body)) + body
    body = _header(3, 1, correlation_id) + struct.pack(">i", 0)  # Metadata v1: no topics
    return "3v1", struct.pack(">i", len(body)) + body


class KafkaFuzzer:
    """Sends fuzzed frames to ``targets`` (process name -> Kafka listener) at ``rate``/s."""

    def __init__(
        self, targets: dict[str, str], history: HistoryWriter, seed: int, *, rate: float = 5.0
    ) -> None:
        self.targets = targets
        self.history = history
        self.rng = random.Random(seed ^ 0xCAFCA)
        self.rate = rate
        self.calls = 0

    async def run(self, stop: asyncio.Event) -> None:
        names = sorted(self.targets)
        while not stop.is_set() and names:
            name = self.rng.choice(names)
            mode = self.rng.choice(KAFKA_MODES)
            what, frame = kafka_request(mode, self.rng, self.calls)
            code = await self._send(self.targets[name], frame)
            self.calls += 1
            self.history.record(
                "fuzz",
                "fuzzer",
                target=name,
                method=f"kafka:{what}",
                mode=mode,
                size=len(frame),
                code=code,
            )
            await asyncio.sleep(1.0 / self.rate)

    @staticmethod
    async def _send(address: str, frame: bytes) -> str:
        host, _, port = address.rpartition(":")
        try:
            async with asyncio.timeout(2):
                reader, writer = await asyncio.open_connection(host, int(port))
        except (OSError, TimeoutError):
            return "UNREACHABLE"
        try:
            async with asyncio.timeout(2):
                writer.write(frame)
                await writer.drain()
                head = await reader.read(4)
                return "ANSWERED" if head else "CLOSED"
        except TimeoutError:
            return "TIMEOUT"
        except (ConnectionError, OSError):
            return "CLOSED"
        finally:
            writer.close()
