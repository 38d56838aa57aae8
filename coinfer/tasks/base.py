"""What a task preset is: prompt parser + answer extraction + checkers + default rules + grader.

The built-in tasks and an open request (``OpenTask``: no prompt grammar, the request's own
extraction) go through the same mechanism: ``RuleSet`` extracts, then checks.

A task turns a prompt into a ``spec`` (the structured problem: variables, pool,
budget), parses a draft into a ``Parsed`` answer without ever raising, checks
task-specific constraints, and grades an answer exactly against the truth.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from coinfer.arithmetic import corrected_prefix
from coinfer.arithmetic import repaired as repaired_equations
from coinfer.extract import Parsed, answer_key
from coinfer.rulespec import Rule


@dataclass(frozen=True)
class Problem:
    """One generated problem: the prompt and its structured spec."""

    task: str
    prompt: str
    spec: dict[str, Any]


MAX_PARTIAL_CHARS = 64
"""The longest beginning of a step ``Task.step_completion`` reads: a preset's step is some 5-20
characters; a longer one is no step the calculator knows, and the check stays bounded per token."""


def split_steps(text: str) -> list[str]:
    """A draft's steps: its ';'- or newline-separated parts before the ``answer`` part."""
    out = []
    for part in text.replace("\n", ";").split(";"):
        part = part.strip()
        if part.lower().startswith("answer"):
            break
        if part:
            out.append(part)
    return out


class Task(ABC):
    """A built-in task. Subclasses are stateless singletons."""

    name: str = ""
    #: Task checkers this task offers to ``task_check`` rules, name -> description.
    checkers: dict[str, str] = {}

    @abstractmethod
    def generate(self, rng: random.Random) -> Problem:
        """A random problem (deterministic for a seeded ``rng``)."""

    @abstractmethod
    def parse_problem(self, prompt: str) -> dict[str, Any]:
        """Prompt -> spec; raises InvalidArgument naming ``problem.prompt``."""

    @abstractmethod
    def solve(self, spec: dict[str, Any]) -> str:
        """The reference answer text, in the format drafts are trained to write."""

    @abstractmethod
    def parse_answer(self, text: str) -> Parsed:
        """Draft text -> Parsed. Never raises: dirty text gives ``Parsed(error=...)``."""

    @abstractmethod
    def check(self, checker: str, spec: dict[str, Any], parsed: Parsed) -> str:
        """Run a task checker; '' when it passes, else a stable precise error."""

    @abstractmethod
    def grade(self, spec: dict[str, Any], parsed: Parsed) -> bool:
        """Exact grade of an answer against the true solution."""

    @abstractmethod
    def default_rules(self, spec: dict[str, Any]) -> list[Rule]:
        """The rule set used when a request carries none."""

    @abstractmethod
    def structure_key(self, parsed: Parsed) -> tuple:
        """Normalised structure (numbers, ids, operators, answer) for de-duplication."""

    @abstractmethod
    def step_ok(self, spec: dict[str, Any], step: str) -> bool:
        """Whether one step (a part of ``split_steps``) is well-formed and exactly right."""

    def step_error(self, spec: dict[str, Any], step: str) -> str | None:
        """One step (a part of ``split_steps``) judged alone: '' when it is right, why when it is a step of
        the task's form with a wrong value (the cloud corrects or resamples it), None when it is not a step
        (prose, an answer in another form: the whole answer judges it). Default: ``step_ok``, and anything
        else is not a step."""
        return "" if self.step_ok(spec, step) else None

    def prefix_error(self, spec: dict[str, Any], text: str) -> str | None:
        """A prefix that ends a step, judged step by step (``step_error``): '' when every part is a right
        step, the first wrong step's error, None from the first part that is no step or begins the answer
        (``answer ...``): the rest is held for the whole answer's rules (``RuleSet.prefix_error``). A prefix
        of right steps can always be finished into an answer the task's checkers pass: the steps left, then
        the answer they give."""
        for part in text.replace("\n", ";").split(";"):
            part = part.strip()
            if not part:
                continue
            if part.lower().startswith("answer"):
                return None
            if err := self.step_error(spec, part):
                return err
            if err is None:
                return None
        return ""

    def verified_prefix(self, spec: dict[str, Any], text: str) -> list[str]:
        """The steps of ``text`` up to (not including) its first wrong or malformed one.

        Even a draft that fails its rules usually starts right; those steps are
        safe context for the cloud when no draft is valid.
        """
        out = []
        for step in split_steps(text):
            if not self.step_ok(spec, step):
                break
            out.append(step)
        return out

    def corrected_prefix(self, spec: dict[str, Any], text: str) -> str | None:
        """``text`` up to its first wrong computed value, with the true value written instead -- what a
        calculator would write for the operands the model chose -- for the model to continue from; None
        when nothing there is a calculator's to correct. Default: the ``a op b = c`` equations of any
        text (``coinfer.arithmetic``)."""
        return corrected_prefix(text)

    def repaired(self, spec: dict[str, Any], text: str) -> str | None:
        """``text`` with every computed value the task's calculator can check rewritten to its true value,
        in place: what the model chose (its steps' terms, its answer) stays the model's, so a draft that
        chose wrong still fails its rules once repaired. None when nothing changed or nothing here is a
        calculator's. Who vouches for the result is ``RuleSet.check_repaired``'s to say (a preset's exact
        checkers; for an open request, the LLM verifier). Default: None."""
        return None

    def step_completion(self, spec: dict[str, Any], partial: str) -> str | None:
        """What ends ``partial`` -- the beginning of a step, no step's end in it -- as a right step of this
        task: the rest of the step as the task's calculator writes it ('' where ``partial`` is one already);
        None where no right step begins so, or where the task has no calculator. Where it is not None the
        cloud may stream ``partial`` as final before the model ends the step, since whatever the model
        writes next, the calculator can end the step rightly (``coinfer.cloud.writer``; docs/api.md,
        Streaming). Bounded: a partial of over ``MAX_PARTIAL_CHARS`` is None. Default: None."""
        return None

    def answer_key(self, parsed: Parsed) -> Any:
        """What drafts agree on (the seed's support term): the extracted answer."""
        return answer_key(parsed)

    def dedup_key(self, text: str, parsed: Parsed) -> Any:
        """Drafts with equal keys are verified once (docs/design.md §5.2: by structure, not text similarity)."""
        return self.structure_key(parsed)

    def problem(self, prompt: str) -> Problem:
        return Problem(self.name, prompt, self.parse_problem(prompt))


