"""The data-directory lock: one process at a time, released on close or when the holder dies."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from highwater.errors import KafkaStorageError
from highwater.storage.data_dir_lock import LOCK_FILE, DataDirLock

_HOLD = """
import sys
from pathlib import Path
from highwater.storage.data_dir_lock import DataDirLock
DataDirLock(Path(sys.argv[1])).acquire()
print("held", flush=True)
sys.stdin.readline()
"""


def test_a_second_holder_is_refused_until_the_first_releases(tmp_path: Path) -> None:
    first, second = DataDirLock(tmp_path), DataDirLock(tmp_path)
    first.acquire()
    assert first.held and (tmp_path / LOCK_FILE).exists()
    with pytest.raises(KafkaStorageError, match="in use by another process"):
        second.acquire()
    assert not second.held
    first.release()
    first.release()  # a second release does nothing
    second.acquire()
    assert second.held
    second.release()


def test_the_lock_of_a_process_that_ended_is_free(tmp_path: Path) -> None:
    with subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as holder:
        try:
            assert holder.stdout is not None and holder.stdout.readline() == "held\n"
            with pytest.raises(KafkaStorageError):
                DataDirLock(tmp_path).acquire()
        finally:
            holder.kill()
    lock = DataDirLock(tmp_path)
    lock.acquire()
    lock.release()
