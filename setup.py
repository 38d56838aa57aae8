"""Generate the coinfer.v1 protobuf stubs at build/install time (never committed), and map the
top-level folders under the one ``coinfer`` namespace."""

from __future__ import annotations

import sys
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

sys.path.insert(0, str(Path(__file__).resolve().parent / "protos"))
from build_stubs import generate  # noqa: E402


class BuildWithStubs(build_py):
    def run(self) -> None:
        generate()
        super().run()


# The folders stay at the top of the repository (one per deployable); installed, they are coinfer.edge
# and so on, so no module named ``edge`` or ``demo`` collides with another project's. A folder absent
# from the build context (the edge image copies coinfer/ and edge/ only) is left out.
ROOT = Path(__file__).resolve().parent
FOLDERS = {
    "coinfer": "coinfer",
    "coinfer.edge": "edge",
    "coinfer.cloud": "cloud",
    "coinfer.quantize": "quantize",
    "coinfer.demo": "demo",
}
PACKAGE_DIR = {ns: d for ns, d in FOLDERS.items() if (ROOT / d / "__init__.py").is_file()}
PACKAGES = [p for ns, d in PACKAGE_DIR.items() for p in [ns, *(f"{ns}.{sub}" for sub in find_packages(str(ROOT / d)))]]

setup(cmdclass={"build_py": BuildWithStubs}, package_dir=PACKAGE_DIR, packages=PACKAGES)
