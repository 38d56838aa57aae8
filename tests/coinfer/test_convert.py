from coinfer import convert
from coinfer import types as t
from coinfer.rules import Rule
from coinfer.v1 import coinfer_pb2 as pb


def test_open_round_trip_keeps_rules_and_defaults():
    req = t.OpenRequest(
        request_id="r1",
        task="select",
        prompt="Pick 2 of A(1,2) B(2,3) with cost<=5.",
        rules=[Rule("count", {"field": "ids", "min": 2, "max": 2, "unique": True}, name="two")],
        refine=t.SamplingParams(temperature=0.5, seed=7),
        expected_drafts=5,
        deadline_ms=1500,
    )
    back = convert.open_from_pb(convert.open_to_pb(req))
    assert back.rules == [Rule("count", {"field": "ids", "min": 2.0, "max": 2.0, "unique": True}, "two")]
    assert back.refine == t.SamplingParams(temperature=0.5, seed=7)
    assert (back.request_id, back.expected_drafts, back.deadline_ms) == ("r1", 5, 1500)
    assert back.draft_model == ""  # an older edge sends none
    req.draft_model = "sha256:abc"
    assert convert.open_from_pb(convert.open_to_pb(req)).draft_model == "sha256:abc"
    # an unset refine means "server defaults", not zeros
    req.refine = None
    assert convert.open_from_pb(convert.open_to_pb(req)).refine is None


def test_every_cloud_event_round_trips():
    events = [
        t.SessionAccepted("r", ["parse", "length"], 3),
        t.Verdict(
            draft_index=2,
            valid=False,
            score=0.0,
            error="step_wrong: 8^2=62 (expected 64)",
            failed_rule="task_check:arith_steps",
            verify_ms=1.5,
            rules_passed=["parse"],
            duplicate_of=0,
        ),
        t.AnswerChunk("3+5"),
        t.AnswerReset("refinement rejected: task_check:arith_steps"),
        t.Summary(
            answer="answer 49",
            source=t.AnswerSource.DRAFT,
            chosen_drafts=[1, 0],
            scores=[t.DraftScore(draft_index=0, valid=True, score=0.25, rank_score=0.5)],
            timings=t.Timings(verify_ms=1.0, refine_ttft_ms=2.0, refine_ms=3.0, total_ms=4.0),
            trace="trace",
            answer_valid=True,
            recommended_drafts=5,
            request_id="r",
        ),
        t.RetryAdvice(
            attempt=1,
            num_drafts=7,
            sampling=t.SamplingParams(temperature=0.6, presence_penalty=0.4),
            reason="parse_error x3",
        ),
    ]
    for ev in events:
        assert convert.event_from_pb(convert.event_to_pb(ev)) == ev


def test_a_summarys_closed_sets_arrive_typed_and_an_unknown_or_empty_value_is_the_default(caplog):
    """``refine_mode`` / ``finish_reason`` travel as strings (proto3 cannot send "unset"): "" is the field's
    default, a newer peer's unknown value too (logged), a known one its enum member."""
    for mode, finish, want_mode, want_finish in [
        ("prefix", "length", t.RefineMode.PREFIX, t.FinishReason.LENGTH),
        ("", "", None, t.FinishReason.STOP),
        ("telepathy", "moon", None, t.FinishReason.STOP),
    ]:
        msg = pb.Summary(answer="8", refine_mode=mode, finish_reason=finish)
        s = convert.from_pb(msg, t.Summary)
        assert (s.refine_mode, s.finish_reason) == (want_mode, want_finish)
        assert s.refine_mode is None or type(s.refine_mode) is t.RefineMode
        assert convert.to_pb(s, pb.Summary).finish_reason == want_finish.value  # back to the wire's string
    assert "unknown RefineMode 'telepathy'" in caplog.text and "unknown FinishReason 'moon'" in caplog.text
