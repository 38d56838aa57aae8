"""Edge daemon configuration: one documented dataclass, read by ``coinfer.serving.settings`` (the cloud's
too) from a TOML file, then environment variables (``COINFER_EDGE_<FIELD>``), then command-line flags
(``--http-port``), each overriding the one before. Defaults run on a CPU box with the cloud on localhost."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from coinfer.edge.kinds import RequestedPlan
from coinfer.edge.planner.estimates import TAU_S
from coinfer.edge.sampling import DEFAULT_MAX_DRAFTS, DEFAULT_MAX_NEW_TOKENS
from coinfer.edge.targets import parse_targets
from coinfer.serving.bounds import bounded, check_bounds
from coinfer.validate import MAX_DEADLINE_MS, MAX_NEW_TOKENS

ENV_PREFIX = "COINFER_EDGE_"


@dataclass(kw_only=True)
class EdgeConfig:
    model: str = ""
    """Draft model directory from the quantize CLI (manifest verified at load)."""
    allow_unverified: bool = False
    """Load a model without (or failing) its manifest."""
    providers: str = ""
    """Comma-separated ONNX Runtime providers; empty = CUDA when present, else CPU."""
    threads: int = bounded(0, ge=0)
    """ORT intra-op threads; 0 = all cores."""
    worker_nice: int = bounded(5, ge=0, le=19)
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
    grpc_port: int = bounded(50061, ge=-1, le=65535)
    """EdgeService port; 0 = any free one; -1 = off."""
    http_host: str = "127.0.0.1"
    http_port: int = bounded(8000, ge=-1, le=65535)
    """OpenAI-compatible HTTP API (+ /metrics, /healthz); 0 = any free one; -1 = off."""
    http_header_timeout_s: float = bounded(10.0, gt=0, le=3600)
    """A connection must send a complete request head within this of connecting (or of its last response)."""
    http_body_timeout_s: float = bounded(30.0, gt=0, le=3600)
    """A request body must arrive within this, else 408."""
    http_max_connections: int = bounded(0, ge=0)
    """Open HTTP connections at most (more: 503 and closed); 0 = half the descriptor limit, at most 4096."""
    plan: RequestedPlan = RequestedPlan.AUTO
    """The plan of a request that asks for ``auto``: ``auto`` lets the planner choose."""
    deadline_ms: int = bounded(30_000, ge=100, le=MAX_DEADLINE_MS)
    """Default whole-request deadline."""
    max_prompt_chars: int = bounded(2048, ge=1)
    max_drafts: int = bounded(DEFAULT_MAX_DRAFTS, ge=1)
    max_new_tokens: int = bounded(DEFAULT_MAX_NEW_TOKENS, ge=1, le=MAX_NEW_TOKENS)
    replays: int = bounded(2, ge=0, le=5)
    """A cloud session that fails before its summary (replica killed, draining, full) is replayed on
    another replica with the drafts already written, at most this many times, within the deadline."""
    breaker_failures: int = bounded(3, ge=1)
    breaker_reset_s: float = bounded(10.0, gt=0)
    model_name: str = "coinfer-edge"
    """The model id the OpenAI API lists and accepts."""
    planner_state: str = ""
    """JSON file where the planner's calibration persists; empty = in memory only."""
    quality_floor: float = bounded(0.0, ge=0, le=1)
    """Plan "auto": the fastest plan whose quality (rule-valid answers, drawn from its estimate) reaches this."""
    planner_tau_s: float = bounded(TAU_S, gt=0, le=86_400)
    """Plan "auto": seconds in which a measurement's weight in the planner's estimates falls to 1/e
    (``coinfer.estimator``). Shorter re-explores a plan measured under a burst sooner; longer explores less
    on an edge that serves a request now and then (docs/planner.md, constants)."""
    probe_on_start: bool = True
    """Calibrate at start (disk, PCIe, decode steps, network, cloud queue)."""
    reprobe_s: float = bounded(300.0, gt=0)
    """Network / cloud estimates older than this are re-probed (in the background)."""

    @property
    def provider_list(self) -> list[str]:
        """``providers`` as a list; empty = the engine's default (CUDA when present, else CPU)."""
        return [p for p in self.providers.split(",") if p]

    def validate(self) -> None:
        """Every field's declared ``Bound``, then the rules between fields. ValueError naming the setting."""
        if not self.model:
            raise ValueError("model: a draft model directory is required")
        plans = tuple(RequestedPlan)
        if self.plan not in plans:
            raise ValueError(f"plan: must be one of {', '.join(plans)}, got {self.plan!r}")
        self.plan = RequestedPlan(self.plan)
        check_bounds(self)
        if self.cloud:
            parse_targets(self.cloud)  # a bad target fails at start, naming the field
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
