"""The record codec a test run uses, for tests that compare the compiled one with the
pure-Python reference.

``make test`` runs the suite on the compiled codec, then the codec's tests again with
``HIGHWATER_PURE_PYTHON=1`` (docs/storage.md). A comparison has nothing to compare in that
second run, so :data:`compiled_only` skips it there, and only there: importing this module
without the compiled codec and without that variable set fails, so a missing build cannot
hide behind the skip.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from highwater.records.implementation import PURE_PYTHON_ENV, codec

__all__ = ["PURE_PYTHON_RUN", "compiled_only", "run_under_debug_allocator"]

PURE_PYTHON_RUN = codec is None
"""True in the suite's pure-Python run (the compiled codec deliberately unused)."""

if PURE_PYTHON_RUN and os.environ.get(PURE_PYTHON_ENV, "") in ("", "0"):
    raise RuntimeError(
        "highwater.records._codec is not built: `make compiled` (or `pip install -e .`) builds it"
    )

compiled_only = pytest.mark.skipif(
    PURE_PYTHON_RUN, reason=f"{PURE_PYTHON_ENV} is set: the pure-Python run of the suite"
)
"""For a test of the compiled codec itself: skipped in the pure-Python run only."""


def run_under_debug_allocator(script: str, test_dir: Path) -> None:
    """Run ``script`` in a child process on the compiled codec under ``PYTHONMALLOC=debug``
    and ``-X dev`` (writes past a block, use after free, a freed object read), with the
    package, tests/support and ``test_dir`` as its ``sys.argv[1:]``; it must print ``ok``."""
    root = Path(__file__).resolve().parents[2]
    paths = [str(root / "services"), str(root / "tests" / "support"), str(test_dir)]
    env = {k: v for k, v in os.environ.items() if k != PURE_PYTHON_ENV}
    env["PYTHONMALLOC"] = "debug"
    result = subprocess.run(
        [sys.executable, "-X", "dev", "-c", script, *paths],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "ok"
