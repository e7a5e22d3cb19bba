"""``highwater dev-cluster``: real processes come up, serve, and all stop on Ctrl-C."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from highwater.client.admin import (
    AdminClient,
    NewTopic,
    OffsetAndMetadata,
    UnknownTopicOrPartitionError,
)

pytestmark = pytest.mark.timeout(120)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie waiting for its parent counts as gone.
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split()[2] != "Z"


def test_a_dev_cluster_serves_and_stops_every_process_it_started(tmp_path: Path) -> None:
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "highwater",
            "dev-cluster",
            "--data-dir",
            str(tmp_path),
            "--controllers",
            "1",
            "--brokers",
            "2",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    children: list[int] = []
    try:
        assert process.stdout is not None
        bootstrap = ""
        for line in process.stdout:
            if match := re.search(r"\(pid (\d+)\)", line):
                children.append(int(match[1]))
            if line.startswith("bootstrap: "):
                bootstrap = line.removeprefix("bootstrap: ").strip()
                break
        # 1 controller, 2 brokers, 2 coordinators.
        assert bootstrap and len(children) == 5, "the cluster did not come up"

        async def create_and_describe() -> list[int]:
            async with AdminClient(bootstrap) as admin:
                results = await admin.create_topics([NewTopic("dev", 2, 2)])
                assert results["dev"].error is None
                for _ in range(100):
                    # Brokers learn of the topic by replicating the metadata log: soon.
                    with contextlib.suppress(UnknownTopicOrPartitionError):
                        described = (await admin.describe_topics(["dev"]))["dev"]
                        if all(p.leader is not None for p in described.partitions):
                            return sorted(len(p.isr) for p in described.partitions)
                    await asyncio.sleep(0.1)
            raise AssertionError("no leaders")

        assert asyncio.run(create_and_describe()) == [2, 2]

        async def commit_and_read_group_offsets() -> dict[tuple[str, int], int]:
            async with AdminClient(bootstrap) as admin:
                await admin.alter_consumer_group_offsets(
                    "dev-group",
                    {("dev", 0): OffsetAndMetadata(7), ("dev", 1): OffsetAndMetadata(9)},
                )
                offsets = await admin.list_consumer_group_offsets("dev-group")
                offsets_topic = await admin.describe_topics(["__consumer_offsets"])
            assert offsets_topic["__consumer_offsets"].replication_factor == 2
            return {tp: o.offset for tp, o in offsets.items()}

        # The coordinators serve groups, their state on __consumer_offsets (2 replicas).
        assert asyncio.run(commit_and_read_group_offsets()) == {("dev", 0): 7, ("dev", 1): 9}
        process.send_signal(signal.SIGINT)
        assert process.wait(60) == 0
        assert not [pid for pid in children if pid_alive(pid)], "a process was left running"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()
        for pid in children:
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)
