import random
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coinfer.errors import InvalidArgument
from coinfer.extract import Extraction
from coinfer.rules import Rule, RuleSet
from coinfer.tasks import OPEN, TASKS, get_task
from coinfer.tasks.arith import evaluate
from coinfer.tasks.select import optimum

ARITH = get_task("arith")
SELECT = get_task("select")
SEED_PROMPT = "If x=3 and y=5, compute (x+y)^2-x*y."
POOL_PROMPT = "Pick 2 of A(3,5) B(4,2) C(2,6) D(5,7) with cost<=8."


def test_unknown_task_lists_known():
    with pytest.raises(
        InvalidArgument,
        match=r"problem.task: unknown task .poetry. \(known: arith, select; empty for an open request\)",
    ):
        get_task("poetry")


@pytest.mark.parametrize("name", sorted(TASKS))
def test_reference_answers_pass_rules_and_grade(name):
    task, rng = TASKS[name], random.Random(0)
    for _ in range(200):
        p = task.generate(rng)
        spec = task.parse_problem(p.prompt)
        assert spec == p.spec
        text = task.solve(spec)
        res, parsed = RuleSet([], task, spec).check(text)
        assert res.valid, (p.prompt, text, res)
        assert task.grade(spec, parsed)


def test_arith_seed_example():
    spec = ARITH.parse_problem(SEED_PROMPT)
    assert ARITH.solve(spec) == "3+5=8; 8^2=64; 3*5=15; 64-15=49; answer 49"
    rules = RuleSet([], ARITH, spec)
    # the seed's own notation (variable names) is checked too
    assert rules.check("x+y=8; 8^2=64; x*y=15; 64-15=49; answer 49")[0].valid
    res, _ = rules.check("x+y=8; 8^2=62; x*y=15; 62-15=47; answer 47")
    assert (res.valid, res.error, res.failed_rule) == (
        False,
        "step_wrong: 8^2=62 (expected 64)",
        "task_check:arith_steps",
    )
    res, parsed = rules.check("3+5=8; 8^2=64; 3*5=15; 64-15=49; answer 50")
    assert res.error == "answer_mismatch: answer 50 != last step 49"
    assert not ARITH.grade(spec, parsed)


def test_arith_plan_refuses_right_arithmetic_on_the_wrong_terms():
    spec = ARITH.parse_problem(SEED_PROMPT)
    rules = RuleSet([], ARITH, spec)
    # every step is right and the answer is the last one, but x*y was read as x+y
    res, _ = rules.check("3+5=8; 8^2=64; 3+5=8; 64-8=56; answer 56")
    assert (res.error, res.failed_rule) == (
        "step_missing: no step computes 3*5=15 of (x+y)^2-x*y",
        "task_check:arith_plan",
    )
    assert rules.check("x*y=15; x+y=8; 8^2=64; 64-15=49; answer 49")[0].valid  # another order is fine
    # steps are counted: one 1+1=2 is not both steps of x-(y+y) at x=4, y=1; nothing after the last
    twice = ARITH.parse_problem("If x=4 and y=1, compute x-(y+y).")
    assert ARITH.check("arith_plan", twice, ARITH.parse_answer("1+1=2; 1+2=3; answer 3")) == (
        "step_missing: no step computes 4-2=2 of x-(y+y)"
    )
    assert ARITH.check("arith_plan", twice, ARITH.parse_answer("1+1=2; 4-2=2; 2+1=3; answer 3")) == (
        "step_extra: 2+1=3 after the expression's last step 4-2"
    )
    # a verified prefix (what the cloud continues) holds only steps of the expression
    assert ARITH.verified_prefix(spec, "3+5=8; 8^2=64; 3*5=15; 64-16=48; answer 48") == ["3+5=8", "8^2=64", "3*5=15"]
    assert ARITH.verified_prefix(spec, "3+5=8; 3-5=-2; 8^2=64; answer 64") == ["3+5=8"]


