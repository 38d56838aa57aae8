"""English word problems: generators, solution format, the held-out split, the grader, mistakes."""

import random

from coinfer.demo import wordprob as w
from coinfer.tasks import is_held_out


def _equations(solution: str):
    for line in solution.split("\n")[:-1]:
        p = w._parse_eq(line)
        assert p is not None, line
        yield p


def test_solutions_are_exact_step_chains_with_an_answer_line():
    rng = random.Random(0)
    for _ in range(2000):
        p = w.generate(rng)
        lines = p.solution.split("\n")
        assert 2 <= len(lines) - 1 <= 3 and lines[-1] == f"Answer: {p.answer}"
        for _, _, a, b, op, c in _equations(p.solution):
            assert op in "+-*/" and {"+": a + b, "-": a - b, "*": a * b, "/": a / b}[op] == c
            assert 0 <= c <= 200
        assert p.prompt.endswith("?") and w.grade(p.solution, p.answer)
    assert len(w.TEMPLATES) >= 8


def test_every_template_is_used_and_deterministic():
    a = [w.generate(random.Random(7)) for _ in range(3)]
    assert a[0] == a[1] == a[2]
    rng = random.Random(1)
    firsts = {w.generate(rng).solution.split("\n")[-2].split(" ")[0] for _ in range(500)}
    assert len(firsts) >= 5


def test_half_as_many_template_like_the_gsm8k_example():
    rng = random.Random(3)
    prompt, steps, ans = w._t_half(rng)
    assert "half as many" in prompt and prompt.endswith("altogether?")
    (_, _, a, b, op1, half), (_, _, a2, b2, op2, total) = (w._parse_eq(s) for s in steps)
    assert (op1, b, half) == ("/", 2, a // 2) and (op2, a2, b2, total) == ("+", a, half, ans)


def test_held_out_split():
    rng = random.Random(2)
    train = [next(w.problems(rng, held_out=False)) for _ in range(50)]
    held = [next(w.problems(rng, held_out=True)) for _ in range(50)]
    assert not any(is_held_out(p.prompt) for p in train) and all(is_held_out(p.prompt) for p in held)


def test_grade_takes_the_last_answer_marker():
    assert w.grade("48 / 2 = 24\nAnswer: 72", 72)
    assert w.grade("Answer: 5\nno wait\nAnswer: 72<|im_end|>", 72)
    assert not w.grade("Answer: 72\nAnswer: 5", 72)
    assert w.grade("Answer:-3", -3) and w.grade("Answer:   12 clips", 12)
    assert not w.grade("answer 72", 72) and not w.grade("Answer:", 0) and not w.grade("", 0)
    assert w.parse_answer("Answer: x7") is None
    assert not w.grade("Answer: " + "9" * 5000, 1)  # long input: linear, no regex


def test_corruptions_are_wrong_but_plausible():
    rng = random.Random(5)
    wrong = 0
    for _ in range(500):
        p = w.generate(rng)
        bad = w.corrupt(p.solution, rng)
        wrong += not w.grade(bad, p.answer)
        assert bad != p.solution or w.grade(bad, p.answer)
    assert wrong >= 400
