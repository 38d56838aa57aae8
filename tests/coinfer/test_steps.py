"""A streamed answer's steps: where one ends; how much of one in progress may stream (open text under the
arithmetic rule; a preset's calculator: tests/coinfer/test_tasks.py)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from coinfer.arithmetic import equations
from coinfer.steps import MAX_OPEN_STEP_CHARS, open_step_shown, step_ends

MARKER = "Answer:"


def test_steps_end_at_a_line_a_semicolon_or_a_sentence_before_a_space():
    text = "It costs 3.5 e.g.,x. 2 + 2 = 4; so\nok! done."
    assert [text[:e][-3:] for e in step_ends(text)] == [",x.", " 4;", "so\n", "ok!"]  # "done." waits
    assert step_ends(text, 20) == [e for e in step_ends(text) if e > 20]


def _shown(partial: str) -> str | None:
    n = open_step_shown(partial, MARKER)
    return None if n is None else partial[:n]


def test_words_leave_as_they_come_and_an_equation_once_its_chain_of_numbers_ends_right():
    assert _shown("In May she sold") == "In May she sold"
    assert _shown("In May she sold 48 / 2 = 2") == "In May she sold"  # 24? 25? it waits
    assert _shown("In May she sold 48 / 2 = 24 clips") == "In May she sold 48 / 2 = 24 clips"
    assert _shown("In May she sold 48 / 2 = 25 clips") is None  # no more of it before the step ends


def test_a_tail_that_may_begin_the_marker_waits_and_the_marker_stops_the_step():
    assert _shown("So the total is A") == "So the total is "
    assert _shown("So An") == "So "
    assert _shown("So Ant") == "So Ant"
    assert _shown("Answer: 72") is None and _shown("So Answer") == "So "
    assert open_step_shown("So A", "") == 4  # no marker to extract: nothing waits for it


def test_a_step_past_the_bound_waits_for_its_end():
    assert _shown("word " * (MAX_OPEN_STEP_CHARS // 5)) is not None
    assert _shown("word " * (MAX_OPEN_STEP_CHARS // 5 + 1)) is None


@settings(max_examples=400, deadline=None)
@given(
    st.text(alphabet="0123456789+-*/=x .,$aAnsw:r", max_size=40), st.text(alphabet="0123456789+-*/= .,aA", max_size=12)
)
def test_whatever_follows_what_left_its_equations_stay_as_they_were_right(partial, rest):
    left = _shown(partial)
    if left is None:
        return
    # no marker begins in what left, whatever follows: the answer's end is held whole
    assert not any(MARKER.startswith(partial[i:]) or MARKER in partial[i:] for i in range(len(left)))
    before = equations(left)
    assert all(true == result for _, result, true in before)  # every equation that left is right
    assert equations(left + rest)[: len(before)] == before  # and nothing that follows changes one
