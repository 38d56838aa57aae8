"""The edge daemon: EdgeService (gRPC) + the OpenAI-compatible HTTP API over one EdgeCore.

Usage::

    coinfer-edge INT8_DIR --cloud cloud.example:50051 --token-file /etc/coinfer/token   # or --model INT8_DIR
    python -m coinfer.edge.daemon --config /etc/coinfer/edge.toml      # [edge] table; COINFER_EDGE_* env overrides

Prints ``GRPC <port>`` and ``HTTP <port>`` once serving (ports may be 0 = any free one).
SIGTERM / SIGINT: stop taking requests, finish in-flight ones, exit.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from coinfer.edge import http_guard
from coinfer.edge.config import ENV_PREFIX, EdgeConfig
from coinfer.edge.service import EdgeCore
from coinfer.edge.servicer import EdgeServicer
from coinfer.manifest import ManifestError
from coinfer.serving import logs, process, settings
from coinfer.serving.decode_guard import DecodeGuard
from coinfer.serving.loopwatch import LoopWatch, lag_histogram
from coinfer.v1 import edge_pb2, edge_pb2_grpc

log = logging.getLogger(__name__)
SERVICE = edge_pb2.DESCRIPTOR.services_by_name["CoinferEdge"].full_name


class EdgeDaemon:
    """Started front ends: ``grpc_port``, ``http_port``; ``stop()`` shuts both down."""

    def __init__(self, cfg: EdgeConfig) -> None:
        self.cfg = cfg
        self.core = EdgeCore(cfg)
        self.grpc_server: grpc.aio.Server | None = None
        self.http_server = None
        self._http_task: asyncio.Task | None = None
        self.grpc_port = self.http_port = -1
        self.loopwatch: LoopWatch | None = None

    async def start(self, freeze_heap: bool = False) -> EdgeDaemon:
        """Load (per the config), open the front ends, then watch the loop as a serving one. ``freeze_heap``:
        move the objects alive once both are up out of the garbage collector's walks (``process.freeze_heap``;
        a daemon's own process, whose model lives as long as it does)."""
        # loading the model and importing the HTTP stack hold the loop before any request can arrive:
        # start-up's, summed in one line when the watch is armed below
        self.loopwatch = LoopWatch(observe=lag_histogram(self.core.metrics.registry), armed=False).start()
        try:
            await self.core.start()
            await self._start_grpc()
            await self._start_http()
        except BaseException:  # a refused model or a taken port: the caller gets no daemon to stop
            self.loopwatch.stop()
            raise
        if freeze_heap:
            log.info("%d objects frozen out of the garbage collector's walks", process.freeze_heap())
        self.loopwatch.arm()
        return self

    async def _start_grpc(self) -> None:
        c = self.cfg
        if c.grpc_port >= 0:
            self.grpc_server = grpc.aio.server(interceptors=[DecodeGuard()])
            edge_pb2_grpc.add_CoinferEdgeServicer_to_server(EdgeServicer(self.core), self.grpc_server)
            hs = health.aio.HealthServicer()
            health_pb2_grpc.add_HealthServicer_to_server(hs, self.grpc_server)
            reflection.enable_server_reflection(
                (SERVICE, health.SERVICE_NAME, reflection.SERVICE_NAME), self.grpc_server
            )
            self.grpc_port = self.grpc_server.add_insecure_port(f"{c.grpc_host}:{c.grpc_port}")
            await self.grpc_server.start()
            for name in ("", SERVICE):
                await hs.set(name, health_pb2.HealthCheckResponse.SERVING)

    async def _start_http(self) -> None:
        c = self.cfg
        if c.http_port >= 0:
            import uvicorn

            from coinfer.edge.http import create_app

            config = uvicorn.Config(
                create_app(self.core),
                host=c.http_host,
                port=c.http_port,
                log_level="warning",
                lifespan="off",
                log_config=None,
                # idle keep-alive connections are closed by the guard's head deadline; uvicorn's
                # own 5 s timer raced clients whose pools also expire connections at 5 s
                timeout_keep_alive=int(c.http_header_timeout_s) + 1,
            )  # uvicorn's records go to our (rate-limited) root
            http_guard.install(config, c.http_header_timeout_s, http_guard.max_connections(c.http_max_connections))
            self.http_server = uvicorn.Server(config)
            self._http_task = asyncio.create_task(self.http_server.serve())
            while not self.http_server.started:
                if self._http_task.done():
                    await self._http_task  # re-raise a bind error
                    raise RuntimeError("HTTP server exited before starting")
                await asyncio.sleep(0.02)
            self.http_port = self.http_server.servers[0].sockets[0].getsockname()[1]

    async def stop(self, grace: float = 5.0) -> None:
        if self.http_server is not None:
            self.http_server.should_exit = True
            await self._http_task
        if self.grpc_server is not None:
            await self.grpc_server.stop(grace)
        await self.core.close()
        if self.loopwatch is not None:
            self.loopwatch.stop()


def build_parser() -> argparse.ArgumentParser:
    """``--config``, ``--token-file`` and a flag per ``EdgeConfig`` field (``coinfer.serving.settings``)."""
    ap = argparse.ArgumentParser(prog="python -m coinfer.edge.daemon", description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", type=Path, help="TOML file ([edge] table with EdgeConfig fields)")
    ap.add_argument("--token-file", type=Path, help="file holding this edge's bearer token")
    settings.add_model_positional(ap, "--model")
    ap.coinfer_settings = settings.add_flags(ap, EdgeConfig, ENV_PREFIX)
    return ap


def load_config(
    ap: argparse.ArgumentParser, args: argparse.Namespace, token: str | None = None, env: dict[str, str] | None = None
) -> EdgeConfig:
    """The parsed command line as a validated ``EdgeConfig``: the draft model is the positional ``MODEL``
    or ``--model`` (ValueError when both are given and differ)."""
    model = settings.named_model(args, **{"--model": getattr(args, "model", None)})
    return EdgeConfig.load(args.config, env, cli=ap.coinfer_settings, args=args, token=token, model=model)


async def serve(cfg: EdgeConfig) -> None:
    process.prioritise_loop(asyncio.get_running_loop(), nice=cfg.worker_nice)  # drafting below the serving loop
    # the model is loaded: its objects out of the garbage collector's walks (lazy: not loaded yet)
    daemon = await EdgeDaemon(cfg).start(freeze_heap=cfg.warm)
    print(f"GRPC {daemon.grpc_port}", flush=True)
    print(f"HTTP {daemon.http_port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await daemon.stop()


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    logs.setup()
    process.raise_fd_limit()
    try:
        token = args.token_file.read_text().strip() if args.token_file else None
        cfg = load_config(ap, args, token)
    except (OSError, ValueError) as exc:
        ap.error(str(exc))
    try:
        asyncio.run(serve(cfg))
    except ManifestError as exc:  # a refused model at start: one clear line for the operator, no traceback
        log.error("draft model refused: %s", exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