class OpenTask(Task):
    """An open request: any prompt, no grammar. Extraction and rules come with the request."""

    name = ""

    def generate(self, rng: random.Random) -> Problem:
        raise NotImplementedError("open requests have no generator")

    def parse_problem(self, prompt: str) -> dict[str, Any]:
        return {}

    def solve(self, spec: dict[str, Any]) -> str:
        raise NotImplementedError("open requests have no reference answer")

    def parse_answer(self, text: str) -> Parsed:
        return Parsed({})

    def check(self, checker: str, spec: dict[str, Any], parsed: Parsed) -> str:
        raise AssertionError("open requests offer no checkers")  # RuleSet refuses task_check first

    def grade(self, spec: dict[str, Any], parsed: Parsed) -> bool:
        raise NotImplementedError("open requests are graded by the caller")

    def default_rules(self, spec: dict[str, Any]) -> list[Rule]:
        return []

    def structure_key(self, parsed: Parsed) -> tuple:
        return tuple(sorted((k, str(v)) for k, v in parsed.fields.items()))

    def repaired(self, spec: dict[str, Any], text: str) -> str | None:
        """The text's equations, each result recomputed and a wrong one carried to its later uses
        (``coinfer.arithmetic.repaired``); applied only under the ``arithmetic`` rule
        (``RuleSet.repairs_equations``)."""
        return repaired_equations(text)

    def dedup_key(self, text: str, parsed: Parsed) -> Any:
        # two open drafts are one only when their text is (whitespace aside): the same answer
        # reached by different reasoning is support, not a duplicate
        return " ".join(text.split())

    def step_ok(self, spec: dict[str, Any], step: str) -> bool:
        return False
