"""Generate Python stubs for every .proto under protos/ into the source tree.

Usage: ``python protos/build_stubs.py`` (also run by setup.py's build_py, so a
``pip install`` generates them). Output lands beside the package path the proto
declares: protos/coinfer/v1/coinfer.proto -> coinfer/v1/coinfer_pb2{,_grpc}.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def generate(root: Path = ROOT) -> list[Path]:
    from grpc_tools import protoc

    include = Path(protoc.__file__).parent / "_proto"  # google/protobuf/*.proto
    protos = sorted((root / "protos").rglob("*.proto"))
    for proto in protos:
        rc = protoc.main(
            [
                "protoc",
                f"-I{root / 'protos'}",
                f"-I{include}",
                f"--python_out={root}",
                f"--grpc_python_out={root}",
                f"--pyi_out={root}",
                str(proto),
            ]
        )
        if rc != 0:
            raise RuntimeError(f"protoc failed on {proto} (exit {rc})")
    return protos


if __name__ == "__main__":
    done = generate()
    print(f"generated stubs for {len(done)} proto file(s)")
    sys.exit(0)
