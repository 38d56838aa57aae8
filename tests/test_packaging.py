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
