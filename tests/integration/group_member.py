"""A consumer group member as a process of its own, for the consumer group integration tests.

``python group_member.py --bootstrap B --group G --topic T --out FILE`` subscribes with the
client library and consumes at-least-once, slowly (``--max-batch`` records, then a pause of
``--batch-pause-ms``) so that failures land mid-stream: each polled batch is recorded, then
committed synchronously. Every step is a JSON line in ``FILE`` (flushed at once, so a member killed
with SIGKILL leaves a complete account up to its last step):

- ``{"event": "assign", "generation": G, "member": M, "partitions": [[t, p], ...],
  "committed": {"t:p": offset}}``: the full assignment of generation G (the eager protocol
  revokes everything first), with the committed offsets it starts from;
- ``{"event": "revoke", ...}``, ``{"event": "record", "partition": p, "offset": o}``;
- ``{"event": "commit", "generation": G, "offsets": {"t:p": offset}}`` once acknowledged.

SIGTERM closes the consumer (a final commit, then LeaveGroup) and exits.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import time
from typing import IO, Any

from highwater.client.consumer import AsyncConsumer, CommitFailedError, TopicPartition


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--max-batch", type=int, default=20)
    parser.add_argument("--batch-pause-ms", type=int, default=250)
    args = parser.parse_args()
    with open(args.out, "a", buffering=1) as out:
        asyncio.run(run(args, out))


async def run(args: argparse.Namespace, out: IO[str]) -> None:
    def emit(event: str, **fields: Any) -> None:
        out.write(json.dumps({"event": event, "t": time.time(), **fields}) + "\n")
        out.flush()

    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    consumer = AsyncConsumer(
        {
            "bootstrap.servers": args.bootstrap,
            "group.id": args.group,
            "client.id": "member",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500,
            "max.poll.interval.ms": 10000,
            "partition.assignment.strategy": "range",
        }
    )

    async def on_assign(c: AsyncConsumer, partitions: list[TopicPartition]) -> None:
        committed = await c.committed(partitions)
        meta = c.consumer_group_metadata()
        emit(
            "assign",
            generation=meta.generation_id,
            member=meta.member_id,
            partitions=[[tp.topic, tp.partition] for tp in partitions],
            committed={f"{tp.topic}:{tp.partition}": tp.offset for tp in committed},
        )

    def on_revoke(c: AsyncConsumer, partitions: list[TopicPartition]) -> None:
        meta = c.consumer_group_metadata()
        emit(
            "revoke",
            generation=meta.generation_id,
            member=meta.member_id,
            partitions=[[tp.topic, tp.partition] for tp in partitions],
        )

    consumer.subscribe([args.topic], on_assign=on_assign, on_revoke=on_revoke)
    try:
        while not stop.is_set():
            messages = await consumer.consume(args.max_batch, timeout=0.2)
            records = [m for m in messages if m.error() is None]
            for message in records:
                emit("record", partition=message.partition(), offset=message.offset())
            if not records:
                continue
            generation = consumer.consumer_group_metadata().generation_id
            try:
                committed = await consumer.commit(asynchronous=False)
            except CommitFailedError as e:
                emit("commit_failed", generation=generation, error=str(e))
                continue
            emit(
                "commit",
                generation=generation,
                offsets={f"{tp.topic}:{tp.partition}": tp.offset for tp in committed or []},
            )
            await asyncio.sleep(args.batch_pause_ms / 1000)
    finally:
        await consumer.close()
        emit("closed")


if __name__ == "__main__":
    main()
