"""``highwater dev-cluster --metadata-store etcd``: an etcd and brokers in the etcd metadata
mode come up, serve, say which mode they are in, and all stop on Ctrl-C, etcd last."""

from __future__ import annotations

import asyncio
import re
import socket
from pathlib import Path

import pytest
from click.testing import CliRunner
from dev_cluster import dev_cluster
from highwater.cli.main import main
from highwater.client.admin import AdminClient, NewTopic

pytestmark = pytest.mark.timeout(120)


def listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def test_an_etcd_mode_dev_cluster_serves_and_stops_with_its_etcd(tmp_path: Path) -> None:
    with dev_cluster(
        tmp_path, "--metadata-store", "etcd", "--brokers", "2", "--coordinators", "1"
    ) as cluster:
        bootstrap = cluster.bootstrap
        [etcd_port] = [
            int(match[1])
            for line in cluster.printed
            if (match := re.search(r"started etcd at 127\.0\.0\.1:(\d+)", line))
        ]
        assert len(cluster.children) == 3, cluster.printed
        assert cluster.fields["metadata store"] == f"etcd://127.0.0.1:{etcd_port}/dev"
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
        cluster.stop()
        assert not listening(etcd_port), "etcd was left running"
