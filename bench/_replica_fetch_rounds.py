"""CPU of an idle replica fetch round: a follower and its leader with nothing to replicate.

``python -m bench._replica_fetch_rounds --partitions 1000,10000``: every partition led by
broker 1 and followed by broker 2, nothing produced, each side measured in this process
over real logs on disk (one broker's logs open at a time: 10,000 partitions of two
brokers would pass the process's open-file limit):

* the leader: its real ``RequestHandler.replica_fetch`` answering a follower's fetches
  as they come off the wire (``FromString`` of the request, ``SerializeToString`` of the
  answer);
* the follower: its real ``ReplicaFetcher`` rounds, over a transport that encodes the
  request and hands back the leader's answers recorded in the first phase.

``replica.fetch.wait.max.ms`` is 0, so each round is all CPU. Two ways a round runs:
``sessionless``, every partition named and read in every fetch (what every replica fetch
was before fetch sessions, and what a follower still does against a leader without them),
and ``session``, an incremental fetch of a KIP-227 session (docs/broker.md). With 10,000
partitions RF 3 on 3 brokers, a leader is asked for about 6,700 partitions per round by
its two followers, each follower about 3,300 from each of two leaders: the 1,000 and
10,000 rows bracket that.

Prints JSON: per size and mode, the CPU milliseconds per round on each side (process
time), the bytes of the request and the answer, the rounds measured.
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


def follower_request(
    partitions: int, session_id: int = 0, epoch: int | None = None, named: bool = True
) -> rpb.ReplicaFetchRequest:
    """The fetch a caught-up follower of every partition sends (``epoch`` None: without a
    session)."""
    request = rpb.ReplicaFetchRequest(
        replica_id=FOLLOWER,
        replica_epoch=FOLLOWER,
        max_wait_ms=0,
        min_bytes=1,
        max_bytes=SETTINGS.replica_fetch_response_max_bytes,
    )
    if session_id:
        request.session_id = session_id
    if epoch is not None:
        request.session_epoch = epoch
    if named:
        for t in range(partitions // TOPIC_PARTITIONS):
            topic = request.topics.add(topic=f"t{t}")
            for index in range(TOPIC_PARTITIONS):
                topic.partitions.add(
                    partition=index,
                    current_leader_epoch=0,
                    fetch_offset=0,
                    last_fetched_epoch=-1,
                    log_start_offset=0,
                    partition_max_bytes=SETTINGS.replica_fetch_max_bytes,
                )
    return request


def open_broker(root: Path, node: int, partitions: int) -> tuple[LogManager, PartitionManager]:
    logs = LogManager(root / f"broker-{node}")
    logs.startup(node_id=node)
    manager = PartitionManager(node, logs)
    manager.apply_image(image(partitions))
    return logs, manager


async def leader_side(
    root: Path, partitions: int, rounds: int
) -> tuple[dict[str, dict[str, float]], dict[str, list[bytes]]]:
    """The leader's CPU per idle fetch, and the answers it gave (first and later)."""
    logs, manager = open_broker(root, LEADER, partitions)
    handler = RequestHandler(
        node_id=LEADER,
        settings=SETTINGS,
        partitions=manager,
        purgatory=Purgatory(),
        telemetry=BrokerTelemetry(manager),
        controller=ControllerClient(["127.0.0.1:1"]),
        broker_epoch=lambda: 1,
        propose=lambda partition, proposal: None,
    )
    sessions = getattr(handler, "replica_sessions", None)  # None: a tree from before them
    if sessions is not None:
        manager.on_change = sessions.partition_changed
    results: dict[str, dict[str, float]] = {}
    answers: dict[str, list[bytes]] = {}
    try:
        full = follower_request(partitions).SerializeToString()
        answer = await handler.replica_fetch(rpb.ReplicaFetchRequest.FromString(full))
        answers["sessionless"] = [answer.SerializeToString()]
        started = time.process_time()
        for _ in range(rounds):
            answer = await handler.replica_fetch(rpb.ReplicaFetchRequest.FromString(full))
            answer.SerializeToString()
        results["sessionless"] = {
            "leader_cpu_ms_per_round": (time.process_time() - started) / rounds * 1e3,
            "request_bytes": len(full),
            "answer_bytes": len(answers["sessionless"][0]),
        }
        if sessions is None:
            return results, answers
        opening = follower_request(partitions, 0, 0).SerializeToString()
        answer = await handler.replica_fetch(rpb.ReplicaFetchRequest.FromString(opening))
        session_id = answer.session_id
        answers["session"] = [answer.SerializeToString()]
        started = time.process_time()
        for epoch in range(1, rounds + 1):
            wire = follower_request(partitions, session_id, epoch, named=False)
            answer = await handler.replica_fetch(
                rpb.ReplicaFetchRequest.FromString(wire.SerializeToString())
            )
            idle = answer.SerializeToString()
        answers["session"].append(idle)
        results["session"] = {
            "leader_cpu_ms_per_round": (time.process_time() - started) / rounds * 1e3,
            "request_bytes": len(wire.SerializeToString()),
            "answer_bytes": len(idle),
        }
    finally:
        await handler.controller.close()
        logs.shutdown()
    return results, answers


@dataclass
class RecordedLeader:
    """Answers a follower's fetches with the leader's recorded answers (the first, then the
    last one over and over), after encoding the request as gRPC would."""

    answers: list[bytes]
    given: int = 0

    async def fetch(
        self, request: rpb.ReplicaFetchRequest, timeout_s: float
    ) -> rpb.ReplicaFetchResponse:
        request.SerializeToString()
        answer = self.answers[min(self.given, len(self.answers) - 1)]
        self.given += 1
        return rpb.ReplicaFetchResponse.FromString(answer)

    async def close(self) -> None:
        pass


async def follower_side(
    root: Path, partitions: int, rounds: int, answers: dict[str, list[bytes]]
) -> dict[str, float]:
    """The follower's CPU per idle fetch round, against the leader's recorded answers."""
    logs, manager = open_broker(root, FOLLOWER, partitions)
    results: dict[str, float] = {}
    try:
        for mode in answers:
            transport = RecordedLeader(answers[mode])
            fetcher = ReplicaFetcher(
                LEADER,
                partitions=manager,
                replica_id=FOLLOWER,
                broker_epoch=lambda: FOLLOWER,
                settings=SETTINGS,
                connect=lambda address, t=transport: t,  # type: ignore[misc]
            )
            await fetcher.fetch_round()  # the full fetch
            started = time.process_time()
            for _ in range(rounds):
                await fetcher.fetch_round()
            results[mode] = (time.process_time() - started) / rounds * 1e3
            await fetcher.close()
    finally:
        logs.shutdown()
    return results


async def measure(root: Path, partitions: int, rounds: int) -> dict[str, dict[str, float]]:
    results, answers = await leader_side(root, partitions, rounds)
    follower = await follower_side(root, partitions, rounds, answers)
    for mode, figures in results.items():
        if mode not in follower:
            continue
        figures["follower_cpu_ms_per_round"] = follower[mode]
        figures["cpu_ms_per_round"] = figures["leader_cpu_ms_per_round"] + follower[mode]
        figures["rounds"] = rounds
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
