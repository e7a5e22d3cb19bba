"""keep_large_buffers: MiB-sized buffers, several alive at once as a Fetch answer's are,
come back without page faults once it has run (glibc)."""

from __future__ import annotations

import ctypes.util
import subprocess
import sys
from pathlib import Path

import pytest

_SERVICES = Path(__file__).resolve().parents[2] / "services"

_ROUNDS = """
import resource, sys
sys.path.insert(0, {services!r})
from highwater.rpc.allocator import keep_large_buffers
if {keep}:
    assert keep_large_buffers()

def page_faults(rounds):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(rounds):
        held = [b"\\x01" * (1 << 20) for _ in range(4)]  # four answers' buffers at once
        del held
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

page_faults(2)
print(page_faults(20))
"""


def _page_faults(keep: bool) -> int:
    code = _ROUNDS.format(services=str(_SERVICES), keep=keep)
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    return int(done.stdout)


@pytest.mark.skipif(
    sys.platform != "linux" or ctypes.util.find_library("c") is None, reason="glibc's malloc"
)
def test_large_buffers_are_reused_without_page_faults() -> None:
    """Without it glibc gives the freed MiBs back to the kernel each round (about 256
    faults per MiB after); with it they stay mapped for the next round."""
    plain, kept = _page_faults(keep=False), _page_faults(keep=True)
    assert plain > 20 * 4 * 100  # the rounds fault their pages in again
    assert kept < plain // 20
