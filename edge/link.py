"""The edge's link to the cloud: one channel, a health watch that feeds the circuit breaker,
and the cloud's latest recommended draft count.

The watch is a ``grpc.health.v1.Health/Watch`` stream on the cloud service; when it
breaks (cloud gone, network down) it is re-opened with capped exponential backoff, so
reconnection is automatic and the breaker learns of a dead cloud without a request
paying for it.
"""

from __future__ import annotations

import asyncio
import logging

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from edge.breaker import CircuitBreaker
from edge.channel import cloud_channel
from edge.config import EdgeConfig

log = logging.getLogger(__name__)
CLOUD_SERVICE = "coinfer.v1.CoinferCloud"


class CloudLink:
    def __init__(self, cfg: EdgeConfig) -> None:
        self.cfg = cfg
        self.channel: grpc.aio.Channel | None = None
        self.breaker = CircuitBreaker(cfg.breaker_failures, cfg.breaker_reset_s)
        self.serving = False
        self.recommended_drafts = 5  # seed 003, 4.2, until the cloud says otherwise
        self._watch: asyncio.Task | None = None

    @property
    def enabled(self) -> bool:
        return bool(self.cfg.cloud)

    async def start(self) -> None:
        if not self.enabled:
            return
        c = self.cfg
        self.channel = cloud_channel(c.cloud, token=c.token, tls_ca=c.tls_ca, tls_cert=c.tls_cert, tls_key=c.tls_key,
                                     server_name=c.tls_server_name,
                                     options=[("grpc.max_receive_message_length", 32 << 20)])
        self._watch = asyncio.create_task(self._watch_health())

    async def _watch_health(self) -> None:
        backoff = 0.2
        stub = health_pb2_grpc.HealthStub(self.channel)
        while True:
            try:
                async for resp in stub.Watch(health_pb2.HealthCheckRequest(service=CLOUD_SERVICE)):
                    backoff = 0.2
                    self._set_serving(resp.status == health_pb2.HealthCheckResponse.SERVING)
                self._set_serving(False)  # the server ended the stream (shutdown)
            except asyncio.CancelledError:
                raise
            except grpc.aio.AioRpcError as exc:
                self._set_serving(False, f"health watch: {exc.code().name}")
            await asyncio.sleep(backoff)
            backoff = min(5.0, backoff * 2)

    def _set_serving(self, serving: bool, why: str = "") -> None:
        if serving != self.serving:
            log.info("cloud %s%s", "SERVING" if serving else "not serving", f" ({why})" if why else "")
        self.serving = serving
        self.breaker.health(serving)

    async def close(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
        if self.channel is not None:
            await self.channel.close()
