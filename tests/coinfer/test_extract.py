"""Answer extraction per request: every kind, numbers, never raising, bounded time."""

import time

import pytest

from coinfer.errors import InvalidArgument
from coinfer.extract import Extraction, answer_key, number
from coinfer.rules import Rule, RuleSet
from coinfer.tasks import OPEN, get_task

SOLUTION = "In May Natalia sold 48 / 2 = 24 clips.\nAltogether she sold 48 + 24 = 72 clips.\nAnswer: 72"


@pytest.mark.parametrize(
    "text,value",
    [
        ("72", 72),
        ("$1,200.50 total", 1200.5),
        ("-3 apples", -3),
        ("x 3", None),
        ("12,345,678 ok", 12345678),
        ("1,23", 1),
        ("", None),
        ("\u00b2", None),
    ],
)
def test_number_at_the_start(text, value):
    assert number(text) == value


@pytest.mark.parametrize(
    "extraction,text,fields",
    [
        (Extraction("marker"), SOLUTION, {"answer": 72, "answer_text": "72"}),
        (Extraction("marker", marker="=>"), "a => 5\nb => 6 cats", {"answer": 6, "answer_text": "6 cats"}),
        (Extraction("boxed"), r"so \boxed{\frac{1}{2}} then \boxed{7}", {"answer": 7, "answer_text": "7"}),
        (Extraction("boxed"), r"\boxed{a{b}c}", {"answer": "a{b}c", "answer_text": "a{b}c"}),
        (
            Extraction("last_line"),
            "work\nThe answer is 9\n\n",
            {"answer": "The answer is 9", "answer_text": "The answer is 9"},
        ),
        (Extraction("json"), 'Sure: {"ids": ["C", "D"], "total": 13} done', {"ids": ["C", "D"], "total": 13}),
        (Extraction("json"), "\u201c{\u201cx\u201d: 1}\u201d", {"x": 1}),  # smart quotes (docs/design.md §5.1)
        (Extraction("regex", pattern=r"total (?P<answer>\d+)"), "total 4, total 5", {"answer": 5, "answer_text": "5"}),
        (Extraction("none"), "anything", {}),
    ],
)
def test_each_kind(extraction, text, fields):
    parsed = extraction(text)
    assert parsed.ok, parsed.error
    assert parsed.fields == fields


@pytest.mark.parametrize(
    "extraction,text,error",
    [
        (Extraction("marker"), "no marker here", "parse_error: no 'Answer:' marker found (truncated?)"),
        (Extraction("marker"), "Answer:   ", "parse_error: nothing after 'Answer:'"),
        (Extraction("boxed"), r"\boxed{unclosed", "parse_error: no complete \\boxed{...} found"),
        (Extraction("json"), "{not json", "parse_error: no JSON object found"),
        (Extraction("last_line"), " \n ", "parse_error: empty text"),
        (Extraction("regex", pattern=r"(?P<answer>\d+)"), "none", "parse_error: no match"),
    ],
)
def test_failures_are_errors_not_exceptions(extraction, text, error):
    parsed = extraction(text)
    assert not parsed.ok and parsed.error.startswith(error), parsed.error


@pytest.mark.parametrize(
    "extraction,field",
    [
        (Extraction("poetry"), "extraction.kind"),
        (Extraction("regex"), "extraction.pattern"),
        (Extraction("regex", pattern="(unclosed"), "extraction.pattern"),
        (Extraction("regex", pattern=r"\d+"), "extraction.pattern"),  # no named group
        (Extraction("marker", marker="x" * 65), "extraction.marker"),
    ],
)
def test_bad_extraction_names_the_field(extraction, field):
    with pytest.raises(InvalidArgument, match=field):
        extraction.validate()


def test_linear_time_on_hostile_text():
    text = "{" * 20000 + "\\boxed{" * 2000 + "Answer:" * 2000
    t0 = time.thread_time()
    for kind in ("marker", "boxed", "json", "last_line"):
        Extraction(kind)(text)
    assert time.thread_time() - t0 < 2.0  # a hang guard in CPU time, 68x what the four took (measured 29 ms)


def test_agreement_key_compares_numbers_as_numbers():
    m = Extraction("marker")
    assert answer_key(m("Answer: 72")) == answer_key(m("Answer: 72.0 clips")) == 72.0
    assert answer_key(m("Answer: Paris")) == answer_key(m("Answer:  paris ")) == "paris"


def test_open_request_rules_run_on_extracted_fields_and_text():
    rules = RuleSet(
        [Rule("numeric_bounds", {"field": "answer", "min": 0, "max": 100}), Rule("arithmetic")],
        OPEN,
        {},
        extraction=Extraction("marker"),
    )
    assert rules.check(SOLUTION)[0].valid
    res, _ = rules.check(SOLUTION.replace("= 72", "= 73"))
    assert (res.failed_rule, res.error) == ("arithmetic", "arithmetic_wrong: 48 + 24 = 73 (expected 72)")
    res, _ = rules.check("Answer: 500")
    assert res.failed_rule == "numeric_bounds" and res.error == "out_of_bounds: answer=500 > 100"
    res, _ = rules.check("I do not know")
    assert res.failed_rule == "parse"
    assert RuleSet([], OPEN, {}).check("Explain why the sky is blue: Rayleigh scattering.")[0].valid


def test_presets_use_the_same_mechanism_and_extraction_overrides_their_parser():
    arith = get_task("arith")
    spec = arith.parse_problem("If x=3 and y=5, compute x+y.")
    assert RuleSet([], arith, spec).check("3+5=8; answer 8")[0].valid  # the preset's own parser
    res, parsed = RuleSet(
        [Rule("numeric_bounds", {"field": "answer", "max": 9})],
        arith,
        spec,
        extraction=Extraction("marker", marker="answer"),
    ).check("3+5=8; answer 8")
    assert res.valid and parsed.fields["answer"] == 8
    with pytest.raises(InvalidArgument, match=r"problem.rules\[0\].params.check"):
        RuleSet([Rule("task_check", {"check": "arith_steps"})], OPEN, {})  # an open request has no checkers


@pytest.mark.parametrize(
    "text",
    [
        "Tom has 3 + 12 = 15 apples | Answer: N",
        "Answer: <int>",
        "Answer: [answer]",
        "Answer: ...",
        "Answer: your answer",
    ],
)
def test_a_placeholder_copied_from_an_instruction_is_no_answer(text):
    parsed = Extraction("marker")(text)
    assert not parsed.ok and "placeholder" in parsed.error


@pytest.mark.parametrize("text,answer", [("Answer: 15", 15), ("Answer: B", "B"), ("Answer: Paris", "Paris")])
def test_real_answers_are_not_placeholders(text, answer):
    assert Extraction("marker")(text).fields["answer"] == answer
