"""The session's answer policy around a scripted engine (logic only; the real vLLM path is tested in
test_service.py): a verified draft accepted as is, refinement when the target doubts a token, the
cloud's own answer never refused by the likelihood threshold, a refinement that never makes an
agreed answer worse, and the finish reason of whichever text is the answer.

Sessions run on virtual time (tests/virtual_time.py): the engine's scripted delays, the rounds and the deadline
race exactly as written, however busy the machine."""

from __future__ import annotations

import pytest

from coinfer import types as t
from coinfer.cloud.config import CloudConfig, PolicyConfig
from coinfer.cloud.engine import Chunk, GenParams, TargetEngine
from coinfer.cloud.session import DraftsDone, Session
from coinfer.extract import Extraction
from coinfer.rules import Rule, RuleSet
from coinfer.tasks import OPEN
from tests.cloud.engines import LIKELIHOOD, RIGHT, WRONG, Replies, ScriptedEngine, apples, apples_by_pattern
from tests.streams import shown as _shown
from tests.virtual_time import now, run

UNREPAIRABLE = "Tom buys 3 * 4 / 7 = 13 apples.\nAnswer: 13"
"""A draft the arithmetic rule refuses and no calculator repairs (12 / 7 has no exact decimal)."""


def _make(
    engine: TargetEngine,
    req: t.OpenRequest,
    task=OPEN,
    spec: dict | None = None,
    rules: RuleSet | None = None,
    *,
    deadline_s: float = 10.0,
    round_odds=None,
    **policy,
) -> Session:
    """A session of ``req`` on ``engine``; ``policy``: PolicyConfig fields that differ from the defaults."""
    spec = {} if spec is None else spec
    return Session(
        cfg=CloudConfig(policy=PolicyConfig(**{**LIKELIHOOD, **policy})),
        engine=engine,
        req=req,
        task=task,
        spec=spec,
        rules=rules if rules is not None else RuleSet(req.rules, task, spec, extraction=req.extraction),
        recommended_drafts=5,
        deadline_s=deadline_s,
        round_odds=round_odds,
    )


def _session(engine: TargetEngine, *, rules: RuleSet | None = None, **kw) -> Session:
    return _make(engine, apples(kw.pop("refine", None)), rules=rules, **kw)


async def _run(session: Session, drafts: list[str], truncated: bool = False) -> list:
    async def inbox():
        for i, text in enumerate(drafts):
            yield t.Draft(index=i, text=text, num_tokens=12, mean_logprob=-0.1, edge_ms=1.0, truncated=truncated)
        yield DraftsDone(len(drafts))

    return [ev async for ev in session.run(inbox())]


async def _collect(events) -> list:
    return [ev async for ev in events]


def test_a_likely_draft_the_drafts_agree_on_is_accepted_as_is():
    engine = ScriptedEngine({RIGHT: [-0.05] * 12, WRONG: [-0.05] * 11 + [-6.0]}, reply="unused")
    events = run(_run(_session(engine), [RIGHT, RIGHT + " ", WRONG]))
    summary = events[-1]
    assert isinstance(summary, t.Summary) and summary.refine_mode == "accepted"
    assert summary.answer == RIGHT and summary.source == t.AnswerSource.DRAFT
    assert summary.timings.decode_tokens == 0 and engine.generated == 0
    assert "".join(e.text for e in events if isinstance(e, t.AnswerChunk)) == RIGHT


def test_a_draft_with_one_token_the_target_doubts_is_not_the_answer():
    # mean logprob -0.38 passes the threshold, but one token at -4 (a number the target would not write)
    # scores it 0.68:
    # under the arithmetic rule the cloud writes its own checked answer; where that answer cannot stream checked
    # step by step (its answer read by a pattern), it refines from candidates
    engine = ScriptedEngine({WRONG: [-0.05] * 11 + [-4.0]}, reply=RIGHT)
    summary = run(_run(_session(engine), [WRONG]))[-1]
    assert summary.refine_mode == "alone" and summary.answer == RIGHT and engine.generated > 0
    assert "best draft not as is (score 0.68 < 0.90)" in summary.trace
    engine = ScriptedEngine({WRONG: [-0.05] * 11 + [-4.0]}, reply=RIGHT)
    summary = run(_run(_make(engine, apples_by_pattern()), [WRONG]))[-1]
    assert summary.refine_mode == "candidates" and engine.generated > 0


