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