def test_a_step_whose_value_is_the_expressions_but_whose_terms_are_not_is_off_plan():
    """At x=3, y=0, drafts of y*(x-y) wrote "3-3=0; 0*0=0;": each value one of the expression's steps' (0),
    the terms not. Continued as a verified prefix, the cloud found no way to the missing 3-0=3."""
    spec = ARITH.parse_problem("If x=3 and y=0, compute y*(x-y).")
    assert ARITH.step_error(spec, "3-3=0") == "step_off_plan: 3-3=0 computes no step of y*(x-y)"
    assert ARITH.step_error(spec, "0*0=0") == "step_off_plan: 0*0=0 computes no step of y*(x-y)"
    assert ARITH.verified_prefix(spec, "3-3=0; 0*0=0; answer 0") == []
    rules = RuleSet([], ARITH, spec)
    assert rules.prefix_error("3-3=0;") == "arith: step_off_plan: 3-3=0 computes no step of y*(x-y)"
    # the expression's own steps, in any order of a commutative operation, with the variables, or folded
    for right in ("3-0=3; 0*3=0;", "x-y=3; 3*0=0;", "0*(3-0)=0;"):
        assert rules.prefix_error(right) == "", right
    assert rules.check("3-0=3; 0*3=0; answer 0")[0].valid


def test_arith_negative_intermediate_parenthesised():
    spec = ARITH.parse_problem("If x=2 and y=5, compute (x-y)^2+x*y.")
    text = ARITH.solve(spec)
    assert text.startswith("2-5=-3; (-3)^2=9;")
    assert evaluate("(x-y)^2+x*y", spec["vars"]) == 19
    assert RuleSet([], ARITH, spec).check(text)[0].valid


@pytest.mark.parametrize(
    "prompt",
    ["", "compute 3+4", "If x=3, compute x**2.", "If x=3 and y=4, compute x/y.", "If x=3 and y=4, compute 9^99."],
)
def test_arith_bad_prompts_name_the_field(prompt):
    with pytest.raises(InvalidArgument, match="problem.prompt"):
        ARITH.parse_problem(prompt)


def test_arith_hostile_step_does_not_hang():
    spec = ARITH.parse_problem(SEED_PROMPT)
    res, _ = RuleSet([], ARITH, spec).check("9^9^9^9=1; answer 1")
    assert not res.valid and res.error.startswith("step_invalid")


def test_select_errors_are_precise():
    spec = SELECT.parse_problem(POOL_PROMPT)
    assert SELECT.solve(spec) == "AB 7:7; AC 5:11; AD 8:12; BC 6:8; BD 9>8; CD 7:13; answer C,D"
    rules = RuleSet([], SELECT, spec)
    cases = {
        "answer B,D": ("budget_exceeded: sum=9 > 8", "task_check:select_budget"),
        "answer C,E": ("not_member: ids has 'E' (allowed: A,B,C,D)", "membership"),
        "answer C,C": ("duplicate: ids has 'C' twice", "count"),
        "answer A,B,C": ("count_wrong: ids has 3 (expected 2..2)", "count"),
        "AB 7:8; answer A,B": ("step_wrong: AB value 8 (expected 7)", "task_check:select_steps"),
        "AD 9:12; answer A,D": ("step_wrong: AD cost 9 (expected 8)", "task_check:select_steps"),
        # the answer must follow from the steps shown: all listed, the best of them chosen
        "AB 7:7; AC 5:11; AD 8:12; BC 6:8; CD 7:13; answer C,D": (
            "step_missing: subset BD not listed",
            "task_check:select_choice",
        ),
        "AB 7:7; AC 5:11; AD 8:12; BC 6:8; BD 9>8; CD 7:13; answer A,D": (
            "answer_mismatch: answer A,D but CD is listed with the best value 13",
            "task_check:select_choice",
        ),
    }
    for text, (error, rule) in cases.items():
        res, _ = rules.check(text)
        assert (res.error, res.failed_rule) == (error, rule), text
    res, parsed = rules.check("answer A,C")  # valid but not optimal: the rules pass, the grade fails
    assert res.valid and not SELECT.grade(spec, parsed)
    assert optimum(spec["pool"], 2, 8) == 13


