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

import pytest
from highwater.records.implementation import PURE_PYTHON_ENV, codec

__all__ = ["PURE_PYTHON_RUN", "compiled_only"]

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