def test_the_clouds_own_answer_is_not_refused_by_the_likelihood_threshold():
    # every draft fails the rules; the target's greedy answer scores low (free prose would), yet it is its own
    engine = ScriptedEngine({RIGHT: [-2.0] * 12}, reply=RIGHT)
    session = _session(engine, max_retries=0)
    summary = run(_run(session, [UNREPAIRABLE]))[-1]
    assert summary.refine_mode == "alone" and summary.answer_valid
    assert engine.generated == len(RIGHT.split(" "))  # greedy only: no candidates were sampled


def _refining(engine: ScriptedEngine, **kw) -> Session:
    # never accept as is: always refine, from the drafts as candidates (the answer read by a pattern: the cloud's
    # own answer cannot stream checked step by step, so it does not answer in their place)
    return _make(engine, apples_by_pattern(kw.pop("refine", None)), accept_min_score=2.0, **kw)


def test_a_refinement_that_contradicts_agreeing_drafts_is_refused():
    # two drafts agree on 17; the refinement says 16 and the target finds it less likely than them
    right2 = RIGHT.replace("Tom", "Tom then")
    engine = ScriptedEngine({RIGHT: [-0.1] * 12, right2: [-0.1] * 12, WRONG: [-0.3] * 12}, reply=WRONG)
    summary = run(_run(_refining(engine), [RIGHT, right2]))[-1]
    assert summary.answer in (RIGHT, right2)
    assert summary.source == t.AnswerSource.DRAFT and summary.fields["answer"] == 17
    assert "contradicts" in summary.trace


def test_a_rejected_refinement_withdraws_what_it_streamed():
    right2 = RIGHT.replace("Tom", "Tom then")
    engine = ScriptedEngine({RIGHT: [-0.1] * 12, right2: [-0.1] * 12, WRONG: [-0.3] * 12}, reply=WRONG)
    events = run(_run(_refining(engine), [RIGHT, right2]))
    resets = [e for e in events if isinstance(e, t.AnswerReset)]
    assert len(resets) == 1 and resets[0].reason.startswith("refinement rejected: contradicts")
    assert "".join(e.text for e in events[: events.index(resets[0])] if isinstance(e, t.AnswerChunk)) == WRONG
    assert _shown(events) == events[-1].answer != WRONG
    # an accepted refinement streams once, no reset
    events = run(_run(_refining(ScriptedEngine({RIGHT: [-0.1] * 12}, reply=RIGHT)), [RIGHT]))
    assert not any(isinstance(e, t.AnswerReset) for e in events) and _shown(events) == events[-1].answer


def test_a_refinement_the_target_clearly_prefers_overrides_agreeing_drafts():
    wrong2 = WRONG.replace("Tom", "Tom then")
    engine = ScriptedEngine({WRONG: [-0.45] * 12, wrong2: [-0.45] * 12, RIGHT: [-0.05] * 12}, reply=RIGHT)
    summary = run(_run(_refining(engine), [WRONG, wrong2]))[-1]
    assert summary.source == t.AnswerSource.REFINED and summary.fields["answer"] == 17


def test_a_refinement_agreeing_with_the_drafts_needs_no_override():
    right2, refined = RIGHT.replace("Tom", "Tom then"), RIGHT.replace("Tom", "So Tom")
    engine = ScriptedEngine({RIGHT: [-0.1] * 12, right2: [-0.1] * 12, refined: [-0.2] * 12}, reply=refined)
    summary = run(_run(_refining(engine), [RIGHT, right2]))[-1]
    assert summary.source == t.AnswerSource.REFINED


