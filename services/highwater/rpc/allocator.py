"""The C allocator of a process that moves MiB-sized gRPC messages: glibc's ``malloc`` kept
from handing those buffers back to the kernel after each message.

A Fetch answer passes through several buffers of its own size on each side (on a broker:
the log's read, the answer message, its serialized bytes, gRPC's copy; on a consumer the
same in reverse), each a ``malloc`` of about 1 MiB freed soon after. glibc serves such
sizes with ``mmap`` until its threshold adapts, and gives the top of its heap back to
the kernel whenever more than ``M_TRIM_THRESHOLD`` of it is free: every answer then
faults fresh pages in and the kernel zeroes them (on a broker serving one consumer,
perf put page faults, page zeroing and unmapping at about a sixth of its CPU).
:func:`keep_large_buffers` raises both thresholds once at the start of a process, so
those buffers come from a heap that stays mapped: the memory a process holds after its
largest answers is kept for the next ones (up to ``TRIM_THRESHOLD_BYTES`` of free heap).

Elsewhere than glibc (musl, macOS) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
from typing import Final

__all__ = ["MMAP_THRESHOLD_BYTES", "TRIM_THRESHOLD_BYTES", "keep_large_buffers"]

log = logging.getLogger(__name__)

MMAP_THRESHOLD_BYTES: Final = 32 * 1024 * 1024
"""Allocations below this come from the heap, not a mapping of their own (glibc's largest
accepted value on 64-bit)."""
TRIM_THRESHOLD_BYTES: Final = 256 * 1024 * 1024
"""How much free memory at the heap's top is kept rather than given back."""

_M_TRIM_THRESHOLD: Final = -1  # glibc's malloc.h
_M_MMAP_THRESHOLD: Final = -3


def keep_large_buffers() -> bool:
    """Set glibc's mmap and trim thresholds for this process (see the module); False
    where the C library is not glibc or refused a setting."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
        libc.gnu_get_libc_version  # noqa: B018  (glibc only: AttributeError elsewhere)
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    done = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    )
    if not done:
        log.warning("malloc refused the mmap or trim threshold; left as they were")
    return done
