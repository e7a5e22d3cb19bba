"""Runs one benchmark function in a child process on the pure-Python codec.

The codec's implementation is chosen when ``highwater.records`` is imported
(``HIGHWATER_PURE_PYTHON=1`` selects the pure-Python reference), so the benchmark's
own process, which runs the compiled paths, cannot measure the other: its rows beside
the compiled ones come from here. ``python -m bench._pure_python MODULE:FUNCTION ARGS``
calls the function with the JSON list ``ARGS`` (awaiting it if it is a coroutine) and
prints its JSON result as the last line.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import os
import subprocess
import sys
from typing import Any

ENV = "HIGHWATER_PURE_PYTHON"


def run_pure(function: str, *args: Any, timeout_s: float = 1800) -> Any:
    """``function`` (``module:name``) called with ``args`` in a child process whose codec is
    the pure-Python one; its JSON result."""
    done = subprocess.run(
        [sys.executable, "-m", "bench._pure_python", function, json.dumps(args)],
        env={**os.environ, ENV: "1"},
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{function} on the pure-Python codec failed: {done.stderr[-1500:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    from highwater.records import IMPLEMENTATION
    from highwater.rpc.allocator import keep_large_buffers

    if IMPLEMENTATION != "pure-python":
        raise SystemExit(f"expected the pure-Python codec, {IMPLEMENTATION} is loaded")
    keep_large_buffers()  # as the benchmark's own process (bench/__main__.py)
    module_name, name = sys.argv[1].split(":")
    function = getattr(importlib.import_module(module_name), name)
    result = function(*json.loads(sys.argv[2]))
    if inspect.isawaitable(result):
        result = asyncio.run(result)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
