"""Python stubs generated from protos/ at test time, for a client built only from the protos.

A test that must see the gRPC contract as a client in another language sees it uses these
instead of the committed ``highwater.v1`` modules: :func:`generate_stubs` runs protoc on
the ``.proto`` files into a directory of its own, and :func:`stub_env` puts that directory
first on ``PYTHONPATH``, so that a subprocess importing ``highwater.v1.broker_pb2`` loads
the freshly generated module and none of the project's code.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PROTO_ROOT = ROOT / "protos"
MINIMAL_CLIENT = Path(__file__).with_name("minimal_grpc_client.py")


def generate_stubs(out: Path) -> Path:
    """protoc's Python messages and gRPC stubs for every proto under protos/, in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in PROTO_ROOT.rglob("*.proto"))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{PROTO_ROOT}",
            f"--python_out={out}",
            f"--grpc_python_out={out}",
            *protos,
        ],
        check=True,
    )
    # Regular packages, so that they shadow the project's own ``highwater`` on the path.
    for package in {(out / p).parent for p in protos}:
        while package != out:
            (package / "__init__.py").touch()
            package = package.parent
    return out


def stub_env(stubs: Path) -> dict[str, str]:
    """The environment of a subprocess that imports the generated stubs first."""
    return dict(os.environ, PYTHONPATH=str(stubs))


async def run_minimal_client(stubs: Path, address: str, topic: str) -> dict[str, Any]:
    """minimal_grpc_client.py against ``address`` in a subprocess on ``stubs``: what each
    answer said, as it printed them."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(MINIMAL_CLIENT),
        address,
        topic,
        env=stub_env(stubs),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode == 0, err.decode()
    answers: dict[str, Any] = json.loads(out)
    return answers
