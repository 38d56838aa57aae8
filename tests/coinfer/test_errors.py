"""coinfer.errors: the error kinds, their gRPC statuses with an ErrorInfo (reason, field), and a peer's
refusal read back from its ErrorInfo, never from its message text."""

from __future__ import annotations

import grpc
import pytest

from coinfer.errors import (
    CoinferError,
    DeadlineExceeded,
    InvalidArgument,
    Reason,
    ResourceExhausted,
    Unavailable,
    from_rpc,
    require,
    status_of,
)


def _rpc_error(exc: CoinferError) -> grpc.aio.AioRpcError:
    """``exc`` as a client sees it: the status a coinfer server sends for it."""
    status = status_of(exc)
    return grpc.aio.AioRpcError(
        status.code, grpc.aio.Metadata(), grpc.aio.Metadata(*status.trailing_metadata), status.details
    )


@pytest.mark.parametrize(
    "exc,code,reason",
    [
        (InvalidArgument("temperature: must be in [0, 2]"), grpc.StatusCode.INVALID_ARGUMENT, Reason.BAD_FIELD),
        (ResourceExhausted("prompt: 5000 chars > limit 2048"), grpc.StatusCode.RESOURCE_EXHAUSTED, Reason.OVER_LIMIT),
        (Unavailable("model: loading"), grpc.StatusCode.UNAVAILABLE, Reason.UNAVAILABLE),
        (DeadlineExceeded("deadline: passed"), grpc.StatusCode.DEADLINE_EXCEEDED, Reason.DEADLINE),
    ],
)
def test_each_kind_has_its_status_and_reason_and_survives_the_wire(exc, code, reason):
    assert (exc.code, exc.reason) == (code, reason)
    back = from_rpc(_rpc_error(exc))
    assert type(back) is type(exc) and (back.reason, back.field, back.message) == (reason, exc.field, exc.message)


def test_the_field_travels_in_the_error_info_not_in_the_message():
    # a message that leads with something else than its field: the field still arrives
    exc = ResourceExhausted("5000 chars is over the limit", field="draft.text")
    assert from_rpc(_rpc_error(exc)).field == "draft.text"
    # a status without an ErrorInfo (another server, a proxy) names no field, whatever its text says
    bare = grpc.aio.AioRpcError(
        grpc.StatusCode.INVALID_ARGUMENT, grpc.aio.Metadata(), grpc.aio.Metadata(), "temperature: bad"
    )
    refused = from_rpc(bare)
    assert isinstance(refused, InvalidArgument) and refused.field == "" and refused.reason is Reason.BAD_FIELD


def test_a_full_cloud_keeps_its_reason():
    back = from_rpc(_rpc_error(ResourceExhausted("sessions: 64 in use", reason=Reason.SESSIONS_FULL)))
    assert isinstance(back, ResourceExhausted) and back.reason is Reason.SESSIONS_FULL


def test_require_names_its_field_as_data():
    require(True, "plan", "never raised")
    with pytest.raises(InvalidArgument) as err:
        require(False, "sampling.top_p", "must be in (0, 1], got 0")
    assert err.value.field == "sampling.top_p" and err.value.message == "sampling.top_p: must be in (0, 1], got 0"
