"""The demo's problems, graders and summary, without its servers (no vLLM here)."""

import random
from itertools import islice

from coinfer.demo import run, wordprob
from coinfer.tasks import TASKS, problems


def test_the_demo_draws_the_same_held_out_problems_in_kind_order_and_grades_them():
    cases = run.cases(random.Random(7), 2)
    assert [(c.kind, c.index) for c in cases] == [(k, i) for k in run.KINDS for i in range(2)]
    rng = random.Random(7)  # the draw order of the loop it replaced: each kind's stream in turn on one rng
    expected = [p.prompt for kind in TASKS for p in islice(problems(rng, (kind,), held_out=True), 2)]
    words = list(islice(wordprob.problems(rng, held_out=True), 2))
    assert [c.prompt for c in cases] == expected + [p.prompt for p in words]
    word, arith = cases[-1], cases[0]
    assert word.is_open and not arith.is_open
    assert word.grade(words[-1].solution) and not word.grade(f"Answer: {words[-1].answer + 1}")
    task = TASKS[arith.kind]
    assert arith.grade(task.solve(task.parse_problem(arith.prompt))) and not arith.grade("no answer")


def _row(kind: str, correct: bool, first: bool, target: bool, cloud_tokens: int, target_tokens: int) -> dict:
    stages = {k: 100.0 for k in run.STAGES}
    return {
        "task": kind,
        "correct": correct,
        "first_draft_correct": first,
        "target_correct": target,
        "drafts": 5,
        "drafts_correct": 2,
        "cloud_tokens": cloud_tokens,
        "target_tokens": target_tokens,
        "target_ms": 50.0,
        **stages,
    }


def test_the_summary_compares_split_first_draft_and_target_alone_per_kind():
    rows = [
        _row("arith", True, False, True, 0, 30),
        _row("arith", True, True, False, 12, 34),
        _row("words", False, False, False, 40, 60),
    ]
    report = {"problems": rows, **run.summarize(rows)}
    a = report["arith"]
    assert a["problems"] == 2 and a["accuracy"] == 1.0 and a["first_draft_accuracy"] == 0.5
    assert a["target_alone_accuracy"] == 0.5 and a["draft_accuracy"] == 0.4
    assert a["cloud_tokens_per_answer"] == {"split": 6.0, "target_alone": 32.0}
    assert "select" not in report  # no problems of that kind: no line
    lines = run.summary_table(report)
    assert len(lines) == 3 and lines[0].split()[:2] == ["task", "n"]
    assert lines[1].split() == ["arith", "2", "100%", "50%", "50%", "6.0", "32.0", "100", "50"]
    assert lines[2].split() == ["words", "1", "0%", "0%", "0%", "40.0", "60.0", "100", "50"]
    ends = {len(line) for line in lines}  # right-aligned numbers: every line ends in the same column
    assert len(ends) == 1, lines
