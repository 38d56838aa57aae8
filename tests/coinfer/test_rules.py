import pytest

from coinfer.errors import InvalidArgument
from coinfer.rules import RULE_KINDS, Rule, RuleSet
from coinfer.tasks import get_task

SELECT = get_task("select")
SPEC = SELECT.parse_problem("Pick 2 of A(3,5) B(4,2) C(2,6) D(5,7) with cost<=8.")
ARITH = get_task("arith")
ASPEC = ARITH.parse_problem("If x=3 and y=5, compute (x+y)^2-x*y.")


def check(rules, text, task=SELECT, spec=SPEC):
    return RuleSet(rules, task, spec).check(text)[0]


def test_empty_rules_mean_task_defaults():
    rs = RuleSet([], SELECT, SPEC)
    assert rs.labels == [
        "task_check:select_steps",
        "membership",
        "count",
        "task_check:select_budget",
        "task_check:select_choice",
    ]


@pytest.mark.parametrize(
    "rule,text,error",
    [
        (Rule("numeric_bounds", {"field": "answer", "max": 40}), "answer 49", "out_of_bounds: answer=49 > 40"),
        (Rule("numeric_bounds", {"field": "answer", "min": 50}), "answer 49", "out_of_bounds: answer=49 < 50"),
        (Rule("length", {"max": 5}), "answer 49", "too_long: 9 chars > 5"),
        (Rule("length", {"min": 20}), "answer 49", "too_short: 9 chars < 20"),
        (Rule("regex", {"pattern": r"^\d"}), "answer 49", r"regex_failed: no match for /^\d/"),
        (
            Rule("regex", {"pattern": "answer", "must_match": False}),
            "answer 49",
            "regex_failed: forbidden match of /answer/",
        ),
        (
            Rule("membership", {"field": "answer", "values": [1, 2]}),
            "answer 49",
            "not_member: answer has '49' (allowed: 1,2)",
        ),
        (
            Rule("json_schema", {"schema": {"type": "object", "properties": {"answer": {"maximum": 10}}}}),
            "answer 49",
            "schema_violation: answer: 49 is greater than the maximum of 10",
        ),
        (Rule("count", {"field": "steps", "min": 1}), "answer 49", "count_wrong: steps has 0 (expected 1..inf)"),
        (Rule("numeric_bounds", {"field": "nope", "max": 1}), "answer 49", "missing_field: nope"),
    ],
)
def test_each_rule_kind_fails_precisely(rule, text, error):
    res = check([rule], text, ARITH, ASPEC)
    assert (res.valid, res.error) == (False, error)
    assert res.failed_rule == rule.kind


@pytest.mark.parametrize(
    "rule",
    [
        Rule("numeric_bounds", {"field": "answer", "min": 0, "max": 100}),
        Rule("length", {"max": 100}),
        Rule("regex", {"pattern": r"answer \d+$"}),
        Rule("json_schema", {"schema": {"type": "object", "required": ["answer"]}}),
        Rule("task_check", {"check": "arith_steps"}),
    ],
)
def test_each_rule_kind_passes(rule):
    res = check([rule], "3+5=8; 8^2=64; 3*5=15; 64-15=49; answer 49", ARITH, ASPEC)
    assert res.valid and res.passed[-1] == rule.label


def test_unknown_kind_lists_known():
    with pytest.raises(InvalidArgument) as e:
        RuleSet([Rule("vibes", {})], ARITH, ASPEC)
    assert e.value.message == f"problem.rules[0].kind: unknown rule kind 'vibes' (known: {', '.join(RULE_KINDS)})"


