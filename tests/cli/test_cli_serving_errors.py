"""Server commands that cannot start say why in one ``Error:`` line, without a traceback:
a broker or coordinator given a controller voter's node id, a log directory named twice."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from embedded_servers import ServerThread, free_port
from highwater.cli.main import main
from highwater.embedded import EMBEDDED_NODE_ID

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    """An embedded server: its controller is voter ``EMBEDDED_NODE_ID``."""
    thread = ServerThread(tmp_path_factory.mktemp("serving-errors"))
    thread.start()
    try:
        yield thread
    finally:
        thread.stop()


def one_error(result: Result) -> str:
    """The one ``Error:`` line of a command that failed cleanly with exit code 1."""
    assert result.exit_code == 1, (result.output, result.exception)
    assert isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1, result.output
    return errors[0]


@pytest.mark.parametrize("role", ["broker", "coordinator"])
def test_an_observer_with_a_voters_node_id_is_refused(
    server: ServerThread, tmp_path: Path, role: str
) -> None:
    result = CliRunner().invoke(
        main,
        [
            role,
            "--node-id",
            str(EMBEDDED_NODE_ID),
            "--listen",
            f"127.0.0.1:{free_port()}",
            "--controllers",
            server.address,
            "--data-dir",
            str(tmp_path),
        ],
    )
    message = one_error(result)
    assert f"the node id {EMBEDDED_NODE_ID} must not be included in the set of voters" in message


def test_server_log_dirs_naming_one_directory_twice(tmp_path: Path) -> None:
    base = ["server", "--listen", f"127.0.0.1:{free_port()}", "--data-dir", str(tmp_path)]
    twice = f"{tmp_path}/logs,{tmp_path}/./logs/"
    result = CliRunner().invoke(main, [*base, "--log-dirs", twice])
    assert result.exit_code == 2, (result.output, result.exception)
    assert "Traceback" not in result.output
    assert f"are the same directory ({tmp_path}/logs)" in result.output
    # The same in the log.dirs key, which the broker's log manager refuses.
    message = one_error(CliRunner().invoke(main, [*base, "--override", f"log.dirs={twice}"]))
    assert "listed twice in log.dirs" in message
