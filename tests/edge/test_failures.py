"""Cloud failures as the edge classifies them (pure logic)."""

import grpc

from coinfer.edge.failures import cloud_failed, request_fault


def test_capacity_and_deadlines_do_not_count_against_the_cloud():
    from coinfer.edge.failures import failure_kind
    from coinfer.errors import Reason

    assert not cloud_failed(Reason.SESSIONS_FULL) and not cloud_failed(Reason.DEADLINE)
    assert not cloud_failed(failure_kind(TimeoutError()))  # the edge's own wait for the request's deadline
    assert cloud_failed(Reason.UNAVAILABLE) and cloud_failed(failure_kind(ConnectionError("stream ended")))
    bad = grpc.aio.AioRpcError(
        grpc.StatusCode.INVALID_ARGUMENT, grpc.aio.Metadata(), grpc.aio.Metadata(), "request_id: at most 128 chars"
    )
    assert request_fault(bad)


def test_a_failures_kind_is_a_reason_and_its_status_is_kept_apart():
    from coinfer.edge.failures import failure_kind, failure_status
    from coinfer.edge.kinds import FallbackKind
    from coinfer.errors import Reason, ResourceExhausted, status_of

    def rpc(code, details="x", trailing=()):
        return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(*trailing), details)

    broken = rpc(grpc.StatusCode.INTERNAL, "Internal error from Core")  # no ErrorInfo: a broken transport
    assert failure_kind(broken) is FallbackKind.TRANSPORT and failure_status(broken) == "INTERNAL"
    gone = rpc(grpc.StatusCode.UNAVAILABLE)  # no ErrorInfo either: a status name is not a reason
    assert failure_kind(gone) is FallbackKind.TRANSPORT and failure_status(gone) == "UNAVAILABLE"
    full = status_of(ResourceExhausted("sessions: full", reason=Reason.SESSIONS_FULL))
    full = rpc(full.code, full.details, full.trailing_metadata)
    assert failure_kind(full) is FallbackKind.SESSIONS_FULL and not cloud_failed(failure_kind(full))
    assert failure_kind(rpc(grpc.StatusCode.DEADLINE_EXCEEDED)) is FallbackKind.DEADLINE
    assert failure_kind(TimeoutError()) is FallbackKind.DEADLINE and failure_status(TimeoutError()) == ""
    assert failure_kind(ConnectionError("no summary")) is FallbackKind.UNAVAILABLE
    assert cloud_failed(FallbackKind.TRANSPORT) and not cloud_failed(FallbackKind.CIRCUIT_OPEN)
