"""``initial.broker.registration.timeout.ms``: a broker or coordinator whose controllers never
answer gives up starting after that long, with an error naming the key, not after the
controller client's own call timeout; a bad value stops it before it starts."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from highwater.rpc.endpoints import free_loopback_ports

pytestmark = pytest.mark.timeout(90)


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "highwater", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("role", ["broker", "coordinator"])
def test_a_start_whose_controllers_never_answer_gives_up_after_the_timeout(
    tmp_path: Path, role: str
) -> None:
    listen, nothing = free_loopback_ports(2)
    began = time.monotonic()
    done = run(
        role, "--node-id", "7",
        "--listen", f"127.0.0.1:{listen}", "--controllers", f"127.0.0.1:{nothing}",
        "--data-dir", str(tmp_path / "data"),
        "--override", "initial.broker.registration.timeout.ms=2000",
    )  # fmt: skip
    took = time.monotonic() - began
    assert done.returncode != 0, done.stdout + done.stderr
    assert "initial.broker.registration.timeout.ms" in done.stderr, done.stderr
    assert "could not register with the controllers in 2000 ms" in done.stderr, done.stderr
    # The controller client alone would have tried for 30 s.
    assert took < 20, took


def test_a_bad_registration_timeout_stops_the_broker_naming_the_key(tmp_path: Path) -> None:
    done = run(
        "broker", "--node-id", "7", "--listen", "127.0.0.1:1", "--controllers", "127.0.0.1:2",
        "--data-dir", str(tmp_path / "data"),
        "--override", "initial.broker.registration.timeout.ms=0",
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert "initial.broker.registration.timeout.ms" in done.stderr, done.stderr
    assert not (tmp_path / "data").exists()
