"""The cloud's own answer racing the drafts (coinfer.cloud.hedge) around a scripted engine: begun where rounds
of the kind rarely hold a valid draft, it answers before a round still being drafted; a round with a valid
draft that closes first wins and the hedge's engine request stops; no hedge for the cloud plan, under heavy
load, or while the kind's rounds pay.

Sessions run on virtual time (tests/virtual_time.py): the engine's scripted delays, the rounds and the deadline
race exactly as written, however busy the machine."""

from __future__ import annotations

import asyncio

import pytest

from coinfer import types as t
from coinfer.cloud.config import CloudConfig, PolicyConfig
from coinfer.cloud.policy import ODDS_TAU_S, RoundOdds
from coinfer.cloud.rounds import request_kind
from coinfer.cloud.session import DraftsDone, Session
from coinfer.rules import RuleSet
from coinfer.tasks import OPEN, get_task
from tests.cloud.engines import LIKELIHOOD, RIGHT, WRONG, ScriptedEngine, apples
from tests.streams import shown
from tests.virtual_time import now, run

BAD = WRONG.replace("4 + 12 = 16", "4 + 12 / 7 = 16")
"""A draft the arithmetic rule refuses and no calculator repairs (its true value has no exact decimal)."""


ARITH = get_task("arith").problem("If x=3 and y=4, compute x*y+5.")
ARITH_RIGHT = get_task("arith").solve(ARITH.spec)
ARITH_BAD = ARITH_RIGHT.replace("=17", "=18").replace("answer 17", "answer 18")
ARITH_KW = {
    "req": t.OpenRequest(request_id="r", task="arith", prompt=ARITH.prompt),
    "task": get_task("arith"),
    "spec": ARITH.spec,
}
"""A preset session's request, task and spec: the rules decide."""


def _rules(req: t.OpenRequest, task=OPEN, spec=None) -> RuleSet:
    return RuleSet(req.rules, task, spec or {}, extraction=req.extraction)


def hopeless_odds(req: t.OpenRequest | None = None, task=OPEN, spec=None) -> RoundOdds:
    """Odds that saw rounds of ``req``'s kind (``apples()``) hold no valid draft many times, lately."""
    req = req or apples()
    odds = RoundOdds()
    for _ in range(30):
        odds.observe(request_kind(req, _rules(req, task, spec)), False)
    return odds


def session(
    engine: ScriptedEngine,
    odds: RoundOdds | None,
    *,
    load: float = 0.0,
    drafting: bool = True,
    req: t.OpenRequest | None = None,
    task=OPEN,
    spec=None,
    **policy,
):
    req = req or apples()
    return Session(
        cfg=CloudConfig(policy=PolicyConfig(**{**LIKELIHOOD, **policy})),
        engine=engine,
        req=req,
        task=task,
        spec=spec or {},
        rules=_rules(req, task, spec),
        recommended_drafts=5,
        deadline_s=10.0,
        load=load,
        round_odds=odds,
        drafting=drafting,
    )


def test_the_hopeless_kinds_hedge_answers_while_the_edge_is_still_drafting():
    engine = ScriptedEngine({}, reply=RIGHT)
    s = session(engine, hopeless_odds())
    still_drafting = asyncio.Event()  # never set: the round never closes
    read_after = []

    async def inbox():
        yield t.Draft(index=0, text=BAD, num_tokens=12, mean_logprob=-0.1, edge_ms=1.0)
        yield t.Draft(
            index=1, text=RIGHT, num_tokens=12, mean_logprob=-0.1, edge_ms=1.0
        )  # passes the rules: its scoring waits for the round's end
        await still_drafting.wait()
        read_after.append(True)  # pragma: no cover - the session must not wait for this
        yield DraftsDone(1)

    async def main():
        return await asyncio.wait_for(_collect(s.run(inbox())), 5.0)  # virtual: a session that waits fails at once

    events = run(main())
    summary = events[-1]
    assert isinstance(summary, t.Summary) and summary.answer == RIGHT and summary.source == t.AnswerSource.CLOUD
    assert "racing the drafts" in summary.trace
    assert shown(events) == RIGHT  # what the hedge wrote reached the session's stream, in order
    assert not any(isinstance(e, t.RetryAdvice) for e in events) and not read_after
    assert all(rid.startswith(s.ctx.key + "h-") for rid in engine.request_ids if "cloud" in rid)
    assert engine.scored == 0  # the hedge won before the round ended: the drafts cost the engine nothing
    verdicts = {v.draft_index: v for v in events if isinstance(v, t.Verdict)}
    assert set(verdicts) == {0, 1} and verdicts[1].error.startswith("not_scored")  # every draft read has one
    assert max(events.index(v) for v in verdicts.values()) < len(events) - 1  # before the Summary


