"""The pair's goals as ``coinfer.demo.evaluate`` judges them (pure: no model)."""

from coinfer.demo.evaluate import _rules, cloud_answer, goals


def _ev(draft_words: float, target_words: float, refine: float, alone: float) -> dict:
    return {
        "draft": {"arith": 0.1, "select": 0.2, "words": draft_words},
        "target": {"arith": 0.4, "select": 0.5, "words": target_words},
        "refine": {"refine_verified_accuracy": refine, "refine_accuracy": refine - 0.1, "target_greedy": alone},
    }


def test_every_goal_met():
    assert all(goals(_ev(0.3, 0.7, 0.75, 0.7)).values())


def test_each_goal_can_fail():
    g = goals(_ev(0.65, 0.7, 0.6, 0.7))  # fallible draft too good, target not 20 above it, refine hurts
    assert not g["draft <= 0.60 on words"]
    assert not g["target >= draft + 0.20 on words"]
    assert not g["refine (verified candidates, as the cloud) >= target alone"]
    assert g["target >= draft + 0.20 on arith"] and g["target >= 0.60 on words"]
    assert not goals(_ev(0.3, 0.55, 0.8, 0.7))["target >= 0.60 on words"]


def test_a_refinement_that_breaks_a_rule_is_replaced_by_the_best_candidate():
    # a refinement the shipped target wrote (held-out words, 2026-12-02) and the candidate it was given
    rules = _rules()
    best = "The crates hold 7 * 8 = 56 stickers.\nIn total Aisha has 56 + 7 = 63 stickers.\nAnswer: 63"
    wrong_sum = "The crates hold 7 * 8 = 56 stickers.\nIn total Aisha has 56 + 7 = 64 stickers.\nAnswer: 64"
    assert (
        cloud_answer(
            "The crates hold 7 * 8 = 64 stickers.\nIn total Aisha has 64 + 7 = 61 stickers.\nAnswer: 61",
            [best, wrong_sum],
            rules,
        )
        == best
    )
    valid_but_wrong = "The crates hold 7 * 9 = 63 stickers.\nIn total Aisha has 63 + 7 = 70 stickers.\nAnswer: 70"
    assert cloud_answer(valid_but_wrong, [best], rules) == valid_but_wrong  # the rules pass it: it stands
