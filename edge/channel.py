"""The edge's channel to the cloud: TLS (optionally mTLS) and its bearer token.

With TLS the token rides as gRPC call credentials. Without TLS gRPC refuses call
credentials (a token in clear text), so on a plaintext channel — loopback, or a
private link the operator vouches for — an interceptor adds the header instead.
"""

from __future__ import annotations

from pathlib import Path

import grpc


class _Token:
    def __init__(self, token: str) -> None:
        self._header = ("authorization", f"Bearer {token}")

    def _details(self, d: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        meta = grpc.aio.Metadata(*(d.metadata or ()), self._header)
        return grpc.aio.ClientCallDetails(d.method, d.timeout, meta, d.credentials, d.wait_for_ready)


# grpc.aio files an interceptor under the first of the four call kinds it subclasses,
# so each kind needs its own object
class _UU(_Token, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation, details, request):
        return await continuation(self._details(details), request)


class _US(_Token, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation, details, request):
        return await continuation(self._details(details), request)


class _SU(_Token, grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(self, continuation, details, request_iterator):
        return await continuation(self._details(details), request_iterator)


class _SS(_Token, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation, details, request_iterator):
        return await continuation(self._details(details), request_iterator)


def cloud_channel(
    target: str,
    token: str = "",
    tls_ca: str = "",
    tls_cert: str = "",
    tls_key: str = "",
    server_name: str = "",
    options: list[tuple[str, object]] | None = None,
) -> grpc.aio.Channel:
    """``target`` ("host:port"); TLS when ``tls_ca`` is given (client cert + key for mTLS)."""
    opts = list(options or [])
    if tls_ca:
        creds = grpc.ssl_channel_credentials(
            root_certificates=Path(tls_ca).read_bytes(),
            private_key=Path(tls_key).read_bytes() if tls_key else None,
            certificate_chain=Path(tls_cert).read_bytes() if tls_cert else None,
        )
        if token:
            creds = grpc.composite_channel_credentials(creds, grpc.access_token_call_credentials(token))
        if server_name:
            opts.append(("grpc.ssl_target_name_override", server_name))
        return grpc.aio.secure_channel(target, creds, options=opts)
    return grpc.aio.insecure_channel(
        target, options=opts, interceptors=[k(token) for k in (_UU, _US, _SU, _SS)] if token else None
    )
