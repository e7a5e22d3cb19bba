"""``highwater quorum describe`` option checks that need no controller."""

from __future__ import annotations

from click.testing import CliRunner
from highwater.cli.main import main


def test_status_and_replication_exclude_each_other() -> None:
    # Port 1 is closed: a command that got as far as connecting would fail differently.
    result = CliRunner().invoke(
        main, ["quorum", "describe", "--controllers", "127.0.0.1:1", "--status", "--replication"]
    )
    assert result.exit_code == 2, result.output
    assert (
        "Only one of --status or --replication should be specified with describe sub-command"
        in result.output
    )
    result = CliRunner().invoke(main, ["quorum", "describe", "--controllers", "127.0.0.1:1"])
    assert result.exit_code == 2 and "give one of --status or --replication" in result.output