@pytest.mark.parametrize(
    "text",
    [
        "Sure! Here it is: {\u201cids\u201d: [\u201cC\u201d, \u201cD\u201d]} hope that helps",
        "After thinking: CD 7:13; answer C, D. Done.",
        "answer: c,d",
    ],
)
def test_select_parses_dirty_drafts(text):
    spec = SELECT.parse_problem(POOL_PROMPT)
    parsed = SELECT.parse_answer(text)
    assert parsed.ok and parsed.fields["ids"] == ["C", "D"], parsed
    assert SELECT.grade(spec, parsed)


@pytest.mark.parametrize(
    "text,ok",
    [
        ("3+5=8; 8^2=64; 3*5=15; 64-15=49; answer 49", True),
        ("Let me think.\n3+5=8; 8^2=64; 3*5=15; 64\u221215=49; so the answer is 49.", True),
        ("3 + 5 = 8 ; 8^2 = 64 ; answer: 49", True),
        ("3+5=8; 8^2=64; 3*5=1", False),  # truncated
        ("", False),
        ("\u201canswer\u201d 49", True),
    ],
)
def test_arith_parses_dirty_drafts(text, ok):
    parsed = ARITH.parse_answer(text)
    assert parsed.ok is ok, parsed
    if ok:
        assert parsed.fields["answer"] == 49
    else:
        assert parsed.error.startswith("parse_error")


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_parsers_never_raise(text):
    for name in ("arith", "select"):
        task = TASKS[name]
        prompt = SEED_PROMPT if name == "arith" else POOL_PROMPT
        res, parsed = RuleSet([], task, task.parse_problem(prompt)).check(text)
        # a verdict either way, never an exception: valid with no error, or invalid naming what failed
        assert (res.valid and not res.error and parsed.ok) or (not res.valid and res.error and res.failed_rule)


@settings(max_examples=200, deadline=None)
@given(
    st.integers(0, 12), st.integers(0, 12), st.sampled_from(["(x+y)^2-x*y", "x*y-y", "(x-y)^2+x*y"]), st.integers(0, 80)
)
def test_truncated_answer_is_never_valid(x, y, expr, cut):
    """A draft cut anywhere before its end (even mid-number: 'answer 4' of 49) fails the rules."""
    spec = ARITH.parse_problem(f"If x={x} and y={y}, compute {expr}.")
    full = ARITH.solve(spec)
    res, _ = RuleSet([], ARITH, spec).check(full[:cut])
    assert res.valid == (cut >= len(full)), (full[:cut], res)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="\u201c\u201d\u2018\u2019 \n,.:;", max_size=20), st.text(alphabet="abc xyz.!?", max_size=30))
def test_smart_quotes_and_prose_around_json(noise, prose):
    spec = SELECT.parse_problem(POOL_PROMPT)
    parsed = SELECT.parse_answer(f"{prose}{noise}{{\u201cids\u201d: [\u201cC\u201d, \u201cD\u201d]}}{noise}{prose}")
    assert parsed.ok and SELECT.grade(spec, parsed)


def test_verified_prefix_stops_at_the_first_wrong_step():
    spec = ARITH.parse_problem(SEED_PROMPT)
    assert ARITH.verified_prefix(spec, "3+5=8; 8^2=62; 3*5=15; answer 47") == ["3+5=8"]
    assert ARITH.verified_prefix(spec, "x+y=8; 8^2=64; oops; 3*5=15") == ["x+y=8", "8^2=64"]
    sspec = SELECT.parse_problem(POOL_PROMPT)
    assert SELECT.verified_prefix(sspec, "AB 7:7; AC 5:11; AD 9:12; answer A,D") == ["AB 7:7", "AC 5:11"]
    assert SELECT.verified_prefix(sspec, "BD 9>8; CD 7:13; answer C,D") == ["BD 9>8", "CD 7:13"]
    assert SELECT.verified_prefix(sspec, "") == []


