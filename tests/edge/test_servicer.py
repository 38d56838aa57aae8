"""The edge's gRPC Solve handler around its core (a stand-in core: no model, no cloud; the service itself runs
against real engines in tests/edge/test_daemon.py)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from coinfer import types as t
from coinfer.edge.servicer import EdgeServicer
from coinfer.v1 import coinfer_pb2 as pb
from coinfer.v1 import edge_pb2 as epb


async def test_a_closed_solve_closes_the_requests_events_before_its_close_returns():
    """grpc.aio drops a streaming handler cancelled while it writes (a client gone) without closing it; when it
    is closed (or finalized), the request's events close with it, their run and cloud call cancelled, not
    when the garbage collector finds the core's generator."""
    log: list[str] = []

    async def events():  # stands in for the request's run: a draft, then a cloud still answering
        try:
            yield t.Draft(index=0, text="3+5=8", num_tokens=3)
            await asyncio.Event().wait()
        finally:
            log.append("events closed")

    async def begin(req):  # the request's lifecycle
        return SimpleNamespace(events=events)

    servicer = EdgeServicer(SimpleNamespace(begin=begin))
    request = epb.SolveRequest(problem=pb.Problem(prompt="If x=3 and y=5, compute x+y."))
    handler = servicer.Solve(request, context=None)
    first = await anext(handler)
    await handler.aclose()
    log.append("handler closed")
    assert first.HasField("draft") and log == ["events closed", "handler closed"]
