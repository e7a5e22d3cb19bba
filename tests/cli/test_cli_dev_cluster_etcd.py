"""``highwater dev-cluster --metadata-store etcd``: an etcd and brokers in the etcd metadata
mode come up, serve, say which mode they are in, and all stop on Ctrl-C, etcd last."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from highwater.cli.main import main
from highwater.client.admin import AdminClient, NewTopic

pytestmark = pytest.mark.timeout(120)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie waiting for its parent is gone
        return stat.read().split()[2] != "Z"


def listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def test_an_etcd_mode_dev_cluster_serves_and_stops_with_its_etcd(tmp_path: Path) -> None:
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "highwater",
            "dev-cluster",
            "--data-dir",
            str(tmp_path),
            "--metadata-store",
            "etcd",
            "--brokers",
            "2",
            "--coordinators",
            "1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    children: list[int] = []
    try:
        assert process.stdout is not None
        bootstrap = store = ""
        etcd_port = 0
        for line in process.stdout:
            if match := re.search(r"started etcd at 127\.0\.0\.1:(\d+)", line):
                etcd_port = int(match[1])
            if match := re.search(r"\(pid (\d+)\)", line):
                children.append(int(match[1]))
            if line.startswith("metadata store: "):
                store = line.removeprefix("metadata store: ").strip()
            if line.startswith("bootstrap: "):
                bootstrap = line.removeprefix("bootstrap: ").strip()
                break
        assert bootstrap and len(children) == 3, "the cluster did not come up"
        assert store == f"etcd://127.0.0.1:{etcd_port}/dev"
        assert not list(tmp_path.glob("controller-*"))  # no controller processes

        async def create() -> None:
            async with AdminClient(bootstrap, request_timeout_s=30) as admin:
                (await admin.create_topics([NewTopic("dev", 2, 2)]))["dev"].raise_for_error()

        asyncio.run(create())
        described = CliRunner().invoke(
            main, ["cluster", "describe", "--bootstrap-server", bootstrap]
        )
        assert described.exit_code == 0, described.output
        assert "MetadataMode: etcd" in described.output
        assert re.search(r"ControllerId: \d+", described.output)
        process.send_signal(signal.SIGINT)
        assert process.wait(60) == 0
        assert not [pid for pid in children if pid_alive(pid)], "a process was left running"
        assert not listening(etcd_port), "etcd was left running"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()
        for pid in children:
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)
