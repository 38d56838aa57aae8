"""CloudCore around a scripted engine: a session's end updates the scheduler weights without holding the event
loop; a draft model identity past its limit is refused naming the field."""

from __future__ import annotations

import asyncio
import dataclasses
import fcntl
import threading

import pytest

from coinfer import types as t
from coinfer.cloud.config import CloudConfig, PolicyConfig
from coinfer.cloud.core import CloudCore
from coinfer.cloud.session import DraftsDone
from coinfer.errors import InvalidArgument
from tests.cloud.engines import RIGHT, ScriptedEngine, apples


async def _drafts():
    yield t.Draft(index=0, text=RIGHT, num_tokens=12, mean_logprob=-0.1, edge_ms=1.0)
    yield DraftsDone(1)


async def test_a_sessions_end_refits_the_weights_off_the_event_loop(tmp_path, monkeypatch):
    """Issue 51: the cloud took the state file's ``flock`` and fitted numpy on the event loop when a session
    ended. The lock is held until the loop has run something else: on the loop, that never happens, and every
    other session waits for the other replicas' updates."""
    order: list[str] = []
    ticked = threading.Event()
    real_flock = fcntl.flock

    def held_flock(f, op):
        order.append("lock")
        ticked.wait(timeout=30)  # a hang guard only: released at once when the loop runs
        order.append("locked")
        real_flock(f, op)

    async def another_session() -> None:
        while "lock" not in order:
            await asyncio.sleep(0.001)
        order.append("the loop ran")
        ticked.set()

    monkeypatch.setattr(fcntl, "flock", held_flock)
    cfg = CloudConfig(policy=PolicyConfig(learn_every=1), state_path=str(tmp_path / "weights.json"))
    core = CloudCore(cfg, ScriptedEngine({RIGHT: [-0.05] * 12}, reply=RIGHT))
    other = asyncio.create_task(another_session())
    events = [ev async for ev in core.session(apples(), _drafts())]
    await asyncio.wait_for(other, 30)
    assert isinstance(events[-1], t.Summary)
    assert order == ["lock", "the loop ran", "locked"] and core.learner.weights.sessions == 1


async def test_a_draft_model_identity_past_its_limit_is_refused_naming_the_field():
    core = CloudCore(CloudConfig(), ScriptedEngine({RIGHT: [-0.05] * 12}, reply=RIGHT))
    req = dataclasses.replace(apples(), draft_model="x" * 129)
    with pytest.raises(InvalidArgument, match="draft_model: 129 chars > 128"):
        _ = [ev async for ev in core.session(req, _drafts())]
    ok = dataclasses.replace(apples(), draft_model="sha256:" + "0" * 64)
    assert isinstance([ev async for ev in core.session(ok, _drafts())][-1], t.Summary)


def test_a_request_is_checked_on_the_loop_only_when_small_and_free_of_client_rules():
    """A thread hop costs more than checking a short preset request (``coinfer.serving.offload``); a client's
    rules or extraction compile at a cost it sets, and a long question parses for longer: both in a thread."""
    from coinfer.chat import ChatMessage
    from coinfer.extract import Extraction
    from coinfer.rules import Rule, request_check_size

    req = t.OpenRequest(request_id="r", task="arith", prompt="If x=3 and y=5, compute (x+y)^2-x*y.")
    assert request_check_size(req) == len(req.prompt)
    chat = t.OpenRequest(
        request_id="c", task="", prompt="", messages=[ChatMessage("user", "hi"), ChatMessage("assistant", "")]
    )
    assert request_check_size(chat) == 4  # every turn counts, an empty one too
    assert request_check_size(dataclasses.replace(req, rules=[Rule("regex", {"pattern": "a"})])) is None
    assert request_check_size(dataclasses.replace(req, extraction=Extraction(kind="marker", marker="x"))) is None
