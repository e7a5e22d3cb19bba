"""``highwater broker --broker-heartbeat-interval-ms`` and ``broker.heartbeat.interval.ms``
(and a coordinator's ``coordinator.heartbeat.interval.ms``): a bad value stops the process
before it starts, naming the flag or the key."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from highwater.cli.main import main


def run_role(data_dir: Path, *args: str, role: str = "broker") -> tuple[int, str]:
    result = CliRunner().invoke(
        main,
        [
            role,
            "--node-id",
            "1",
            "--listen",
            "127.0.0.1:1",
            "--controllers",
            "127.0.0.1:2",
            "--data-dir",
            str(data_dir),
            *args,
        ],
    )
    return result.exit_code, result.output


@pytest.mark.parametrize("value", ["0", "-5", "often"])
def test_a_heartbeat_interval_that_is_not_a_positive_int_is_a_usage_error(
    tmp_path: Path, value: str
) -> None:
    code, output = run_role(tmp_path / "data", "--broker-heartbeat-interval-ms", value)
    assert code == 2
    assert "--broker-heartbeat-interval-ms" in output
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (
            ("--broker-heartbeat-interval-ms", "9000"),
            "broker.heartbeat.interval.ms (9000) must be less than "
            "broker.session.timeout.ms (9000)",
        ),
        (
            ("--override", "broker.heartbeat.interval.ms=3000", "--override",
             "broker.session.timeout.ms=2500"),
            "broker.heartbeat.interval.ms (3000) must be less than "
            "broker.session.timeout.ms (2500)",
        ),
        (
            ("--override", "broker.heartbeat.interval.ms=none"),
            "Invalid value 'none' for configuration broker.heartbeat.interval.ms: "
            "not an integer; allowed: an int, at least 1",
        ),
    ],
)  # fmt: skip
def test_a_heartbeat_interval_the_session_would_not_survive_stops_the_broker(
    tmp_path: Path, args: tuple[str, ...], named: str
) -> None:
    code, output = run_role(tmp_path / "data", *args)
    assert code == 1
    assert output.strip() == f"Error: {named}"
    assert not (tmp_path / "data").exists()


def test_a_coordinator_heartbeat_interval_its_lease_would_not_survive_stops_it(
    tmp_path: Path,
) -> None:
    code, output = run_role(
        tmp_path / "data",
        "--override",
        "coordinator.heartbeat.interval.ms=5000",
        "--override",
        "coordinator.session.timeout.ms=4000",
        role="coordinator",
    )
    assert code == 1
    assert output.strip() == (
        "Error: coordinator.heartbeat.interval.ms (5000) must be less than "
        "coordinator.session.timeout.ms (4000)"
    )
    assert not (tmp_path / "data").exists()
