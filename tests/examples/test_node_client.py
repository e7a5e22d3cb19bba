"""The Node.js example client (examples/node/client.js) against a real embedded server:
keyed records placed by the broker where the Python client's partitioner puts them, read
back with structured fetch and through a consumer session in a group, committed.

It loads its stubs from protos/ at run time with @grpc/proto-loader, as a client in any
language would generate them, and sets only the fields docs/grpc.md lists. ``make test``
installs Node.js and the example's npm packages (``make node-deps``).
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from embedded_servers import free_port
from example_clients import check_story
from highwater.embedded import EmbeddedServer

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]
CLIENT = ROOT / "examples" / "node" / "client.js"


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[str]:
    address = f"127.0.0.1:{free_port()}"
    server = EmbeddedServer(listen=address, data_dir=tmp_path)
    await server.start()
    try:
        yield address
    finally:
        await server.stop()


async def test_the_node_client_produces_consumes_commits_and_lists_offsets(server: str) -> None:
    node = shutil.which("node")
    assert node is not None, "make node-deps installs Node.js"
    assert (CLIENT.parent / "node_modules" / "@grpc" / "grpc-js").is_dir(), "make node-deps"
    process = await asyncio.create_subprocess_exec(
        node,
        str(CLIENT),
        server,
        "from-node",
        "node-group",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 90)
    assert process.returncode == 0, err.decode()
    seen = json.loads(out)

    check_story(seen)
    fetched = {r["key"]: r for r in seen["consumed"]}  # structured fetch, as well
    for key, partition, offset in seen["placements"]:
        record = fetched[key]
        assert (record["partition"], record["offset"]) == (partition, offset)
        assert record["value"] == key.replace("key", "value")
        assert record["headers"] == [["source", "node"]]
