"""The arithmetic rule: inline equations recomputed, in linear time."""

import time

from hypothesis import example, given
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


def test_a_value_is_written_in_plain_decimals_the_check_reads_back():
    from coinfer.arithmetic import corrected_prefix, repaired

    # exponent notation ("1e-05") is no number to the check: a repair written so failed it again
    assert repaired("so 1 / 100000 = 0.001 of it") == "so 1 / 100000 = 0.00001 of it"
    assert corrected_prefix("so 1 / 100000 = 0.001 of it") == "so 1 / 100000 = 0.00001 of"
    assert first_wrong_equation("1 / 100000 = 1") == "arithmetic_wrong: 1 / 100000 = 1 (expected 0.00001)"
    # exact, no float noise, an integer without a point; big values in full
    assert repaired("0.1 + 0.2 = 0.4") == "0.1 + 0.2 = 0.3" and repaired("1.5 * 2 = 4") == "1.5 * 2 = 3"
    assert repaired("123456789 * 987654321 = 1") == "123456789 * 987654321 = 121932631112635269"
    assert repaired("1,000,000 * 1,000,000 = 1") == "1,000,000 * 1,000,000 = 1000000000000"
    # past what the check reads as a number (30 characters), or no finite decimal: nothing a calculator
    # can write in place, so no repair
    assert repaired("99999999999999999999 * 99999999999999999999 = 1") is None
    assert repaired("1 / 3 = 0.3") is None
    # a message shows a value it cannot write exactly rounded, never in exponent notation
    assert first_wrong_equation("7 / 3 = 2") == "arithmetic_wrong: 7 / 3 = 2 (expected about 2.33333333333)"
    huge = first_wrong_equation("99999999999999999999 * 99999999999999999999 = 1")
    assert huge.endswith("(expected a number of over 30 digits)")
    # a repaired value that would run into what follows it ("3.5.7" -> "2.7") reads back as another value
    assert repaired("1 + 1 = 3.5.7 apples") is None


_DECIMAL = st.builds(
    lambda n, places: f"{n / 10**places:.{places}f}" if places else str(n),
    st.integers(0, 10**6),
    st.integers(0, 6),
)


@given(_DECIMAL, st.sampled_from("+-*/"), _DECIMAL, st.sampled_from(["1", "0.5", "7"]))
def test_any_repaired_equation_of_decimals_passes_in_plain_decimals(a, op, b, written):
    from coinfer.arithmetic import repaired

    text = f"so {a} {op} {b} = {written} left"
    fixed = repaired(text)
    if fixed is None:  # right as written, a division by zero, or no finite decimal
        assert first_wrong_equation(text) == "" or "/" in op
    else:
        value = fixed.split("= ")[1].split(" ")[0]
        assert "e" not in value and not value.endswith(".0") and first_wrong_equation(fixed) == ""


def test_a_wrong_result_is_carried_only_to_where_the_text_uses_it():
    from coinfer.arithmetic import repaired

    # prose that happens to hold the same number is no use of it, and the step after it computes with
    # that prose's number: neither changes
    boxes = "2 + 2 = 5 days. The 5 boxes cost 5 * 3 = 15"
    assert repaired(boxes) == "2 + 2 = 4 days. The 5 boxes cost 5 * 3 = 15"
    # an operand of a later step, the stated answer: carried
    assert repaired("2 + 2 = 5 days. Then 5 * 3 = 15.\nAnswer: 15") == "2 + 2 = 4 days. Then 4 * 3 = 12.\nAnswer: 12"
    # a later step that writes the same value rightly is what a later use refers to
    assert repaired("2 + 2 = 5. 1 + 4 = 5. 5 * 2 = 10") == "2 + 2 = 4. 1 + 4 = 5. 5 * 2 = 10"
    # the answer is the number after the marker ("in 5 days" is prose), and states the latest result even
    # where prose repeated it
    assert repaired("2 + 2 = 5 days, in 5 days.\nAnswer: 5") == "2 + 2 = 4 days, in 5 days.\nAnswer: 4"


_PROSE = ["The 5 boxes.", "In 2 days.", "Step 3:", "He is 12.", "It took 4 - 1 hours."]


def _step(a: int, op: str, b: int, off: int) -> str:
    return f"So {a} {op} {b} = { ({'+': a + b, '-': a - b, '*': a * b}[op] + off) } now."


_STEP = st.builds(_step, st.integers(0, 12), st.sampled_from("+-*"), st.integers(0, 12), st.integers(-2, 2))


@given(st.lists(st.one_of(st.sampled_from(_PROSE), _STEP), max_size=8))
def test_prose_is_never_rewritten_and_a_repaired_text_holds_every_equation(parts):
    from coinfer.arithmetic import repaired

    fixed = repaired(" ".join(parts))
    if fixed is not None:
        assert first_wrong_equation(fixed) == "" and repaired(fixed) is None
        assert all(p in fixed for p in parts if p in _PROSE)


def test_a_negative_result_is_carried_into_the_chain_that_begins_at_it():
    from coinfer.arithmetic import repaired

    assert repaired("2 - 5 = 3 + 1 = 4") == "2 - 5 = -3 + 1 = -2"
    assert repaired("1 - 2 = -3 + 1 = -2") == "1 - 2 = -1 + 1 = 0"  # a wrong negative, carried
    assert repaired("2 - 1 = -3 + 1 = -2") == "2 - 1 = 1 + 1 = 2"  # its sign dropped
    assert repaired("0 - 2 = -2 + 5 = 4") == "0 - 2 = -2 + 5 = 3"  # a right negative the next step begins at


_PIECE = st.one_of(
    st.integers(0, 20).map(str),
    st.sampled_from(["0.5", "3.5", "1,000", "100000", "0.001", "2.25", "999999999999999", "1,5", ".5", "5,"]),
    st.sampled_from(
        [" ", " + ", " - ", "-", " * ", " / ", " x ", " = ", "=", "$", ",", ".", "Answer: ", " apples", "\n"]
    ),
)


@given(st.lists(_PIECE, max_size=25))
@example(["0", " + ", "0", " = ", "0.5", "0.5"])
@example(["1", " - ", "2", " = ", "-", "3", " + ", "1", " = ", "-", "2"])
def test_any_text_repaired_holds_every_equation_and_keeps_every_step(pieces):
    from coinfer.arithmetic import repaired

    # signs, points and thousands commas around the values rewritten ("0 + 0 = 0.50.5" was repaired to
    # "0 + 0 = 0.5": the true 0 run into the ".5" after it)
    text = "".join(pieces)
    fixed = repaired(text)
    if fixed is not None:
        assert first_wrong_equation(fixed) == "" and repaired(fixed) is None
        assert fixed.count("=") == text.count("=")