def test_the_refinement_drops_a_copied_candidate_label_and_refuses_copied_scaffolding():
    engine = ScriptedEngine({RIGHT: [-0.1] * 12}, reply="(1) " + RIGHT)
    summary = run(_run(_refining(engine), [RIGHT]))[-1]
    assert summary.source == t.AnswerSource.REFINED and summary.answer == RIGHT

    leak = "Candidate solutions (they may contain mistakes):\n" + RIGHT
    engine = ScriptedEngine({RIGHT: [-0.1] * 12}, reply=leak)
    summary = run(_run(_refining(engine), [RIGHT]))[-1]
    assert summary.source == t.AnswerSource.DRAFT and "scaffolding" in summary.trace


def test_finish_reason_is_that_of_the_text_returned():
    # a refinement cut at its budget: "length"
    engine = ScriptedEngine({RIGHT: [-0.1] * 12}, reply=RIGHT, finish="length")
    assert run(_run(_refining(engine), [RIGHT]))[-1].finish_reason == "length"
    # a truncated draft accepted as is where the request's answer budget is the draft's own: "length";
    # a finished one: "stop"
    engine = ScriptedEngine({RIGHT: [-0.05] * 12}, reply="unused")
    same_budget = _session(engine, refine=t.SamplingParams(max_new_tokens=12))
    assert run(_run(same_budget, [RIGHT, RIGHT + " "], truncated=True))[-1].finish_reason == "length"
    assert run(_run(_session(engine), [RIGHT, RIGHT + " "]))[-1].finish_reason == "stop"


def test_a_finished_draft_is_chosen_over_a_truncated_one_of_any_score():
    ramble = "L'Etoile, la Cite, la Bastille, Paris, la cite, la region, la culture, les pays que le monde ne"
    engine = ScriptedEngine({RIGHT: [-0.2] * 12, ramble: [-0.01] * 12}, reply="unused")
    session = _session(engine, rules=RuleSet([], OPEN, {}))  # free text: no rule tells them apart

    async def inbox():
        yield t.Draft(index=0, text=ramble, num_tokens=64, mean_logprob=-0.01, edge_ms=1.0, truncated=True)
        yield t.Draft(index=1, text=RIGHT, num_tokens=12, mean_logprob=-0.2, edge_ms=1.0)
        yield DraftsDone(2)

    summary = run(_collect(session.run(inbox())))[-1]
    assert summary.answer == RIGHT and summary.finish_reason == "stop"


def test_a_draft_cut_at_the_draft_budget_is_continued_to_the_answers_own():
    """Drafts get 256 tokens, the cloud's answer 512: a good draft cut at its budget is continued by the
    target (only the rest decoded), not returned cut where the target's own answer would go on."""
    engine = ScriptedEngine({RIGHT: [-0.05] * 12}, reply=" That is all.")
    events = run(_run(_session(engine), [RIGHT, RIGHT + " "], truncated=True))
    summary = events[-1]
    assert summary.answer == RIGHT + " That is all." and summary.finish_reason == "stop"
    assert summary.refine_mode == "prefix" and "continued by the target" in summary.trace
    assert engine.generated == len(" That is all.".split(" ")) and _shown(events) == summary.answer  # the rest only
    # a continuation that fails the rules is dropped: the draft as it stands, cut ("length")
    engine = ScriptedEngine({RIGHT: [-0.05] * 12}, reply=" and 2 + 2 = 5")
    summary = run(_run(_session(engine), [RIGHT, RIGHT + " "], truncated=True))[-1]
    assert summary.answer == RIGHT and summary.finish_reason == "length" and "continuation failed" in summary.trace


def test_the_deadline_returns_the_best_verified_draft_instead_of_an_error():
    engine = ScriptedEngine({RIGHT: [-0.1] * 12}, reply=RIGHT, delay_s=1.0)  # a refinement of ~12 s
    session = _refining(engine, deadline_s=0.8)

    async def timed() -> tuple[list, float]:
        t0 = now()
        return await _run(session, [RIGHT]), now() - t0

    events, took = run(timed())  # virtual time (tests/virtual_time.py): exact, whatever the machine's load
    summary = events[-1]
    assert took == pytest.approx(0.8)  # bounded by the deadline, not by the refinement
    assert summary.refine_mode == "deadline" and summary.answer == RIGHT and summary.source == t.AnswerSource.DRAFT
    assert _shown(events) == RIGHT  # the unfinished refinement's words are withdrawn