def test_problems_parse_in_parallel_threads_while_the_collector_runs_python():
    """CPython 3.11's ast.parse is not thread-safe when a collection runs Python callbacks (the servers
    parse problems in worker threads; the loop watch has a gc callback): SystemError without the lock."""
    import gc
    import threading
    import time

    from coinfer.tasks.arith import _tree

    errors: list[str] = []

    def work() -> None:
        for _ in range(1500):
            try:
                _tree("-" * 60 + "x")
                _tree("+".join(["x"] * 60))
            except SystemError as exc:
                errors.append(str(exc))

    def callback(phase: str, info: dict) -> None:
        time.perf_counter()

    old = gc.get_threshold()
    gc.callbacks.append(callback)
    gc.set_threshold(50)
    try:
        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        gc.callbacks.remove(callback)
        gc.set_threshold(*old)
    assert errors == []


def test_select_corrects_a_steps_sums_and_an_answer_its_own_steps_contradict():
    select = TASKS["select"]
    spec = select.parse_problem("Pick 2 of A(4,9) B(3,6) C(8,2) D(1,8) with cost<=8.")
    right = "AB 7:15; AC 12>8; AD 5:17; BC 11>8; BD 4:14; CD 9>8; answer A,D"
    assert select.corrected_prefix(spec, right) is None
    # the first wrong step gets its subset's true sums (the subset stays the model's); fits or not
    assert select.corrected_prefix(spec, "AB 7:15; AC 9:11; AD 5:17; answer A,C") == "AB 7:15; AC 12>8;"
    assert select.corrected_prefix(spec, "AB 6:15; answer A,B") == "AB 7:15;"
    # right steps, an answer that is not the best they list: that one
    assert select.corrected_prefix(spec, right.replace("answer A,D", "answer A,B")) == right
    # an id not in the pool, or no step to correct: nothing
    assert select.corrected_prefix(spec, "AZ 7:15; answer A,Z") is None
    assert select.corrected_prefix(spec, "answer A,D") is None


def test_select_repairs_every_sum_in_place_and_keeps_the_subsets_and_the_choice():
    select = TASKS["select"]
    spec = select.parse_problem("Pick 2 of A(4,9) B(3,6) C(8,2) D(1,8) with cost<=8.")
    right = "AB 7:15; AC 12>8; AD 5:17; BC 11>8; BD 4:14; CD 9>8; answer A,D"
    rules = RuleSet([], select, spec)
    assert select.repaired(spec, right) is None  # nothing to repair
    # wrong sums, a fitting subset written over budget and one the other way, the right choice: repaired, it passes
    slips = "AB 7:16; AC 9:11; AD 5:16; BC 11>8; BD 5>8; CD 9>8; answer A,D"
    assert not rules.check(slips)[0].valid
    assert select.repaired(spec, slips) == right and rules.check(right)[0].valid
    # the model's choice is kept: repaired sums show it is not the best listed, and the rules still fail it
    wrong_choice = select.repaired(spec, slips.replace("answer A,D", "answer B,D"))
    assert wrong_choice == right.replace("answer A,D", "answer B,D")
    assert rules.check(wrong_choice)[0].failed_rule == "task_check:select_choice"
    # a subset left out stays left out (select_choice fails it); ids not in the pool, or not k distinct, untouched
    missing = select.repaired(spec, "AB 7:16; AD 5:17; answer A,D")
    assert missing == "AB 7:15; AD 5:17; answer A,D" and not rules.check(missing)[0].valid
    assert select.repaired(spec, "AZ 7:15; AA 8:18; ABC 1:1; answer A,D") is None
    # spacing and the text around the steps kept
    assert select.repaired(spec, "AB  7 : 16;\nanswer A,B") == "AB 7:15;\nanswer A,B"


