"""The deployables are console scripts of the installed distribution, each pointing at a real entry."""

import importlib
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_deployable_has_a_console_script_that_resolves():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert {"coinfer-edge", "coinfer-cloud", "coinfer-quantize"} <= set(scripts)
    for name, target in scripts.items():
        module, _, func = target.partition(":")
        assert callable(getattr(importlib.import_module(module), func)), name


def test_the_distribution_installs_one_top_level_package(tmp_path):
    """edge/, cloud/, quantize/ and demo/ install as coinfer.edge, ...: no generic top-level module
    (``edge``, ``demo``) to collide with another project's in site-packages."""
    import subprocess
    import sys
    import zipfile

    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("coinfer-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"coinfer", wheel.name.split("-py3")[0] + ".dist-info"}
    for module in (
        "edge/daemon.py",
        "cloud/server.py",
        "quantize/cli.py",
        "demo/run.py",
        "v1/coinfer_pb2.py",
        "quantize/data/generic_prompts.jsonl",
    ):
        assert f"coinfer/{module}" in names, module