def test_the_likelihood_threshold_is_relative_to_the_draft_models_own_confidence():
    """Free prose scores far below a formulaic answer: a draft the target finds as likely as the draft
    model did passes at -1.1; one it finds far less likely fails; the floor bounds a claimed own value."""
    prose = "Autumn wind carries leaves across the quiet road; the year lets them go. Answer: 17"
    engine = ScriptedEngine({prose: [-1.1] * 12}, reply="unused")

    async def one(own: float) -> t.Verdict:
        async def inbox():
            yield t.Draft(index=0, text=prose, num_tokens=12, mean_logprob=own, edge_ms=1.0)
            yield DraftsDone(1)

        s = _session(engine, max_retries=0)
        return [ev async for ev in s.run(inbox()) if isinstance(ev, t.Verdict)][0]

    assert run(one(-0.9)).valid  # the draft model was about as sure: natural text
    bad = run(one(-0.1))  # the draft model was sure, the target is not
    assert not bad.valid and bad.error.startswith("low_likelihood")


def test_cloud_candidates_continue_the_greedy_answers_own_right_steps():
    # no draft is valid; the target's greedy answer slips at its last step: the candidates are sampled
    # after the steps it got right (fewer tokens, right steps kept)
    from coinfer.tasks import TASKS

    arith = TASKS["arith"]
    spec = arith.parse_problem("If x=3 and y=5, compute (x+y)^2-x*y.")

    class Candidates(ScriptedEngine):
        async def sample(self, prompt: str, params: GenParams, n: int, request_id: str) -> list[Chunk]:
            self.prompts.append(prompt)
            return [Chunk(" 64-15=49; answer 49", 3) for _ in range(n)]

    engine = Candidates({}, reply="3+5=8; 8^2=64; 3*5=15; 64-15=48; answer 48")
    req = t.OpenRequest(request_id="r", task="arith", prompt="If x=3 and y=5, compute (x+y)^2-x*y.")
    # candidates alone (the corrections: below); a rule only the whole answer can satisfy holds it whole
    # (the preset's own rules alone stream it step by step: tests/cloud/test_alone.py)
    rules = RuleSet([*arith.default_rules(spec), Rule("regex", {"pattern": "answer"})], arith, spec)
    session = _make(engine, req, arith, spec, rules, max_retries=0, calculator_fixes=0)
    events = run(_run(session, ["3+5=9; answer 9"]))
    summary = events[-1]
    assert _shown(events) == summary.answer  # the greedy answer streamed first is withdrawn
    assert len(engine.prompts) == 2 and engine.prompts[1].endswith("3+5=8; 8^2=64; 3*5=15;")  # greedy, then sampled
    assert summary.answer == "3+5=8; 8^2=64; 3*5=15; 64-15=49; answer 49" and summary.answer_valid
    assert summary.refine_mode == "alone"  # no draft step was right: the drafts gave nothing


def test_a_wrong_computed_value_in_the_clouds_answer_is_corrected_and_the_target_continues():
    slip = "Tom buys 3 * 4 = 12 apples.\nNow he has 5 + 12 = 16 apples.\nAnswer: 16"
    engine = Replies([slip, ".\nAnswer: 17"])
    session = _session(engine, max_retries=0)
    events = run(_run(session, [UNREPAIRABLE]))
    summary = events[-1]
    # the true value and the target's next word, then the target goes on
    assert engine.prompts[1].endswith("Now he has 5 + 12 = 17 apples")
    assert summary.answer == "Tom buys 3 * 4 = 12 apples.\nNow he has 5 + 12 = 17 apples.\nAnswer: 17"
    assert summary.answer_valid and "a computed value corrected" in summary.trace
    # checked step by step before the Answer: marker, the wrong step was never shown: nothing withdrawn
    assert not any(isinstance(e, t.AnswerReset) for e in events) and _shown(events) == summary.answer


