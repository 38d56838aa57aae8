"""Auth, TLS, metrics endpoint and draining over real gRPC (no engine needed for these paths)."""

from __future__ import annotations

import datetime
import ipaddress
import json
import urllib.request

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from coinfer.cloud.auth import load_tokens
from coinfer.cloud.config import CloudConfig, EngineConfig, PolicyConfig
from coinfer.cloud.server import create_server
from coinfer.edge.channel import cloud_channel
from coinfer.v1 import coinfer_pb2 as pb
from coinfer.v1 import coinfer_pb2_grpc as pb_grpc

TOKENS = {"edge-a": "a" * 32, "edge-b": "b" * 32}


def self_signed(tmp_path):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    (tmp_path / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "key.pem").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return str(tmp_path / "cert.pem"), str(tmp_path / "key.pem")


async def expect_code(coro, code, fragment=""):
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await coro
    assert e.value.code() == code, e.value.details()
    assert fragment in (e.value.details() or "")


async def test_bearer_tokens_over_tls(tmp_path):
    cert, key = self_signed(tmp_path)
    srv = await create_server(
        CloudConfig(engine=EngineConfig(model="unused"), auth_tokens=TOKENS, tls_cert=cert, tls_key=key)
    )
    target = f"127.0.0.1:{srv.port}"
    try:
        async with cloud_channel(target, tls_ca=cert, server_name="localhost") as ch:  # TLS, no token
            stub = pb_grpc.CoinferCloudStub(ch)
            await expect_code(
                stub.Status(pb.StatusRequest()), grpc.StatusCode.UNAUTHENTICATED, "authorization: missing bearer token"
            )
            # health stays open for probes that carry no credentials
            resp = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest())
            assert resp.status == health_pb2.HealthCheckResponse.NOT_SERVING
        async with cloud_channel(target, token="x" * 32, tls_ca=cert, server_name="localhost") as ch:
            await expect_code(
                pb_grpc.CoinferCloudStub(ch).Status(pb.StatusRequest()),
                grpc.StatusCode.UNAUTHENTICATED,
                "unknown token",
            )
        async with cloud_channel(target, token=TOKENS["edge-b"], tls_ca=cert, server_name="localhost") as ch:
            st = await pb_grpc.CoinferCloudStub(ch).Status(pb.StatusRequest())
            assert not st.ready and st.weight_a == pytest.approx(1.0)
        async with grpc.aio.insecure_channel(target) as ch:  # plaintext to a TLS port: no connection
            await expect_code(
                pb_grpc.CoinferCloudStub(ch).Status(pb.StatusRequest(), timeout=5), grpc.StatusCode.UNAVAILABLE
            )
    finally:
        await srv.stop(grace=0)


async def test_tokens_on_a_plaintext_channel_and_streaming_calls(tmp_path):
    srv = await create_server(CloudConfig(engine=EngineConfig(model="unused"), auth_tokens=TOKENS))
    target = f"127.0.0.1:{srv.port}"
    try:
        async with cloud_channel(target) as ch:
            stub = pb_grpc.CoinferCloudStub(ch)

            async def msgs():
                yield pb.EdgeMessage(open=pb.SessionOpen())

            await expect_code(stub.Session(msgs()).read(), grpc.StatusCode.UNAUTHENTICATED, "missing bearer")
            await expect_code(stub.Generate(pb.GenerateRequest()).read(), grpc.StatusCode.UNAUTHENTICATED)
        async with grpc.aio.insecure_channel(target) as ch:
            stub = pb_grpc.CoinferCloudStub(ch)
            await expect_code(
                stub.Status(pb.StatusRequest(), metadata=(("authorization", "Basic abc"),)),
                grpc.StatusCode.UNAUTHENTICATED,
                "expected 'Bearer <token>'",
            )
        async with cloud_channel(target, token=TOKENS["edge-a"]) as ch:
            stub = pb_grpc.CoinferCloudStub(ch)
            assert (await stub.Probe(pb.ProbeRequest(response_bytes=10))).payload
            # authenticated, reaches the servicer: bad input is still named
            await expect_code(
                stub.Generate(pb.GenerateRequest()).read(), grpc.StatusCode.INVALID_ARGUMENT, "problem.prompt"
            )
            # valid input with no engine attached (loading / restarting): UNAVAILABLE, not INTERNAL
            await expect_code(
                stub.Generate(pb.GenerateRequest(problem=pb.Problem(prompt="hi"))).read(),
                grpc.StatusCode.UNAVAILABLE,
                "engine: not ready",
            )
    finally:
        await srv.stop(grace=0)


