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
    t0 = time.perf_counter()
    first_wrong_equation("1 + " * 20000 + "= 3 " + "9" * 5000 + " = 1")
    assert time.perf_counter() - t0 < 1.0


def test_corrected_prefix_writes_the_true_value_of_the_first_wrong_equation_and_stops_there():
    from coinfer.arithmetic import corrected_prefix

    text = "Priya reads 9 * 7 = 63 pages.\nThere are 64 - 63 = 11 pages left.\nThen 2 + 2 = 5.\nAnswer: 11"
    assert corrected_prefix(text) == "Priya reads 9 * 7 = 63 pages.\nThere are 64 - 63 = 1"
    assert corrected_prefix("so 0 - 2 = -3 left") == "so 0 - 2 = -2"
    assert corrected_prefix("1,000 + 1 = 1,002") == "1,000 + 1 = 1001"
    assert corrected_prefix("7 / 2 = 3 each") == "7 / 2 = 3.5"
    # nothing to correct: every equation holds; a division by zero or a value not written exactly
    assert corrected_prefix("48 / 2 = 24 clips") is None
    assert corrected_prefix("7 / 0 = 1") is None and corrected_prefix("7 / 3 = 2") is None