def test_a_drafts_slip_on_a_sum_is_corrected_into_the_prefix_the_target_continues():
    from coinfer.tasks import TASKS

    select = TASKS["select"]
    prompt = "Pick 2 of A(4,9) B(3,6) C(8,2) D(1,8) with cost<=8."
    spec = select.parse_problem(prompt)
    rest = " AD 5:17; BC 11>8; BD 4:14; CD 9>8; answer A,D"
    engine = Replies([rest])
    req = t.OpenRequest(request_id="r", task="select", prompt=prompt)
    session = _make(engine, req, select, spec, RuleSet(select.default_rules(spec), select, spec), max_retries=0)
    # the draft's first step has the wrong cost (7 is right): the cloud starts after its steps, repaired
    summary = run(_run(session, ["AB 8:15; AC 12>8; answer A,B"]))[-1]
    assert engine.prompts[0].endswith("AB 7:15; AC 12>8;")
    assert summary.answer == "AB 7:15; AC 12>8;" + rest and summary.answer_valid and summary.refine_mode == "prefix"
    # no repair: its first step corrected, the rest the target's
    engine = Replies([" AC 12>8;" + rest])
    session = _make(
        engine, req, select, spec, RuleSet(select.default_rules(spec), select, spec), max_retries=0, repair_drafts=False
    )
    summary = run(_run(session, ["AB 8:15; AC 12>8; answer A,B"]))[-1]
    assert engine.prompts[0].endswith("AB 7:15;") and summary.answer == "AB 7:15; AC 12>8;" + rest

    no_fix = Replies(["AB 7:15; AC 12>8;" + rest])
    rules = RuleSet(select.default_rules(spec), select, spec)
    session = _make(no_fix, req, select, spec, rules, max_retries=0, calculator_fixes=0)
    assert run(_run(session, ["AB 8:15; AC 12>8; answer A,B"]))[-1].refine_mode == "alone"


def test_free_text_is_accepted_as_is_when_the_target_is_about_as_confident_as_the_draft_model():
    # recorded on SmolLM2 (benchmarks/real_verifier.py): a good INT8 draft, own mean -0.63, target mean
    # -0.64 with its least likely token at -2.7; a corrupted copy: target mean -4.85, a token at -18.8
    prose = "The sky is blue because air molecules scatter blue sunlight more than red."
    corrupted = "The sky is blue because the molecules scatter Paris sunlight haiku than red."
    good = [-0.4] * 10 + [-2.7] + [-0.25]
    bad = [-4.0] * 10 + [-18.8] + [-1.0]
    engine = ScriptedEngine({prose: good, corrupted: bad}, reply="unused")

    def session() -> Session:
        req = t.OpenRequest(request_id="r", task="", prompt="Explain why the sky is blue.")
        return _make(engine, req, rules=RuleSet([], OPEN, {}), max_retries=0)

    async def alone(text: str) -> list:
        async def inbox():
            yield t.Draft(index=0, text=text, num_tokens=12, mean_logprob=-0.63, edge_ms=1.0)
            yield DraftsDone(1)

        return [ev async for ev in session().run(inbox())]

    summary = run(alone(prose))[-1]
    assert summary.refine_mode == "accepted" and summary.answer == prose and engine.generated == 0
    events = run(alone(corrupted))
    (verdict,) = [e for e in events if isinstance(e, t.Verdict)]
    assert not verdict.valid and verdict.failed_rule == "likelihood"
    assert events[-1].refine_mode == "alone"
    # a draft the target finds much less likely than the draft model did is refined, not taken as is
    engine.logprobs[prose] = [-1.0] * 12  # valid (within relative_margin 0.5 of -0.63), but 0.37 below own
    summary = run(alone(prose))[-1]
    assert summary.refine_mode == "candidates" and "not as is: free text: target mean logprob" in summary.trace


