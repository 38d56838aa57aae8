from coinfer import convert
from coinfer import types as t
from coinfer.rules import Rule
from coinfer.v1 import coinfer_pb2 as pb


def test_open_round_trip_keeps_rules_and_defaults():
    req = t.OpenRequest(
        "r1",
        "select",
        "Pick 2 of A(1,2) B(2,3) with cost<=5.",
        [Rule("count", {"field": "ids", "min": 2, "max": 2, "unique": True}, name="two")],
        t.SamplingParams(temperature=0.5, seed=7),
        5,
        1500,
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
        t.Verdict(2, False, 0.0, "step_wrong: 8^2=62 (expected 64)", "task_check:arith_steps", 1.5, ["parse"], 0),
        t.AnswerChunk("3+5"),
        t.AnswerReset("refinement rejected: task_check:arith_steps"),
        t.Summary(
            "answer 49",
            t.AnswerSource.DRAFT,
            [1, 0],
            [t.DraftScore(0, True, 0.25, 0.5)],
            t.Timings(1.0, 2.0, 3.0, 4.0),
            "trace",
            True,
            5,
            "r",
        ),
        t.RetryAdvice(1, 7, t.SamplingParams(temperature=0.6, presence_penalty=0.4), "parse_error x3"),
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