@pytest.mark.parametrize(
    "rule,field",
    [
        (Rule("numeric_bounds", {"max": 3}), "problem.rules[0].params.field"),
        (Rule("numeric_bounds", {"field": "answer"}), "problem.rules[0].params"),
        (Rule("numeric_bounds", {"field": "answer", "min": 5, "max": 1}), "problem.rules[0].params.min"),
        (Rule("numeric_bounds", {"field": "answer", "max": "ten"}), "problem.rules[0].params.max"),
        (Rule("membership", {"field": "ids"}), "problem.rules[0].params.values"),
        (Rule("regex", {"pattern": "("}), "problem.rules[0].params.pattern"),
        (Rule("regex", {"pattern": "a" * 600}), "problem.rules[0].params.pattern"),
        (Rule("json_schema", {"schema": {"type": "nonsense"}}), "problem.rules[0].params.schema"),
        (Rule("task_check", {"check": "select_budget"}), "problem.rules[0].params.check"),
    ],
)
def test_bad_params_name_the_field(rule, field):
    with pytest.raises(InvalidArgument) as e:
        RuleSet([rule], ARITH, ASPEC)
    assert e.value.message.startswith(field + ":"), e.value.message


def test_first_failure_stops_and_passed_lists_the_rest():
    rules = [
        Rule("length", {"max": 100}),
        Rule("numeric_bounds", {"field": "answer", "max": 10}, name="small"),
        Rule("regex", {"pattern": "never"}),
    ]
    res = check(rules, "answer 49", ARITH, ASPEC)
    assert (res.failed_rule, res.passed) == ("small", ["parse", "length"])


def test_parse_failure_is_the_first_rule():
    res = check([], "", ARITH, ASPEC)
    assert (res.valid, res.failed_rule, res.error) == (False, "parse", "parse_error: no 'answer <int>' found (empty)")


def test_only_an_open_request_with_no_rule_and_nothing_to_extract_is_judged_by_the_loop_watch_alone():
    # such an answer can stream as final (docs/api.md, Streaming); any rule or extraction waits for the whole
    from coinfer.extract import Extraction
    from coinfer.tasks import OPEN

    assert RuleSet([], OPEN, {}).only_loop_watch
    assert RuleSet([], OPEN, {}, extraction=Extraction("none")).only_loop_watch
    assert not RuleSet([Rule("length", {"max": 50})], OPEN, {}).only_loop_watch
    assert not RuleSet([], OPEN, {}, extraction=Extraction("marker")).only_loop_watch
    arith = get_task("arith")
    assert not RuleSet([], arith, arith.parse_problem("If x=3 and y=5, compute x+y.")).only_loop_watch


def _open(*rules: Rule) -> RuleSet:
    from coinfer.tasks import OPEN

    return RuleSet(list(rules), OPEN, {})


FORBID = {"pattern": "darn", "must_match": False}


@pytest.mark.parametrize(
    "rule,judges",
    [
        (Rule("arithmetic"), True),  # an equation is whole once its step ends
        (Rule("regex", FORBID), True),  # a forbidden match in a prefix is one in the whole
        (Rule("length", {"max": 50}), True),  # too long stays too long
        (Rule("regex", {"pattern": "darn"}), False),  # the match may come later
        (Rule("regex", {"pattern": r"\bdarn\b", "must_match": False}), False),  # \b at the end looks ahead
        (Rule("regex", {"pattern": "darn$", "must_match": False}), False),
        (Rule("regex", {"pattern": "dar(?=n)", "must_match": False}), False),
        (Rule("regex", {"pattern": r"(?<=\\)darn\\b", "must_match": False}), True),  # a literal backslash, b
        (Rule("length", {"min": 5, "max": 50}), False),  # too short may yet grow
        (Rule("numeric_bounds", {"field": "answer", "max": 3}), False),
        (Rule("json_schema", {"schema": {"type": "object"}}), False),
    ],
)
def test_which_rules_judge_a_prefix(rule, judges):
    assert _open(rule).judges_prefix is judges
    assert not _open(rule).only_loop_watch  # any rule waits at least for a step's end


def test_a_preset_or_an_extraction_judges_only_the_whole_answer():
    from coinfer.extract import Extraction
    from coinfer.tasks import OPEN

    assert _open().judges_prefix and _open(Rule("arithmetic"), Rule("regex", FORBID)).judges_prefix
    assert not RuleSet([Rule("arithmetic")], ARITH, ASPEC).judges_prefix  # the preset's parser needs the end
    assert not RuleSet([Rule("arithmetic")], OPEN, {}, extraction=Extraction("marker")).judges_prefix