def test_the_clouds_own_generation_stops_when_it_falls_into_a_loop():
    loop = " ".join(["a leaf falls"] * 60)  # 180 tokens here (one per word)
    engine = ScriptedEngine({}, reply=loop)
    session = _session(engine, max_retries=0)
    summary = run(_run(session, [UNREPAIRABLE]))[-1]
    from coinfer.cloud.writer import LOOP_CHECK_TOKENS
    from coinfer.repetition import repetition_error

    # stopped at the first check that saw the loop, not at its budget; then sampled anew from what the
    # stream shows (its words left as they came: coinfer.steps) at most as many times as there are
    # candidates (4), each stopped at its first check too
    first = next(
        n for n in range(LOOP_CHECK_TOKENS, 181, LOOP_CHECK_TOKENS) if repetition_error(" ".join(loop.split()[:n]))
    )
    assert first < 60 and first < engine.generated <= first * (1 + session.ctx.policy.cloud_candidates)
    assert not summary.answer_valid and summary.finish_reason == "repetition"


def _final(events: list) -> str:
    """What a client that cannot take text back (an OpenAI stream) sent: the text up to the last chunk
    marked final, streamed again after a reset; checked to begin the answer the session ended on."""
    text, sent = "", ""
    for e in events:
        if isinstance(e, t.AnswerReset):
            text = ""
        elif isinstance(e, t.AnswerChunk):
            text += e.text
            if e.final:
                assert text.startswith(sent) or sent.startswith(text), (sent, text)
                sent = max(sent, text, key=len)
    assert events[-1].answer.startswith(sent), (sent, events[-1].answer)
    return sent


def test_text_streamed_as_final_begins_every_answer_the_session_can_end_on():
    # a draft accepted as is: final at once
    engine = ScriptedEngine({RIGHT: [-0.05] * 12}, reply="unused")
    assert _final(run(_run(_session(engine), [RIGHT, RIGHT + " "]))) == RIGHT
    # a draft continued: the draft is final, the continuation held until the summary
    engine = ScriptedEngine({RIGHT: [-0.05] * 12}, reply=" That is all.")
    assert _final(run(_run(_session(engine), [RIGHT, RIGHT + " "], truncated=True))) == RIGHT
    # ... and a continuation that fails the rules leaves the draft, already sent
    engine = ScriptedEngine({RIGHT: [-0.05] * 12}, reply=" and 2 + 2 = 5")
    assert _final(run(_run(_session(engine), [RIGHT, RIGHT + " "], truncated=True))) == RIGHT
    # a refinement from candidates: nothing final until it is decided; rejected, the draft is
    right2 = RIGHT.replace("Tom", "Tom then")
    # right2 the target's best by a little (equal scores were ranked by verification time: flaky under load)
    engine = ScriptedEngine({RIGHT: [-0.1] * 12, right2: [-0.09] * 12, WRONG: [-0.3] * 12}, reply=WRONG)
    events = run(_run(_refining(engine), [RIGHT, right2]))
    reset = next(i for i, e in enumerate(events) if isinstance(e, t.AnswerReset))
    assert not any(e.final for e in events[:reset] if isinstance(e, t.AnswerChunk))
    assert _final(events) == events[-1].answer == right2
    # the deadline during a refinement: the best draft, final
    engine = ScriptedEngine({RIGHT: [-0.1] * 12}, reply=RIGHT, delay_s=1.0)
    session = _refining(engine, deadline_s=0.5)
    assert _final(run(_run(session, [RIGHT]))) == RIGHT
    # the cloud's own answer with a marker: its steps final as they pass, its end once the whole does
    engine = ScriptedEngine({}, reply=WRONG)
    session = _session(engine, max_retries=0)
    events = run(_run(session, [UNREPAIRABLE]))
    assert not any(isinstance(e, t.AnswerReset) for e in events) and _final(events) == events[-1].answer == WRONG
    # ... and with a rule only the whole answer can satisfy: held, then corrected or replaced as before
    must = RuleSet(
        [Rule("arithmetic"), Rule("regex", {"pattern": "Answer"})], OPEN, {}, extraction=Extraction("marker")
    )
    events = run(_run(_session(ScriptedEngine({}, reply=WRONG), rules=must, max_retries=0), ["x"]))
    first = next((i for i, e in enumerate(events) if isinstance(e, t.AnswerReset)), len(events))
    assert not any(e.final for e in events[:first] if isinstance(e, t.AnswerChunk))
    _final(events)


