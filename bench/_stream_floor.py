"""What one ``grpc.aio`` stream exchange costs a server whose handler does nothing.

``python -m bench._stream_floor [--exchanges 3000] [--streams 3]``: a server process
(grpc.aio on uvloop, as the brokers run) whose bidirectional stream answers each
``ReplicaFetchRequest`` at once with an empty ``ReplicaFetchResponse``; this process
drives ``--streams`` streams at once, each sending its next request when the last one is
answered, and prints the server's CPU (user and system, all threads, from
``/proc/<pid>/stat``) per exchange. Every ``ProduceStream``, ``FetchStream`` and
``ReplicaFetch`` message a broker answers costs at least this: the floor under the
leader's CPU per Produce request (docs/broker.md, "Where end-to-end latency goes"). The
machine is shared: compare figures measured back to back, with the load beside them.

``--gap-ms G [G ...]`` measures one stream's exchanges one at a time instead, each after
G ms of idleness (the client sleeps first), and prints the median and p90 wall time of an
exchange per gap, beside the same exchange of the same bytes over a plain TCP connection
to an echo server on uvloop in another process: the physical floor of a message there
and back between two processes, without gRPC. A commit of the controller quorum with one
writer sends its messages a millisecond or two apart, so its hops cost the exchange at
such a gap, not the back-to-back one (docs/raft.md, "Tenth pass").
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import cast

import grpc
import grpc.aio
import uvloop
from highwater.internal.v1 import replication_pb2 as rpb

from bench._etcd_peer import percentile

_METHOD = "/bench.StreamFloor/Exchange"
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


async def _serve() -> None:
    async def exchange(
        requests: AsyncIterator[rpb.ReplicaFetchRequest], _context: grpc.aio.ServicerContext
    ) -> AsyncIterator[rpb.ReplicaFetchResponse]:
        async for _request in requests:
            yield rpb.ReplicaFetchResponse()

    handler = grpc.stream_stream_rpc_method_handler(
        exchange,
        request_deserializer=rpb.ReplicaFetchRequest.FromString,
        response_serializer=rpb.ReplicaFetchResponse.SerializeToString,
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers(
        [grpc.method_handlers_generic_handler("bench.StreamFloor", {"Exchange": handler})]
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(port, flush=True)
    await server.wait_for_termination()


async def _drive(port: int, exchanges: int, streams: int) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        method = channel.stream_stream(
            _METHOD,
            request_serializer=rpb.ReplicaFetchRequest.SerializeToString,
            response_deserializer=rpb.ReplicaFetchResponse.FromString,
        )

        async def one() -> None:
            call = method(wait_for_ready=True)
            request = rpb.ReplicaFetchRequest(replica_id=1)
            for _ in range(exchanges):
                await call.write(request)
                await call.read()
            await call.done_writing()

        await asyncio.gather(*(one() for _ in range(streams)))


async def _exchange_times(port: int, exchanges: int, gap_s: float) -> list[float]:
    """One stream's exchanges, each after ``gap_s`` of idleness: their wall times (µs)."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        method = channel.stream_stream(
            _METHOD,
            request_serializer=rpb.ReplicaFetchRequest.SerializeToString,
            response_deserializer=rpb.ReplicaFetchResponse.FromString,
        )
        call = method(wait_for_ready=True)
        request = rpb.ReplicaFetchRequest(replica_id=1)
        times = []
        for _ in range(exchanges):
            await asyncio.sleep(gap_s)
            started = time.perf_counter_ns()
            await call.write(request)
            await call.read()
            times.append((time.perf_counter_ns() - started) / 1000)
        await call.done_writing()
        return times


class _Echo(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        self._transport.write(data)


async def _serve_tcp_echo() -> None:
    server = await asyncio.get_running_loop().create_server(_Echo, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    await server.serve_forever()


async def _tcp_exchange_times(port: int, exchanges: int, gap_s: float) -> list[float]:
    """The same exchanges over plain TCP to the echo server: their wall times (µs)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    message = rpb.ReplicaFetchRequest(replica_id=1).SerializeToString()
    times = []
    try:
        for _ in range(exchanges):
            await asyncio.sleep(gap_s)
            started = time.perf_counter_ns()
            writer.write(message)
            await reader.readexactly(len(message))
            times.append((time.perf_counter_ns() - started) / 1000)
    finally:
        writer.close()
    return times


def _quantiles(times: list[float]) -> str:
    ordered = sorted(times)
    return f"p50 {percentile(ordered, 0.5):5.0f} µs, p90 {percentile(ordered, 0.9):5.0f} µs"


def _measure_gaps(gaps_ms: list[float], exchanges: int) -> None:
    servers = {
        kind: subprocess.Popen(
            [sys.executable, "-m", "bench._stream_floor", flag],
            stdout=subprocess.PIPE,
            text=True,
        )
        for kind, flag in (("grpc", "--serve"), ("tcp", "--serve-tcp"))
    }
    try:
        ports = {}
        for kind, server in servers.items():
            assert server.stdout is not None
            ports[kind] = int(server.stdout.readline())
        uvloop.run(_exchange_times(ports["grpc"], 200, 0.0))  # warm-up
        for gap_ms in gaps_ms:
            # Fewer exchanges after long gaps, so that each gap takes about as long.
            count = max(100, min(exchanges, int(exchanges * 2 / max(gap_ms, 2.0))))
            grpc_times = uvloop.run(_exchange_times(ports["grpc"], count, gap_ms / 1000))
            tcp_times = uvloop.run(_tcp_exchange_times(ports["tcp"], count, gap_ms / 1000))
            print(
                f"after {gap_ms:4.1f} ms idle, {count:,} exchanges: grpc.aio stream "
                f"{_quantiles(grpc_times)}; plain TCP {_quantiles(tcp_times)}; "
                f"load average {os.getloadavg()[0]:.1f}",
                flush=True,
            )
    finally:
        for server in servers.values():
            server.kill()
            server.wait()


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--exchanges", type=int, default=3000, help="per stream")
    parser.add_argument("--streams", type=int, default=3)
    parser.add_argument(
        "--gap-ms",
        type=float,
        nargs="+",
        help="one stream, each exchange after this idleness; beside plain TCP (see above)",
    )
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--serve-tcp", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        uvloop.run(_serve())
        return
    if args.serve_tcp:
        uvloop.run(_serve_tcp_echo())
        return
    if args.gap_ms:
        _measure_gaps(args.gap_ms, args.exchanges)
        return
    server = subprocess.Popen(
        [sys.executable, "-m", "bench._stream_floor", "--serve"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        uvloop.run(_drive(port, 200, args.streams))  # warm-up
        cpu, started = _cpu_s(server.pid), time.perf_counter()
        uvloop.run(_drive(port, args.exchanges, args.streams))
        cpu, elapsed = _cpu_s(server.pid) - cpu, time.perf_counter() - started
    finally:
        server.kill()
        server.wait()
    total = args.exchanges * args.streams
    print(
        f"{total:,} exchanges on {args.streams} streams: server CPU {cpu / total * 1e6:.1f} µs "
        f"per exchange, {elapsed / total * 1e6:.1f} µs of wall time; "
        f"load average {os.getloadavg()[0]:.1f}"
    )


if __name__ == "__main__":
    main()
