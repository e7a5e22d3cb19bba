"""The ``highwater`` command imports a subcommand's module only when that command runs: an
operator tool does not load the broker, the controller or Kafka's protocol codec, and help
still lists every command. A command on the admin client does not load what only some
commands use: the Controller API's messages and codec, the metadata image, the SCRAM and
JWT libraries."""

from __future__ import annotations

import subprocess
import sys

from click.testing import CliRunner
from highwater.cli.main import COMMANDS, main

PROBE = """
import sys
from highwater.cli.main import main
try:
    main(["topics", "--help"], prog_name="highwater")
except SystemExit as e:
    assert e.code == 0, e.code
loaded = [m for m in ("highwater.broker.service", "highwater.controller.service",
                      "highwater.coordinator.service", "kafka",
                      "highwater.controller_api.messages", "highwater.metadata", "scramp",
                      "jwt") if m in sys.modules]
assert "highwater.client.admin" in sys.modules
print("loaded:", ",".join(loaded))
"""


def test_a_tool_command_loads_no_server_role() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "loaded: ", done.stdout


def test_help_lists_every_command() -> None:
    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0, result.output
    listed = result.output.split("Commands:", 1)[1]
    names = {line.split()[0] for line in listed.splitlines() if line.strip()}
    assert names == set(COMMANDS)
