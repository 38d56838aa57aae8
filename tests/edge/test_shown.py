"""AnswerView: the one record of what the user has seen of an answer (edge/shown.py)."""

from coinfer import types as t
from coinfer.edge.shown import AnswerView


def test_final_text_leaves_at_once_and_held_text_waits_for_the_answer():
    v = AnswerView()
    assert v.see(t.AnswerChunk("3+5=8;", final=False)) == ""  # a refinement the rules may still refuse
    assert v.see(t.AnswerChunk(" 8^2=64;", final=True)) == "3+5=8; 8^2=64;"  # final: the held text before it too
    assert v.see(t.AnswerChunk(" 3*5=16;")) == ""
    assert v.text == "3+5=8; 8^2=64; 3*5=16;" and v.final == "3+5=8; 8^2=64;"
    v.see(t.AnswerReset("refinement rejected"))  # the draft follows, beginning with what was sent
    assert not v.streamed and v.final == "3+5=8; 8^2=64;"  # a reset withdraws the text, never the final part
    assert v.see(t.AnswerChunk("3+5=8; 8^2=64;", final=True)) == ""  # already sent
    assert v.see(t.AnswerChunk(" 3*5=15; answer 49", final=True)) == " 3*5=15; answer 49"
    assert v.begins("3+5=8; 8^2=64; 3*5=15; answer 49") and v.final == "3+5=8; 8^2=64; 3*5=15; answer 49"
    # held to the end: the answer whole at Done
    v = AnswerView()
    assert v.see(t.AnswerChunk("Paris")) == "" and v.streamed and v.final == "" and v.begins("Paris.")
    # final text a later answer does not begin (a replica failed, its replay answered differently)
    v = AnswerView()
    assert v.see(t.AnswerChunk("The sky", final=True)) == "The sky"
    v.see(t.AnswerReset("UNAVAILABLE: replica gone"))
    assert v.see(t.AnswerChunk("Blue light", final=True)) == ""  # never sent over what was
    assert not v.begins("Blue light scatters.")


def test_what_each_answer_event_committed_is_recorded_for_a_reader_behind_the_view():
    v = AnswerView()
    for ev in (t.AnswerChunk("a", final=True), t.Draft(index=0, text="x"), t.AnswerChunk("b"), t.AnswerReset("r")):
        v.see(ev)
    v.see(t.AnswerChunk("abc", final=True))
    assert v.commits == [1, 1, 1, 3] and v.final == "abc"  # a draft is no answer event


def test_the_first_chunk_is_timed_and_other_events_change_nothing():
    v = AnswerView()
    assert v.see(t.Draft(index=0, text="x")) == "" and v.first_chunk_at is None and not v.streamed
    v.see(t.AnswerChunk("a"))
    first = v.first_chunk_at
    v.see(t.AnswerChunk("b"))
    assert first is not None and v.first_chunk_at == first and v.text == "ab"
