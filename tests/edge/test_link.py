"""The cloud setting names the replicas; gRPC's balancer spreads calls over the serving ones and skips
a NOT_SERVING or stopped one (real gRPC servers on 127.0.0.1 with the health service)."""

import asyncio
import collections
import json

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from coinfer.edge.link import CLOUD_SERVICE, SERVICE_CONFIG
from coinfer.edge.targets import parse_targets
from coinfer.v1 import coinfer_pb2 as pb
from coinfer.v1 import coinfer_pb2_grpc as pb_grpc


@pytest.mark.parametrize(
    "cloud, target, monitored",
    [
        ("cloud.example:50051", "cloud.example:50051", [("cloud.example", 50051)]),
        ("dns:///coinfer-cloud.ns.svc:50051", "dns:///coinfer-cloud.ns.svc:50051", [("coinfer-cloud.ns.svc", 50051)]),
        ("10.0.0.1:1,10.0.0.2:2", "ipv4:10.0.0.1:1,10.0.0.2:2", [("10.0.0.1", 1), ("10.0.0.2", 2)]),
        ("localhost:7,127.0.0.1:8", "ipv4:127.0.0.1:7,127.0.0.1:8", [("127.0.0.1", 7), ("127.0.0.1", 8)]),
        ("[::1]:7,[::1]:8", "ipv6:[::1]:7,[::1]:8", [("::1", 7), ("::1", 8)]),
    ],
)
def test_cloud_targets(cloud, target, monitored):
    assert parse_targets(cloud) == (target, monitored)


@pytest.mark.parametrize(
    "cloud, msg",
    [
        ("a.example:1,b.example:2", "IP:port entries"),
        ("10.0.0.1:1,[::1]:2", "all IPv4 or all IPv6"),
        ("10.0.0.1", "not host:port"),
        ("10.0.0.1:99999", "not host:port"),
    ],
)
def test_bad_cloud_targets_name_the_field(cloud, msg):
    from coinfer.edge.config import EdgeConfig

    with pytest.raises(ValueError, match=f"cloud: .*{msg}"):
        EdgeConfig(model="m", cloud=cloud).validate()


class _Replica(pb_grpc.CoinferCloudServicer):
    def __init__(self, name: str) -> None:
        self.name = name

    async def Status(self, request, context):
        return pb.StatusResponse(model=self.name)


async def test_round_robin_skips_not_serving_and_stopped_replicas():
    servers, healths, ports = [], [], []
    for i in range(3):
        s = grpc.aio.server()
        pb_grpc.add_CoinferCloudServicer_to_server(_Replica(f"r{i}"), s)
        h = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(h, s)
        ports.append(s.add_insecure_port("127.0.0.1:0"))
        await s.start()
        await h.set(CLOUD_SERVICE, health_pb2.HealthCheckResponse.SERVING)
        servers.append(s)
        healths.append(h)
    target, _ = parse_targets(",".join(f"127.0.0.1:{p}" for p in ports))
    async with grpc.aio.insecure_channel(target, options=[("grpc.service_config", json.dumps(SERVICE_CONFIG))]) as ch:
        stub = pb_grpc.CoinferCloudStub(ch)

        async def spread(n: int = 30) -> dict[str, int]:
            c = collections.Counter()
            for _ in range(n):
                c[(await stub.Status(pb.StatusRequest(), wait_for_ready=True, timeout=5)).model] += 1
            return dict(c)

        async def settles(want: set[str]) -> dict[str, int]:
            """The spread once health updates have reached the balancer and every subchannel is
            connected (both travel asynchronously: a replica still connecting gets fewer picks)."""
            for _ in range(50):
                got = await spread()
                if set(got) == want and max(got.values()) - min(got.values()) <= 2:
                    return got
                await asyncio.sleep(0.1)
            return got

        got = await settles({"r0", "r1", "r2"})
        assert set(got) == {"r0", "r1", "r2"} and max(got.values()) - min(got.values()) <= 2, got
        await healths[1].set(CLOUD_SERVICE, health_pb2.HealthCheckResponse.NOT_SERVING)  # draining
        got = await settles({"r0", "r2"})
        assert set(got) == {"r0", "r2"} and abs(got["r0"] - got["r2"]) <= 2, got
        await servers[2].stop(None)  # gone
        assert await settles({"r0"}) == {"r0": 30}
        await healths[1].set(CLOUD_SERVICE, health_pb2.HealthCheckResponse.SERVING)  # back
        assert set(await settles({"r0", "r1"})) == {"r0", "r1"}
    for s in servers[:2]:
        await s.stop(None)


