"""Pure logic of the edge pipeline (the pipeline itself runs against real engines in tests/integration)."""


def test_a_finished_draft_beats_a_truncated_one_with_a_better_score():
    from coinfer import types as t
    from coinfer.edge.pipeline import EdgePipeline
    from coinfer.rules import RuleSet
    from coinfer.tasks import OPEN

    cut = t.Draft(0, "Autumn wind, the leaves", 256, -0.649, truncated=True)
    done = t.Draft(1, "Autumn wind carries\nleaves across the quiet road\nthe year lets them go", 192, -0.668)
    best, valid, _ = EdgePipeline.local_answer(RuleSet([], OPEN, {}), [cut, done])
    assert best is done and valid
    loop = t.Draft(2, "a leaf's fate is determined " * 60, 512, -0.147)
    best, _, _ = EdgePipeline.local_answer(RuleSet([], OPEN, {}), [loop, cut])
    assert best is cut  # the loop fails the built-in repetition check
