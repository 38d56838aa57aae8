"""The cloud's own answer alone, around a stand-in engine: from the drafts' right steps, a computed value
corrected, candidates sampled; kept as streamed where only the loop watch judges it."""

from __future__ import annotations

import asyncio
import dataclasses

from coinfer import types as t
from coinfer.cloud.alone import CloudAlone
from coinfer.cloud.answer_stream import AnswerStream
from coinfer.cloud.judging import Judge
from coinfer.cloud.writer import Writer
from coinfer.rules import Rule, RuleSet
from coinfer.tasks import OPEN, TASKS
from tests.cloud.engines import RIGHT, Replies, ScriptedEngine, apples, context, draft
from tests.streams import shown


def _alone(ctx, drafts: list[str] = ()) -> tuple[t.Summary, list, Judge]:
    stream = AnswerStream()
    judge = Judge(ctx)
    alone = CloudAlone(ctx, judge=judge, writer=Writer(ctx, stream), stream=stream)

    async def go():
        for i, text in enumerate(drafts):
            await judge.verdict(draft(i, text))
        a = await alone.answer()
        stream.end()
        return a, [ev async for ev in stream.events()]

    a, events = asyncio.run(go())
    return a, events, judge


def test_with_no_drafts_the_cloud_answers_alone_and_its_greedy_answer_is_not_thresholded():
    engine = ScriptedEngine({RIGHT: [-3.0] * 12}, reply=RIGHT)  # far below any likelihood threshold
    a, events, _ = _alone(context(engine, apples()))
    assert a.valid and a.text == RIGHT == shown(events) and a.source == t.AnswerSource.CLOUD
    assert a.mode is t.RefineMode.ALONE and a.note.startswith("no drafts (cloud plan)") and engine.scored == 0
    assert a.steps == a.generated == len(RIGHT.split(" "))


def _whole() -> t.OpenRequest:
    """``apples`` with a rule only the whole answer can satisfy (a match that may come later): held
    whole, then corrected or replaced."""
    return dataclasses.replace(apples(), rules=[Rule("arithmetic"), Rule("regex", {"pattern": "Answer"})])


def test_a_wrong_computed_value_is_corrected_and_the_target_continues():
    slip = "Tom buys 3 * 4 = 12 apples.\nNow he has 5 + 12 = 16 apples.\nAnswer: 16"
    engine = Replies([slip, ".\nAnswer: 17"])
    a, events, _ = _alone(context(engine, _whole()))
    # the true value, and the model's word after it (cut after the digits, it would write "= 176")
    assert engine.prompts[1].endswith("Now he has 5 + 12 = 17 apples") and a.valid and a.text == shown(events)
    assert "1 computed value(s) corrected" in a.note and any(isinstance(e, t.AnswerReset) for e in events)


def test_candidates_replace_a_failed_answer_and_count_their_tokens():
    engine = ScriptedEngine({}, reply="Tom buys 3 * 4 = 13 apples.\nAnswer: 13")
    ctx = context(engine, _whole(), calculator_fixes=0, cloud_candidates=3)
    a, events, _ = _alone(ctx)
    assert not a.valid and a.note.endswith("(its answer failed verification)")  # candidates say the same
    assert engine.generated == len(engine.reply.split(" ")) + 3
    engine = Replies(["Tom buys 3 * 4 = 13 apples.\nAnswer: 13"])
    engine.sample = _sampled(RIGHT)
    a, events, _ = _alone(context(engine, _whole(), calculator_fixes=0, cloud_candidates=3))
    assert a.valid and a.text == RIGHT == shown(events) and a.finish is t.FinishReason.STOP


def _sampled(text: str):
    from coinfer.cloud.engine import Chunk

    async def sample(prompt, params, n, request_id):
        return [Chunk(text, 5, "stop") for _ in range(n)]

    return sample


