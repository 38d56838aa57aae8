"""The built-in repetition check: generated loops are invalid everywhere, natural answers are not."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

from coinfer.repetition import repetition_error
from coinfer.rules import RuleSet
from coinfer.tasks import OPEN, TASKS

ROOT = Path(__file__).resolve().parents[2]
PHRASES = [
    "a leaf's fate is determined",
    "The answer is 7.",
    "I am not sure.",
    "秋の葉が落ちる",
    "!",
    "ha",
    "Paris is the capital of France and",
    "x = x + 1;",
    "1 2 3 4",
]


def loops(rng: random.Random, n: int = 60) -> list[str]:
    """A sensible opening, then a phrase repeated to the end of a budget (how a model degenerates)."""
    out = []
    for _ in range(n):
        phrase = rng.choice(PHRASES)
        head = rng.choice(["", "Autumn comes.\n", "Let me think about this step by step. "])
        sep = rng.choice([" ", "\n", ""]) if len(phrase) > 2 else ""
        times = rng.randint(40, 120) if len(phrase) > 2 else rng.randint(200, 400)  # a budget's worth
        out.append(head + sep.join([phrase] * times))
    return out


def natural() -> list[str]:
    """Real prose, code and every built-in task's reference answers."""
    texts = []
    for path in sorted(ROOT.glob("*.md")) + sorted((ROOT / "coinfer").glob("*.py"))[:6]:
        body = path.read_text()
        texts += [body[i : i + 1500] for i in range(0, len(body), 1500)]
    rng = random.Random(0)
    for task in TASKS.values():
        for _ in range(50):
            texts.append(task.solve(task.generate(rng).spec))
    return [t for t in texts if t.strip()]


def test_generated_loops_are_invalid_with_a_precise_error():
    for text in loops(random.Random(1)):
        err = repetition_error(text)
        assert err.startswith("repetition:"), text[:80]
        res, _ = RuleSet([], OPEN, {}).check(text)
        assert not res.valid and res.failed_rule == "repetition" and res.error == err


def test_a_loop_that_has_begun_at_the_end_of_a_long_text_is_found():
    prose = natural()[0].split()[:150]  # 150 words of a sensible answer, then the loop begins
    for phrase in ("a leaf's fate is determined,", "and the wind blows and the leaves fall"):
        text = " ".join(prose + phrase.split() * 5)
        assert "ends in a loop" in repetition_error(text), phrase
        assert repetition_error(" ".join(prose + phrase.split())) == ""  # said once: a phrase, not a loop


def test_natural_text_and_task_answers_pass():
    texts = natural()
    assert len(texts) > 100
    flagged = [t[:80] for t in texts if repetition_error(t)]
    assert flagged == []


@pytest.mark.parametrize("text", ["Answer: 7", "yes yes yes", "Paris. " * 4, ""])
def test_short_repeats_are_not_loops(text):
    assert repetition_error(text) == ""


def test_linear_time_on_a_large_text():
    words = " ".join(str(i) for i in range(200_000))
    t0 = time.process_time()
    repetition_error(words)
    repetition_error("ab" * 500_000)
    assert time.process_time() - t0 < 5.0  # ~0.3 s here; a quadratic check would take minutes
