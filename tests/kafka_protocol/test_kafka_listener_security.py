"""The Kafka listener authenticates no one yet, so it cannot run where the ACL checks are
on: ``--kafka-listen`` with ``--super-users`` (or ``--authorizer acl``) stops the role at
start with one line saying why, before anything is bound or written."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from highwater.cli.main import main


@pytest.mark.parametrize(
    "role",
    [
        ["server", "--listen", "127.0.0.1:1"],
        ["broker", "--node-id", "1", "--listen", "127.0.0.1:1", "--controllers", "127.0.0.1:2"],
    ],
)
@pytest.mark.parametrize("checks", [["--super-users", "User:admin"], ["--authorizer", "acl"]])
def test_the_kafka_listener_is_refused_beside_the_acl_checks(
    tmp_path: Path, role: list[str], checks: list[str]
) -> None:
    data_dir = tmp_path / "data"
    result = CliRunner().invoke(
        main,
        [*role, "--data-dir", str(data_dir), "--kafka-listen", "127.0.0.1:3", *checks],
    )
    assert result.exit_code == 2, result.output
    assert "--kafka-listen cannot be used with the ACL authorizer on" in result.output
    assert not data_dir.exists()