def test_the_drafts_right_steps_are_the_prefix_the_target_continues():
    select = TASKS["select"]
    prompt = "Pick 2 of A(4,9) B(3,6) C(8,2) D(1,8) with cost<=8."
    spec = select.parse_problem(prompt)
    rest = " AC 12>8; AD 5:17; BC 11>8; BD 4:14; CD 9>8; answer A,D"
    engine = Replies([rest])
    req = t.OpenRequest(request_id="r", task="select", prompt=prompt)
    ctx = context(engine, req, select, spec, RuleSet(select.default_rules(spec), select, spec))
    a, events, judge = _alone(
        dataclasses.replace(
            ctx, cfg=dataclasses.replace(ctx.cfg, policy=dataclasses.replace(ctx.policy, repair_drafts=False))
        ),
        ["AB 8:15; AC 12>8; answer A,B"],  # its first cost is wrong: 7
    )
    assert not judge.judged[0].verdict.valid and engine.prompts[0].endswith("AB 7:15;")
    assert a.valid and a.text == "AB 7:15;" + rest and a.mode is t.RefineMode.PREFIX
    assert a.note.startswith("no valid draft after retries: cloud answered alone from 1 verified steps")


def test_the_drafts_repaired_steps_are_the_prefix_and_the_target_writes_only_what_they_got_wrong():
    select = TASKS["select"]
    prompt = "Pick 2 of A(4,9) B(3,6) C(8,2) D(1,8) with cost<=8."
    spec = select.parse_problem(prompt)
    steps = "AB 7:15; AC 12>8; AD 5:17; BC 11>8; BD 4:14; CD 9>8;"
    engine = Replies([" answer A,D"])
    req = t.OpenRequest(request_id="r", task="select", prompt=prompt)
    # every sum but one wrong, and the wrong choice: repaired, still invalid; its repaired steps are all right
    slips = "AB 7:16; AC 9:11; AD 5:16; BC 11>8; BD 5>8; CD 9>8; answer B,D"
    a, events, judge = _alone(context(engine, req, select, spec), [slips])
    assert not judge.judged[0].verdict.valid and engine.prompts[0].endswith(steps)
    assert a.valid and a.text == steps + " answer A,D" and a.mode is t.RefineMode.PREFIX and len(engine.prompts) == 1
    assert a.note.startswith("no valid draft after retries: cloud answered alone from 6 verified steps")


def test_where_only_the_loop_watch_judges_the_answer_streams_final_and_a_loop_is_kept_cut():
    loop = " ".join(["a leaf falls"] * 60)
    engine = ScriptedEngine({}, reply=loop)
    req = t.OpenRequest(request_id="r", task="", prompt="Write a haiku.")
    a, events, _ = _alone(context(engine, req, OPEN, {}, RuleSet([], OPEN, {})))
    assert a.finish is t.FinishReason.REPETITION and not a.valid and "a loop cut" in a.note
    assert all(e.final for e in events) and not any(isinstance(e, t.AnswerReset) for e in events)
    assert engine.generated == len(a.text.split())  # no candidates after it


def _open(*rules: Rule) -> t.OpenRequest:
    """An open request whose rules all judge a prefix (extraction none)."""
    return t.OpenRequest(
        request_id="r", task="", prompt="Tom has 5 apples and buys 3 bags of 4. How many?", rules=list(rules)
    )


def _only_final(events: list) -> str:
    """The text of the answer chunks, each of which must be final (never withdrawn, no reset)."""
    chunks = [e for e in events if isinstance(e, (t.AnswerChunk, t.AnswerReset))]
    assert all(isinstance(e, t.AnswerChunk) and e.final for e in chunks), chunks
    return "".join(e.text for e in chunks)


def test_with_prefix_rules_the_answer_streams_final_step_by_step_and_a_wrong_step_is_corrected_unshown():
    slip = "Tom buys 3 * 4 = 12 apples.\nNow he has 5 + 12 = 16 apples.\nSo 16."
    engine = Replies([slip, ".\nSo 17."])
    a, events, _ = _alone(context(engine, _open(Rule("arithmetic"))))
    chunks = [e.text for e in events if isinstance(e, t.AnswerChunk)]
    # the words leave as they come; an equation once its chain of numbers ends, checked ("3 * 4 = 12 a")
    assert chunks[:4] == ["Tom", " buys", " 3 * 4 = 12 apples.", "\n"] and "Now he has" in "".join(chunks)
    assert _only_final(events) == a.text == "Tom buys 3 * 4 = 12 apples.\nNow he has 5 + 12 = 17 apples.\nSo 17."
    assert engine.prompts[1].endswith("Now he has 5 + 12 = 17 apples") and "16" not in _only_final(events)
    assert a.valid and a.source is t.AnswerSource.CLOUD and "a computed value corrected" in a.note
    assert a.note.startswith("no drafts (cloud plan)") and a.generated == engine.generated < len(slip.split(" ")) + 3


