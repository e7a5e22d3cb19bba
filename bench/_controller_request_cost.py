"""The active controller's CPU per ``AlterConfigs`` on its request path alone: a measuring driver.

``python -m bench._controller_request_cost [--requests N] [--groups 1 8 32] [--best K]``
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
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Sequence

from highwater.controller import ControllerConfig
from highwater.controller.quorum_controller import QuorumController
from highwater.controller.service import RaftMetadataStore
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench._controller_request_cost", description=__doc__
    )
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--groups", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--best", type=int, default=5, help="runs per group size")
    args = parser.parse_args(argv)
    for group in args.groups:
        best = min(asyncio.run(_per_request_us(args.requests, group)) for _ in range(args.best))
        print(f"groups of {group}: {best:.1f} us of CPU per request", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
