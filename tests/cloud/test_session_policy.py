"""The session's answer policy around a scripted engine (logic only; the real vLLM path is tested in
test_service.py): a verified draft accepted as is, refinement when the target doubts a token, and
the cloud's own answer never refused by the likelihood threshold."""

from __future__ import annotations

import asyncio

from cloud.config import CloudConfig
from cloud.engine import Chunk, EngineStats, GenParams, TargetEngine
from cloud.session import DraftsDone, Session
from coinfer import types as t
from coinfer.extract import Extraction
from coinfer.rules import Rule, RuleSet
from coinfer.tasks import OPEN

RIGHT = "Tom buys 3 * 4 = 12 apples.\nNow he has 5 + 12 = 17 apples.\nAnswer: 17"
WRONG = "Tom buys 3 * 4 = 12 apples.\nNow he has 4 + 12 = 16 apples.\nAnswer: 16"


class ScriptedEngine(TargetEngine):
    """Logprobs per continuation from a table; every generation answers ``reply``."""

    def __init__(self, logprobs: dict[str, list[float]], reply: str) -> None:
        self.logprobs, self.reply, self.generated = logprobs, reply, 0

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    async def generate(self, prompt: str, params: GenParams, request_id: str):
        for word in self.reply.split(" "):
            self.generated += 1
            yield Chunk(word + " ", 1)

    async def sample(self, prompt: str, params: GenParams, n: int, request_id: str) -> list[Chunk]:
        self.generated += n
        return [Chunk(self.reply, 1) for _ in range(n)]

    async def continuation_logprobs(self, prompt: str, continuation: str, request_id: str) -> list[float]:
        return self.logprobs.get(continuation, [-5.0] * 8)

    async def judge(self, prompt: str, schema: dict, max_tokens: int, request_id: str) -> str:
        raise NotImplementedError

    async def abort(self, request_id: str) -> None:
        return None

    async def check_health(self) -> None:
        return None

    def stats(self) -> EngineStats:
        return EngineStats(running=0, max_num_seqs=8, ready=True)

    @property
    def max_model_len(self) -> int:
        return 4096


def _session(engine: TargetEngine) -> Session:
    req = t.OpenRequest(request_id="r", task="", prompt="Tom has 5 apples and buys 3 bags of 4. How many?",
                        rules=[Rule("arithmetic")], extraction=Extraction("marker"))
    rules = RuleSet(req.rules, OPEN, {}, extraction=req.extraction)
    return Session(CloudConfig(), engine, req, OPEN, {}, rules, recommended_drafts=5, deadline_s=10.0)


async def _run(session: Session, drafts: list[str]) -> list:
    async def inbox():
        for i, text in enumerate(drafts):
            yield t.Draft(i, text, 12, -0.1, 1.0)
        yield DraftsDone(len(drafts))

    return [ev async for ev in session.run(inbox())]


def test_a_likely_draft_the_drafts_agree_on_is_accepted_as_is():
    engine = ScriptedEngine({RIGHT: [-0.05] * 12, WRONG: [-0.05] * 11 + [-6.0]}, reply="unused")
    events = asyncio.run(_run(_session(engine), [RIGHT, RIGHT + " ", WRONG]))
    summary = events[-1]
    assert isinstance(summary, t.Summary) and summary.refine_mode == "accepted"
    assert summary.answer == RIGHT and summary.source == t.AnswerSource.DRAFT
    assert summary.timings.decode_tokens == 0 and engine.generated == 0
    assert "".join(e.text for e in events if isinstance(e, t.AnswerChunk)) == RIGHT


def test_a_draft_with_one_token_the_target_doubts_is_refined():
    # mean logprob -0.38 passes the threshold, but one token at -4 is a number the target would not write
    engine = ScriptedEngine({WRONG: [-0.05] * 11 + [-4.0]}, reply=RIGHT)
    summary = asyncio.run(_run(_session(engine), [WRONG]))[-1]
    assert summary.refine_mode == "candidates" and engine.generated > 0


def test_the_clouds_own_answer_is_not_refused_by_the_likelihood_threshold():
    # every draft fails the rules; the target's greedy answer scores low (free prose would), yet it is its own
    engine = ScriptedEngine({RIGHT: [-2.0] * 12}, reply=RIGHT)
    session = _session(engine)
    session.cfg.policy.max_retries = 0
    summary = asyncio.run(_run(session, ["Tom buys 3 * 4 = 13 apples.\nAnswer: 13"]))[-1]
    assert summary.refine_mode == "alone" and summary.answer_valid
    assert engine.generated == len(RIGHT.split(" "))  # greedy only: no candidates were sampled
