"""The cloud gRPC service: CoinferCloud + grpc.health.v1 + reflection over one vLLM engine.

Usage::

    python -m cloud.server --model ~/.cache/coinfer/models/<key>/target --port 50051

Health is NOT_SERVING while the engine loads, SERVING once it answers, and back
to NOT_SERVING when it dies or the server drains for shutdown (SIGTERM/SIGINT:
stop taking sessions, give in-flight ones ``--grace`` seconds).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from cloud.config import CloudConfig, EngineConfig
from cloud.core import CloudCore
from cloud.engine import TargetEngine, VllmEngine
from cloud.servicer import CoinferCloudServicer
from coinfer.v1 import coinfer_pb2, coinfer_pb2_grpc

log = logging.getLogger(__name__)
SERVICE = coinfer_pb2.DESCRIPTOR.services_by_name["CoinferCloud"].full_name


class CloudServer:
    """A started server: ``port``, ``core``, ``health``; ``stop()`` drains and closes."""

    def __init__(self, server: grpc.aio.Server, port: int, core: CloudCore, health_servicer: health.aio.HealthServicer,
                 cfg: CloudConfig) -> None:
        self.server, self.port, self.core, self.health, self.cfg = server, port, core, health_servicer, cfg
        self._watch: asyncio.Task | None = None

    async def set_serving(self, serving: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ("", SERVICE):
            await self.health.set(name, status)

    async def attach_engine(self, engine: TargetEngine) -> None:
        self.core.engine = engine
        await self.set_serving(True)
        self._watch = asyncio.create_task(self._watch_engine())

    async def _watch_engine(self, period_s: float = 5.0) -> None:
        """Heartbeat (seed 5.2): a dead engine flips health to NOT_SERVING."""
        while True:
            await asyncio.sleep(period_s)
            try:
                await self.core.engine.check_health()
            except Exception as exc:  # noqa: BLE001
                log.error("engine unhealthy: %s", exc)
                await self.set_serving(False)
                return

    async def stop(self, grace: float | None = None) -> None:
        await self.set_serving(False)
        if self._watch:
            self._watch.cancel()
        await self.server.stop(self.cfg.grace_s if grace is None else grace)
        if self.core.engine is not None:
            await self.core.engine.close()


async def create_server(cfg: CloudConfig, engine: TargetEngine | None = None) -> CloudServer:
    """Bind and start; health is NOT_SERVING until an engine is attached."""
    opts = [("grpc.max_receive_message_length", cfg.limits.max_message_bytes),
            ("grpc.max_send_message_length", max(cfg.limits.max_message_bytes, 17 << 20))]
    server = grpc.aio.server(options=opts)
    core = CloudCore(cfg)
    coinfer_pb2_grpc.add_CoinferCloudServicer_to_server(CoinferCloudServicer(core), server)
    hs = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(hs, server)
    reflection.enable_server_reflection((SERVICE, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
    port = server.add_insecure_port(f"{cfg.host}:{cfg.port}")
    await server.start()
    srv = CloudServer(server, port, core, hs, cfg)
    await srv.set_serving(False)
    if engine is not None:
        await srv.attach_engine(engine)
    return srv


async def serve(cfg: CloudConfig, ready: asyncio.Event | None = None) -> None:
    srv = await create_server(cfg)
    log.info("listening on %s:%d (NOT_SERVING while the engine loads)", cfg.host, srv.port)
    print(f"PORT {srv.port}", flush=True)  # for wrappers that started us with port 0
    await srv.attach_engine(await VllmEngine(cfg.engine).start())
    log.info("engine ready: SERVING")
    if ready:
        ready.set()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("draining (grace %.0f s)", cfg.grace_s)
    await srv.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="coinfer cloud gRPC service (verify + refine on vLLM)")
    ap.add_argument("--model", required=True, help="target model directory (Hugging Face format)")
    ap.add_argument("--host", default="127.0.0.1", help="bind address")
    ap.add_argument("--port", type=int, default=50051, help="port; 0 picks a free one (printed as 'PORT n')")
    ap.add_argument("--max-model-len", type=int, default=256, help="engine context length")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16", "auto"])
    ap.add_argument("--grace", type=float, default=10.0, help="seconds in-flight sessions get on shutdown")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cfg = CloudConfig(engine=EngineConfig(model=args.model, max_model_len=args.max_model_len, dtype=args.dtype),
                      host=args.host, port=args.port, grace_s=args.grace)
    try:
        cfg.engine.validate()
    except ValueError as exc:
        ap.error(str(exc))
    asyncio.run(serve(cfg))
    return 0


if __name__ == "__main__":
    sys.exit(main())
