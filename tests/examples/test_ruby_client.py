"""The Ruby example client (examples/ruby/client.rb) against a real embedded server, with
stubs generated from protos/ at test time by grpc_tools_ruby_protoc (Debian's
ruby-grpc-tools; ``make ruby-deps`` installs it with ruby-grpc)."""

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
CLIENT = ROOT / "examples" / "ruby" / "client.rb"


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[str]:
    address = f"127.0.0.1:{free_port()}"
    server = EmbeddedServer(listen=address, data_dir=tmp_path / "server")
    await server.start()
    try:
        yield address
    finally:
        await server.stop()


async def run(*command: str, timeout: float = 90) -> bytes:
    process = await asyncio.create_subprocess_exec(
        *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout)
    assert process.returncode == 0, err.decode()
    return out


async def test_the_ruby_client_produces_consumes_in_a_group_commits_and_lists_offsets(
    server: str, tmp_path: Path
) -> None:
    ruby, protoc = shutil.which("ruby"), shutil.which("grpc_tools_ruby_protoc")
    assert ruby is not None and protoc is not None, "make ruby-deps installs Ruby and its gRPC"
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    protos = sorted(
        str(p.relative_to(ROOT / "protos")) for p in (ROOT / "protos").glob("highwater/v1/*.proto")
    )
    await run(protoc, f"-I{ROOT / 'protos'}", f"--ruby_out={stubs}", f"--grpc_out={stubs}", *protos)
    out = await run(ruby, "-I", str(stubs), str(CLIENT), server, "from-ruby", "ruby-group")
    check_story(json.loads(out))
