"""The demo pair's keys: each model is keyed by what its weights depend on, so one can be retrained alone."""

import json
from dataclasses import replace

import pytest

from coinfer.demo import train


def test_a_draft_change_invalidates_the_draft_alone():
    recipe = train.Recipe()
    bigger = replace(recipe, draft=replace(recipe.draft, steps=recipe.draft.steps + 1))
    assert train.target_key(bigger) == train.target_key(recipe)
    assert train.draft_key(bigger) != train.draft_key(recipe) and train.pair_key(bigger) != train.pair_key(recipe)


def test_the_target_key_covers_its_sampler_and_the_data():
    recipe = train.Recipe()
    assert train.target_key(replace(recipe, sampler=replace(recipe.sampler, seed=9))) != train.target_key(recipe)
    mix = replace(recipe, weights=(0.4, 0.1, 0.5))
    assert train.target_key(mix) != train.target_key(recipe) and train.draft_key(mix) != train.draft_key(recipe)
    # evaluation settings decide no weights
    assert train.pair_key(replace(recipe, eval_problems=10, refine_eval=0)) == train.pair_key(recipe)


def test_retraining_the_draft_alone_needs_a_matching_target(tmp_path):
    (tmp_path / "report.json").write_text(json.dumps({"target_key": "0" * 16}))
    with pytest.raises(SystemExit, match="retrain both"):
        train.retrain_draft(tmp_path)


def test_the_keys_hash_code_with_the_project_modules_named_by_their_folders():
    """An installed path (coinfer.demo.x) and its folder (demo.x) hash alike; any other change does not."""

    def a():
        from coinfer.demo.evaluate import _load  # noqa: F401

    def b():
        from demo.evaluate import _load  # noqa: F401

    def c():
        from demo.evaluate import _generate  # noqa: F401

    assert train.code_text(a).replace("name='a'", "name='b'") == train.code_text(b)
    assert train.code_text(b).replace("name='b'", "name='c'") != train.code_text(c)


def test_the_keys_hash_what_code_does_not_its_layout_or_comments():
    """A reformatted or commented training function keeps its key (ruff format once changed the shipped
    pair's key without changing its recipe); a changed value does not."""

    def a(x):
        return {"k": x + 1}

    def b(x):  # the same code, another layout
        # a comment
        return {
            "k": x + 1,
        }

    def c(x):
        return {"k": x + 2}

    assert train.code_text(a).replace("name='a'", "name='b'") == train.code_text(b)
    assert train.code_text(a).replace("name='a'", "name='c'") != train.code_text(c)
