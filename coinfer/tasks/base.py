"""What a task is: prompt format + answer parser + rule set + exact grader.

A task turns a prompt into a ``spec`` (the structured problem: variables, pool,
budget), parses a draft into a ``Parsed`` answer without ever raising, checks
task-specific constraints, and grades an answer exactly against the truth.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from coinfer.rules import Rule


@dataclass(frozen=True)
class Problem:
    """One generated problem: the prompt and its structured spec."""

    task: str
    prompt: str
    spec: dict[str, Any]


@dataclass
class Parsed:
    """A parsed answer. ``error`` is set (and ``fields`` partial) when parsing failed."""

    fields: dict[str, Any] = field(default_factory=dict)
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error


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

    def format_prompt(self, prompt: str) -> str:
        """Model input for a prompt: the answer starts on the next line."""
        return prompt.strip() + "\n"

    def problem(self, prompt: str) -> Problem:
        return Problem(self.name, prompt, self.parse_problem(prompt))
