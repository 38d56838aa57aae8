"""The exact-split benchmark's table from its rows (pure): equal counts, mismatches with their lead, the
per-answer costs and their ratios to the cloud plan's (plain greedy on the same engine)."""

from benchmarks.exact_split import report, same_answers


def _cost(steps, decoded, scored=0, offered=0, accepted=0, requests=1):
    return {
        "steps": steps,
        "decoded_tokens": decoded,
        "scored_tokens": scored,
        "prompt_tokens": 50 * requests + scored,
        "cached_tokens": 40 * requests,
        "draft_tokens_offered": offered,
        "draft_tokens_accepted": accepted,
        "engine_requests": requests,
    }


def _row(prompt, equal, split_cost, cloud_cost, lead=None, split_text="a"):
    row = {
        "prompt": prompt,
        "cloud": {"text": "a", "ms": 100.0, "info": {"cloud_cost": cloud_cost, "timings_ms": {}}},
        "split": {
            "text": split_text,
            "ms": 150.0,
            "info": {"cloud_cost": split_cost, "timings_ms": {"first_draft": 40.0}},
        },
        "cloud_stream": {"text": "a", "ms": 100.0, "first_ms": 10.0},
        "split_stream": {"text": "a", "ms": 150.0, "first_ms": 60.0},
        "equal": equal,
        "equal_stream": True,
    }
    if lead is not None:
        row["lead"] = lead
    return row


def test_the_report_counts_equal_answers_and_states_splits_work_against_greedys():
    rows = [
        _row("p1", True, _cost(40, 39, scored=70, offered=60, accepted=50, requests=3), _cost(90, 90)),
        _row(
            "p2",
            False,
            _cost(60, 59, scored=40, offered=30, accepted=20, requests=2),
            _cost(90, 90),
            lead=0.0004,
            split_text="ab",
        ),
    ]
    out = report(rows)
    assert out["equal_plain"] == 1 and out["equal_streamed"] == 2
    assert out["mismatches"] == [
        {
            "prompt": "p2",
            "streamed": False,
            "lead_nats": 0.0004,
            "at_char": 1,
            "lengths": [1, 2],
            "cloud": "a",
            "split": "ab",
            "how": {"cloud": {}, "split": {}},
        }
    ]
    assert out["split_steps_over_greedy"] == round(50 / 90, 3)
    assert out["split_scored_plus_decoded_over_greedy_tokens"] == round((55 + 49) / 90, 3)
    assert out["draft_tokens_taken_share"] == round(35 / 45, 3) and out["answer_tokens_from_drafts"] == round(
        35 / 90, 3
    )
    assert out["first_content_p50_ms"] == {"cloud": 10, "split": 60} and out["edge_first_draft_p50_ms"] == 40


def test_two_runs_compare_answer_by_answer_per_plan():
    rows = [_row("p1", True, _cost(1, 1), _cost(2, 2)), _row("p2", False, _cost(1, 1), _cost(2, 2), 0.1, "b")]
    ours = report(rows)
    assert ours["answers"] == [
        {"prompt": "p1", "cloud": "a", "split": "a"},
        {"prompt": "p2", "cloud": "a", "split": "b"},
    ]
    theirs = {"answers": [{"prompt": "p2", "cloud": "a", "split": "a"}, {"prompt": "p3", "cloud": "x", "split": "x"}]}
    assert same_answers(ours, theirs) == {
        "prompts": 1,
        "equal_cloud": 1,
        "equal_split": 0,
        "differ": [{"prompt": "p2", "plans": ["split"]}],
    }
