"""The cloud gRPC service: CoinferCloud + grpc.health.v1 + reflection over one vLLM engine.

Usage::

    coinfer-cloud ~/.cache/coinfer/models/<key>/target --port 50051
    coinfer-cloud GEMMA3_DIR --chat-template deploy/chat_templates/gemma.jinja   # a base model: its template
    coinfer-cloud MODEL_DIR --engine.url http://vllm:8000 --port 50051   # the target on a vLLM server elsewhere

(``python -m coinfer.cloud.server`` alike.) The target model is the positional ``MODEL``, as in ``vllm
serve MODEL``; ``--engine.model`` (the setting's own name: ``[cloud.engine] model`` in TOML,
``COINFER_CLOUD_ENGINE__MODEL``) and ``--model`` (the edge daemon's name for its model) say the same.

Health is NOT_SERVING while the engine loads, SERVING once it answers, and back
to NOT_SERVING when the server drains for shutdown (SIGTERM/SIGINT: stop taking
sessions, give in-flight ones ``--grace`` seconds) or the engine dies or hangs
(a heartbeat every ``--heartbeat-period`` s); a failed engine is restarted, its
processes killed, and health turns SERVING again once the new one answers. The
engine's processes die with the server, even when it is SIGKILLed.

With ``--engine.url`` the target runs on a vLLM OpenAI-compatible server elsewhere
(``coinfer.cloud.remote_engine``; ``MODEL`` is then a local copy of the model it
serves, for its tokenizer and chat template): health is NOT_SERVING while that
server is not reached or refuses, SERVING again as soon as it answers; the engine
is never replaced (nothing here to restart). A server that serves another model is
refused at start (exit status 2).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import socket
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from coinfer.cloud.auth import BearerAuthInterceptor, load_tokens
from coinfer.cloud.config import ENV_PREFIX, CloudConfig, EngineConfig
from coinfer.cloud.core import CloudCore
from coinfer.cloud.engine import TargetEngine
from coinfer.cloud.remote_http import WrongServer
from coinfer.cloud.servicer import CoinferCloudServicer
from coinfer.cloud.vllm_common import exactness_caveat
from coinfer.cloud.vllm_engine import VllmEngine
from coinfer.errors import Reason, Unavailable
from coinfer.serving import logs, process, settings
from coinfer.serving.decode_guard import DecodeGuard
from coinfer.serving.loopwatch import LoopWatch, lag_histogram
from coinfer.types import VerifierKind
from coinfer.v1 import coinfer_pb2, coinfer_pb2_grpc

log = logging.getLogger(__name__)
process.watch_parent_if_spawned()  # in vLLM's spawned engine processes: they end with this server
SERVICE = coinfer_pb2.DESCRIPTOR.services_by_name["CoinferCloud"].full_name


class CloudServer:
    """A started server: ``port``, ``core``, ``health``; ``stop()`` drains and closes."""

    def __init__(
        self,
        server: grpc.aio.Server,
        port: int,
        core: CloudCore,
        health_servicer: health.aio.HealthServicer,
        cfg: CloudConfig,
    ) -> None:
        self.server, self.port, self.core, self.health, self.cfg = server, port, core, health_servicer, cfg
        self.metrics_port: int | None = None
        self._watch: asyncio.Task | None = None
        self._load: asyncio.Task | None = None
        # importing vLLM and torch and loading the engine hold the loop for seconds before any session can
        # arrive: start-up's, summed in one line when the first engine is attached (``attach_engine``)
        self.loopwatch = LoopWatch(observe=lag_histogram(core.metrics.registry), armed=False).start()
        self.engine_factory: Callable[[], Awaitable[TargetEngine]] | None = None
        """Starts a replacement engine when the heartbeat fails (None: stay NOT_SERVING)."""
        self.serving = False
        """What health says now."""

    async def set_serving(self, serving: bool) -> None:
        self.serving = serving
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ("", SERVICE):
            await self.health.set(name, status)

    async def attach_engine(self, engine: TargetEngine) -> None:
        self.core.engine = engine
        self.loopwatch.arm()  # serving from here: stalls are warned with their stacks (a restart's too)
        await self.set_serving(not self.core.draining)
        if self._watch is None:
            self._watch = asyncio.create_task(self._watch_engine())
            self._load = asyncio.create_task(self._sample_load())
            if self.cfg.policy.verifier is VerifierKind.EXACT and (caveat := exactness_caveat(engine.tie_nats)):
                log.warning("%s", caveat)

    async def _sample_load(self) -> None:
        """Engine load into the draft-count controller at a fixed rate (its smoothing is per sample)."""
        while True:
            self.core.sample_load()
            await asyncio.sleep(self.cfg.load_period_s)

    async def _watch_engine(self) -> None:
        """Heartbeat (docs/design.md §5.2): a dead or hung engine turns health NOT_SERVING (gRPC balancers and
        edges move to other replicas; new sessions here get UNAVAILABLE) and, given an
        ``engine_factory``, is replaced by a fresh one, after which health is SERVING again. An engine that
        ``recovers`` by itself (a remote server restarting) is asked again instead, SERVING once it answers;
        its health changes wake the heartbeat at once (``TargetEngine.health_changed``)."""
        while True:
            engine = self.core.engine
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.cfg.heartbeat_period_s):
                    await engine.health_changed()
            try:
                await engine.heartbeat(self.cfg.heartbeat_timeout_s)
            except Unavailable as exc:
                if self.serving or not engine.recovers:
                    log.error("engine unhealthy: %s", exc.message)
                reason = "hung" if exc.reason is Reason.ENGINE_HUNG else "dead"
            else:
                if not self.serving and not self.core.draining:
                    log.info("engine: answering again: SERVING")
                    await self.set_serving(True)
                continue
            await self.set_serving(False)
            if engine.recovers:
                continue
            if self.engine_factory is None:
                return
            self.core.metrics.restarts.labels(reason).inc()
            await self._restart()

    async def _restart(self) -> None:
        old, self.core.engine = self.core.engine, None  # admission: UNAVAILABLE "restarting" meanwhile
        try:
            # kills its processes now (a hung engine would only run out vLLM's 5 s shutdown wait); requests
            # still on it fail UNAVAILABLE (the edge replays them)
            await old.close(wait_s=0.0)
        except Exception:  # noqa: BLE001 - a broken engine may fail to shut down cleanly; start anyway
            log.exception("closing the failed engine")
        delay = 1.0
        while True:
            try:
                engine = await self.engine_factory()
                break
            except Exception:  # noqa: BLE001 - keep trying: NOT_SERVING meanwhile, the replica stays up
                log.exception("engine restart failed; next try in %.0f s", delay)
                await asyncio.sleep(delay)
                delay = min(60.0, delay * 2)
        process.freeze_heap()  # the new engine's objects out of the collector's walks, the old one's collected
        await self.attach_engine(engine)
        log.info("engine restarted: %s", "SERVING" if not self.core.draining else "draining")

    async def stop(self, grace: float | None = None, close_engine: bool = True) -> None:
        await self.set_serving(False)
        self.core.draining = True  # new sessions: UNAVAILABLE; in-flight ones finish within the grace
        for task in (self._watch, self._load):
            if task:
                task.cancel()
        await self.core.drained(self.cfg.grace_s if grace is None else grace)
        await self.server.stop(0.5)
        self.loopwatch.stop()
        if close_engine and self.core.engine is not None:
            await self.core.engine.close()
        self.core.close()


def server_credentials(cfg: CloudConfig) -> grpc.ServerCredentials | None:
    if not cfg.tls_cert:
        return None
    ca = Path(cfg.tls_client_ca).read_bytes() if cfg.tls_client_ca else None
    return grpc.ssl_server_credentials(
        [(Path(cfg.tls_key).read_bytes(), Path(cfg.tls_cert).read_bytes())],
        root_certificates=ca,
        require_client_auth=ca is not None,
    )


async def create_server(cfg: CloudConfig, engine: TargetEngine | None = None) -> CloudServer:
    """Bind and start; health is NOT_SERVING until an engine is attached."""
    cfg.validate()
    opts = [
        ("grpc.max_receive_message_length", cfg.limits.max_message_bytes),
        ("grpc.max_send_message_length", max(cfg.limits.max_message_bytes, 17 << 20)),
    ]
    auth = BearerAuthInterceptor(cfg.auth_tokens) if cfg.auth_tokens else None
    server = grpc.aio.server(options=opts, interceptors=[DecodeGuard()] + ([auth] if auth else []))
    core = CloudCore(cfg)
    servicer = CoinferCloudServicer(core, auth)
    coinfer_pb2_grpc.add_CoinferCloudServicer_to_server(servicer, server)
    hs = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(hs, server)
    reflection.enable_server_reflection((SERVICE, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
    creds = server_credentials(cfg)
    addr = f"{cfg.host}:{cfg.port}"
    port = server.add_secure_port(addr, creds) if creds else server.add_insecure_port(addr)
    await server.start()
    servicer.replica = f"{socket.gethostname()}:{port}"
    srv = CloudServer(server, port, core, hs, cfg)
    if cfg.metrics_port >= 0:
        srv.metrics_port = core.metrics.serve(cfg.metrics_port, cfg.metrics_host)
    await srv.set_serving(False)
    if engine is not None:
        await srv.attach_engine(engine)
    return srv


async def serve(cfg: CloudConfig, ready: asyncio.Event | None = None) -> None:
    process.children_die_with_parent()  # forked engine processes end with this server, even on SIGKILL
    process.start_resource_tracker()  # at the loop's priority, not the engine's starting worker thread's
    process.prioritise_loop(asyncio.get_running_loop())  # client-rule checks below the serving loop
    srv = await create_server(cfg)
    log.info("listening on %s:%d (NOT_SERVING while the engine loads)", cfg.host, srv.port)
    print(f"PORT {srv.port}", flush=True)  # for wrappers that started us with port 0
    srv.engine_factory = lambda: start_engine(cfg.engine)
    try:
        engine = await srv.engine_factory()
    except WrongServer as exc:
        log.error("%s", exc)
        await srv.stop(grace=0)
        raise SystemExit(2) from None
    frozen = process.freeze_heap()  # before SERVING: the engine's objects out of the garbage collector's walks
    await srv.attach_engine(engine)
    log.info("engine ready: SERVING (%d objects frozen out of the garbage collector's walks)", frozen)
    if ready:
        ready.set()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("draining (grace %.0f s)", cfg.grace_s)
    await srv.stop()


async def start_engine(cfg: EngineConfig) -> TargetEngine:
    """The target engine ``cfg`` configures, started: vLLM in this process, or the server at ``cfg.url``."""
    if cfg.remote:
        from coinfer.cloud.remote_engine import RemoteEngine

        return await RemoteEngine(cfg).start()
    return await VllmEngine(cfg).start()


def build_parser() -> argparse.ArgumentParser:
    """``--config``, ``--auth-tokens`` and a flag per ``CloudConfig`` field, sections included
    (``--engine.model``, ``--policy.min-mean-logprob``; ``coinfer.serving.settings``)."""
    ap = argparse.ArgumentParser(
        prog="python -m coinfer.cloud.server", description="coinfer cloud gRPC service (verify + refine on vLLM)"
    )
    ap.add_argument(
        "--config",
        type=Path,
        help="TOML file ([cloud] table with CloudConfig fields; "
        "[cloud.engine], [cloud.limits], [cloud.policy] for the sections)",
    )
    ap.add_argument(
        "--auth-tokens",
        type=Path,
        help='JSON file {"edge-id": "token", ...}; callers need '
        "'authorization: Bearer <token>' (health and reflection stay open)",
    )
    settings.add_model_positional(ap, "--engine.model and --model")
    ap.add_argument(
        "--model",
        dest="model_alias",
        metavar="MODEL",
        help="the same as --engine.model (the edge daemon's name for its model)",
    )
    ap.add_argument(
        "--chat-template",
        dest="chat_template_alias",
        metavar="FILE",
        help="the same as --engine.chat-template (vLLM's flag): the Jinja template the target reads "
        "conversations with (a base model has none: deploy/chat_templates/gemma.jinja for Gemma)",
    )
    ap.coinfer_settings = settings.add_flags(ap, CloudConfig, ENV_PREFIX)
    return ap


def load_config(ap: argparse.ArgumentParser, args: argparse.Namespace, env=None, secrets: bool = True) -> CloudConfig:
    """The parsed command line as a validated ``CloudConfig`` (``secrets``: read the token file)."""
    tokens = load_tokens(args.auth_tokens) if secrets and args.auth_tokens else None
    model = settings.named_model(
        args, **{"--engine.model": getattr(args, "engine.model", None), "--model": args.model_alias}
    )
    cfg = settings.load(
        CloudConfig,
        ENV_PREFIX,
        "cloud",
        args.config,
        env,
        ap.coinfer_settings,
        args,
        auth_tokens=tokens,
        engine={k: v for k, v in (("model", model), ("chat_template", args.chat_template_alias)) if v} or None,
    )
    if not cfg.engine.model:
        raise ValueError(
            "MODEL: the target model directory is required, positional or --engine.model (with --engine.url: a "
            "local copy of the model the server serves, for its tokenizer and chat template)"
        )
    cfg.validate()
    return cfg


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    logs.setup()
    process.raise_fd_limit()
    try:
        cfg = load_config(ap, args)
    except ValueError as exc:
        ap.error(str(exc))
    asyncio.run(serve(cfg))
    return 0


if __name__ == "__main__":
    sys.exit(main())
