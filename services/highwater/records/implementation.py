"""Which implementation of the codec's hot paths runs: the compiled twin or pure Python.

``highwater.records._codec`` (C against the CPython API, built from
``_codec.c`` by ``pip install``) stands in for the per-record and per-batch functions of
this package: :func:`~.batch.append_fields`, :func:`~.record.record_size`,
:func:`~.record.encode_records`, :func:`~.record.read_records` (and
:meth:`~.batch.RecordBatch.records`), :meth:`~.batch.RecordBatch.iter_keys`,
:func:`~.header.check_batch`, :func:`~.header.scan_batches`, the leader's append checks
(:data:`~.header.stamp_batches`), the log cleaner's per-batch loops
(:meth:`~.batch.RecordBatch.map_keys`, :meth:`~.batch.RecordBatch.filter_records`) and the
producer's ``murmur2``. The pure-Python functions
stay the reference: ``HIGHWATER_PURE_PYTHON=1`` in the environment selects them, and they
also run wherever the compiled code meets a record it does not take (anything unusual or
corrupt), so both give the same bytes, the same records and the same typed errors.

:data:`IMPLEMENTATION` says which is loaded (``"compiled"`` or ``"pure-python"``); it
falls back to pure Python when the extension was not built.
"""

from __future__ import annotations

import importlib
import os
from typing import Any, Final

__all__ = ["IMPLEMENTATION", "PURE_PYTHON_ENV", "codec"]

PURE_PYTHON_ENV: Final = "HIGHWATER_PURE_PYTHON"
"""The environment variable that selects the pure-Python paths when set (not to ``0``)."""

codec: Any = None
"""The compiled module, or None when the pure-Python paths serve."""
if os.environ.get(PURE_PYTHON_ENV, "") in ("", "0"):
    try:
        codec = importlib.import_module("highwater.records._codec")
    except ImportError:  # not built: the pure-Python paths serve
        codec = None

IMPLEMENTATION: Final = "compiled" if codec is not None else "pure-python"
