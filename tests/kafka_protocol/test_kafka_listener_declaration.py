"""A Kafka listener whose security protocol cannot work with the process's settings stops
the role at start with one line saying what is missing, before anything is bound or
written: SSL and SASL_SSL need the --tls-* files, SASL_* need --sasl-enabled-mechanisms,
and an unknown protocol is a bad --kafka-listen."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from highwater.cli.main import main


@pytest.mark.parametrize(
    ("listener", "missing"),
    [
        ("SSL://127.0.0.1:3", "needs --tls-cert-file and --tls-key-file"),
        ("SASL_PLAINTEXT://127.0.0.1:3", "needs --sasl-enabled-mechanisms"),
        ("TLS://127.0.0.1:3", "'TLS' is not a security protocol"),
    ],
)
def test_a_kafka_listener_that_cannot_work_is_refused_at_start(
    tmp_path: Path, listener: str, missing: str
) -> None:
    data_dir = tmp_path / "data"
    result = CliRunner().invoke(
        main,
        [
            *("server", "--listen", "127.0.0.1:1", "--data-dir", str(data_dir)),
            *("--kafka-listen", listener, "--super-users", "User:admin"),
        ],
    )
    assert result.exit_code == 2, result.output
    assert missing in result.output
    assert not data_dir.exists()
