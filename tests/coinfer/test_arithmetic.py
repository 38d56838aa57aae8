"""The arithmetic rule: inline equations recomputed, in linear time."""

import time

from hypothesis import given
from hypothesis import strategies as st

from coinfer.arithmetic import equations, first_wrong_equation


def test_worked_solution_passes_and_a_wrong_step_is_named():
    ok = "In May she sold 48 / 2 = 24 clips.\nAltogether 48 + 24 = 72.\nAnswer: 72"
    assert first_wrong_equation(ok) == ""
    assert first_wrong_equation(ok.replace("= 24", "= 25")) == "arithmetic_wrong: 48 / 2 = 25 (expected 24)"


def test_precedence_units_separators_and_what_is_not_an_equation():
    assert first_wrong_equation("2 + 3 * 4 = 14; 3 x 4 = 12; $5 + $3 = $8; 1,000 + 1 = 1,001; -3 + 5 = 2") == ""
    assert first_wrong_equation("7 / 2 = 3.5") == ""
    assert first_wrong_equation("7 / 0 = 1") == "arithmetic_wrong: 7 / 0 divides by zero"
    assert equations("x = 5, 8^2=64, answer = 3") == []  # no number-op-number chain before '='


@given(st.integers(0, 999), st.integers(0, 999), st.sampled_from("+-*"))
def test_any_true_equation_passes(a, b, op):
    value = {"+": a + b, "-": a - b, "*": a * b}[op]
    assert first_wrong_equation(f"so {a} {op} {b} = {value} items") == ""
    assert first_wrong_equation(f"so {a} {op} {b} = {value + 1} items").startswith("arithmetic_wrong")


def test_hostile_length_is_linear():
    from coinfer.arithmetic import repaired

    # hang guards in this thread's CPU time (a busy machine does not stretch it), 20x and 10x what each took
    # (measured 0.125 s and 0.24 s): backtracking on these inputs runs for minutes
    t0 = time.thread_time()
    first_wrong_equation("1 + " * 20000 + "= 3 " + "9" * 5000 + " = 1")
    assert time.thread_time() - t0 < 2.5
    many = "1 + 1 = 3; 3 + 1 = 5. " * 4000  # 8,000 wrong results, each carried to the next step: one pass
    t0 = time.thread_time()
    fixed = repaired(many)
    assert time.thread_time() - t0 < 2.5 and fixed is not None and first_wrong_equation(fixed) == ""


def test_corrected_prefix_writes_the_true_value_of_the_first_wrong_equation_and_stops_there():
    from coinfer.arithmetic import corrected_prefix

    text = "Priya reads 9 * 7 = 63 pages.\nThere are 64 - 63 = 11 pages left.\nThen 2 + 2 = 5.\nAnswer: 11"
    # what the model wrote right after the value is kept up to the next word's end (or one punctuation
    # mark): a value cut after its digits was continued into a longer wrong number ("= 5" -> "= 55")
    assert corrected_prefix(text) == "Priya reads 9 * 7 = 63 pages.\nThere are 64 - 63 = 1 pages"
    assert corrected_prefix("so 0 - 2 = -3 left") == "so 0 - 2 = -2 left"
    assert corrected_prefix("1,000 + 1 = 1,002") == "1,000 + 1 = 1001"
    assert corrected_prefix("7 / 2 = 3 each") == "7 / 2 = 3.5 each"
    assert corrected_prefix("68 - 63 = 55.\nAnswer: 55") == "68 - 63 = 5."
    assert corrected_prefix("68 - 63 = 55 ; 2 + 2 = 4") == "68 - 63 = 5 ;"
    # nothing to correct: every equation holds; a division by zero or a value not written exactly
    assert corrected_prefix("48 / 2 = 24 clips") is None
    assert corrected_prefix("7 / 0 = 1") is None and corrected_prefix("7 / 3 = 2") is None


def test_repaired_recomputes_each_result_and_carries_a_wrong_one_to_where_it_is_used():
    from coinfer.arithmetic import repaired

    draft = "Aisha reads 6 * 2 = 13 pages.\nThere are 43 - 13 = 29 pages left.\nAnswer: 29"
    assert repaired(draft) == "Aisha reads 6 * 2 = 12 pages.\nThere are 43 - 12 = 31 pages left.\nAnswer: 31"
    # only what the draft computed changes: its operands as given, its prose
    assert (
        repaired("Leo has 43 - 12 = 36 pages; 12 more. Answer: 36") == "Leo has 43 - 12 = 31 pages; 12 more. Answer: 31"
    )
    assert repaired("so 0 - 2 = 2 left. Answer: 2") == "so 0 - 2 = -2 left. Answer: -2"
    assert repaired("2 + 3 = 6 + 1 = 8") == "2 + 3 = 5 + 1 = 6"  # a chain that begins at a repaired result
    # nothing to repair: every equation holds; a division by zero; a value not written exactly
    assert repaired("48 / 2 = 24 clips") is None
    assert repaired("7 / 0 = 1") is None and repaired("7 / 3 = 2") is None


@given(
    st.lists(
        st.tuples(st.integers(0, 99), st.sampled_from("+-*"), st.integers(-3, 3), st.booleans()), min_size=1, max_size=6
    ),
    st.integers(0, 99),
)
def test_a_repaired_text_holds_every_equation_and_repairing_it_again_changes_nothing(
    steps,
    first,
):
    from coinfer.arithmetic import repaired

    # a chain of steps, each on the previous step's result as written, some results off by a little
    parts, prev = [], first
    for b, op, off, uses_prev in steps:
        a = prev if uses_prev else b
        value = {"+": a + b, "-": a - b, "*": a * b}[op] + off
        parts.append(f"Then {a} {op} {b} = {value} apples.")
        prev = value
    text = " ".join(parts) + f"\nAnswer: {prev}"
    fixed = repaired(text)
    if fixed is None:
        assert first_wrong_equation(text) == ""
    else:
        assert first_wrong_equation(fixed) == ""
        assert repaired(fixed) is None
        assert fixed.count("=") == text.count("=")  # the draft's steps stay its own
