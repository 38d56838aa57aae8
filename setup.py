"""Generate the coinfer.v1 protobuf stubs at build/install time (never committed)."""

from __future__ import annotations

import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

sys.path.insert(0, str(Path(__file__).resolve().parent / "protos"))
from build_stubs import generate  # noqa: E402


class BuildWithStubs(build_py):
    def run(self) -> None:
        generate()
        super().run()


setup(cmdclass={"build_py": BuildWithStubs})
