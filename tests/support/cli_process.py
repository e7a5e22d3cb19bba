"""The ``highwater`` command in a process of its own, for tests that run it against processes."""

from __future__ import annotations

import asyncio
import sys


async def highwater_cli(*args: str, stdin: bytes | None = None) -> str:
    """``highwater ARGS`` in a process of its own; its output (asserting it succeeded).

    Not ``CliRunner`` in a thread: the command runs its own event loop (``asyncio.run``)
    with gRPC channels of its own, and grpc.aio serves one event loop per process (a second
    loop in another thread shares the first's completion queue: grpc/grpc#25364). That
    is the likely cause of an UNAVAILABLE that ``cluster describe`` once got from a live
    broker in tests/integration/test_etcd_mode_processes.py,
    which ran it that way. ``stdin``: what the command reads (``produce``'s lines).
    """
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "highwater",
        *args,
        stdin=asyncio.subprocess.DEVNULL if stdin is None else asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(process.communicate(stdin), 90)
    assert process.returncode == 0, output.decode()
    return output.decode()
