"""The code's shape, as a reader meets it: no function of the installed packages runs past 60 lines after the
formatter (issue 51: ten did; each split where it holds more than one step)."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("cloud", "edge", "coinfer", "quantize", "demo")
MAX_LINES = 60


def _long_functions() -> list[str]:
    found = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if "v1" in path.relative_to(ROOT).parts:  # generated protobuf stubs
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    lines = node.end_lineno - node.lineno + 1
                    if lines > MAX_LINES:
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_function_of_the_packages_runs_past_60_lines():
    assert _long_functions() == []


def test_the_check_finds_a_long_function(tmp_path, monkeypatch):
    """The check reads real files: a 61-line function in one of the packages is found."""
    import tests.test_layout as layout

    pkg = tmp_path / "cloud"
    pkg.mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(60))
    (pkg / "long.py").write_text(f"def long():\n{body}\n")
    monkeypatch.setattr(layout, "ROOT", tmp_path)
    monkeypatch.setattr(layout, "PACKAGES", ("cloud",))
    assert layout._long_functions() == ["cloud/long.py:1 long (61 lines)"]