def test_a_step_a_forbidden_pattern_fails_is_sampled_anew_from_the_last_good_step_seeded():
    engine = Replies(["The sky is blue. It is darn pretty. Really.", " Air scatters blue light. Done."])
    ctx = context(engine, _open(Rule("regex", {"pattern": "darn", "must_match": False})), cloud_temperature=0.5)
    a, events, _ = _alone(ctx)
    assert _only_final(events) == a.text == "The sky is blue. Air scatters blue light. Done." and a.valid
    assert engine.prompts[1].endswith("The sky is blue.") and "resampled" in a.note
    assert (engine.params[1].temperature, engine.params[1].seed) == (0.5, 1)  # the same request: the same text


def test_when_no_continuation_passes_the_answer_ends_at_its_last_good_step():
    engine = Replies(["The sky is blue. It is darn pretty.", " So darn blue.", " A darn sky."])
    ctx = context(engine, _open(Rule("regex", {"pattern": "darn", "must_match": False})), cloud_candidates=2)
    a, events, _ = _alone(ctx)
    assert _only_final(events) == a.text == "The sky is blue." and a.valid and "ended at its last good step" in a.note
    assert len(engine.request_ids) == 3  # the answer, then two samples from "The sky is blue."


def test_a_length_max_stops_the_answer_at_its_last_step_within_it():
    engine = ScriptedEngine({}, reply="One. Two. Three. Four.")
    a, events, _ = _alone(context(engine, _open(Rule("length", {"max": 12}))))
    assert _only_final(events) == a.text == "One. Two." and a.valid and a.finish is t.FinishReason.LENGTH
    assert len(engine.request_ids) == 1  # stopped, not sampled anew


ARITH = "If x=3 and y=5, compute (x+y)^2-x*y."


def _arith(engine, **policy):
    """The cloud plan of an arith preset request (its own parser and checkers)."""
    req = t.OpenRequest(request_id="r", task="arith", prompt=ARITH)
    return context(engine, req, task=TASKS["arith"], spec=TASKS["arith"].parse_problem(ARITH), **policy)


def test_a_presets_steps_stream_as_final_and_its_answer_once_the_whole_passes():
    engine = Replies(["x+y=8; 8^2=64; x*y=15; 64-15=49; answer 49"])
    a, events, _ = _alone(_arith(engine))
    chunks = [e.text for e in events if isinstance(e, t.AnswerChunk)]
    assert chunks[:2] == ["x+y=8;", " 8^2=64;"] and chunks[-1] == " answer 49"  # the answer: last, once checked
    assert _only_final(events) == a.text == "x+y=8; 8^2=64; x*y=15; 64-15=49; answer 49" and a.valid


def test_a_presets_wrong_step_is_corrected_unshown_and_a_wrong_answer_sampled_anew_from_the_last_step():
    engine = Replies(["3+5=8; 8^2=64; 3*5=16; answer 48", "; 64-15=49; answer 50", " answer 49"])
    a, events, _ = _alone(_arith(engine, cloud_temperature=0.5))
    assert engine.prompts[1].endswith("8^2=64; 3*5=15")  # the calculator's value, the target continues
    assert engine.prompts[2].endswith("64-15=49;") and engine.params[2].seed == 1  # the end, sampled anew
    assert _only_final(events) == a.text == "3+5=8; 8^2=64; 3*5=15; 64-15=49; answer 49" and a.valid
    assert "16" not in a.text and "50" not in _only_final(events)


def test_where_not_one_step_passes_the_last_try_is_the_answer_unverified():
    engine = Replies(["3-5=-2; answer -2"] + ["3-5=-2; answer 9"] * 2)  # right terms off the plan, every try
    a, events, _ = _alone(_arith(engine, cloud_candidates=2))
    assert _only_final(events) == a.text == "3-5=-2;" and not a.valid  # what it tried, not an empty answer
    assert "no step passed: its last try, unverified" in a.note and len(engine.prompts) == 3


