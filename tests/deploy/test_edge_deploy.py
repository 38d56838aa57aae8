"""deploy/edge: the systemd unit's and the Dockerfile's daemon arguments parse with the daemon's own
parser, the sample config loads, and the image's extra exists."""

from __future__ import annotations

import json
import shlex
import tomllib
from pathlib import Path

from coinfer.edge.config import EdgeConfig
from coinfer.edge.daemon import build_parser

ROOT = Path(__file__).resolve().parents[2]
EDGE = ROOT / "deploy/edge"


def test_systemd_unit_runs_the_daemon_with_valid_flags():
    lines = (EDGE / "coinfer-edge.service").read_text().splitlines()
    sections = {x.strip("[]") for x in lines if x.startswith("[")}
    assert {"Unit", "Service", "Install"} <= sections
    exec_start = shlex.split(next(x for x in lines if x.startswith("ExecStart=")).split("=", 1)[1])
    assert exec_start[1:3] == ["-m", "coinfer.edge.daemon"]
    args = build_parser().parse_args(exec_start[3:])
    assert args.config == Path("/etc/coinfer/edge.toml") and args.token_file


def test_sample_config_loads_and_the_dockerfile_entrypoint_parses():
    cfg = EdgeConfig.load(EDGE / "edge.toml", env={})
    assert cfg.cloud and cfg.tls_ca and cfg.plan == "auto"
    text = (EDGE / "Dockerfile").read_text()
    entry = json.loads(next(x for x in text.splitlines() if x.startswith("ENTRYPOINT")).split(" ", 1)[1])
    assert entry[1:3] == ["-m", "coinfer.edge.daemon"]
    build_parser().parse_args(entry[3:])
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert "edge-cpu" in extras and "edge-gpu" in extras and "ARG EXTRA=edge-cpu" in text
    assert not any(d.startswith("onnxruntime-gpu") for d in extras["edge-cpu"])
    for src in ("protos", "coinfer", "edge"):
        assert f"COPY {src} " in text