def test_a_draft_the_rules_pass_where_they_decide_wins_and_stops_the_hedge():
    engine = ScriptedEngine({}, reply=ARITH_BAD + " and so on", delay_s=0.5)  # a slow cloud answer
    s = session(engine, hopeless_odds(**ARITH_KW), **ARITH_KW)

    async def inbox():
        yield t.Draft(index=0, text=ARITH_RIGHT, num_tokens=12, mean_logprob=-0.1, edge_ms=1.0)
        yield DraftsDone(1)

    events = run(_collect(s.run(inbox())))
    summary = events[-1]
    assert isinstance(summary, t.Summary) and summary.answer == ARITH_RIGHT
    assert summary.source == t.AnswerSource.DRAFT and shown(events) == ARITH_RIGHT  # nothing of the hedge shown
    assert s.hedge is not None and s.hedge.task.cancelled()
    assert engine.generated < len(ARITH_BAD.split(" ")) + 3  # its generation stopped part way


def test_drafts_that_need_the_llm_verifier_are_not_scored_while_the_hedge_answers():
    engine = ScriptedEngine({RIGHT: [-0.05] * 12}, reply=WRONG, delay_s=0.02)
    s = session(engine, hopeless_odds())

    async def inbox():
        yield t.Draft(
            index=0, text=RIGHT, num_tokens=12, mean_logprob=-0.1, edge_ms=1.0
        )  # the target would find it likely: never asked
        yield t.Draft(index=1, text=BAD, num_tokens=12, mean_logprob=-0.1, edge_ms=1.0)
        yield DraftsDone(2)

    events = run(_collect(s.run(inbox())))
    verdicts = {v.draft_index: v for v in events if isinstance(v, t.Verdict)}
    assert verdicts[0].error.startswith("not_scored: the cloud answered itself") and not verdicts[0].valid
    assert verdicts[1].failed_rule == "arithmetic"  # the rules still run, at once
    assert events[-1].answer == WRONG and events[-1].source == t.AnswerSource.CLOUD and engine.scored == 0


# the hedge streams a preset's right steps as it checks them: failing at "12+5=18" with no fix and no
# candidate allowed, its answer ends at its last good step (what it showed)
@pytest.mark.parametrize(("drafts_first", "answer"), [(True, ARITH_RIGHT), (False, ARITH_BAD.split(" ")[0])])
def test_a_hedge_that_fails_its_checks_waits_only_for_a_round_already_holding_a_valid_draft(drafts_first, answer):
    # a preset (the rules decide: a draft is valid once they pass it); the cloud's own answer fails them
    # (no fix, no candidate) and is written by 0.3 s. On virtual time (tests/virtual_time.py): the draft
    # arrives at 0 s or at 0.6 s and the round closes 1 s after it, whatever the machine's load
    engine = ScriptedEngine({}, reply=ARITH_BAD, delay_s=0.3 / len(ARITH_BAD.split(" ")))
    # (accept_first off: on, a draft the rules pass answers at once, round or no round)
    s = session(
        engine, hopeless_odds(**ARITH_KW), cloud_candidates=0, calculator_fixes=0, accept_first=False, **ARITH_KW
    )

    async def inbox():
        if not drafts_first:
            await asyncio.sleep(0.6)
        yield t.Draft(index=0, text=ARITH_RIGHT, num_tokens=12, mean_logprob=-0.1, edge_ms=1.0)
        await asyncio.sleep(1.0)  # the round closes long after the hedge ended
        yield DraftsDone(1)

    async def main():
        t0 = now()
        events = await _collect(s.run(inbox()))
        return events, now() - t0

    events, took = run(main())
    assert events[-1].answer == answer
    # a valid draft judged: the round's end answers (at 1 s); none yet: the hedge's answer at once, as soon as
    # its check failed (0.15 s: half its words), before the draft arrives (0.6 s)
    assert took == pytest.approx(1.0) if drafts_first else took < 0.6, took


def test_no_hedge_for_the_cloud_plan_under_heavy_load_or_while_rounds_pay():
    for odds, load, drafting in (
        (hopeless_odds(), 0.0, False),  # the cloud plan: no drafts to race
        (hopeless_odds(), 0.9, True),  # heavy load: a lost race wastes time others wait for
        (RoundOdds(), 0.0, True),  # no rounds seen yet
        (None, 0.0, True),
    ):
        engine = ScriptedEngine({}, reply=RIGHT)
        s = session(engine, odds, load=load, drafting=drafting)

        async def inbox():
            yield t.Draft(index=0, text=BAD, num_tokens=12, mean_logprob=-0.1, edge_ms=1.0)
            yield DraftsDone(1)

        run(_collect(s.run(inbox()) if drafting else s.run(_none())))
        assert s.hedge is None, (load, drafting)
    s = session(ScriptedEngine({}, reply=RIGHT), hopeless_odds(), hedge_below_odds=0.0)
    run(_collect(s.run(_none())))
    assert s.hedge is None