def test_arith_repairs_each_value_and_carries_it_to_where_the_draft_used_it():
    arith = TASKS["arith"]
    spec = arith.parse_problem("If x=2 and y=0, compute (x-y)^2+x*y.")
    rules = RuleSet([], arith, spec)
    # 1 was written for 2-0 and for 2^2: each later use reads the step that then computes the expression's
    slips = "2-0=1; 1^2=1; 2*0=0; 1+0=1; answer 1"
    assert arith.repaired(spec, slips) == "2-0=2; 2^2=4; 2*0=0; 4+0=4; answer 4"
    assert rules.check(arith.repaired(spec, slips))[0].valid
    assert arith.repaired(spec, arith.solve(spec)) is None  # right: nothing to repair
    # spacing, negative operands, newlines kept
    spec = arith.parse_problem("If x=3 and y=6, compute (x-y)^2+x*y.")
    assert arith.repaired(spec, "3 - 6 = -1\n(-1)^2 =1\n3*6=18; 1+18=27; answer 27") == (
        "3 - 6 = -3\n(-3)^2 =9\n3*6=18; 9+18=27; answer 27"
    )
    # the model's operations stay its own: wrong terms still fail once repaired
    spec = arith.parse_problem("If x=3 and y=0, compute y*(x-y).")
    repaired = arith.repaired(spec, "0-3=-3; 0*(-3)=-3; answer -3")
    assert repaired == "0-3=-3; 0*(-3)=0; answer 0" and rules_fail(arith, spec, repaired) == "task_check:arith_plan"
    # an answer that was not the last step's value stays as written (arith_steps fails it); prose untouched
    spec = arith.parse_problem("If x=3 and y=5, compute (x+y)^2.")
    assert arith.repaired(spec, "3+5=9; 9^2=81; answer 80") == "3+5=8; 8^2=64; answer 80"
    assert arith.repaired(spec, "so we add them; answer 64") is None


def rules_fail(task, spec, text: str) -> str:
    res, _ = RuleSet([], task, spec).check(text)
    return "" if res.valid else res.failed_rule


def test_arith_corrects_a_steps_value_as_it_evaluates_the_step_its_terms_kept():
    arith = TASKS["arith"]
    spec = arith.parse_problem("If x=6 and y=3, compute x-(y-x).")  # -3, then 9
    # a negative operand in parentheses: the text calculator reads no such equation
    assert arith.corrected_prefix(spec, "3-6=-3; 6-(-3)=6; answer 6") == "3-6=-3; 6-(-3)=9"
    assert arith.corrected_prefix(spec, "3-6=-3;\n6 - (-3) = 6;") == "3-6=-3;\n6 - (-3) = 9"  # spacing kept
    assert arith.corrected_prefix(spec, "3-6=-3; 6-(-3)=9; answer 9") is None  # right
    spec = arith.parse_problem("If x=3 and y=5, compute (x+y)^2-x*y.")
    assert arith.corrected_prefix(spec, "3+5=8; 8^2=63; answer 63") == "3+5=8; 8^2=64"


def test_the_default_correction_is_the_arithmetic_of_any_text():
    arith = TASKS["arith"]
    spec = arith.parse_problem("If x=3 and y=5, compute (x+y)^2-x*y.")
    assert arith.corrected_prefix(spec, "3+5=8; 8^2=64; 3*5=16; 64-16=48; answer 48") == "3+5=8; 8^2=64; 3*5=15"


def test_a_repair_of_hostile_text_is_bounded_and_never_raises():
    arith = TASKS["arith"]
    spec = arith.parse_problem("If x=3 and y=5, compute (x+y)^2.")
    rules = RuleSet([], arith, spec)
    # every step writes 0 for another sum, then steps of four 0s: each literal has one candidate (the latest
    # repair of a 0), so a step has at most 2^4 variants, whatever the draft wrote before
    hostile = "".join(f"1+{i}=0; " for i in range(1, 300)) + "0+0+0+0=0; " * 40 + "answer 0"
    res, _, text, repaired = rules.check_repaired(hostile[:4096])
    assert not res.valid and text == hostile[:4096] and repaired == ""
    # a number past int()'s digit limit: a parse error, no repair tried
    res, _, _, repaired = rules.check_repaired("3+5=" + "9" * 5000 + "; answer 8")
    assert res.failed_rule == "parse" and repaired == ""
    select = TASKS["select"]
    sspec = select.parse_problem("Pick 2 of A(4,9) B(3,6) C(8,2) D(1,8) with cost<=8.")
    res, _, _, repaired = RuleSet([], select, sspec).check_repaired("AB 7:" + "1" * 5000 + "; answer A,B")
    assert res.failed_rule == "parse" and repaired == ""


