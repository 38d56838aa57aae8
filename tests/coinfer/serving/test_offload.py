"""Small work on client data runs on the loop; large work, or work whose cost a client sets, in a thread."""

import asyncio
import threading

from coinfer.extract import Extraction
from coinfer.rules import Rule, RuleSet
from coinfer.serving.offload import INLINE_CHARS, run_sized
from coinfer.tasks import get_task


def test_work_runs_on_the_loop_only_when_its_size_is_known_and_small():
    async def where(size, **kw) -> bool:
        loop_thread = threading.get_ident()
        return await run_sized(size, lambda: threading.get_ident() == loop_thread, **kw)

    async def main():
        return [
            await where(0),
            await where(INLINE_CHARS),
            await where(INLINE_CHARS + 1),
            await where(None),
            await where(5000, limit=1 << 16),
        ]

    assert asyncio.run(main()) == [True, True, False, False, True]


def test_only_the_projects_own_rules_are_sized_by_the_text():
    arith = get_task("arith")
    spec = arith.parse_problem("If x=3 and y=5, compute (x+y)^2-x*y.")
    text = "x + y = 8. 8 * 8 = 64. answer 49"
    assert RuleSet([], arith, spec).check_size(text) == len(text)
    assert RuleSet([], get_task(""), {}).check_size(text) == len(text)  # open text: the repetition check
    # a client's pattern or extraction costs what the client makes it cost: always in a thread
    assert RuleSet([Rule("regex", {"pattern": "answer"})], arith, spec).check_size(text) is None
    assert RuleSet([], arith, spec, extraction=Extraction(kind="marker", marker="answer")).check_size(text) is None
