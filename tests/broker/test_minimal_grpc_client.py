"""A client built only from the protos, setting only the required fields, gets a consumer's
answers: no unset field is taken for a replica id, an epoch or a size of zero.

The client (tests/support/minimal_grpc_client.py) runs in a subprocess on stubs generated
from protos/ at test time and talks to a real embedded server (broker node 1) through the
one ``highwater.v1.Broker`` service: it creates the topic there too (the broker forwards the
admin calls to the controller). Before the contract's follower fields were optional, its
Fetch was taken for a follower fetch from broker 0 and answered NOT_LEADER_OR_FOLLOWER with
high watermark -1, its ListOffsets and OffsetsForLeaderEpoch named leader epoch 0, and its
Produce was acks=0.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from embedded_servers import free_port
from highwater.embedded import EmbeddedServer
from highwater.v1.common_pb2 import ErrorCode
from proto_stubs import generate_stubs, run_minimal_client

pytestmark = pytest.mark.timeout(120)

TOPIC = "plain"


@pytest.fixture(scope="module")
def stubs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate_stubs(tmp_path_factory.mktemp("stubs"))


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[EmbeddedServer]:
    server = EmbeddedServer(listen=f"127.0.0.1:{free_port()}", data_dir=tmp_path / "data")
    await server.start()
    await server.broker.wait_unfenced()
    try:
        yield server
    finally:
        await server.stop()


async def test_every_request_with_only_its_required_fields_gets_a_consumers_answer(
    server: EmbeddedServer, stubs: Path
) -> None:
    answers = await run_minimal_client(stubs, server.listen, TOPIC)

    # Created through the broker's own service with nothing but a name: the defaults.
    assert answers["create_topics"] == {
        "error": ErrorCode.NONE,
        "topic_error": ErrorCode.NONE,
        "num_partitions": 1,
        "replication_factor": 1,
    }

    # acks unset is acks=all: answered once appended (and committed), at offset 0.
    assert answers["produce"] == {"error": ErrorCode.NONE, "base_offset": 0}
    # A consumer's fetch: both records, up to the high watermark.
    fetch = answers["fetch"]
    assert (fetch["error"], fetch["high_watermark"], fetch["log_start_offset"]) == (
        ErrorCode.NONE,
        2,
        0,
    )
    assert fetch["records_bytes"] > 0
    assert answers["list_offsets_latest"] == {"error": ErrorCode.NONE, "offset": 2}
    assert answers["list_offsets_earliest"] == {"error": ErrorCode.NONE, "offset": 0}
    assert answers["offsets_for_leader_epoch"] == {
        "error": ErrorCode.NONE,
        "leader_epoch": 0,
        "end_offset": 2,
    }
    # No producer id given: a new producer, not producer 0 getting its epoch bumped.
    producer = answers["init_producer_id"]
    assert producer["error"] == ErrorCode.NONE
    assert producer["producer_epoch"] == 0
    assert producer["producer_id"] >= 0
    assert answers["describe_configs"] == {
        "error": ErrorCode.NONE,
        "values": {"cleanup.policy": "delete"},
    }
    assert answers["delete_topics"] == {"error": ErrorCode.NONE, "topic_error": ErrorCode.NONE}
