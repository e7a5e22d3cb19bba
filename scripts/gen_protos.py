"""Generates the Python stubs of protos/ into services/ (highwater/v1, the client-facing API,
and highwater/internal/v1, the services' own), or checks them."""

from __future__ import annotations

import argparse
import filecmp
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "protos"
OUT_ROOT = ROOT / "services"
PACKAGE_DIRS = {
    Path("highwater") / "v1": "the client-facing API, highwater.v1",
    Path("highwater") / "internal" / "v1": "the services' own API, highwater.internal.v1",
}
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")


def _generate(out_root: Path) -> None:
    protos = sorted(
        str(p.relative_to(PROTO_ROOT))
        for package in PACKAGE_DIRS
        for p in (PROTO_ROOT / package).glob("*.proto")
    )
    if not protos:
        sys.exit("no .proto files under protos/highwater")
    bin_dir = Path(sys.executable).parent
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    cmd = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"--python_out={out_root}",
        f"--grpc_python_out={out_root}",
        f"--mypy_out={out_root}",
        f"--mypy_grpc_out={out_root}",
        *protos,
    ]
    subprocess.run(cmd, check=True, cwd=ROOT, env=env)
    for package, what in PACKAGE_DIRS.items():
        (out_root / package / "__init__.py").write_text(
            f'"""Generated protobuf and gRPC stubs of {what}."""\n'
        )
    internal = out_root / "highwater" / "internal" / "__init__.py"
    internal.write_text('"""Generated code of the protos the services speak among themselves."""\n')


def _generated_files(directory: Path) -> set[str]:
    return {p.name for p in directory.glob("*") if p.name.endswith(GENERATED_SUFFIXES)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--check", action="store_true", help="fail if the committed stubs are stale"
    )
    args = parser.parse_args()
    if not args.check:
        for package in PACKAGE_DIRS:
            target = OUT_ROOT / package
            for name in _generated_files(target) if target.exists() else ():
                (target / name).unlink()
        _generate(OUT_ROOT)
        for package in PACKAGE_DIRS:
            target = OUT_ROOT / package
            print(f"generated {len(_generated_files(target))} files in {target.relative_to(ROOT)}")
        return 0
    stale: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        _generate(Path(tmp))
        for package in PACKAGE_DIRS:
            fresh_dir, target = Path(tmp) / package, OUT_ROOT / package
            fresh, committed = _generated_files(fresh_dir), _generated_files(target)
            stale += sorted(str(package / n) for n in fresh ^ committed)
            stale += sorted(
                str(package / n)
                for n in fresh & committed
                if not filecmp.cmp(fresh_dir / n, target / n, shallow=False)
            )
    if stale:
        print("stale generated protobuf code (run `make protos`): " + ", ".join(stale))
        return 1
    print("generated protobuf code is fresh")
    return 0


if __name__ == "__main__":
    sys.exit(main())