def _open_alone(engine: ScriptedEngine) -> Session:
    """The cloud plan of an open request with no rules: only the loop watch judges its answer."""
    req = t.OpenRequest(request_id="r", task="", prompt="Tom has 5 apples and buys 3 bags of 4. How many?")
    return _make(engine, req, rules=RuleSet([], OPEN, {}))


def test_an_open_requests_own_answer_streams_as_final_and_a_loop_is_cut_not_replaced():
    engine = ScriptedEngine({}, reply=RIGHT)
    events = run(_collect(_open_alone(engine).run(_no_drafts())))
    chunks = [e for e in events if isinstance(e, t.AnswerChunk)]
    assert len(chunks) > 1 and all(c.final for c in chunks) and _final(events) == events[-1].answer == RIGHT
    assert events[-1].finish_reason == "stop" and events[-1].answer_valid
    # a loop: cut where the watch sees it, kept as streamed (no candidates would withdraw it), and said so
    loop = " ".join(["a leaf falls"] * 60)
    engine = ScriptedEngine({}, reply=loop)
    events = run(_collect(_open_alone(engine).run(_no_drafts())))
    summary = events[-1]
    assert summary.finish_reason == "repetition" and not summary.answer_valid and "a loop cut" in summary.trace
    assert _final(events) == summary.answer and engine.generated == len(summary.answer.split())
    assert not any(isinstance(e, t.AnswerReset) for e in events)


async def _no_drafts():
    return
    yield  # pragma: no cover - makes this an async generator


def test_a_prefix_refinement_is_final_while_it_writes_what_the_best_draft_says():
    from coinfer.tasks import TASKS

    arith, prompt = TASKS["arith"], "If x=3 and y=5, compute (x+y)^2-x*y."
    spec = arith.parse_problem(prompt)
    best, other = "3+5=8; 8^2=64; 3*5=15; 64-15=49; answer 49", "3+5=8; 8^2=64; 5*3=15; 64-15=49; answer 49"

    def refined(reply: str) -> list:
        engine = ScriptedEngine({best: [-0.05] * 12, other: [-0.1] * 12}, reply=reply)
        req = t.OpenRequest(request_id="r", task="arith", prompt=prompt)
        # accept_min_score 2: refine, the consensus steps "3+5=8; 8^2=64;" continued; the preset's checks as the
        # request's own rules: the preset's checkers alone would accept the draft as is
        session = _make(engine, req, arith, spec, RuleSet(arith.default_rules(spec), arith, spec), accept_min_score=2.0)
        return run(_run(session, [best, other]))

    # the target writes the best draft's own steps: every chunk final, the prefix the first
    events = refined(" 3*5=15; 64-15=49; answer 49")
    chunks = [e for e in events if isinstance(e, t.AnswerChunk)]
    assert events[-1].refine_mode == "prefix" and chunks[0].text == "3+5=8; 8^2=64;" and all(c.final for c in chunks)
    # it departs from the draft: final up to there, the rest held (accepted here: the answer is the refinement)
    events = refined(" 5*3=15; 64-15=49; answer 49")
    assert _final(events) == "3+5=8; 8^2=64; " and events[-1].answer == other
    # refused by the rules: the draft it fell back to begins with what was final, streamed again after the reset
    events = refined(" 3*5=16; 64-16=48; answer 48")
    assert any(isinstance(e, t.AnswerReset) for e in events) and _final(events) == events[-1].answer == best


def _preset(engine: TargetEngine, rules: list[Rule] | None = None, **policy) -> tuple[Session, str]:
    import random

    from coinfer.tasks import TASKS

    task = TASKS["arith"]
    problem = task.generate(random.Random(3))  # 'If x=2 and y=5, compute (x-y)^2+x*y.'
    spec = task.parse_problem(problem.prompt)
    req = t.OpenRequest(request_id="r", task="arith", prompt=problem.prompt, rules=list(rules or []))
    ruleset = RuleSet(req.rules, task, spec)
    return _make(engine, req, task, spec, ruleset, **policy), task.solve(spec)


