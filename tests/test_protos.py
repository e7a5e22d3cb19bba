"""The wire contract's own checks: ``buf lint`` and ``buf breaking`` over protos/ (buf.yaml).

Breaking changes are looked for twice, both against the rules of buf.yaml (WIRE_JSON: no
field number, type, JSON name or enum value of any message may change):

- against ``protos/baseline.binpb``, an image of the protos committed with the tree, so a
  clean (shallow) clone in CI checks something; it is refreshed (``make protos-baseline``)
  only in a commit that breaks the contract on purpose, where review sees it change;
- against the protos of the previous commit (``HEAD~1``, taken out with ``git archive``),
  when the clone has it, unless the current commit refreshed the baseline (a break on
  purpose).

buf comes from npm (``@bufbuild/buf``, tools/buf; ``make buf-deps``).
"""

from __future__ import annotations

import subprocess
import tarfile
from io import BytesIO
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BUF = ROOT / "tools" / "buf" / "node_modules" / ".bin" / "buf"
BASELINE = ROOT / "protos" / "baseline.binpb"

pytestmark = pytest.mark.timeout(120)


def buf(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    assert BUF.exists(), "make buf-deps installs buf from npm"
    return subprocess.run([str(BUF), *args], cwd=cwd, capture_output=True, text=True, timeout=100)


def git(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, timeout=30)


def test_the_protos_pass_buf_lint() -> None:
    result = buf("lint")
    assert result.returncode == 0, result.stdout + result.stderr


def test_no_breaking_change_since_the_committed_baseline() -> None:
    result = buf("breaking", "--against", str(BASELINE))
    assert result.returncode == 0, result.stdout + result.stderr


def test_no_breaking_change_since_the_previous_commit(tmp_path: Path) -> None:
    if git("rev-parse", "--verify", "--quiet", "HEAD~1").returncode != 0:
        pytest.skip("the clone has no previous commit (shallow); the baseline check stands")
    changed = git("diff", "--name-only", "HEAD~1", "HEAD", "--", str(BASELINE)).stdout
    if changed.strip():
        pytest.skip("this commit refreshed the baseline: a break on purpose")
    archive = git("archive", "HEAD~1", "protos")
    assert archive.returncode == 0, archive.stderr
    with tarfile.open(fileobj=BytesIO(archive.stdout)) as tar:
        tar.extractall(tmp_path, filter="data")
    image = tmp_path / "previous.binpb"
    built = buf("build", str(tmp_path / "protos"), "-o", str(image))
    assert built.returncode == 0, built.stdout + built.stderr
    result = buf("breaking", "--against", str(image))
    assert result.returncode == 0, result.stdout + result.stderr
