"""The edge's link to the cloud: one load-balanced channel over every replica, per-replica health,
the circuit breaker, and the cloud's latest recommended draft count.

Balancing is gRPC's own, not ours: the channel's target names every replica (a DNS name that
resolves to several addresses, e.g. a Kubernetes headless Service, or a list of IP:port) and its
service config asks for ``round_robin`` with client-side health checking on the cloud service.
gRPC then opens a subchannel per replica, watches each one's ``grpc.health.v1`` status, and picks a
READY, SERVING replica per call: a session is one stream, so it stays on its replica; a draining
replica (NOT_SERVING) gets no new sessions while its in-flight ones finish; a dead one leaves the
rotation when its connection breaks; DNS is re-resolved when connections fail.

Beside it, one small monitor per replica address (its own channel: a health watch and a periodic
``Status``) feeds what gRPC does not expose: per-replica state for ``status()`` and ``/metrics``,
the pool's best queue for the planner, and the breaker, which opens only when *no* replica serves
(one bad replica does not send every request to the edge). Monitors reconnect with capped
exponential backoff.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from dataclasses import dataclass, field

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from coinfer.edge.breaker import CircuitBreaker
from coinfer.edge.channel import cloud_channel
from coinfer.edge.config import EdgeConfig
from coinfer.edge.sampling import DEFAULT_DRAFTS
from coinfer.edge.targets import parse_targets

log = logging.getLogger(__name__)
CLOUD_SERVICE = "coinfer.v1.CoinferCloud"
SERVICE_CONFIG = {
    "loadBalancingConfig": [{"round_robin": {}}],
    "healthCheckConfig": {"serviceName": CLOUD_SERVICE},
    # unary calls (Status, Probe) retried on another replica; a session is replayed by the edge
    # itself with the drafts it already wrote (edge.pipeline), never blindly re-sent
    "methodConfig": [
        {
            "name": [{"service": CLOUD_SERVICE, "method": m} for m in ("Status", "Probe")],
            "retryPolicy": {
                "maxAttempts": 3,
                "initialBackoff": "0.1s",
                "maxBackoff": "1s",
                "backoffMultiplier": 2,
                "retryableStatusCodes": ["UNAVAILABLE"],
            },
        }
    ],
}
RESOLVE_RETRY_S = 0.5
"""The first wait before resolving again after a failed pass (doubled each failure, at most ``resolve_s``)."""


@dataclass(kw_only=True)
class Replica:
    """What the edge knows of one replica address (from its monitor)."""

    address: str
    serving: bool = False
    queue_depth: float = 0.0
    load: float = 0.0
    running: float = 0.0
    last_seen: float = 0.0
    why: str = "not yet seen"
    _tasks: list[asyncio.Task] = field(default_factory=list, repr=False)
    _channel: grpc.aio.Channel | None = field(default=None, repr=False)

    def as_dict(self) -> dict:
        return {
            "address": self.address,
            "serving": self.serving,
            "queue_depth": self.queue_depth,
            "load": self.load,
            "running": self.running,
            "why": self.why,
        }


class CloudLink:
    def __init__(self, cfg: EdgeConfig, resolve_s: float = 10.0, status_s: float = 2.0) -> None:
        self.cfg = cfg
        self.channel: grpc.aio.Channel | None = None
        self.breaker = CircuitBreaker(failures=cfg.breaker_failures, reset_s=cfg.breaker_reset_s)
        self.recommended_drafts = DEFAULT_DRAFTS  # until the cloud says otherwise
        self.replicas: dict[str, Replica] = {}
        self.resolve_s, self.status_s = resolve_s, status_s
        self._resolver: asyncio.Task | None = None
        self.target, self._names = parse_targets(cfg.cloud) if cfg.cloud else ("", [])

    @property
    def enabled(self) -> bool:
        return bool(self.cfg.cloud)

    @property
    def serving(self) -> bool:
        """Some replica serves."""
        return any(r.serving for r in self.replicas.values())

    def _channel_to(self, target: str, monitor: bool = False) -> grpc.aio.Channel:
        """The pool's channel (``monitor=False``: sessions, balanced over the SERVING replicas) or one replica's
        monitor's. A monitor's channel checks no health itself: with gRPC's client-side health checking a
        NOT_SERVING replica takes no call at all, its own health watch included, so the monitor read a replica
        that was up and loading its engine as UNAVAILABLE, the word for one it cannot reach."""
        c = self.cfg
        name = c.tls_server_name
        if not name and monitor and self._names:  # a monitor dials an IP: TLS verifies the name
            name = self._names[0][0]
        config = SERVICE_CONFIG if not monitor else {"methodConfig": SERVICE_CONFIG["methodConfig"]}
        return cloud_channel(
            target,
            token=c.token,
            tls_ca=c.tls_ca,
            tls_cert=c.tls_cert,
            tls_key=c.tls_key,
            server_name=name,
            # a replica back from a restart is dialled within 1 s, not after gRPC's
            # default backoff (up to 120 s once it was down for a minute): the edge is
            # back on split within ~2 s of SERVING (a SYN a second to a dead replica)
            options=[
                ("grpc.max_receive_message_length", 32 << 20),
                ("grpc.initial_reconnect_backoff_ms", 250),
                ("grpc.max_reconnect_backoff_ms", 1000),
                ("grpc.service_config", json.dumps(config)),
                ("grpc.enable_retries", 1),
            ],
        )

    async def start(self) -> None:
        if not self.enabled:
            return
        self.channel = self._channel_to(self.target)
        # connect every replica's subchannel now, not on the first session: until they are READY the
        # balancer can only pick the ones that are, and early sessions would pile onto those
        self.channel.get_state(try_to_connect=True)
        self._resolver = asyncio.create_task(self._resolve_loop())

    async def _resolve(self) -> list[str]:
        out: list[str] = []
        for host, port in self._names:
            try:
                infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
            except OSError as exc:
                log.warning("cloud: cannot resolve %s (%s)", host, exc)
                continue
            for family, _, _, _, sockaddr in infos:
                ip = sockaddr[0]
                out.append(f"[{ip}]:{port}" if family == socket.AF_INET6 else f"{ip}:{port}")
        return sorted(set(out))

    async def _resolve_loop(self) -> None:
        """Keep one monitor per address the cloud's name resolves to (replicas come and go). A failed pass
        (nothing resolved, or a replica's channel that could not be built: TLS files mid-rotation) is
        logged and tried again with capped exponential backoff: the loop ends only at ``close()``."""
        retry = min(RESOLVE_RETRY_S, self.resolve_s)
        while True:
            try:
                tracked = await self._track(await self._resolve())
            except Exception as exc:  # the loop outlives any one pass; CancelledError (close) is no Exception
                log.warning("cloud: tracking replicas failed, again in %.1f s: %r", retry, exc, exc_info=True)
                tracked = False
            if tracked:
                retry = min(RESOLVE_RETRY_S, self.resolve_s)
                await asyncio.sleep(self.resolve_s)
            else:
                await asyncio.sleep(retry)
                retry = min(self.resolve_s, retry * 2)

    async def _track(self, addrs: list[str]) -> bool:
        """One monitor per address in ``addrs``; replicas gone from DNS dropped. False when nothing resolved
        (every replica kept: a DNS hiccup is no replica's death)."""
        for a in addrs:
            if a not in self.replicas:
                # the channel first: one that cannot be built leaves no replica registered without monitors
                # (it would never be watched: the next pass sees it known)
                r = Replica(address=a, _channel=self._channel_to(a, monitor=True))
                r._tasks = [asyncio.create_task(self._watch(r)), asyncio.create_task(self._poll(r))]
                self.replicas[a] = r
        for a in [a for a in self.replicas if addrs and a not in addrs]:  # gone from DNS
            before = self.serving
            await self._drop(self.replicas.pop(a))
            if self.serving != before:
                self.breaker.health(self.serving)
        return bool(addrs)

    async def _watch(self, r: Replica) -> None:
        backoff = 0.2
        stub = health_pb2_grpc.HealthStub(r._channel)
        while True:
            try:
                async for resp in stub.Watch(health_pb2.HealthCheckRequest(service=CLOUD_SERVICE)):
                    backoff = 0.2
                    status = health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)
                    self._set(r, resp.status == health_pb2.HealthCheckResponse.SERVING, f"health watch: {status}")
                self._set(r, False, "health stream ended (shutdown)")
            except asyncio.CancelledError:
                raise
            except grpc.aio.AioRpcError as exc:
                self._set(r, False, f"health watch: {exc.code().name}")
            await asyncio.sleep(backoff)
            backoff = min(1.0, backoff * 2)

    async def _poll(self, r: Replica) -> None:
        """The replica's load (the planner's queue term and /metrics)."""
        from coinfer.edge.planner.probes import cloud_status
        from coinfer.v1 import coinfer_pb2_grpc as pb_grpc

        stub = pb_grpc.CoinferCloudStub(r._channel)
        while True:
            if r.serving:
                st = await cloud_status(stub, timeout=max(1.0, self.status_s))
                if st is not None:
                    r.queue_depth, r.load, r.running, r.last_seen = (
                        st["queue_depth"],
                        st["load"],
                        st["running"],
                        time.time(),
                    )
            await asyncio.sleep(self.status_s)

    def _set(self, r: Replica, serving: bool, why: str) -> None:
        before = self.serving
        if serving != r.serving:
            log.info("cloud replica %s %s (%s)", r.address, "SERVING" if serving else "not serving", why)
        r.serving, r.why = serving, why
        if self.serving != before:  # the pool's view moved: the breaker follows (not one replica's)
            self.breaker.health(self.serving)

    def best(self) -> Replica | None:
        """The serving replica with the shortest queue: the planner's cloud terms (a session may land
        on another, but gRPC's rotation skips none of the serving ones for long)."""
        live = [r for r in self.replicas.values() if r.serving]
        return min(live, key=lambda r: (r.queue_depth, r.load)) if live else None

    async def _drop(self, r: Replica) -> None:
        for t in r._tasks:
            t.cancel()
        if r._channel is not None:
            await r._channel.close()

    async def close(self) -> None:
        if self._resolver is not None:
            self._resolver.cancel()
        for r in list(self.replicas.values()):
            await self._drop(r)
        if self.channel is not None:
            await self.channel.close()
