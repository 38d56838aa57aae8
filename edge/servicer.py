"""Thin gRPC EdgeService over ``EdgeCore``: protobuf <-> domain types, errors mapped once."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import grpc

from coinfer import convert
from coinfer import types as t
from coinfer.chat import ChatMessage
from coinfer.edge.kinds import RequestedPlan
from coinfer.edge.service import Done, EdgeCore, SolveRequest
from coinfer.errors import InvalidArgument, ResourceExhausted, abort
from coinfer.v1 import coinfer_pb2 as pb
from coinfer.v1 import edge_pb2 as epb
from coinfer.v1 import edge_pb2_grpc as epb_grpc


def result_to_pb(done: Done) -> epb.SolveResult:
    info = done.info()
    msg = epb.SolveResult(answer=done.result.answer, **{k: v for k, v in info.items() if k != "fields"})
    msg.fields.update(convert.jsonable(info["fields"]))
    return msg


def solve_request(request: epb.SolveRequest) -> SolveRequest:
    p = request.problem
    return SolveRequest(
        prompt=p.prompt,
        task=p.task,
        rules=[convert.rule_from_pb(r) for r in p.rules],
        sampling=convert.from_pb(request.sampling, t.SamplingParams) if request.HasField("sampling") else None,
        num_drafts=request.num_drafts,
        plan=request.plan or RequestedPlan.AUTO,  # the wire's string: checked (and named if unknown) by the core
        deadline_ms=request.deadline_ms,
        request_id=request.request_id,
        messages=[ChatMessage(m.role, m.content) for m in p.messages],
        extraction=convert.extraction_from_pb(p.extraction),
    )


class EdgeServicer(epb_grpc.CoinferEdgeServicer):
    def __init__(self, core: EdgeCore) -> None:
        self.core = core

    async def Solve(
        self, request: epb.SolveRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[epb.SolveEvent]:
        try:
            req = await asyncio.to_thread(solve_request, request)  # rule params: up to MiBs of Struct, off the loop
            lifecycle = await self.core.begin(req)
            # closed with this handler, at once (a client gone): the request's run and cloud call end with it
            async with contextlib.aclosing(lifecycle.events()) as events:
                async for ev in events:
                    if isinstance(ev, Done):
                        yield epb.SolveEvent(result=result_to_pb(ev))
                    elif isinstance(ev, t.Draft):
                        yield epb.SolveEvent(draft=convert.to_pb(ev, pb.Draft))
                    elif isinstance(ev, t.Verdict):
                        yield epb.SolveEvent(verdict=convert.to_pb(ev, pb.Verdict))
                    elif isinstance(ev, t.AnswerChunk):
                        yield epb.SolveEvent(chunk=pb.AnswerChunk(text=ev.text, final=ev.final))
                    elif isinstance(ev, t.AnswerReset):
                        yield epb.SolveEvent(reset=pb.AnswerReset(reason=ev.reason))
        except Exception as exc:  # noqa: BLE001 - never crash the daemon
            if isinstance(exc, (InvalidArgument, ResourceExhausted)):  # the client's fault, by field
                self.core.metrics.bad_request(exc.field)
            await abort(context, exc)

    async def Status(self, request: epb.EdgeStatusRequest, context: grpc.aio.ServicerContext) -> epb.EdgeStatus:
        st = self.core.status()
        return epb.EdgeStatus(
            **{k: v for k, v in st.items() if k != "replicas"},
            replicas=[epb.ReplicaStatus(**r) for r in st["replicas"]],
        )