def test_an_open_answers_steps_stream_until_its_marker_and_the_marker_line_once_it_passes():
    engine = ScriptedEngine({}, reply=RIGHT)
    a, events, _ = _alone(context(engine, apples()))  # an Answer: marker to extract
    chunks = [e.text for e in events if isinstance(e, t.AnswerChunk)]
    assert chunks[:3] == ["Tom", " buys", " 3 * 4 = 12 apples."] and chunks[-1] == "Answer: 17"  # as they come
    assert "A" not in "".join(chunks[:-1])  # the marker's line: once the whole answer passes
    assert _only_final(events) == a.text == RIGHT and a.valid


def test_a_rule_only_the_whole_answer_satisfies_still_holds_the_answer():
    engine = ScriptedEngine({}, reply=RIGHT)
    a, events, _ = _alone(context(engine, _whole()))
    assert a.valid and not any(e.final for e in events if isinstance(e, t.AnswerChunk))


def test_a_presets_step_streams_as_it_grows_while_the_calculator_can_end_it():
    engine = Replies(["3 + 5 = 8; 8 ^ 2 = 64; 3 * 5 = 15; 64 - 15 = 49; answer 49"])
    a, events, _ = _alone(_arith(engine))
    chunks = [e.text for e in events if isinstance(e, t.AnswerChunk)]
    assert chunks[:4] == ["3 ", "+ ", "5 ", "= "] and all(e.final for e in events if isinstance(e, t.AnswerChunk))
    assert _only_final(events) == a.text == "3 + 5 = 8; 8 ^ 2 = 64; 3 * 5 = 15; 64 - 15 = 49; answer 49" and a.valid


def test_a_wrong_value_after_a_shown_beginning_is_ended_by_the_calculator_and_the_target_continues():
    engine = Replies(["3 + 5 = 8; 3 * 5 = 16; answer 16", " 8 ^ 2 = 64; 64 - 15 = 49; answer 49"])
    a, events, _ = _alone(_arith(engine))
    assert engine.prompts[1].endswith("3 + 5 = 8; 3 * 5 = 15;")  # "3 * 5 = " was shown: the calculator ends it
    assert _only_final(events) == a.text == "3 + 5 = 8; 3 * 5 = 15; 8 ^ 2 = 64; 64 - 15 = 49; answer 49" and a.valid
    assert "16" not in _only_final(events) and "ended by the calculator" in a.note


def test_an_off_plan_step_after_a_shown_beginning_is_ended_as_the_plan_step_it_began():
    # "3 + " begins the plan's 3+5=8; "3 + 7" begins none: held from there, and once it fails its end
    # is the calculator's, never a withdrawal of what the stream showed
    engine = Replies(["3 + 7 = 10; answer 10", " 8^2=64; 3*5=15; 64-15=49; answer 49"])
    a, events, _ = _alone(_arith(engine))
    chunks = [e.text for e in events if isinstance(e, t.AnswerChunk)]
    assert chunks[:3] == ["3 ", "+ ", "5=8;"] and engine.prompts[1].endswith("3 + 5=8;")
    assert _only_final(events) == a.text == "3 + 5=8; 8^2=64; 3*5=15; 64-15=49; answer 49" and a.valid


def test_a_select_subset_streams_as_it_grows_and_a_slipped_sum_is_ended_by_the_calculator():
    prompt = "Pick 2 of A(4,9) B(3,6) C(8,2) with cost<=8."
    req = t.OpenRequest(request_id="r", task="select", prompt=prompt)
    ctx = context(
        Replies(["AB 7 :15; AC 12 >8; BC 11 >8; answer A,B", "AC 12 >8; BC 11 >8; answer A,B"]),
        req,
        task=TASKS["select"],
        spec=TASKS["select"].parse_problem(prompt),
    )
    a, events, _ = _alone(ctx)
    chunks = [e.text for e in events if isinstance(e, t.AnswerChunk)]
    assert chunks[:2] == ["AB ", "7 "]  # then " :15" begins no right step (":" follows the cost unspaced)
    assert _only_final(events) == a.text == "AB 7 :15; AC 12 >8; BC 11 >8; answer A,B" and a.valid
