"""Regenerate the Python stubs of protos/headstart/v1/*.proto (the one way to do it).

    .venv/bin/python scripts/gen_protos.py          # write shared/headstart/v1/
    .venv/bin/python scripts/gen_protos.py --out D  # write D/headstart/v1/ (the stale test)

The generator is pinned: stubs from another grpcio-tools differ in their
version guard, so this script refuses to run with any other version.
"""

from __future__ import annotations

import argparse
import sys
from importlib.metadata import version
from pathlib import Path

GRPCIO_TOOLS_VERSION = "1.85.1"
ROOT = Path(__file__).resolve().parents[1]
PROTO_ROOT = ROOT / "protos"
DEFAULT_OUT = ROOT / "shared"
PACKAGE = Path("headstart") / "v1"
INIT = '"""Generated gRPC stubs of protos/headstart/v1 (scripts/gen_protos.py; do not edit)."""\n'


class ProtoGenError(RuntimeError):
    """Wrong grpcio-tools version or a protoc failure."""


def generate(out_root: Path = DEFAULT_OUT) -> list[Path]:
    """Run protoc on every .proto of the package into `out_root`; returns the files written."""
    installed = version("grpcio-tools")
    if installed != GRPCIO_TOOLS_VERSION:
        raise ProtoGenError(f"grpcio-tools {installed} installed; the stubs are pinned to {GRPCIO_TOOLS_VERSION}")
    from grpc_tools import protoc

    protos = sorted((PROTO_ROOT / PACKAGE).glob("*.proto"))
    include = Path(protoc.__file__).parent / "_proto"
    args = [
        "grpc_tools.protoc", f"-I{PROTO_ROOT}", f"-I{include}",
        f"--python_out={out_root}", f"--pyi_out={out_root}", f"--grpc_python_out={out_root}",
        *[str(p.relative_to(PROTO_ROOT)) for p in protos],
    ]
    (out_root / PACKAGE).mkdir(parents=True, exist_ok=True)
    if protoc.main(args) != 0:
        raise ProtoGenError(f"protoc failed: {' '.join(args)}")
    (out_root / PACKAGE / "__init__.py").write_text(INIT)
    return sorted(p for p in (out_root / PACKAGE).iterdir() if p.is_file())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ns = parser.parse_args(argv)
    for path in generate(ns.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