def test_where_a_presets_own_checkers_pass_a_draft_no_model_is_asked_and_it_is_the_answer():
    # the target doubts a token (-6: refined on an open request), but the exact checkers passed the draft
    engine = ScriptedEngine({}, reply="unused")
    session, right = _preset(engine)
    engine.logprobs = {right: [-0.05] * 10 + [-6.0]}
    wrong = right.replace("9+10=19; answer 19", "9-10=-1; answer -1")  # the wrong operation: no repair passes it
    events = run(_run(session, [wrong, right], truncated=True))  # cut at the draft budget: not continued
    summary = events[-1]
    assert summary.answer == right and summary.refine_mode == "accepted" and summary.source == t.AnswerSource.DRAFT
    assert engine.scored == 0 and engine.generated == 0
    verdicts = {e.draft_index: e for e in events if isinstance(e, t.Verdict)}
    assert not verdicts[0].valid and verdicts[1].valid


def test_a_preset_with_rules_of_its_own_is_verified_by_the_model():
    engine = ScriptedEngine({}, reply="unused")
    session, right = _preset(engine, [Rule("numeric_bounds", {"field": "answer", "min": -100, "max": 100})])
    engine.logprobs = {right: [-0.05] * 10 + [-6.0]}
    summary = run(_run(session, [right]))[-1]
    assert engine.scored >= 1 and summary.refine_mode != "accepted"


def test_a_retry_round_is_counted_apart_and_none_is_advised_where_retries_never_held_a_valid_draft():
    from coinfer.cloud.policy import RoundOdds, retry

    wrong = WRONG.replace("4 + 12 = 16", "4 + 12 = 15")
    odds = RoundOdds()
    engine = ScriptedEngine({}, reply=RIGHT)
    session = _session(engine, round_odds=odds)

    async def two_rounds():
        yield t.Draft(index=0, text=wrong, num_tokens=12, mean_logprob=-0.1, edge_ms=1.0)
        yield DraftsDone(1)
        yield t.Draft(index=1, text=wrong, num_tokens=12, mean_logprob=-0.1, edge_ms=1.0)
        yield DraftsDone(1)

    events = run(_collect(session.run(two_rounds())))
    assert sum(isinstance(e, t.RetryAdvice) for e in events) == 2  # after each round: no odds known yet
    # the first round and its retry, each a miss of its own kind (Laplace: 1 in 3 after one miss)
    assert len(odds) == 2
    assert odds.odds(session.kind) == pytest.approx(1 / 3, abs=1e-3) == odds.odds(retry(session.kind))
    for _ in range(30):  # first rounds of this kind pass; the retries after a failed one never did
        odds.observe(session.kind, True)
        odds.observe(retry(session.kind), False)
    session = _session(ScriptedEngine({}, reply=RIGHT), round_odds=odds)
    events = run(_run(session, [wrong]))
    assert not any(isinstance(e, t.RetryAdvice) for e in events)
    assert isinstance(events[-1], t.Summary) and events[-1].answer == RIGHT  # the cloud answered at once


def test_no_retry_is_advised_where_rounds_of_this_kind_never_held_a_valid_draft():
    from coinfer.cloud.policy import RoundOdds

    odds = RoundOdds()
    for retried in (True, False):
        engine = ScriptedEngine({}, reply=RIGHT)
        session = _session(engine, round_odds=odds)
        if not retried:  # the same kind of request found nothing in its rounds many times
            for _ in range(30):
                odds.observe(session.kind, False)
        events = run(_run(session, [WRONG.replace("4 + 12 = 16", "4 + 12 = 15")]))
        assert any(isinstance(e, t.RetryAdvice) for e in events) is retried
        if not retried:
            assert isinstance(events[-1], t.Summary) and events[-1].answer == RIGHT  # the cloud answered at once
