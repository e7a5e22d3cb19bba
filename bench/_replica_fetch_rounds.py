"""CPU of an idle replica fetch round: a follower and its leader with nothing to replicate.

``python -m bench._replica_fetch_rounds --partitions 1000,10000``: one leader and one
follower broker in this process (real ``PartitionManager`` over real logs on disk, the
follower's real ``ReplicaFetcher``, the leader's real ``RequestHandler.replica_fetch``),
every partition led by the leader and followed by the follower, nothing produced. The
transport encodes the request and the answer as gRPC would (``SerializeToString`` and
``FromString``), without the network, and answers at once (``replica.fetch.wait.max.ms``
0), so each round is all CPU: the follower building its fetch and applying the answer,
the leader reading its partitions, the wire encoding both ways.

Two ways a round runs: ``sessionless``, every partition named and read in every fetch
(what every replica fetch was before fetch sessions, and what a follower still does
against a leader without them), and ``session``, an incremental fetch of a KIP-227
session (docs/broker.md). With 10,000 partitions RF 3 on 3 brokers, a leader is asked for
about 6,700 partitions per round by its two followers, each follower about 3,300 from each
of two leaders: the 1,000 and 10,000 rows bracket that.

Prints one JSON object: per mode and size, the CPU seconds per round (process time, both
sides), the bytes of the request and answer, and the rounds measured.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from highwater.broker.partitions import PartitionManager
from highwater.broker.purgatory import Purgatory
from highwater.broker.replica_fetcher import ReplicaFetcher
from highwater.broker.request_handler import RequestHandler
from highwater.broker.settings import BrokerSettings
from highwater.broker.telemetry import BrokerTelemetry
from highwater.controller_api.client import ControllerClient
from highwater.internal.v1 import replication_pb2 as rpb
from highwater.metadata import (
    BrokerEndpoint,
    MetadataImage,
    MetadataRecord,
    PartitionRecord,
    RegisterBrokerRecord,
    TopicRecord,
    UnfenceBrokerRecord,
    replay,
)
from highwater.storage.log_manager import LogManager

LEADER, FOLLOWER = 1, 2
TOPIC_PARTITIONS = 100
SETTINGS = BrokerSettings(replica_fetch_max_wait_ms=0)


def image(partitions: int) -> MetadataImage:
    records: list[MetadataRecord] = []
    for broker_id in (LEADER, FOLLOWER):
        endpoint = BrokerEndpoint("PLAINTEXT", f"b{broker_id}", 9092)
        records.append(RegisterBrokerRecord(broker_id, f"inc-{broker_id}", broker_id, (endpoint,)))
        records.append(UnfenceBrokerRecord(broker_id, broker_id))
    for t in range(partitions // TOPIC_PARTITIONS):
        topic_id = f"topic-{t:04d}-id-0000000"
        records.append(TopicRecord(f"t{t}", topic_id))
        for index in range(TOPIC_PARTITIONS):
            replicas = (LEADER, FOLLOWER)
            records.append(PartitionRecord(topic_id, index, replicas, replicas, LEADER))
    return replay(records, 10)


@dataclass
class WireTransport:
    """The leader's ``replica_fetch`` behind the request's and answer's wire encoding."""

    handler: RequestHandler
    request_bytes: int = 0
    answer_bytes: int = 0
    session: bool = True

    async def fetch(
        self, request: rpb.ReplicaFetchRequest, timeout_s: float
    ) -> rpb.ReplicaFetchResponse:
        if not self.session and "session_epoch" in request.DESCRIPTOR.fields_by_name:
            request.ClearField("session_epoch")  # as a follower that predates sessions
            request.session_id = 0
        wire = request.SerializeToString()
        self.request_bytes = len(wire)
        answer = await self.handler.replica_fetch(rpb.ReplicaFetchRequest.FromString(wire))
        wire = answer.SerializeToString()
        self.answer_bytes = len(wire)
        return rpb.ReplicaFetchResponse.FromString(wire)

    async def close(self) -> None:
        pass


async def measure(root: Path, partitions: int, rounds: int) -> dict[str, dict[str, float]]:
    managers = []
    partition_managers = []
    the_image = image(partitions)
    for node in (LEADER, FOLLOWER):
        logs = LogManager(root / f"broker-{node}")
        logs.startup(node_id=node)
        managers.append(logs)
        manager = PartitionManager(node, logs)
        manager.apply_image(the_image)
        partition_managers.append(manager)
    leader_partitions, follower_partitions = partition_managers
    handler = RequestHandler(
        node_id=LEADER,
        settings=SETTINGS,
        partitions=leader_partitions,
        purgatory=Purgatory(),
        telemetry=BrokerTelemetry(leader_partitions),
        controller=ControllerClient(["127.0.0.1:1"]),
        broker_epoch=lambda: 1,
        propose=lambda partition, proposal: None,
    )
    sessions = getattr(handler, "replica_sessions", None)
    if sessions is not None:
        leader_partitions.on_change = sessions.partition_changed
    results: dict[str, dict[str, float]] = {}
    try:
        for mode in ("sessionless", "session"):
            transport = WireTransport(handler, session=mode == "session")
            fetcher = ReplicaFetcher(
                LEADER,
                partitions=follower_partitions,
                replica_id=FOLLOWER,
                broker_epoch=lambda: FOLLOWER,
                settings=SETTINGS,
                connect=lambda address, t=transport: t,  # type: ignore[misc]
            )
            for _ in range(3):  # the full fetch, then the followers' fetches at the end
                await fetcher.fetch_round()
            started_cpu, started = time.process_time(), time.perf_counter()
            for _ in range(rounds):
                await fetcher.fetch_round()
            cpu = time.process_time() - started_cpu
            results[mode] = {
                "cpu_ms_per_round": cpu / rounds * 1e3,
                "wall_ms_per_round": (time.perf_counter() - started) / rounds * 1e3,
                "request_bytes": transport.request_bytes,
                "answer_bytes": transport.answer_bytes,
                "rounds": rounds,
            }
            await fetcher.close()
    finally:
        await handler.controller.close()
        for logs in managers:
            logs.shutdown()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench._replica_fetch_rounds")
    parser.add_argument("--partitions", default="1000,10000")
    parser.add_argument("--rounds", type=int, default=0, help="default: 200,000 / partitions")
    parser.add_argument("--data-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    out: dict[str, object] = {"load_before": os.getloadavg()}
    for partitions in (int(p) for p in args.partitions.split(",")):
        rounds = args.rounds or max(20, 200_000 // partitions)
        with tempfile.TemporaryDirectory(dir=args.data_dir) as root:
            out[str(partitions)] = asyncio.run(measure(Path(root), partitions, rounds))
        print(json.dumps({str(partitions): out[str(partitions)]}), flush=True)
    out["load_after"] = os.getloadavg()
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
