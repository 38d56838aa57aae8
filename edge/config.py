"""Edge daemon configuration: one documented dataclass, read by ``coinfer.serving.settings`` (the cloud's
too) from a TOML file, then environment variables (``COINFER_EDGE_<FIELD>``), then command-line flags
(``--http-port``), each overriding the one before. Defaults run on a CPU box with the cloud on localhost."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from coinfer.edge.targets import parse_targets
from coinfer.types import PLAN_CHOICES as PLANS  # one definition, in the shared package

ENV_PREFIX = "COINFER_EDGE_"


@dataclass
class EdgeConfig:
    model: str = ""
    """Draft model directory from the quantize CLI (manifest verified at load)."""
    allow_unverified: bool = False
    """Load a model without (or failing) its manifest."""
    providers: str = ""
    """Comma-separated ONNX Runtime providers; empty = CUDA when present, else CPU."""
    threads: int = 0
    """ORT intra-op threads; 0 = all cores."""
    worker_nice: int = 5
    """How far below the serving event loop drafting and checks run (nice values, 0..19; 0 = the same).
    On a CPU box the drafting threads otherwise take every core from the loop (/healthz waited 95 ms)."""
    warm: bool = True
    """Pre-warm at start (session + one token); False = lazy, loaded on the first request."""
    cloud: str = ""
    """Cloud replicas: ``host:port`` (a DNS name resolving to every replica, e.g. a headless Service),
    ``dns:///host:port``, or a list ``IP:port,IP:port``; gRPC balances sessions over the serving ones
    (``edge/link.py``). Empty = no cloud (every request is edge-only)."""
    token: str = field(default="", metadata={"cli": False})
    """Bearer token of this edge at the cloud. A secret: ``--token-file``, the TOML file or
    ``COINFER_EDGE_TOKEN``, never a flag (a process list shows flags)."""
    tls_ca: str = ""
    """PEM CA of the cloud's certificate: TLS when set."""
    tls_cert: str = ""
    tls_key: str = ""
    tls_server_name: str = ""
    grpc_host: str = "127.0.0.1"
    grpc_port: int = 50061
    """EdgeService port; 0 = any free one; -1 = off."""
    http_host: str = "127.0.0.1"
    http_port: int = 8000
    """OpenAI-compatible HTTP API (+ /metrics, /healthz); 0 = any free one; -1 = off."""
    http_header_timeout_s: float = 10.0
    """A connection must send a complete request head within this of connecting (or of its last response)."""
    http_body_timeout_s: float = 30.0
    """A request body must arrive within this, else 408."""
    http_max_connections: int = 0
    """Open HTTP connections at most (more: 503 and closed); 0 = half the descriptor limit, at most 4096."""
    plan: str = "auto"
    deadline_ms: int = 30_000
    """Default whole-request deadline."""
    max_prompt_chars: int = 2048
    max_drafts: int = 16
    max_new_tokens: int = 1024
    replays: int = 2
    """A cloud session that fails before its summary (replica killed, draining, full) is replayed on
    another replica with the drafts already written, at most this many times, within the deadline."""
    breaker_failures: int = 3
    breaker_reset_s: float = 10.0
    model_name: str = "coinfer-edge"
    """The model id the OpenAI API lists and accepts."""
    planner_state: str = ""
    """JSON file where the planner's calibration persists; empty = in memory only."""
    quality_floor: float = 0.0
    """Plan "auto": the fastest plan whose expected quality (rule-valid answers) reaches this."""
    cloud_thrift: float = 0.25
    """Plan "auto": of the plans predicted within this fraction of the fastest, the one that holds the
    cloud least (the cloud is shared: its busy time is every other user's queue). 0 = the fastest."""
    probe_on_start: bool = True
    """Calibrate at start (disk, PCIe, decode steps, network, cloud queue)."""
    reprobe_s: float = 300.0
    """Network / cloud estimates older than this are re-probed (in the background)."""

    @property
    def provider_list(self) -> list[str]:
        """``providers`` as a list; empty = the engine's default (CUDA when present, else CPU)."""
        return [p for p in self.providers.split(",") if p]

    def validate(self) -> None:
        if not self.model:
            raise ValueError("model: a draft model directory is required")
        if self.plan not in PLANS:
            raise ValueError(f"plan: must be one of {', '.join(PLANS)}, got {self.plan!r}")
        for name in ("grpc_port", "http_port"):
            if not -1 <= getattr(self, name) <= 65535:
                raise ValueError(f"{name}: must be -1..65535, got {getattr(self, name)}")
        if not 100 <= self.deadline_ms <= 600_000:
            raise ValueError(f"deadline_ms: must be in 100..600000, got {self.deadline_ms}")
        for name in ("http_header_timeout_s", "http_body_timeout_s"):
            if not 0 < getattr(self, name) <= 3600:
                raise ValueError(f"{name}: must be in (0, 3600], got {getattr(self, name)}")
        if not 0 <= self.worker_nice <= 19:
            raise ValueError(f"worker_nice: must be in 0..19, got {self.worker_nice}")
        if self.http_max_connections < 0:
            raise ValueError(f"http_max_connections: must be >= 0, got {self.http_max_connections}")
        if not 0.0 <= self.cloud_thrift <= 1.0:
            raise ValueError(f"cloud_thrift: must be in 0..1, got {self.cloud_thrift}")
        if not 0 <= self.replays <= 5:
            raise ValueError(f"replays: must be in 0..5, got {self.replays}")
        if self.cloud:
            parse_targets(self.cloud)  # a bad target fails at start, naming the field
        if self.breaker_failures < 1 or self.breaker_reset_s <= 0:
            raise ValueError("breaker_failures >= 1 and breaker_reset_s > 0 required")
        if self.token and not self.cloud:
            raise ValueError("token: given without a cloud target")

    @classmethod
    def load(
        cls,
        path: Path | None = None,
        env: Mapping[str, str] | None = None,
        cli: Any = None,
        args: Any = None,
        **overrides: Any,
    ) -> EdgeConfig:
        """TOML file ``path`` (an ``[edge]`` table) < the environment (``COINFER_EDGE_<FIELD>``; ``env``,
        else ``os.environ``) < flags (``cli`` over the parsed ``args``: ``coinfer.serving.settings.add_flags``)
        < ``overrides``; then ``validate``. ValueError naming the setting and where it came from."""
        from coinfer.serving import settings

        cfg = settings.load(cls, ENV_PREFIX, "edge", path, env, cli, args, **overrides)
        cfg.validate()
        return cfg
