"""Pure logic of the edge pipeline (the pipeline itself runs against real engines in tests/integration)."""


def test_a_finished_draft_beats_a_truncated_one_with_a_better_score():
    from coinfer import types as t
    from coinfer.edge.pipeline import EdgePipeline
    from coinfer.rules import RuleSet
    from coinfer.tasks import OPEN

    cut = t.Draft(index=0, text="Autumn wind, the leaves", num_tokens=256, mean_logprob=-0.649, truncated=True)
    done = t.Draft(
        index=1,
        text="Autumn wind carries\nleaves across the quiet road\nthe year lets them go",
        num_tokens=192,
        mean_logprob=-0.668,
    )
    best, valid, _, _ = EdgePipeline.local_answer(RuleSet([], OPEN, {}), [cut, done])
    assert best is done and valid
    loop = t.Draft(index=2, text="a leaf's fate is determined " * 60, num_tokens=512, mean_logprob=-0.147)
    best, _, _, _ = EdgePipeline.local_answer(RuleSet([], OPEN, {}), [loop, cut])
    assert best is cut  # the loop fails the built-in repetition check


def test_where_a_presets_checkers_judge_a_draft_with_wrong_sums_is_the_answer_repaired():
    from coinfer import types as t
    from coinfer.edge.pipeline import EdgePipeline
    from coinfer.rules import RuleSet
    from coinfer.tasks import get_task
    from tests.cloud.test_judging import SELECT_PROMPT, SELECT_RIGHT, SELECT_SLIPS

    select = get_task("select")
    rules = RuleSet([], select, select.parse_problem(SELECT_PROMPT))
    wrong_choice = t.Draft(
        index=0, text=SELECT_SLIPS.replace("answer A,D", "answer B,D"), num_tokens=40, mean_logprob=-0.1
    )  # the likelier
    slips = t.Draft(index=1, text=SELECT_SLIPS, num_tokens=40, mean_logprob=-0.3)
    best, valid, fields, repaired = EdgePipeline.local_answer(rules, [wrong_choice, slips])
    assert valid and repaired and best.text == SELECT_RIGHT and best.index == 1 and fields["ids"] == ["A", "D"]
    # a repair that would rewrite text already shown as final is not taken
    best, valid, _, repaired = EdgePipeline.local_answer(rules, [slips], shown=SELECT_SLIPS[:8])
    assert not valid and not repaired and best is slips
    # rules of the request's own are not exact: nothing is repaired
    own = RuleSet(select.default_rules(rules.spec), select, rules.spec)
    best, valid, _, repaired = EdgePipeline.local_answer(own, [slips])
    assert not valid and not repaired and best is slips