def test_hopeless_needs_enough_misses_and_a_hedged_kind_is_waited_for_again_as_its_evidence_fades():
    now = [0.0]
    odds = RoundOdds(clock=lambda: now[0])
    kind = ("sha256:draft", "", ())
    assert not odds.rare(kind, 0.25)  # never seen: every rate equally likely
    for _ in range(3):
        odds.observe(kind, False)
    assert not odds.rare(kind, 0.25) and odds.odds(kind) < 0.25  # 3 misses: poor, but could be bad luck
    misses = 3
    while not odds.rare(kind, 0.25):
        odds.observe(kind, False)
        misses += 1
    assert 5 < misses < 20 and not odds.rare(kind, 0.0)  # 0: off
    # hedged, its rounds are not counted: the evidence fades until the kind is waited for (and counted) again
    now[0] += ODDS_TAU_S
    assert not odds.rare(kind, 0.25)
    for _ in range(20):
        odds.observe(kind, True)
    assert not odds.rare(kind, 0.25) and odds.odds(kind) > 0.5  # the drafts got better


async def _none():
    return
    yield  # pragma: no cover


async def _collect(events) -> list:
    return [ev async for ev in events]


def test_a_hopeless_kind_whose_evidence_faded_waits_for_its_round_and_counts_it():
    now = [0.0]
    odds = RoundOdds(clock=lambda: now[0])
    req = apples()
    kind = request_kind(req, _rules(req))
    for _ in range(30):
        odds.observe(kind, False)
    now[0] += 2 * ODDS_TAU_S  # no session of the kind was waited for since: too uncertain to hedge now
    engine = ScriptedEngine({}, reply=RIGHT)
    s = session(engine, odds)

    async def inbox():
        yield t.Draft(index=0, text=BAD, num_tokens=12, mean_logprob=-0.1, edge_ms=1.0)
        yield DraftsDone(1)

    before = odds.odds(kind)
    events = run(_collect(s.run(inbox())))
    assert s.hedge is None and events[-1].answer == RIGHT
    assert odds.odds(kind) < before  # the round was counted: a miss, the kind is known poor again


class _FailsOnce(ScriptedEngine):
    """Its first generation fails (the hedge's); the rest answer ``reply``."""

    async def generate(self, prompt, params, request_id):
        if not self.request_ids:
            self.request_ids.append(request_id)
            raise RuntimeError("engine hiccup")
        async for chunk in super().generate(prompt, params, request_id):
            yield chunk


def test_a_hedge_that_failed_on_an_error_leaves_the_session_to_answer_without_it(caplog):
    engine = _FailsOnce({}, reply=RIGHT)
    s = session(engine, hopeless_odds())

    async def inbox():
        await asyncio.sleep(0.05)  # the hedge has failed by now
        yield t.Draft(index=0, text=BAD, num_tokens=12, mean_logprob=-0.1, edge_ms=1.0)
        yield DraftsDone(1)

    events = run(_collect(s.run(inbox())))
    assert isinstance(events[-1], t.Summary) and events[-1].answer == RIGHT and shown(events) == RIGHT
    assert "racing the drafts" not in events[-1].trace and "the hedge failed" in caplog.text


def _hedged_share(hits: str, sessions: int = 600, every_s: float = 1.0) -> tuple[float, float]:
    """Sessions of a kind, one every ``every_s`` seconds, whose rounds, when waited for, hold a valid draft as
    ``hits`` says in turn ("x": one did), the first three missing by chance: the share the cloud hedged over
    all sessions, and over the last half (a hedged session's round is not observed)."""
    now = [0.0]
    odds, kind, hedged, seen = RoundOdds(clock=lambda: now[0]), ("sha256:draft", "", ()), [], 0
    for _ in range(3):
        odds.observe(kind, False)
    for _ in range(sessions):
        now[0] += every_s
        hedged.append(odds.rare(kind, 0.25))
        if not hedged[-1]:
            odds.observe(kind, hits[seen % len(hits)] == "x")
            seen += 1
    return sum(hedged) / sessions, sum(hedged[sessions // 2 :]) / (sessions - sessions // 2)


def test_a_kind_whose_first_rounds_missed_by_chance_is_not_hedged_and_a_hopeless_one_mostly_is():
    # the words problems' drafts: valid in ~40% of first rounds; three misses made them hopeless for good
    # under counting rules (23-29 of 30 sessions hedged)
    assert _hedged_share("..x.x")[0] == 0.0
    every, late = _hedged_share("." * 19 + "x")  # a hopeless pair (1 in 20), a session a second
    assert every > 0.8 and 0.0 < 1.0 - late < 0.1  # hedged, bar a few sessions that keep its odds measured
