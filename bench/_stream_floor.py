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

import grpc
import grpc.aio
import uvloop
from highwater.internal.v1 import replication_pb2 as rpb

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


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--exchanges", type=int, default=3000, help="per stream")
    parser.add_argument("--streams", type=int, default=3)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        uvloop.run(_serve())
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
