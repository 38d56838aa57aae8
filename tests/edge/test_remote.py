"""Pure logic of the split plan's cloud session (the session itself runs against real engines in tests/integration)."""

import asyncio

from coinfer import types as t
from coinfer.edge.remote import SplitSession, follow_advice
from coinfer.edge.sampling import Sampling
from coinfer.v1 import coinfer_pb2 as pb


def test_retry_advice_changes_exploration_and_keeps_the_users_limits():
    mine = Sampling(temperature=0.0, max_new_tokens=24, seed=7, stop=("\n\n",), n=3)
    advice = t.RetryAdvice(
        attempt=1,
        num_drafts=6,
        sampling=t.SamplingParams(
            temperature=0.6, top_p=0.9, presence_penalty=0.4, frequency_penalty=0.2, max_new_tokens=256
        ),
        reason="regex_failed x3",
    )
    nxt = follow_advice(mine, advice)
    assert (nxt.n, nxt.temperature, nxt.top_p, nxt.presence_penalty, nxt.frequency_penalty) == (6, 0.6, 0.9, 0.4, 0.2)
    assert (nxt.max_new_tokens, nxt.seed, nxt.stop) == (24, 7, ("\n\n",))  # the user's budget, seed and stops
    roomy = follow_advice(Sampling(max_new_tokens=1000, n=3), advice)
    assert roomy.max_new_tokens == 256  # and never more than the cloud advises


class _Call:
    """A stand-in for a grpc.aio stream call: each write takes a while; what happened is recorded in order."""

    def __init__(self) -> None:
        self.log: list[str] = []
        self.begun = asyncio.Event()

    async def write(self, msg) -> None:
        self.log.append("write begun")
        self.begun.set()
        await asyncio.sleep(0.05)
        self.log.append("write done")

    async def done_writing(self) -> None:
        self.log.append("half-closed")


def _session(call: _Call) -> SplitSession:
    req = t.OpenRequest(request_id="r", task="", prompt="Why is the sky blue?", deadline_ms=10_000)
    s = SplitSession(
        pipe=None, call=call, req=req, task_prompt=req.prompt, emit=lambda ev: None, t0=0.0, result=None, written=None
    )
    s.accepted.set()
    return s


async def test_the_summary_half_closes_after_the_write_under_way_which_is_never_cut():
    """Cancelled half-way, a grpc.aio write leaves its operation pending in gRPC's core and the half-close
    after it fails: the round stops, the write under way ends, then the edge half-closes and writes no more."""
    call = _Call()
    s = _session(call)

    async def round_of_drafts() -> None:
        for _ in range(5):
            await s.write(pb.EdgeMessage())

    writer = asyncio.create_task(round_of_drafts())
    await call.begun.wait()  # the first write is under way when the Summary is read
    await s.half_close(writer)
    assert call.log == ["write begun", "write done", "half-closed"] and writer.cancelled()
    await s.write(pb.EdgeMessage())  # closed: nothing more goes out
    assert call.log[-1] == "half-closed"


async def test_a_round_whose_drafting_fails_half_closes_at_once_so_the_cloud_answers_from_what_it_has():
    # before: the round never sent DraftsDone and the cloud waited for it until its deadline (60 s)
    call = _Call()
    s = _session(call)

    async def failing_round() -> None:
        await s.write(pb.EdgeMessage())
        raise RuntimeError("the draft engine failed")

    writer = s._writer(failing_round())
    await asyncio.gather(writer, return_exceptions=True)
    await s._half_closing
    assert call.log == ["write begun", "write done", "half-closed"] and s.closed