async def test_a_failed_pass_of_the_resolver_is_retried_and_leaves_no_replica_unwatched(caplog):
    """A replica's channel that cannot be built once (its TLS files mid-rotation: FileNotFoundError) used to
    end the resolve loop for good, with the replica left registered without a channel or monitors. The
    pass is logged and tried again after a short backoff (not after ``resolve_s``), and the replica is then
    watched. The 10 s wait is a hang guard only: the retry comes after 0.5 s (20x)."""
    from coinfer.edge.config import EdgeConfig
    from coinfer.edge.link import CloudLink

    # the pool's channel dials the name, a replica's monitor the address it resolves to
    link = CloudLink(EdgeConfig(model="m", cloud="dns:///127.0.0.1:1"), resolve_s=3600.0, status_s=3600.0)
    built, dial = asyncio.Event(), link._channel_to
    calls: list[str] = []

    def channel_to(target: str, monitor: bool = False) -> grpc.aio.Channel:
        calls.append(target)
        if monitor and len(calls) == 2:
            raise FileNotFoundError("ca.pem")
        ch = dial(target, monitor)
        if monitor:
            built.set()
        return ch

    link._channel_to = channel_to
    await link.start()
    try:
        await asyncio.wait_for(built.wait(), 10)
        r = link.replicas["127.0.0.1:1"]
        assert calls == [link.target, "127.0.0.1:1", "127.0.0.1:1"]  # the pool's channel, the failure, the retry
        assert r._channel is not None and len(r._tasks) == 2 and not link._resolver.done()
        assert any("ca.pem" in m for m in caplog.messages)
    finally:
        await link.close()


async def test_a_replica_up_but_not_serving_is_reported_so_not_as_unreachable():
    """The monitor's channel used the pool's client-side health checking, under which a NOT_SERVING replica
    takes no call, its own health watch included: the edge's /healthz said ``health watch: UNAVAILABLE`` for a
    cloud that answered and was loading its engine (tried by hand, the cloud in front of a vLLM server still
    compiling). The 10 s waits are hang guards (each change arrived in 0.02 s here, `COINFER_TEST_WAITS`: 500x)."""
    from coinfer.edge.config import EdgeConfig
    from coinfer.edge.link import CloudLink
    from tests.waiting import until

    s = grpc.aio.server()
    pb_grpc.add_CoinferCloudServicer_to_server(_Replica("r"), s)
    h = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(h, s)
    port = s.add_insecure_port("127.0.0.1:0")
    await s.start()
    await h.set(CLOUD_SERVICE, health_pb2.HealthCheckResponse.NOT_SERVING)  # up, its engine loading
    link = CloudLink(EdgeConfig(model="m", cloud=f"127.0.0.1:{port}"), status_s=3600.0)
    await link.start()

    def why() -> str:
        r = next(iter(link.replicas.values()), None)
        return r.why if r is not None else "no replica"

    try:
        # before the fix the first wait failed: the replica's why stayed "health watch: UNAVAILABLE"
        await until(lambda: why() == "health watch: NOT_SERVING", guard_s=10, what="the monitor sees NOT_SERVING")
        assert not link.serving
        await h.set(CLOUD_SERVICE, health_pb2.HealthCheckResponse.SERVING)
        await until(lambda: why() == "health watch: SERVING", guard_s=10, what="the monitor sees SERVING")
        assert link.serving
        await s.stop(None)  # gone: now it is unreachable
        await until(lambda: why().startswith("health watch: UNAVAILABLE"), guard_s=10, what="the monitor loses it")
        assert not link.serving
    finally:
        await link.close()
        await s.stop(None)
