"""The active controller's CPU per ``AlterConfigs`` on its request path alone: a measuring driver.

``python -m bench._controller_request_cost [--requests N] [--groups 1 8 32] [--best K]
[--through-server 4 16 64 [--seconds S]]``
runs, in this process, what the active controller's worker does for each request of
``python -m bench raft``'s write workload, without gRPC and without Raft's I/O: the
request's proto to its message (``controller_api/codec.py``), ``QuorumController.alter_configs``
on the store's latest state, the store's staging of its ``ConfigRecord``
(``RaftMetadataStore.append`` between ``begin_batch`` and ``seal``), the answer to its
proto, and one ``seal`` per group of ``--groups`` requests (its image built, its records
handed to an appender that only counts offsets). The image holds 64 topics with a
config override each, as the benchmark's does. It prints the CPU time
(``time.process_time``) per request, the best of ``--best`` runs per group size: what
the group-level work (one delta, one image per group) saves shows as the difference
between group sizes. The machine is shared: compare figures measured back to back.

``--through-server 4 16 64`` measures the whole controller instead, still without gRPC:
a lone voter's ``ControllerServer`` (its worker, the call's future and answer, the Raft
append, the fsync in the flusher thread, the commit and the apply) answering
``ControllerServer.call`` from that many writer tasks, each sending its next request as
soon as the last is answered, so that every group holds all of them. It prints the CPU
of this process (every thread) per committed write for each number of writers, and the
split into a cost per request and a cost per Raft batch that the smallest and the
largest number of writers imply (``cpu = per_request + per_batch / writers``). The writer
tasks' own work (each request built, each answer read back from its proto: about 7 µs)
is in the per-request figure.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from highwater.controller import ControllerConfig
from highwater.controller.quorum_controller import QuorumController
from highwater.controller.service import ControllerServer, ControllerSettings, RaftMetadataStore
from highwater.controller_api import codec
from highwater.controller_api import messages as m
from highwater.metadata import (
    ConfigRecord,
    ConfigResourceType,
    MetadataRecord,
    PartitionRecord,
    RegisterBrokerRecord,
    TopicRecord,
)
from highwater.metadata.state_machine import MetadataStateMachine
from highwater.raft.messages import OffsetAndEpoch
from highwater.rpc.endpoints import free_loopback_ports

TOPICS = 64


class _CountingAppender:
    """The part of ``RaftServer`` the store appends through: offsets only, never committed."""

    leader_id = 1

    def __init__(self) -> None:
        self.end_offset = 0

    def append(
        self,
        values: Sequence[bytes],
        *,
        epoch: int | None = None,
        base_offset: int | None = None,
    ) -> tuple[OffsetAndEpoch, asyncio.Future[int]]:
        self.end_offset += len(values)
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        return OffsetAndEpoch(self.end_offset - 1, epoch or 0), future


async def _per_request_us(requests: int, group: int) -> float:
    machine = MetadataStateMachine()
    store = RaftMetadataStore(_CountingAppender(), machine)
    controller = QuorumController(
        store.latest_image,
        ControllerConfig(cluster_id="bench"),
        seed=1,
        view_supplier=store.latest_view,
    )
    store.activate(1)
    setup: list[MetadataRecord] = [RegisterBrokerRecord(1, "incarnation", 0, fenced=False)]
    for t in range(TOPICS):
        setup += [
            TopicRecord(f"topic-{t}", f"id-{t}"),
            PartitionRecord(f"id-{t}", 0, (1,), (1,), 1),
            ConfigRecord(ConfigResourceType.TOPIC, f"topic-{t}", "retention.ms", "86400000"),
        ]
    store.append(setup)
    protos = [
        codec.ALTER_CONFIGS.request_to_proto(
            m.AlterConfigsRequest(
                (
                    m.AlterConfigsResource(
                        ConfigResourceType.TOPIC,
                        f"topic-{i % TOPICS}",
                        (m.AlterableConfig("retention.ms", value=str(100_000 + i)),),
                    ),
                )
            )
        )
        for i in range(requests)
    ]
    started = time.process_time()
    for first in range(0, requests, group):
        store.begin_batch()
        for proto in protos[first : first + group]:
            request = codec.ALTER_CONFIGS.request_from_proto(proto)
            result = controller.alter_configs(request)
            if result.response.resources[0].error:
                raise RuntimeError(f"refused: {result.response}")
            store.append(result.records)
            codec.ALTER_CONFIGS.response_to_proto(result.response)
        store.seal()
    return (time.process_time() - started) / requests * 1e6


async def _through_server(writers: int, seconds: float) -> tuple[float, float]:
    """CPU microseconds per committed write of a lone voter answering ``writers`` writer
    tasks for ``seconds`` (after a second of warm-up), and the writes per Raft batch."""
    address = f"127.0.0.1:{free_loopback_ports(1)[0]}"
    with tempfile.TemporaryDirectory(prefix="request-cost-") as root:
        server = ControllerServer(
            node_id=1,
            listen=address,
            voters={1: address},
            data_dir=Path(root) / "controller-1",
            settings=ControllerSettings(),
        )
        await server.start()
        try:
            await server.wait_active()
            setup: list[MetadataRecord] = [RegisterBrokerRecord(1, "incarnation", 0, fenced=False)]
            for t in range(writers):
                setup += [
                    TopicRecord(f"topic-{t}", f"id-{t}"),
                    PartitionRecord(f"id-{t}", 0, (1,), (1,), 1),
                ]
            if not await server.propose(setup):
                raise RuntimeError("the lone voter is not the active controller")
            committed = 0
            running = True

            async def writer(t: int) -> None:
                nonlocal committed
                value = 100_000
                while running:
                    value += 1
                    request = m.AlterConfigsRequest(
                        (
                            m.AlterConfigsResource(
                                ConfigResourceType.TOPIC,
                                f"topic-{t}",
                                (m.AlterableConfig("retention.ms", value=str(value)),),
                            ),
                        )
                    )
                    answer = codec.ALTER_CONFIGS.response_from_proto(
                        await server.call(codec.ALTER_CONFIGS, request)
                    )
                    if answer.resources[0].error:
                        raise RuntimeError(f"refused: {answer}")
                    committed += 1

            tasks = [asyncio.create_task(writer(t)) for t in range(writers)]
            await asyncio.sleep(1.0)
            writes, cpu, batches = committed, time.process_time(), server.store.sealed_batches
            await asyncio.sleep(seconds)
            writes = committed - writes
            cpu = time.process_time() - cpu
            batches = server.store.sealed_batches - batches
            running = False
            await asyncio.gather(*tasks)
        finally:
            await server.stop()
    return cpu / writes * 1e6, writes / max(batches, 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench._controller_request_cost", description=__doc__
    )
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--groups", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--best", type=int, default=5, help="runs per group size")
    parser.add_argument(
        "--through-server",
        type=int,
        nargs="+",
        metavar="WRITERS",
        help="measure a lone voter's ControllerServer with this many writers instead",
    )
    parser.add_argument(
        "--seconds", type=float, default=3.0, help="window per --through-server run"
    )
    args = parser.parse_args(argv)
    if args.through_server:
        figures = {}
        for writers in args.through_server:
            runs = [asyncio.run(_through_server(writers, args.seconds)) for _ in range(args.best)]
            cpu_us, per_batch = min(runs)
            figures[writers] = cpu_us
            print(
                f"{writers} writers: {cpu_us:.1f} us of CPU per write "
                f"({per_batch:.1f} writes per batch), the best of {len(runs)}",
                flush=True,
            )
        few, many = min(figures), max(figures)
        if few != many:
            per_batch_us = (figures[few] - figures[many]) / (1 / few - 1 / many)
            per_request_us = figures[many] - per_batch_us / many
            print(f"per request {per_request_us:.1f} us, per Raft batch {per_batch_us:.0f} us")
        return 0
    for group in args.groups:
        best = min(asyncio.run(_per_request_us(args.requests, group)) for _ in range(args.best))
        print(f"groups of {group}: {best:.1f} us of CPU per request", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
