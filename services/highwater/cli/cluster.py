"""``highwater cluster describe``: the cluster id, the active controller and the brokers.

As Kafka's DescribeCluster (``kafka-cluster.sh``, the AdminClient's ``describeCluster``)::

    ClusterId: <id>
    ControllerId: <node id of the active controller>
    MetadataMode: kraft
    Broker: 1<TAB>Host: h<TAB>Port: 9092<TAB>Rack: r

The brokers come from ``Metadata``; in KRaft mode the cluster id and the active
controller from ``DescribeQuorum``, which the bootstrap server answers as a replica (a
voter or an observer) of the metadata log: the active controller is the quorum's leader.
In etcd mode (``MetadataMode: etcd``, docs/etcd-mode.md) ``Metadata`` names them: the
controller is the broker whose pushes the bootstrap broker last accepted.
"""

from __future__ import annotations

import asyncio

import click
import grpc.aio

from highwater.cli.tables import format_option, print_json
from highwater.cli.topics import Connection, connection_options, run_admin
from highwater.client.admin import AdminClient, ClusterDescription
from highwater.internal.v1 import raft_pb2, raft_pb2_grpc
from highwater.rpc.channels import open_channel

__all__ = ["cluster"]

_NO_LEADER = -1


async def _quorum(addresses: list[str], timeout_s: float) -> raft_pb2.DescribeQuorumResponse:
    """The first DescribeQuorum answer that names the cluster; ClickException if none."""
    problems: list[str] = []
    for address in addresses:
        try:
            async with open_channel(address) as channel:
                reply = await raft_pb2_grpc.RaftStub(channel).DescribeQuorum(
                    raft_pb2.DescribeQuorumRequest(), timeout=timeout_s
                )
        except grpc.aio.AioRpcError as e:
            problems.append(f"{address}: {e.code().name}")
            continue
        if reply.cluster_id:
            return reply
        problems.append(f"{address}: no cluster id")
    raise click.ClickException(f"no server described the quorum ({'; '.join(problems)})")


@click.group("cluster")
def cluster() -> None:
    """Describe the cluster (kafka-cluster)."""


@cluster.command("describe")
@connection_options
@format_option
def describe(conn: Connection, output_format: str) -> None:
    """Print the cluster id, the active controller, the metadata mode and the brokers."""

    async def work(admin: AdminClient) -> ClusterDescription:
        return await admin.describe_cluster()

    description = run_admin(conn, work)
    mode = description.metadata_mode or "kraft"
    controller_id = description.controller_id
    cluster_id = description.cluster_id
    if mode == "kraft":
        quorum = asyncio.run(_quorum(conn.bootstrap_server.split(","), conn.timeout))
        if controller_id is None:
            controller_id = quorum.leader_id if quorum.leader_id != _NO_LEADER else None
        cluster_id = cluster_id or quorum.cluster_id
    if output_format == "json":
        print_json(
            {
                "cluster_id": cluster_id,
                "controller_id": controller_id,
                "metadata_mode": mode,
                "brokers": [
                    {"id": n.node_id, "host": n.host, "port": n.port, "rack": n.rack}
                    for n in description.nodes
                ],
            }
        )
        return
    click.echo(f"ClusterId: {cluster_id}")
    click.echo(f"ControllerId: {controller_id if controller_id is not None else 'none'}")
    click.echo(f"MetadataMode: {mode}")
    for node in description.nodes:
        click.echo(
            f"Broker: {node.node_id}\tHost: {node.host}\tPort: {node.port}\tRack: {node.rack or ''}"
        )