def _marker(*rules: Rule, kind: str = "marker") -> RuleSet:
    from coinfer.extract import Extraction
    from coinfer.tasks import OPEN

    return RuleSet(list(rules), OPEN, {}, extraction=Extraction(kind))


def test_which_answers_stream_their_steps_with_their_end_held():
    bounds = Rule("numeric_bounds", {"field": "answer", "min": 0, "max": 99})
    assert RuleSet([], ARITH, ASPEC).streams_steps and RuleSet([], SELECT, SPEC).streams_steps  # the presets
    assert RuleSet([Rule("arithmetic"), Rule("task_check", {"check": "arith_plan"})], ARITH, ASPEC).streams_steps
    assert _marker(Rule("arithmetic"), bounds, Rule("length", {"min": 3})).streams_steps  # the demo's words
    assert _open(Rule("arithmetic")).streams_steps  # every rule judges a prefix
    # a match the prefix may already have made impossible, an end found only at the end: held whole
    assert not RuleSet([Rule("regex", {"pattern": "^x"})], ARITH, ASPEC).streams_steps
    assert not _marker(Rule("regex", {"pattern": r"\bdarn\b", "must_match": False})).streams_steps
    assert not _marker(bounds, kind="last_line").streams_steps and not _marker(bounds, kind="json").streams_steps
    assert not _open(Rule("length", {"min": 5})).streams_steps  # no end to hold: the rest waits whole


def test_a_presets_steps_are_judged_one_by_one_until_its_answer_begins():
    rules = RuleSet([], ARITH, ASPEC)  # (x+y)^2-x*y at x=3, y=5: 8, 64, 15, 49
    assert rules.prefix_error("x+y=8;") == "" and rules.prefix_error("3+5=8; 8^2=64;") == ""
    assert rules.prefix_error("x+y=8; 8^2=65;") == "arith: step_wrong: 8^2=65 (expected 64)"
    assert rules.prefix_error("x+y=8; x-y=-2;") == "arith: step_off_plan: x-y=-2 computes no step of (x+y)^2-x*y"
    assert rules.prefix_error("x+y=8; answer 8;") is None  # the answer is judged whole
    assert rules.prefix_error("First, x plus y.") is None  # no step of the preset's form: judged whole
    select = RuleSet([], SELECT, SPEC)  # A(3,5) B(4,2) C(2,6) D(5,7), cost <= 8
    assert select.prefix_error("AB 7:7; AC 5:11;") == ""
    assert select.prefix_error("AB 7:8;") == "select: step_wrong: AB value 8 (expected 7)"
    assert select.prefix_error("ABC 9>8;").startswith("select: step_off_task: ABC")  # it could not be listed
    assert select.prefix_error('{"ids": ["C", "D"]}\n') is None


def test_an_open_answers_text_is_judged_until_its_marker():
    rules = _marker(Rule("arithmetic"), Rule("numeric_bounds", {"field": "answer", "max": 99}))
    assert rules.prefix_error("Tom buys 3 * 4 = 12 apples.\n") == ""
    assert rules.prefix_error("Tom buys 3 * 4 = 13 apples.\n").startswith("arithmetic: arithmetic_wrong")
    assert rules.prefix_error("So 12 apples.\nAnswer: 12\n") is None
    from coinfer.extract import Extraction
    from coinfer.tasks import OPEN

    own = RuleSet([Rule("arithmetic")], OPEN, {}, extraction=Extraction("marker", marker="Final:"))
    assert own.prefix_error("Answer: 3 is a guess.\n") == "" and own.prefix_error("Final: 3\n") is None


def test_a_prefix_is_judged_by_the_rules_that_judge_prefixes():
    rules = _open(Rule("arithmetic"), Rule("regex", FORBID, name="polite"), Rule("length", {"max": 40}))
    assert rules.prefix_error("So 3 * 4 = 12.") == "" and rules.max_chars == 40
    assert rules.prefix_error("So 3 * 4 = 13.") == "arithmetic: arithmetic_wrong: 3 * 4 = 13 (expected 12)"
    assert rules.prefix_error("A darn pity.") == "polite: regex_failed: forbidden match of /darn/"
    assert _open().max_chars == float("inf")