def test_token_file_and_tls_config_errors(tmp_path):
    f = tmp_path / "tokens.json"
    f.write_text(json.dumps({"edge-a": "short"}))
    with pytest.raises(ValueError, match="at least 16"):
        load_tokens(f)
    f.write_text("[]")
    with pytest.raises(ValueError, match="non-empty JSON object"):
        load_tokens(f)
    f.write_text(json.dumps(TOKENS))
    assert load_tokens(f) == TOKENS
    with pytest.raises(ValueError, match="tls_cert / tls_key"):
        CloudConfig(engine=EngineConfig(model="m"), tls_cert="c.pem").validate()
    with pytest.raises(ValueError, match="is not a file"):
        CloudConfig(engine=EngineConfig(model="m"), tls_cert="/nope", tls_key="/nope").validate()
    with pytest.raises(ValueError, match="policy.verifier"):
        CloudConfig(engine=EngineConfig(model="m"), policy=PolicyConfig(verifier="vibes")).validate()


async def test_metrics_endpoint_and_draining_refuses_new_sessions():
    srv = await create_server(CloudConfig(engine=EngineConfig(model="unused"), metrics_port=0))
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{srv.metrics_port}/metrics", timeout=5).read().decode()
        assert 'coinfer_scheduler_weight{name="a"} 1.0' in body
        assert "coinfer_sessions_active 0.0" in body and "coinfer_recommended_drafts" in body
        srv.core.draining = True
        async with grpc.aio.insecure_channel(f"127.0.0.1:{srv.port}") as ch:
            stub = pb_grpc.CoinferCloudStub(ch)
            req = pb.GenerateRequest(problem=pb.Problem(task="arith", prompt="If x=1 and y=2, compute x+y."))
            await expect_code(stub.Generate(req).read(), grpc.StatusCode.UNAVAILABLE, "draining")
            assert (await stub.Status(pb.StatusRequest())).draining
    finally:
        await srv.stop(grace=0)


async def test_bearer_scheme_is_case_insensitive(tmp_path):
    srv = await create_server(CloudConfig(engine=EngineConfig(model="unused"), auth_tokens=TOKENS))
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{srv.port}") as ch:
            stub = pb_grpc.CoinferCloudStub(ch)
            for scheme in ("bearer", "BEARER", "Bearer"):
                st = await stub.Status(
                    pb.StatusRequest(), metadata=(("authorization", f"{scheme} {TOKENS['edge-a']}"),)
                )
                assert st.model == "unused"
    finally:
        await srv.stop(grace=0)


def _rpc_error(exc) -> grpc.aio.AioRpcError:
    """What an edge receives when a coinfer server aborts with ``exc`` (or a bare status code)."""
    from coinfer.errors import status_of

    if isinstance(exc, grpc.StatusCode):
        return grpc.aio.AioRpcError(exc, grpc.aio.Metadata(), grpc.aio.Metadata(), "no details")
    st = status_of(exc)
    return grpc.aio.AioRpcError(st.code, grpc.aio.Metadata(), grpc.aio.Metadata(*st.trailing_metadata), st.details)


def test_which_cloud_errors_are_the_requests_fault():
    from coinfer.edge.failures import cloud_failed, failure_kind, request_fault
    from coinfer.errors import InvalidArgument, Reason, ResourceExhausted, Unavailable, error_info

    assert request_fault(_rpc_error(InvalidArgument("problem.prompt: required")))
    over = _rpc_error(ResourceExhausted("draft.text: 5000 chars > limit 4096"))
    assert request_fault(over) and error_info(over) == (Reason.OVER_LIMIT, {"field": "draft.text"})
    # the cloud's or the operator's problem: the user gets a local answer flagged with the reason
    full = _rpc_error(ResourceExhausted("sessions: 64 active, limit 64", reason=Reason.SESSIONS_FULL))
    assert (
        not request_fault(full) and failure_kind(full) == Reason.SESSIONS_FULL and not cloud_failed(failure_kind(full))
    )
    assert not request_fault(_rpc_error(grpc.StatusCode.UNAUTHENTICATED))
    draining = _rpc_error(Unavailable("server: draining for shutdown"))
    assert not request_fault(draining) and cloud_failed(failure_kind(draining))
    # decided on the reason, not on the text: a limit whose message happens to start like the full case
    assert request_fault(_rpc_error(ResourceExhausted("sessions: 3 drafts per session at most", field="drafts")))
    assert failure_kind(_rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED)) == Reason.DEADLINE


@pytest.mark.slow
async def test_a_refused_token_is_answered_locally_not_as_an_error(draft_engine):
    from coinfer.edge.pipeline import EdgePipeline, Plan
    from coinfer.edge.sampling import Sampling

    srv = await create_server(CloudConfig(engine=EngineConfig(model="unused"), auth_tokens=TOKENS))
    try:
        async with cloud_channel(f"127.0.0.1:{srv.port}", token="x" * 32) as ch:
            res = await EdgePipeline(draft_engine, ch).solve(
                "",
                "Explain why the sky is blue.",
                sampling=Sampling(n=2, max_new_tokens=8),
                plan=Plan.SPLIT,
                deadline_s=20,
            )
        assert res.source == "edge_only" and res.fallback_reason.startswith("UNAUTHENTICATED"), res.fallback_reason
        assert res.answer and res.drafts
    finally:
        await srv.stop(grace=0)