def test_an_expression_with_no_plan_of_steps_is_refused_with_the_field_named():
    arith = TASKS["arith"]
    # the hostile fuzz's prompt: 64 signs ended the edge's local answer with an AssertionError (HTTP 500);
    # and with no operation to write, any answer passed the checkers
    for expr, why in [
        ("-" * 64 + "x", "a sign before"),
        ("-(x+y)*2", "a sign before 'x + y': write it as 0-(x + y)"),
        ("x", "it computes nothing"),
        ("(-3)", "it computes nothing"),
    ]:
        with pytest.raises(InvalidArgument, match=rf"problem.prompt: bad expression .*{re.escape(why)}"):
            arith.parse_problem(f"If x=1 and y=2, compute {expr}.")
    spec = arith.parse_problem("If x=3 and y=5, compute (-2)*x+y.")  # a negative literal is a term
    assert arith.solve(spec) == "(-2)*3=-6; (-6)+5=-1; answer -1"
    assert arith.repaired(spec, "(-2)*3=-5; (-5)+5=0; answer 0") == "(-2)*3=-6; (-6)+5=-1; answer -1"


@pytest.mark.parametrize("name", ["arith", "select"])
def test_every_beginning_of_a_right_step_is_ended_by_the_calculator_into_a_right_step(name):
    task, rng = TASKS[name], random.Random(7)
    for _ in range(40):
        spec = task.generate(rng).spec
        steps = [s.strip() for s in task.solve(spec).split(";")][:-1]  # the steps, not "answer ..."
        for step in steps:
            for n in range(1, len(step) + 1):
                rest = task.step_completion(spec, " " + step[:n])
                assert rest is not None and task.step_error(spec, step[:n] + rest) == "", (step, n, rest)
        assert task.step_completion(spec, "answer ") is None and task.step_completion(spec, "") is None


_ARITH_SPEC = TASKS["arith"].parse_problem("If x=3 and y=-2, compute (x-y)^2+x*y.")
_SELECT_SPEC = TASKS["select"].parse_problem("Pick 2 of A(4,9) B(3,6) C(8,2) D(1,8) with cost<=8.")


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet="0123456789+-*^()= ABCDEx:>", max_size=24))
def test_whatever_a_step_begins_with_the_calculators_end_is_a_right_step_or_none(partial):
    for name, spec in (("arith", _ARITH_SPEC), ("select", _SELECT_SPEC)):
        rest = TASKS[name].step_completion(spec, partial)
        assert rest is None or TASKS[name].step_error(spec, partial + rest) == "", (name, partial, rest)
    assert TASKS["arith"].step_completion(_ARITH_SPEC, "1" * 65) is None  # bounded: MAX_PARTIAL_CHARS


def test_an_open_texts_repair_is_offered_only_under_the_arithmetic_rule_whether_or_not_it_passes():
    draft = "She buys 3 * 6 = 17 stamps.\nNow she has 25 + 17 = 42 stamps."  # no marker: fails the extraction
    rules = RuleSet([Rule("arithmetic", {})], OPEN, {}, extraction=Extraction(kind="marker"))
    assert rules.repaired(draft) == "She buys 3 * 6 = 18 stamps.\nNow she has 25 + 18 = 43 stamps."
    assert not rules.check_repaired(draft)[0].valid  # check_repaired keeps only a repair that passes
    assert RuleSet([], OPEN, {}).repaired(draft) is None  # no calculator rule: nothing vouches for one
    assert rules.repaired("3 * 6 = " + "9" * 5000) is None  # a number past the calculator's digits
